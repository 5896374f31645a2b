"""Types that learned but failed their own verification (issue #32), one class of construct per test, each on a
real transformers 5.24 type's class defaults (shrunk as the learner shrinks them) or on hand-derived values.

* ALiBi's slopes take other ops when the head count is no power of two (bloom, mpt): a size regime;
* a width the model reads for another (Helium's ``o_proj`` is ``hidden × hidden`` after ``heads · head_dim``
  channels): a product of sizes probed together;
* a first layer whose casts differ in bf16 only (Mamba's ``residual_in_fp32``): its own layer kind; a loop over
  the sequence (Mamba's reference scan): refused naming it;
* a parameter created with ``requires_grad=False`` (AfMoE's router ``expert_bias``): no gradient, no states.

Expected values come from the model code cited at each test (or by hand from the formula there), never from the
learner's output. The tests that build models are slow (referee/slow through tests/conftest.py's importorskip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fitplan.arch.archexpr import evaluate


def _small(model_type: str) -> dict:
    """The class defaults as bench/learn_breadth.py writes them, shrunk as ``learn-architecture`` shrinks them."""
    from transformers import AutoConfig

    from fitplan_torch.learn.command import shrink

    return shrink(json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type})))


# --------------------------------------------------------------------------- ALiBi: a power of two or not


@pytest.mark.parametrize("n, floor, ceil", [(1, 1, 1), (8, 8, 8), (12, 8, 16), (30, 16, 32), (112, 64, 128)])
def test_power_of_two_functions_of_the_file_language(n, floor, ceil):
    """``pow2_floor`` / ``pow2_ceil``: BLOOM-176B's 112 heads take slopes for 64 heads and 112 - 64 = 48 more
    (modeling_bloom.py ``_get_alibi_slopes``: ``closest_power_of_2 = 2 ** floor(log2(num_heads))``); MPT builds
    ``2 ** ceil(log2(num_heads))`` = 128 (modeling_mpt.py ``build_mpt_alibi_tensor``)."""
    assert evaluate("pow2_floor(n)", {"n": n}) == floor and evaluate("pow2_ceil(n)", {"n": n}) == ceil
    assert evaluate("pow2_floor(n) == n", {"n": n}) is (n == floor)


def test_the_fitter_writes_alibi_slope_counts_as_powers_of_two():
    """In the regime where the heads are no power of two, BLOOM's slopes are ``cat`` of ``pow2_floor(h)`` and
    ``h - pow2_floor(h)`` (the extra slopes: ``min(cp2, h - cp2)``, and ``h - cp2 < cp2``): at 12, 24 and 40 heads,
    8 + 4, 16 + 8, 32 + 8 by hand. A monomial of h fits the first two probes (2h/3, h/3) but not the third."""
    from fitplan_torch.learn.fit import Fitter

    env = [{"n_head": h, "b": 2, "s": 16} for h in (12, 24, 40)]
    f = Fitter(env, {"n_head": 1})
    assert f.fit([8, 16, 32]) == "pow2_floor(n_head)"
    assert f.fit([4, 8, 8]) == "n_head - pow2_floor(n_head)"
    assert f.fit([16, 32, 64]) == "pow2_ceil(n_head)"


@pytest.mark.parametrize("model_type, heads", [("bloom", "n_head"), ("mpt", "n_heads")])
def test_alibi_types_learn_the_head_count_regime(model_type, heads):
    """BLOOM records ``full``, ``arange``, ``pow`` and ``cat`` more for 12 heads than for 8 (modeling_bloom.py
    ``_get_alibi_slopes``: ``if closest_power_of_2 != num_heads``), MPT a strided ``slice`` pair, ``cat`` and a
    ``slice`` (modeling_mpt.py ``build_mpt_alibi_tensor``): the switch is found, under the file's conditions."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.configrules import config_class
    from fitplan_torch.learn.sizeregimes import power_of_two_heads

    base = derive.hf_config(_small(model_type)).to_dict()
    switch = power_of_two_heads(base, config_class(model_type), ("16", "eager"), lambda m: None)
    assert switch is not None
    assert [r.when for r in switch] == [f"pow2_floor({heads}) == {heads}", f"pow2_floor({heads}) != {heads}"]
    pow2, other = (r.setup(dict(base), 2, 16)[heads] for r in switch)
    assert (pow2 & (pow2 - 1), other & (other - 1) != 0) == (0, True)


def test_a_rotary_type_has_no_head_count_regime():
    """Llama's ops are the same at 8 and 12 heads (rotary embeddings, no slopes): no switch, no extra classes."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.configrules import config_class
    from fitplan_torch.learn.sizeregimes import power_of_two_heads

    base = derive.hf_config(_small("llama")).to_dict()
    assert power_of_two_heads(base, config_class("llama"), ("16", "eager"), lambda m: None) is None


def test_bloom_reproduces_a_fresh_run_at_held_out_head_counts():
    """The graph check (verify.check_graph) ran BLOOM at 20 heads, where the file learned at 8 and 16 had no
    ``cat`` of extra slopes: every variant failed at the prologue's op 5. Each regime now reproduces its held-out
    run, the one with no power of two included."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V

    data, results, specs = derive.learn_full(_small("bloom"), log=lambda m: None)
    assert {r.name.split("+")[-1] for _, _, r in specs} == {"heads-pow2", "heads-other"}
    assert V.check_graph(data, results, specs, lambda m: None) == []


# --------------------------------------------------------------------------- a product the model needs


def test_a_product_of_variables_is_found_in_the_base_config():
    """Helium runs only with ``hidden_size == num_attention_heads * head_dim`` (modeling_helium.py: ``o_proj =
    nn.Linear(config.hidden_size, config.hidden_size)`` after ``num_attention_heads * head_dim`` channels): in the
    GQA regime's base (12 heads of 16 = 192) the relation is found from either factor, and from neither where
    the product does not hold."""
    from fitplan_torch.learn.relations import relations

    base = {"hidden_size": 192, "num_attention_heads": 12, "head_dim": 16, "num_key_value_heads": 4,
            "intermediate_size": 256}
    names = list(base)
    assert relations(base, names, "num_attention_heads") == [("hidden_size", "head_dim")]
    assert relations(base, names, "head_dim") == [("hidden_size", "num_attention_heads")]
    assert relations({**base, "hidden_size": 64}, names, "num_attention_heads") == []


def test_helium_serves_its_own_config():
    """Helium's learning held ``hidden_size``, ``num_attention_heads`` and ``head_dim`` at the GQA regime's
    192 / 12 / 16 and refused the very config it learned from (64 / 4 / 16). They are now probed together and the
    file serves that config: its memory check against the referee holds."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.learner import learn_and_check

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        written = learn_and_check(_small("helium"), Path(d), verify=True, tolerance=0.01, log=lambda m: None)
        header = json.loads((Path(d) / "helium.json").read_text())
    assert Path(d) / "helium.json" in written
    assert not {"hidden_size", "num_attention_heads", "head_dim"} & set(header.get("held") or {})
    assert ["hidden_size == num_attention_heads*head_dim", "hidden_size"] in [
        [c["expr"], c["field"]] for c in header["config"]["checks"]]


# --------------------------------------------------------------------------- Mamba's first layer


def test_mamba_first_layer_is_its_own_kind_in_bf16_only():
    """``MambaBlock.forward`` (modeling_mamba.py): ``self.norm(hidden_states.to(dtype=self.norm.weight.dtype))``
    and ``residual.to(torch.float32)``. In bf16 the first block casts the residual (bf16 embedding), the others
    cast the fp32 input for the norm; with fp32 weights both are no-ops. Given the two variants' layer kinds as the
    learner found them (bf16: first differs; fp32: all alike), the rule is ``i == 0``, checked on a 3-layer bf16
    recording (the odd layer is the first, not the last)."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from fitplan_torch.learn import derive
    from fitplan_torch.learn.configrules import config_class
    from fitplan_torch.learn.layerkinds import FIRST, first_layer_rule

    base = derive.hf_config(_small("mamba")).to_dict()
    regime = derive.Regime("b>1", None)
    rec = SimpleNamespace(base=base, cls=config_class("mamba"),
                          specs=[("16", "eager", regime), ("mixed", "eager", regime)])
    entries = [{"kinds": ["k0", "k1"]}, {"kinds": ["k0", "k0"]}]
    assert first_layer_rule(rec, entries, lambda m: None) == FIRST
    assert [evaluate(FIRST, {"i": i}) for i in range(3)] == ["1", "0", "0"]
    middle = [{"kinds": ["k0", "k1", "k0"]}, {"kinds": ["k0", "k0", "k0"]}]  # the middle layer differs: no such rule
    assert first_layer_rule(rec, middle, lambda m: None) is None


def test_a_loop_over_the_sequence_is_probed_as_a_size():
    """Mamba's reference scan off CUDA (modeling_mamba.py ``slow_forward``: ``for i in range(seq_len)``) recorded
    other ops at every sequence length, so no probe of ``s`` kept them and the learning was refused. The loop now
    folds to one carried block (learn/seqloop.py) repeated once per position but the first: the probes of ``s``
    record the same ops, with the count following ``s`` (by hand: 15 at s = 16, 19 at s = 20). The refusal for a
    loop that does not fold is tests/test_learn_seqloop.py's."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive

    base = derive.hf_config(_small("mamba")).to_dict()
    probes, single, recs, _ = derive.make_probes(base, [], 2, 16, derive.Regime("b>1", None), None, "16", "eager",
                                                 lambda m: None)
    assert "s" in single
    rec = recs[single["s"]]
    assert probes[single["s"]].s == 20 and {r["count"] for r in rec.repeats} == {19}
    assert {r["count"] for r in recs[0].repeats} == {15} and all(len(r["carry"]) == 1 for r in rec.repeats)


# --------------------------------------------------------------------------- frozen parameters


def test_a_frozen_parameter_has_no_gradient_and_no_optimizer_state(tiny_llama_with):
    """A parameter the model creates with ``requires_grad=False`` (AfMoE: ``nn.Parameter(torch.zeros(num_experts,
    dtype=torch.float32), requires_grad=False)``, modeling_afmoe.py) has no ``.grad`` and AdamW gives it no state
    (torch/optim/adam.py ``_init_group`` skips ``p.grad is None``). tiny-llama with its two input norms (64 each)
    listed ``frozen``, bf16-true full fine-tuning with ``adamw_torch``: the weights stay, the gradients lose
    2 × 64 × 2 bytes, the states 2 × (64 × 2 × 2 + 4) bytes (``exp_avg`` and ``exp_avg_sq`` in the parameter's
    dtype, ``step`` a 0-d fp32 tensor: ``_init_group``)."""
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[1] / "tests" / "data" / "configs" / "tiny-llama" / "config.json")

    def estimate(frozen):
        e = tiny_llama_with({"frozen": frozen} if frozen else {})
        return {k: e[k] for k in ("weight_bytes", "gradient_bytes", "optimizer_state_bytes")}

    cfg = json.loads(Path(config).read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    assert (hidden, layers) == (64, 2)
    full = estimate([])
    part = estimate(["model.layers.{i}.input_layernorm.weight"])
    assert part["weight_bytes"] == full["weight_bytes"]
    assert full["gradient_bytes"] - part["gradient_bytes"] == layers * hidden * 2
    assert full["optimizer_state_bytes"] - part["optimizer_state_bytes"] == layers * (hidden * 2 * 2 + 4)


# --------------------------------------------------------------------------- a precision the model cannot train in


def test_a_model_that_runs_in_no_regime_names_the_op_and_line(tmp_path, cli_in_process):
    """XMOD's language adapters write the adapters' output into ``torch.zeros_like(hidden_states)`` by a boolean
    mask (models/xmod/modeling_xmod.py ``XmodOutput.lang_adapter``). Under bf16 autocast the hidden states come
    out of ``LayerNorm`` in float32 and the adapter's ``Linear`` in bfloat16 (layer_norm is on autocast's float32
    list, linear on its lower-precision list, on CUDA as on the CPU), and ``index_put_`` requires one dtype
    (torch's own check, which fires without autocast too: checked by hand with a float32 destination and a
    bfloat16 source), so bf16-mixed does not run on any device. The learner leaves that precision class out of the
    file, saying why with the op and the line (not only "runs in none of the regimes"), learns the others, and the
    core refuses bf16-mixed by name (exit 2). The config: the class defaults with ``default_language`` "en_XX", as
    transformers' XmodModelTester states it (bench/breadth/configs/xmod.json). Controls: before the op and line were
    named the log ended at "none of the regimes" (the breadth row of xmod, learn-9zzzzzz-z2-lead.json); before the
    class was left out the learning refused the whole type (exit 2)."""
    pytest.importorskip("torch")
    from transformers import AutoConfig

    cfg = {**AutoConfig.for_model("xmod", default_language="en_XX").to_dict(), "model_type": "xmod"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg, default=str))
    proc = cli_in_process("learn-architecture", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join((proc.stdout + proc.stderr).split())  # the console wraps long lines
    assert "mixed/sdpa: left out, the model does not run in it (the model runs in none of the regimes: " \
           "RuntimeError: Index put requires the source and destination dtypes match" in said
    assert "models/xmod/modeling_xmod.py:" in said and "new_hidden_states[lang_mask]" in said
    run = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--model", str(path), "--precision",
                          "bf16-mixed"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "FITPLAN_ARCH_DIR": str(tmp_path / "out"), "FITPLAN_NO_CACHE": "1"})
    refused = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 2 and "Traceback" not in refused, refused[-2000:]
    assert "xmod does not run in precision class 'mixed'" in refused


# --------------------------------------------------------------------------- a regime reusing another's segments


def test_a_segment_reused_at_batch_one_must_give_its_recorded_shapes():
    """``torch.einsum`` permutes its operands with the dimensions of size 1 grouped apart (torch 2.13,
    aten/src/ATen/native/Linear.cpp ``sumproduct_pair``): ProphetNet's n-gram attention ``einsum("bnhtc,bnhsc->
    bnhts")`` (models/prophetnet/modeling_prophetnet.py) permutes the query to ``[b, n, h, t, c, 1]`` at b = 2 and
    to ``[n, h, t, c, 1, 1]`` at b = 1: the same ops in the same order, another layout. The b = 1 regime took the
    b > 1 regime's expressions for such a segment, and verification found ``[1, 40, 21, 4, 1]`` where the model
    made ``[40, 21, 4, 1, 1]``. The shapes are measured here by torch (each permute's output); the expressions
    are those of the b = 2 layout, written by hand. Expected: they hold at b = 2, and not at b = 1 (control)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from fitplan_torch.learn.derive import _shapes_hold

    def permutes(b):
        shapes = []

        class Log(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.permute.default:
                    shapes.append(list(out.shape))
                return out

        with Log():
            torch.einsum("bnhtc,bnhsc->bnhts", torch.randn(b, 4, 2, 21, 16), torch.randn(b, 4, 2, 42, 16))
        return {"tensors": [[x, "f32", None] for x in shapes]}

    ref = {"sym_tensors": [[d, "f32", None] for d in (
        ["b", "n", "h", "s", "1", "c"], ["b", "n", "h", "1", "2 * s", "c"], ["b", "n", "h", "s", "c", "1"],
        ["b", "n", "h", "c", "2 * s", "1"], ["b", "n", "h", "s", "2 * s", "1"])]}
    env = {"n": 4, "h": 2, "s": 21, "c": 16}
    assert _shapes_hold(ref, permutes(2), {**env, "b": 2})
    at_one = permutes(1)
    assert at_one["tensors"][2][0] == [4, 2, 21, 16, 1, 1]  # the b = 1 layout, as torch makes it
    assert not _shapes_hold(ref, at_one, {**env, "b": 1})


def test_a_held_out_config_keeps_what_the_file_holds():
    """The graph check's held-out config changes only sizes the file serves: the file refuses a config that states
    another value of a field it holds (archfile ``symbols``: "the learned ... file serves only ..."), and its
    ``held`` is the union over every variant and the layer pattern (learn/files.py ``held_sizes``), so a size one
    variant probed but another held is no free size of the check. By hand: variables a, b, c, d; the variant
    holds b, the file holds b and c: a and d are free."""
    from fitplan_torch.learn.verify import free_variables

    res = {"variables": ["a", "b", "c", "d"], "held": {"b": 2}}
    assert free_variables(res, {"held": {"b": 2, "c": 4}}) == ["a", "d"]
    assert free_variables(res, {}) == ["a", "c", "d"]  # control: without the file's held, c would be changed
