"""The quantity graph: declarations, checks, reducer chains, evaluation, provenance."""

from __future__ import annotations


import pytest

import fitplan
from fitplan import Quantity, Reducer, hookimpl, quantity
from fitplan.errors import GraphError
from fitplan.engine import graph
from fitplan.inputs.names import input_names
from fitplan.pluginmgr.registry import make_registry


def compile_graph(quantities, reducers):
    return graph.compile_graph(quantities, reducers, input_names())


def q(name, func, plugin="p"):
    return Quantity(name=name, func=func, unit="x", plugin=plugin)


def test_dependencies_are_parameter_names_and_order_is_topological():
    g = compile_graph([q("c", lambda a, b: a + b), q("a", lambda per_device_train_batch_size: per_device_train_batch_size * 2),
                       q("b", lambda a: a * 10)], [])
    values, _ = g.evaluate({"per_device_train_batch_size": 3})
    assert (values["a"], values["b"], values["c"]) == (6, 60, 66)


def test_duplicate_quantity_names_both_plugins():
    with pytest.raises(GraphError) as e:
        compile_graph([q("a", lambda: 1, "first"), q("a", lambda: 2, "second")], [])
    assert "quantity 'a' is declared by plugin 'first' and again by plugin 'second'" in e.value.details[0]


def test_unbound_dependency_suggests():
    with pytest.raises(GraphError) as e:
        compile_graph([q("weight_total", lambda weigth_bytes: 1, "mine")], [])
    detail = e.value.details[0]
    assert "plugin 'mine'" in detail and "unknown name 'weigth_bytes'" in detail


def test_cycle_is_printed():
    with pytest.raises(GraphError) as e:
        compile_graph([q("a", lambda b: b), q("b", lambda c: c), q("c", lambda a: a)], [])
    assert "dependency cycle:" in e.value.message
    assert all(n in e.value.message for n in ("a ->", "b ->", "c"))


def test_reducer_chain_order_and_conditions():
    base = q("x", lambda per_device_train_batch_size: 100)
    r1 = Reducer("half", "x", lambda value: value // 2, lambda zero_stage: zero_stage >= 1, after=("minus",))
    r2 = Reducer("minus", "x", lambda value: value - 10, lambda: True)
    g = compile_graph([base], [r1, r2])
    assert g.chains["x"] == ["x.raw", "x.minus", "x.half"]
    v, applied = g.evaluate({"per_device_train_batch_size": 1, "zero_stage": 1})
    assert v["x"] == (100 - 10) // 2 and applied == {"x.minus": True, "x.half": True}
    v, applied = g.evaluate({"per_device_train_batch_size": 1, "zero_stage": 0})
    assert v["x"] == 90 and applied["x.half"] is False


@pytest.mark.parametrize("fields", [
    dict(model="llama-2-7b", gpu="a100-80gb", precision="bf16-mixed", per_device_train_batch_size=4, gradient_checkpointing=True),
    dict(model="llama-2-7b", gpu="h100-80gb", method="qlora", per_device_train_batch_size=2, gradient_accumulation_steps=4),
    dict(params="1B", per_device_train_batch_size=1),
])
def test_straight_line_evaluation_is_the_step_interpreter(fields):
    """The generated straight-line function computes what the step-by-step interpreter does: the same values,
    reducer flags and insertion order (the interpreter is the reference; the generated code is the fast path)."""
    from fitplan.context import get_context
    from fitplan.engine.interpreter import run, straight_line
    from fitplan.estimation import build_inputs

    ctx = get_context()
    inputs = build_inputs(fitplan.scenario_from_dict(fields), ctx.registry, ctx.rulesets)
    g = ctx.registry.compiled()
    v, applied = dict(inputs), {}
    run(g.steps, v, applied)
    fast_v, fast_applied = straight_line(g.steps)(inputs)
    assert list(fast_v.items()) == list(v.items()) and list(fast_applied.items()) == list(applied.items())
    assert not all(applied.values()) and ("model" not in fields or any(applied.values()))  # both branches are run


def test_a_failing_step_is_named_after_the_straight_line_run(monkeypatch):
    monkeypatch.setattr(graph.CompiledGraph, "STRAIGHT_AFTER", 1)
    boom = q("y", lambda x: 1 // (x - 100) if x == 100 else x, plugin="crashy")
    g = compile_graph([q("x", lambda per_device_train_batch_size: 100 * per_device_train_batch_size), boom], [])
    assert g.evaluate({"per_device_train_batch_size": 2})[0]["y"] == 200 and g._straight is None
    assert g.evaluate({"per_device_train_batch_size": 3})[0]["y"] == 300 and g._straight is not None
    with pytest.raises(fitplan.PluginError, match="plugin 'crashy'.*quantity 'y'.*ZeroDivisionError"):
        g.evaluate({"per_device_train_batch_size": 1})


def test_dependencies_read_from_code_are_inspects():
    """Declarations read parameter names from the code object of a plain function: the same names, in the same
    order, as inspect.signature, for every built-in declaration and for the shapes that fall back to it."""
    import functools
    import inspect

    from fitplan.context import get_context
    from fitplan.engine.declarations import _params

    g = get_context().registry.compiled()
    funcs = [q.func for q in g.quantities.values()] + [f for r in g.reducers.values() for f in (r.condition, r.transform)]

    def kwonly(a, /, b, *, c): ...
    def star(a, *args, b): ...

    @functools.wraps(kwonly)
    def wrapped(*args, **kwargs): ...

    for f in [*funcs, kwonly, star, wrapped, functools.partial(kwonly, 1), lambda: 0]:
        assert _params(f) == tuple(inspect.signature(f).parameters)
    assert _params(kwonly) == ("a", "b", "c") and _params(star) == ("a", "args", "b")


def test_contradictory_reducer_order():
    base = q("x", lambda: 1)
    r1 = Reducer("a", "x", lambda value: value, lambda: True, after=("b",))
    r2 = Reducer("b", "x", lambda value: value, lambda: True, after=("a",))
    with pytest.raises(GraphError) as e:
        compile_graph([base], [r1, r2])
    assert "contradictory ordering" in e.value.details[0]


def test_reducer_on_unknown_target():
    with pytest.raises(GraphError) as e:
        compile_graph([q("weight_bytes", lambda: 1)], [Reducer("r", "weight_byte", lambda value: value, lambda: True, plugin="pl")])
    assert "plugin 'pl': reducer 'r' targets unknown quantity 'weight_byte'" in e.value.details[0]
    assert "weight_bytes" in e.value.details[0]


class CountingPlugin:
    calls = 0

    @hookimpl
    def fitplan_register_quantities(self, register):
        CountingPlugin.calls += 1

        @quantity("bytes")
        def doubled_peak_bytes(peak_bytes):
            """Twice the peak."""
            return 2 * peak_bytes

        register(doubled_peak_bytes)


def test_compile_once_evaluate_many_without_hook_calls():
    reg = make_registry(entry_points=False, extra_plugins=[("counting", CountingPlugin())])
    assert CountingPlugin.calls == 1
    for b in (1, 2, 4):
        est = fitplan.estimate(params="1B", per_device_train_batch_size=b, registry=reg)
        assert est["doubled_peak_bytes"] == 2 * est["peak_bytes"]
    assert CountingPlugin.calls == 1


def test_provenance_names_plugin_deps_and_ruleset():
    est = fitplan.estimate(model="llama-2-7b", gpu="a100-80gb", precision="bf16-true")
    p = est.provenance("weight_bytes.raw")
    assert p["plugin"] == "fitplan.builtin.model_states"
    assert "param_count" in p["deps"] and p["value"] == 6_738_415_616 * 2
    assert est.provenance("gpu_spec")["ruleset"].endswith(".toml")
    z = est.provenance("optimizer_state_bytes.zero")
    assert z["kind"] == "reducer" and z["applied"] is False


def test_graph_exports():
    from fitplan.context import get_context

    g = get_context().registry.compiled()
    dot, mmd = g.to_dot(), g.to_mermaid()
    assert dot.startswith("digraph fitplan {") and '"param_count" -> "weight_bytes.raw";' in dot
    assert mmd.startswith("flowchart LR") and "weight_bytes" in mmd


def test_estimate_orders_the_graph_without_networkx():
    """Compiling orders the graph with Kahn's algorithm (no cache to trust or tamper with); networkx, which
    costs about 0.1 s to import, is only loaded to name a cycle or for graph algorithms (explain, recommend)."""
    import subprocess
    import sys

    probe = ("import sys, fitplan; e = fitplan.estimate(params='7B', assumptions='seed'); "
             "print(e['weight_bytes'], 'networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["28000000000", "False"]


def test_lexicographic_order_is_networkx_order():
    import networkx as nx

    from fitplan.context import get_context

    compiled = get_context().registry.compiled()
    g = nx.DiGraph()
    g.add_nodes_from(compiled.nodes)
    g.add_edges_from(compiled.edges)
    expected = [n for n in nx.lexicographical_topological_sort(g) if compiled.nodes[n].kind != "input"]
    assert [s[1] for s in compiled.steps] == expected


def test_objective_choices_match_the_recommender():
    import inspect

    from fitplan.cli.commands import recommend as commands
    from fitplan.search import space

    assert 'OBJECTIVES = ("cost", "time", "gpus")' in inspect.getsource(commands)
    assert space.OBJECTIVES == ("cost", "time", "gpus")
