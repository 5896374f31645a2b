"""Built-in plugins: registered exactly like third-party ones (see :data:`fitplan.pluginmgr.registry.BUILTIN_PLUGINS`)."""
