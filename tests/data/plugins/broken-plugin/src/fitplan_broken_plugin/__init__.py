"""Broken fitplan plugins, one per fault (see ``plugins.py``)."""
