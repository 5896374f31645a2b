"""The rules engine: declarations, the quantity graph, its interpreter and order cache.

This layer knows no quantity, GPU or model name: it checks, orders and evaluates whatever the
plugins declare (docs/architecture.md).
"""
