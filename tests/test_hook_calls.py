"""Hooks are called through pluggy (``pm.hook``), each implementation guarded (``pluginmgr/guard.py``): pluggy's call
order, ``tryfirst``, wrappers (``wrapper=True``) and old-style hookwrappers (``hookwrapper=True``) change the result as
pluggy documents (https://pluggy.readthedocs.io, "Call time order", "Wrappers"), and a plugin that fails is named and
the others still answer.

The plugins are real: modules written to a temporary source tree and loaded through ``fitplan`` entry points of a
dist-info (as ``pip install`` would leave them), registered by ``make_registry`` like any third-party plugin."""

from __future__ import annotations

import textwrap

import pytest

from fitplan.errors import FitplanError
from fitplan.pluginmgr.registry import make_registry

ANSWER = """
from fitplan.api import hookimpl

@hookimpl{options}
def fitplan_validate(scenario, estimate, options):
    return {{"by": {name!r}}}
"""
WRAPPER = """
from fitplan.api import hookimpl

@hookimpl(wrapper=True)
def fitplan_validate(scenario, estimate, options):
    report = yield
    return {**report, "wrapped_by": "wrapper"}
"""
OLD_WRAPPER = """
from fitplan.api import hookimpl

@hookimpl(hookwrapper=True)
def fitplan_validate(scenario, estimate, options):
    outcome = yield
    outcome.force_result({**outcome.get_result(), "checked": True})
"""
RAISES = """
from fitplan.api import hookimpl

@hookimpl(tryfirst=True)
def fitplan_validate(scenario, estimate, options):
    raise RuntimeError("no GPU here")
"""
WRAPPER_RAISES = """
from fitplan.api import hookimpl

@hookimpl(wrapper=True)
def fitplan_validate(scenario, estimate, options):
    report = yield
    raise ValueError("the wrapper broke after the call")
"""
USER_ERROR = """
from fitplan.api import FitplanError, hookimpl

@hookimpl
def fitplan_validate(scenario, estimate, options):
    raise FitplanError("this scenario needs 40 GB of CPU memory", field="--max-cpu-memory", value="16G")
"""
DECLARING_WRAPPER = """
from fitplan.api import hookimpl, quantity

@quantity("bytes", category="memory")
def wrapper_reserve_bytes():
    return 7

@hookimpl(wrapper=True)
def fitplan_register_quantities(register):
    yield
    register(wrapper_reserve_bytes)
"""


@pytest.fixture
def plugins(fitplan_entry_points, tmp_path):
    """Factory: ``plugins(a=SOURCE, b=SOURCE)`` makes entry points ``a``, ``b`` of modules with those sources and
    returns the registry that loads exactly them."""
    def make(**sources: str):
        src = tmp_path / "src"
        src.mkdir(exist_ok=True)
        for name, text in sources.items():
            (src / f"plugin_{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
        fitplan_entry_points("fitplan-hook-calls", {name: f"plugin_{name}" for name in sources}, src=src)
        return make_registry(entry_points=list(sources), blocked=())
    return make


def validate(reg):
    return reg.pm.hook.fitplan_validate(scenario=None, estimate=None, options={})


def test_entry_points_are_called_by_name_and_the_first_answer_wins(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), b=ANSWER.format(name="b", options=""))
    assert reg.errors == []
    assert validate(reg) == {"by": "a"}  # fitplan_validate is firstresult; entry points are called by name


def test_tryfirst_moves_a_plugin_ahead(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), b=ANSWER.format(name="b", options="(tryfirst=True)"))
    assert reg.errors == []
    assert validate(reg) == {"by": "b"}


def test_trylast_moves_a_plugin_behind(plugins):
    reg = plugins(a=ANSWER.format(name="a", options="(trylast=True)"), b=ANSWER.format(name="b", options=""))
    assert validate(reg) == {"by": "b"}


def test_a_wrapper_changes_the_result(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), w=WRAPPER)
    assert reg.errors == []
    assert validate(reg) == {"by": "a", "wrapped_by": "wrapper"}


def test_an_old_style_hookwrapper_forces_the_result(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), h=OLD_WRAPPER)
    assert reg.errors == []
    assert validate(reg) == {"by": "a", "checked": True}


def test_a_raising_plugin_is_named_and_the_others_answer(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), boom=RAISES)
    assert validate(reg) == {"by": "a"}  # boom ran first (tryfirst), raised, and answered nothing
    assert [e.message for e in reg.errors] == ["plugin 'boom' raised RuntimeError: no GPU here in fitplan_validate"]
    assert "FITPLAN_BLOCK_PLUGINS=boom" in reg.errors[0].render()


def test_a_wrapper_that_fails_leaves_the_result_and_is_named(plugins):
    reg = plugins(a=ANSWER.format(name="a", options=""), w=WRAPPER_RAISES)
    assert validate(reg) == {"by": "a"}
    assert [e.message for e in reg.errors] == [
        "plugin 'w' raised ValueError: the wrapper broke after the call in fitplan_validate"]


def test_a_users_error_from_a_validation_plugin_reaches_the_user_unchanged(plugins):
    reg = plugins(u=USER_ERROR)
    with pytest.raises(FitplanError) as e:
        validate(reg)
    assert e.value.message == "this scenario needs 40 GB of CPU memory" and e.value.field == "--max-cpu-memory"
    assert reg.errors == []


def test_a_wrapper_of_a_declaration_hook_declares_as_itself(plugins):
    reg = plugins(dw=DECLARING_WRAPPER)
    assert reg.errors == []
    declared = {q.name: q.plugin for q in reg.quantities}
    assert declared["wrapper_reserve_bytes"] == "dw"
    assert declared["weight_bytes"] == "fitplan.builtin.model_states"  # the wrapped call went on


def test_the_built_in_plugins_are_called_first():
    """The registry registers the built-ins last, so that pluggy (last registered first) calls them first, in
    BUILTIN_PLUGINS order, and an extra plugin after them."""
    from fitplan.api import hookimpl
    from fitplan.pluginmgr.registry import BUILTIN_PLUGINS

    class Extra:
        @hookimpl
        def fitplan_register_names(self, register):
            pass

    reg = make_registry(entry_points=False, extra_plugins=[("extra", Extra())], blocked=())
    assert reg.plugin_names() == [*BUILTIN_PLUGINS, "extra"]
    order = [impl.plugin_name for impl in reversed(reg.pm.hook.fitplan_register_names.get_hookimpls())]
    assert order == [n for n in [*BUILTIN_PLUGINS, "extra"] if n in order] and order[-1] == "extra"


DIRS = """
from fitplan.api import hookimpl

@hookimpl{options}
def fitplan_ruleset_dirs():
    return [{path!r}]
"""
DIRS_WRAPPER = """
from fitplan.api import hookimpl

@hookimpl(wrapper=True)
def fitplan_ruleset_dirs():
    answers = yield
    return [*answers, [{path!r}]]
"""


def ruleset_dir(path, provider: str):
    """A directory holding one valid ruleset: a provider without instances."""
    path.mkdir()
    (path / "prices.toml").write_text(f'[[provider]]\nid = "{provider}"\nname = "{provider}"\nbilling = "hour"\n'
                                      'currency = "USD"\nsource = "tests/test_hook_calls.py"\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("tryfirst", [False, True])
def test_ruleset_directories_come_in_call_order(plugins, tmp_path, tryfirst):
    a, b = ruleset_dir(tmp_path / "rules-a", "hook-a"), ruleset_dir(tmp_path / "rules-b", "hook-b")
    reg = plugins(a=DIRS.format(options="", path=str(a)),
                  b=DIRS.format(options="(tryfirst=True)" if tryfirst else "", path=str(b)))
    assert reg.errors == []
    assert reg.ruleset_dirs() == ([str(b), str(a)] if tryfirst else [str(a), str(b)])
    assert reg.ruleset_dirs_by_plugin() == {"a": [str(a)], "b": [str(b)]}


def test_a_directory_a_wrapper_adds_is_the_wrappers(plugins, tmp_path):
    a, w = ruleset_dir(tmp_path / "rules-a", "hook-a"), ruleset_dir(tmp_path / "rules-w", "hook-w")
    reg = plugins(a=DIRS.format(options="", path=str(a)), w=DIRS_WRAPPER.format(path=str(w)))
    assert reg.errors == []
    assert reg.ruleset_dirs_by_plugin() == {"a": [str(a)], "w": [str(w)]}


SETTINGS_WRAPPER = """
from fitplan.api import Setting, hookimpl

@hookimpl(wrapper=True)
def fitplan_register_settings(register):
    yield
    register(Setting("hook_calls_probe", "training", type="int", default=3, minimum=0,
                     help="a field declared by a wrapper after the others"))
"""
SETTINGS_RAISES = """
from fitplan.api import hookimpl

@hookimpl(tryfirst=True)
def fitplan_register_settings(register):
    raise RuntimeError("no settings today")
"""


def test_settings_are_declared_through_pluggy_like_every_hook(plugins):
    """fitplan_register_settings goes through pm.hook as the other declaring hooks do: a wrapper's setting is its
    own, a plugin that raises is named and answers nothing, and the built-in offload_params is still installed."""
    from fitplan.inputs.settings import declared, restore_point

    declared()
    restore = restore_point()
    try:
        reg = plugins(sw=SETTINGS_WRAPPER, boom=SETTINGS_RAISES)
        assert [e.message for e in reg.errors] == [
            "plugin 'boom' raised RuntimeError: no settings today in fitplan_register_settings"]
        table = declared()
        assert (table["hook_calls_probe"].plugin, table["hook_calls_probe"].default) == ("sw", 3)
        assert table["offload_params"].plugin == "fitplan.builtin.sharding"
    finally:
        restore()
    assert "hook_calls_probe" not in declared()
