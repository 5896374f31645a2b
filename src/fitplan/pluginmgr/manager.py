"""fitplan's pluggy ``PluginManager``: pluggy's, with a quicker look at a plugin module's names.

Registering a plugin, pluggy asks :meth:`parse_hookimpl_opts` about every name in ``dir(plugin)``, each through
``inspect.getattr_static`` (``pluggy/_manager.py`` ``_static_hook_attr``); fitplan's plugins are modules with
some 30 names each and about 25 of them register at every start (~700 names, ~10 ms of a short command,
issue #26). For a module, :meth:`PluginManager.parse_hookimpl_opts` answers "not a hook implementation"
from the module's own dictionary for a name that holds no function, or a plain function without the
``fitplan_impl`` marker, which is what pluggy concludes for them too; anything else goes to pluggy.
"""

from __future__ import annotations

import types
from typing import Any

import pluggy


class PluginManager(pluggy.PluginManager):
    """:class:`pluggy.PluginManager` with a fast answer for the names of a module that are no hook
    implementation (``tests/test_plugin_manager.py`` compares it with pluggy's answer for every name of every
    built-in plugin)."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if isinstance(plugin, types.ModuleType):
            value = vars(plugin).get(name)
            if isinstance(value, types.FunctionType):
                if self.project_name + "_impl" not in value.__dict__:
                    return None
            elif not isinstance(value, (staticmethod, classmethod, types.MethodType)):
                return None
        return super().parse_hookimpl_opts(plugin, name)
