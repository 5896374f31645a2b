"""ACME's fitplan rulesets, shipped as a plugin.

The package holds TOML data only (``rulesets/``); this module tells fitplan where it is through the
``fitplan_ruleset_dirs`` hook. The same directory works without installing anything:
``fitplan estimate --ruleset-dir plugins/acme-fitplan-rules/src/acme_fitplan_rules/rulesets ...``.
"""

from __future__ import annotations

from pathlib import Path

from fitplan.api import hookimpl

__version__ = "0.1.0"

RULESETS = Path(__file__).resolve().parent / "rulesets"


@hookimpl
def fitplan_ruleset_dirs():
    """ACME's pricing: loaded after fitplan's bundled rulesets, before any ``--ruleset-dir``."""
    return [str(RULESETS)]
