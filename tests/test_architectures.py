"""Architectures as data (docs/architectures.md): the bundled learned files, what the core reads from them,
and (with torch) that they have not drifted from the transformers code they were learned from.

Expected values are derived by hand from the published configs or were measured by peft/torch (stated).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError
from conftest import string_constants

ROOT = Path(__file__).resolve().parents[1]
ARCH_DIR = ROOT / "rulesets" / "architectures"
CONFIGS = ROOT / "tests" / "data" / "configs"
LISTED = ("llama mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma gemma2 gemma3_text phi phi3 gpt2 gpt_neox falcon "
          "olmo olmo2 starcoder2 gpt_bigcode cohere granite stablelm deepseek_v2 deepseek_v3 smollm3 glm4 exaone4 "
          "ernie4_5 gpt_oss llama4_text").split()


def tiny(model_type: str) -> str:
    name = "tiny-" + model_type.replace("_text", "").replace("_", "-")
    return str(CONFIGS / name / "config.json")


# --------------------------------------------------------------------------- no per-model code in the core


def _string_literals(path: Path) -> list[tuple[int, str]]:
    return string_constants(path)  # a dict keyed by model_type would be per-model code too: keys count


def test_the_core_has_no_model_type_literal():
    # every model type with a bundled file (the shared tables autograd.json / peft.json are not one)
    known = set(LISTED) | {p.name.removesuffix(".graphs.json") for p in ARCH_DIR.glob("*.graphs.json")}
    hits = []
    for path in sorted((ROOT / "src" / "fitplan").rglob("*.py")):
        for line, value in _string_literals(path):
            if value in known:
                hits.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert hits == []


def test_the_scanner_sees_literals():
    # the test above could not fail if the scanner missed string constants: show that it finds them
    src = ROOT / "tests" / "data" / "literal_probe.py"
    src.write_text('"""doc"""\nX = {"llama": 1}\n', encoding="utf-8")
    try:
        assert (2, "llama") in _string_literals(src)
        assert all(v != "doc" for _, v in _string_literals(src))
    finally:
        src.unlink()


# --------------------------------------------------------------------------- the bundled files


@pytest.mark.parametrize("model_type", LISTED)
def test_every_listed_model_type_has_a_learned_file(model_type):
    from fitplan.builtin.archfile import load

    af = load(model_type)
    assert af.learned["torch"] == "2.13.0"
    assert af.learned["transformers"] == "5.24.0"
    assert af.learned["peft"] == "0.21.2"
    precisions = {v["precision"] for v in af.variants}
    assert precisions == {"16", "mixed"}
    attns = {v["attn"] for v in af.variants}
    assert attns == set(af.data["attn_implementations"]) and "eager" in attns
    attn = "sdpa" if "sdpa" in attns else "eager"
    spec = fitplan.estimate(model=tiny(model_type), device="cpu", per_device_train_batch_size=2, max_seq_length=32,
                            attn_implementation=attn).arch
    assert spec.model_type == model_type and spec.param_count > 0


@pytest.mark.parametrize("model_type", LISTED)
def test_every_listed_model_type_has_catalog_entries(model_type):
    from fitplan.context import get_context

    rules = get_context().rulesets
    entries = [e for e in rules.models.values() if e.config.get("model_type") == model_type]
    assert entries, f"no published size of {model_type} in rulesets/models"


def test_one_file_serves_every_size_of_a_family():
    # Qwen3-MoE 30B-A3B and 235B-A22B: published parameter counts 30.5B and 235B (model cards)
    small = fitplan.estimate(model="qwen3-30b-a3b")
    big = fitplan.estimate(model="qwen3-235b-a22b")
    assert small.arch.model_type == big.arch.model_type == "qwen3_moe"
    assert 30.4e9 < small["param_count"] < 30.6e9
    assert 234e9 < big["param_count"] < 236e9


# --------------------------------------------------------------------------- reading config.json like the config class


def test_defaults_and_derived_fields(tmp_path):
    # LlamaConfig: num_key_value_heads defaults to the heads, head_dim to hidden_size // heads
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 512,
           "num_hidden_layers": 2, "vocab_size": 1000}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    a = fitplan.estimate(model=str(p)).arch
    assert (a.num_key_value_heads, a.head_dim) == (8, 32)
    # by hand: 2 layers of (4·256² + 3·256·512 + 2·256) + 2·1000·256 + 256
    assert a.param_count == 2 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 2 * 1000 * 256 + 256


def test_attribute_map_aliases(tmp_path):
    # GPT-2 calls the width n_embd; a config.json that says hidden_size means the same (attribute_map)
    base = json.loads(Path(tiny("gpt2")).read_text())
    alias = {k: v for k, v in base.items() if k != "n_embd"}
    alias["hidden_size"] = base["n_embd"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(alias))
    assert fitplan.estimate(model=str(p)).arch.param_count == fitplan.estimate(model=tiny("gpt2")).arch.param_count


def test_values_kept_inside_rope_parameters(tmp_path):
    # GPT-NeoX: rotary_pct (legacy key) or rope_parameters.partial_rotary_factor set the rotary width;
    # the rotary buffers hold d_rot / 2 fp32 inverse frequencies, twice (inv_freq and original_inv_freq)
    base = json.loads(Path(tiny("gpt_neox")).read_text())
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    out = {}
    for name, extra in (("legacy", {"rotary_pct": 0.5}), ("nested", {"rope_parameters": {"partial_rotary_factor": 0.5}})):
        cfg = {k: v for k, v in base.items() if k not in ("rotary_pct", "rope_parameters", "partial_rotary_factor")}
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({**cfg, **extra}))
        out[name] = fitplan.estimate(model=str(p), device="cpu")["buffer_bytes"]
    assert out["legacy"] == out["nested"] == 2 * 4 * int(head_dim * 0.5) // 2


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"hidden_size": 0}, "$.hidden_size", "hidden_size must be a positive integer, got 0"),
    ({"hidden_size": "wide"}, "$.hidden_size", "hidden_size must be an integer, got 'wide'"),
    ({"num_key_value_heads": 3}, "$.num_key_value_heads", "must be a multiple of the number of key/value heads"),
    ({"hidden_size": 65}, "$.hidden_size", "hidden size must be a multiple of the number of attention heads"),
])
def test_invalid_fields_name_file_and_field(tmp_path, change, field, message):
    cfg = {**json.loads(Path(tiny("llama")).read_text()), **change}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert message in e.value.message
    assert e.value.file == str(p) and e.value.field == field


def test_unknown_model_type_says_how_to_learn_it(tmp_path, monkeypatch):
    from fitplan.builtin import archfile

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "brand_new_lm", "hidden_size": 64}))
    monkeypatch.setattr(archfile, "_plugin_installed", lambda: True)
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert "unknown model_type 'brand_new_lm'" in e.value.message
    assert f"fitplan learn-architecture {p} --install" in e.value.suggestion
    monkeypatch.setattr(archfile, "_plugin_installed", lambda: False)
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert "install the fitplan-torch plugin" in e.value.suggestion


def test_unknown_model_type_exits_2_without_traceback(cli, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "brand_new_lm"}))
    proc = cli("estimate", "--model", str(p))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "learn-architecture" in proc.stderr


def test_switches_not_learned_are_refused(tmp_path):
    # the bundled llama file was learned without attention biases: a config with them is refused, with
    # the command that learns it (not silently estimated with the wrong graph)
    from fitplan.builtin.archfile import load

    if "attention_bias" not in load("llama").data["flags"]["when"]:
        pytest.skip("the llama file records no attention_bias switch")
    cfg = {**json.loads(Path(tiny("llama")).read_text()), "attention_bias": True}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert "attention_bias" in e.value.message and "learn-architecture" in e.value.suggestion


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_a_held_size_is_refused_at_another_value(model_type, tmp_path, cli):
    # DeepseekV2Config / DeepseekV3Config set head_dim to qk_rope_head_dim (transformers 5.24), so no probe can
    # change the rotary width alone: the learner holds it at the tiny config's (the published) 64 and the file
    # serves only that value. V2's class overwrites a stated head_dim (not held: it follows); V3's keeps a stated
    # one, and the model runs only when it equals the rotary width (held too). 32 is refused, naming the field.
    from fitplan.builtin.archfile import load

    held = {"qk_rope_head_dim": 64, **({"head_dim": 64} if model_type == "deepseek_v3" else {})}
    assert load(model_type).data["held"] == held
    cfg = json.loads(Path(tiny(model_type)).read_text())
    assert cfg["qk_rope_head_dim"] == 64
    fitplan.estimate(model=tiny(model_type))
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "qk_rope_head_dim": 32, "head_dim": 32}))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert e.value.field == f"$.{min(held)}" and e.value.value == 32 and "learn-architecture" in e.value.suggestion
    assert "qk_rope_head_dim = 32" in e.value.message
    proc = cli("estimate", "--model", str(p))
    assert proc.returncode == 2 and "qk_rope_head_dim" in proc.stderr and "Traceback" not in proc.stderr


def test_a_partial_rotary_that_changes_the_ops_is_refused(tmp_path):
    # transformers 5.24 modeling_phi3.py rotates the first partial_rotary_factor * head_dim channels and
    # concatenates the rest (q[..., rotary_dim:], empty at 1.0): the learner found no other value that records the
    # same ops as the tiny config's 1.0 (Phi-3-mini/medium), so the file holds it. Phi-4-mini (phi3, 0.75) is
    # refused until learned, rather than estimated with Phi-3's ops.
    from fitplan.builtin.archfile import load

    assert load("phi3").data["held"] == {"partial_rotary_factor": 1.0}
    cfg = json.loads(Path(tiny("phi3")).read_text())
    fitplan.estimate(model=tiny("phi3"))
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "partial_rotary_factor": 0.75}))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert (e.value.field, e.value.value) == ("$.partial_rotary_factor", 0.75)


# --------------------------------------------------------------------------- expressions


@pytest.mark.parametrize(("src", "value"), [
    ("b*s*hidden_size", 2 * 16 * 64),
    ("hidden_size//num_attention_heads", 16),
    ("int(f*hidden_size//num_attention_heads)//2", 4),
    ("layer_types[i] == 'full_attention'", True),
    ("x if x is not None else hidden_size", 64),
    ("i not in skip and (i + 1) % 2 == 0", True),
    ("ceil_div(s, 32)*32", 32),
])
def test_expressions(src, value):
    from fitplan.builtin.archexpr import evaluate

    env = {"b": 2, "s": 16, "hidden_size": 64, "num_attention_heads": 4, "f": 0.5, "i": 1,
           "layer_types": ("sliding_attention", "full_attention"), "x": None, "skip": (0,)}
    assert evaluate(src, env) == value


@pytest.mark.parametrize("src", ["__import__('os')", "x.__class__", "open('f')", "lambda: 1", "[1, 2]", "a; b"])
def test_expressions_are_not_python(src):
    from fitplan.builtin.archexpr import ExprError, evaluate

    with pytest.raises(ExprError):
        evaluate(src, {"x": 1, "a": 1, "b": 2})


# --------------------------------------------------------------------------- LoRA targets, one rule


def test_all_linear_on_mixtral_matches_peft():
    # measured with peft 0.21.2 on tiny-mixtral (LoraConfig(r=8, target_modules="all-linear")): 61,504
    # trainable parameters; peft converts the fused experts and the router to parameter targets
    e = fitplan.estimate(model=tiny("mixtral"), method="lora", lora_r=8, lora_target_modules=("all-linear",))
    assert e["trainable_param_count"] == 61_504


def test_target_semantics():
    from fitplan.builtin.lora_targets import module_matches, peft_target_modules

    m = "model.layers.0.self_attn.q_proj"
    assert module_matches(m, ("q_proj",))
    assert module_matches(m, ("self_attn.q_proj",))
    assert not module_matches(m, ("proj",))
    assert module_matches(m, (r".*layers\.0\..*q_proj",))
    assert not module_matches(m, (r".*layers\.1\..*q_proj",))
    assert module_matches(m, ("all-linear",)) and not module_matches("lm_head", ("all-linear",), output_module="lm_head")
    assert peft_target_modules(("all-linear",)) == "all-linear"
    assert peft_target_modules((r".*q_proj",)) == r".*q_proj"
    assert peft_target_modules(("q_proj", "v_proj")) == ["q_proj", "v_proj"]


def test_regex_targets_count_per_layer():
    # tiny-llama: q_proj is 64 x 64; adapting it in layer 0 only: A (8, 64) + B (64, 8) once
    e = fitplan.estimate(model=tiny("llama"), method="lora", lora_r=8, lora_target_modules=(r".*layers\.0\.self_attn\.q_proj",))
    assert e["trainable_param_count"] == 8 * 64 + 64 * 8


def test_no_targets_means_peft_default_for_the_model_type():
    # peft 0.21 LoraConfig() without target_modules: GPT-2 -> ["c_attn"] (peft/utils/constants.py). tiny-gpt2:
    # n_embd 64, 2 layers; c_attn is a Conv1D 64 -> 192: A (8, 64) + B (192, 8) per layer
    e = fitplan.estimate(model=tiny("gpt2"), method="lora", lora_r=8)
    assert e["trainable_param_count"] == 2 * (8 * 64 + 192 * 8)
    assert e.scenario.lora.lora_target_modules == ("c_attn",)
    llama = fitplan.estimate(model=tiny("llama"), method="lora", lora_r=8, max_seq_length=64)
    assert llama.scenario.lora.lora_target_modules == ("q_proj", "v_proj")
    full = fitplan.estimate(model=tiny("llama"), max_seq_length=64)  # peft's default is no LoRA option the user gave
    assert not [w for w in full.warnings if "LoRA options" in w]


def test_no_targets_on_a_model_type_peft_has_no_default_for_is_refused():
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=tiny("olmo"), method="lora")  # peft 0.21's mapping has no "olmo"
    assert e.value.field == "lora_target_modules" and "olmo" in e.value.message and "all-linear" in e.value.suggestion
    assert fitplan.estimate(model=tiny("olmo"))["trainable_param_count"] > 0  # full fine-tuning needs no targets


def test_peft_default_table_is_peft_s():
    peft_constants = pytest.importorskip("peft.utils.constants")
    from fitplan.builtin.archfile import peft_table

    table = peft_table()["lora_default_targets"]
    assert table == {k: list(v) for k, v in peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.items()}


def test_missing_target_lists_the_modules():
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=tiny("llama"), method="lora", lora_target_modules=("qproj",))
    assert "qproj" in e.value.message and "q_proj" in e.value.suggestion


# --------------------------------------------------------------------------- --params, MoE routing


def test_params_alone_gets_a_typical_shape_marked_approximate():
    e = fitplan.estimate(params="7B", precision="bf16-mixed", per_device_train_batch_size=1, max_seq_length=512)
    assert e["weight_bytes"] == 4 * 7_000_000_000  # the count is the user's
    assert e["activation_bytes"] > 0 and e["logits_bytes"] > 0
    assert "approximate" in e.arch.name
    assert any("typical shape" in w and "approximate" in w for w in e.warnings)


def test_moe_routing_is_stated():
    e = fitplan.estimate(model=tiny("mixtral"), per_device_train_batch_size=2, max_seq_length=32)
    r = e["moe_routing"]
    # tiny-mixtral: 4 experts, 2 per token; 64 tokens
    assert (r["expert_rows"], r["rows_per_expert_balanced"], r["rows_per_expert_bound"]) == (128, 32, 64)
    assert "does not depend on routing" in r["assumption"]
    assert fitplan.estimate(model=tiny("llama"))["moe_routing"] is None


# --------------------------------------------------------------------------- drift (torch)


@pytest.mark.parametrize(("model_type", "variant"), [("llama", ("16", "sdpa")), ("qwen2_moe", ("mixed", "eager"))])
def test_bundled_files_have_not_drifted(model_type, variant):
    """Re-learn one variant (its most general regime) from the tiny config the bundled file was learned
    from: every segment must be byte-for-byte in the bundled file. A transformers / torch upgrade that
    changes the model's ops fails here and names the model type; `python -m fitplan_torch.learn.bundle`
    regenerates every file (bench-size: a representative subset runs in the suite)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitplan_torch.learn import derive

    from fitplan.builtin.archfile import load

    af = load(model_type)
    fresh, _, _ = derive.learn_full(af.learned["config"], log=lambda *a: None, variants=(variant,), first_only=True)
    missing = [k for k, seg in fresh["segments"].items() if k not in af.segments]
    assert missing == [], f"{model_type} {variant}: {len(missing)} segment(s) changed since the file was learned"


def test_learn_architecture_cli_errors(cli, tmp_path):
    pytest.importorskip("torch")
    proc = cli("learn-architecture", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "file not found" in proc.stderr and "Traceback" not in proc.stderr
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64}))
    proc = cli("learn-architecture", str(p))
    assert proc.returncode == 2 and "model_type" in proc.stderr


def test_learn_architecture_writes_a_file_the_core_reads(cli, tmp_path, monkeypatch):
    """The whole path a user takes for a new architecture, on the smallest bundled one: learn (without the
    slow verification), then estimate with the learned file; it must agree with the bundled file."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "arch"
    # learning records the model at several sizes: about a minute on two idle cores
    proc = cli("learn-architecture", tiny("ernie4_5"), "--out", str(out), "--no-verify", "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "ernie4_5.json").is_file() and (out / "ernie4_5.graphs.json").is_file()
    kw = dict(model=tiny("ernie4_5"), precision="bf16-mixed", gradient_checkpointing=True, per_device_train_batch_size=3,
              max_seq_length=40, method="lora", lora_target_modules=("all-linear",), device="cpu")
    bundled = fitplan.estimate(**kw)
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(out))
    from fitplan.builtin import archfile, step_trace
    from fitplan.inputs import architecture

    for f in (archfile.load, step_trace.build, architecture._param_groups, architecture._param_count):
        f.cache_clear()
    mine = fitplan.estimate(**kw)
    for f in (archfile.load, step_trace.build, architecture._param_groups, architecture._param_count):
        f.cache_clear()
    assert (mine["saved_for_backward_bytes"], mine["peak_bytes"]) == (bundled["saved_for_backward_bytes"], bundled["peak_bytes"])


def test_a_model_without_sdpa_runs_eager_with_a_warning():
    # transformers 5.24 modeling_gemma2.py: _supports_sdpa = False (soft-capping); without an explicit choice
    # transformers loads it with eager attention, which is what fitplan's default then estimates
    kw = dict(model=tiny("gemma2"), per_device_train_batch_size=2, max_seq_length=32, device="cpu")
    default, eager = fitplan.estimate(**kw), fitplan.estimate(**kw, attn_implementation="eager")
    assert default["peak_bytes"] == eager["peak_bytes"]
    assert any("no sdpa attention" in w for w in default.warnings)
    assert not any("no sdpa attention" in w for w in eager.warnings)
