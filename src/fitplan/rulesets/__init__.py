"""Declarative TOML data: the schemas of ruleset files, loading and checking them, pricing lookups and
the SkyPilot catalog importer. Rulesets are data only: never executed."""
