"""fitplan's PluginManager (``pluginmgr/manager.py``) finds exactly the hook implementations pluggy finds."""

from __future__ import annotations

import types

import pluggy

from fitplan.pluginmgr.manager import PluginManager
from fitplan.pluginmgr.registry import default_registry


class _Holder:
    @staticmethod
    def fitplan_static() -> None:
        """not marked"""


def test_same_answer_as_pluggy_for_every_name_of_every_loaded_plugin():
    ours, theirs = PluginManager("fitplan"), pluggy.PluginManager("fitplan")
    plugins = [p for _, p in default_registry().pm.list_name_plugin() if p is not None]
    probe = types.ModuleType("probe")  # the kinds of value a plugin module may hold
    probe.static, probe.cls, probe.bound, probe.number = _Holder.__dict__["fitplan_static"], _Holder, _Holder().__init__, 3
    marked = pluggy.HookimplMarker("fitplan")

    @marked
    def fitplan_marked() -> None:
        """marked"""

    probe.fitplan_marked = fitplan_marked
    found = 0
    for plugin in [*plugins, probe]:
        for name in dir(plugin):
            expected = theirs.parse_hookimpl_opts(plugin, name)
            assert ours.parse_hookimpl_opts(plugin, name) == expected, (plugin, name)
            found += expected is not None
    assert len(plugins) > 20 and found > 30  # the built-ins' hook implementations were among them
