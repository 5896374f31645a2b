"""Built-in plugins: registered exactly like third-party ones (see :data:`fitplan.plugins.BUILTIN_PLUGINS`)."""
