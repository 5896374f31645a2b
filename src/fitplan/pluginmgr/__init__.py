"""The plugin system: every hook specification and the registry that loads plugins and collects
what they declare (quantities, reducers, optimizers, names, commands, formats, ruleset directories)."""
