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


def test_the_scanner_sees_literals(tmp_path):
    # the test above could not fail if the scanner missed string constants: show that it finds them
    src = tmp_path / "literal_probe.py"
    src.write_text('"""doc"""\nX = {"llama": 1}\n', encoding="utf-8")
    assert (2, "llama") in _string_literals(src)
    assert all(v != "doc" for _, v in _string_literals(src))


# --------------------------------------------------------------------------- the bundled files


@pytest.mark.parametrize("model_type", LISTED)
def test_every_listed_model_type_has_a_learned_file(model_type):
    from fitplan.arch.archfile import load

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
    from fitplan.arch import archfile

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
    from fitplan.arch.archfile import load

    if "attention_bias" not in load("llama").data["flags"]["when"]:
        pytest.skip("the llama file records no attention_bias switch")
    cfg = {**json.loads(Path(tiny("llama")).read_text()), "attention_bias": True}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert "attention_bias" in e.value.message and "learn-architecture" in e.value.suggestion


def test_deepseek_rotary_width_is_a_symbol(tmp_path, cli):
    # DeepseekV2Config / DeepseekV3Config set head_dim = qk_rope_head_dim in __post_init__ (transformers 5.24), so
    # the learner varies the rotary width with head_dim following it: nothing is held, and a config at another
    # width (32) is estimated. V2's class overwrites a stated head_dim; V3's keeps one, and its rotary embedding
    # reads it, so the model runs only when it equals qk_rope_head_dim: the file checks that.
    from fitplan.arch.archfile import load

    for model_type in ("deepseek_v2", "deepseek_v3"):
        assert "held" not in load(model_type).data
        a = fitplan.estimate(model=tiny(model_type), precision="bf16-true", optim="adamw_torch")
        p = tmp_path / f"{model_type}.json"
        p.write_text(json.dumps({**json.loads(Path(tiny(model_type)).read_text()), "qk_rope_head_dim": 32}))
        b = fitplan.estimate(model=str(p), precision="bf16-true", optim="adamw_torch")
        # kv_a_proj_with_mqa: hidden x (kv_lora_rank + rope) and q_b_proj: q_lora_rank x heads*(nope + rope) shrink
        # by 32 columns each (modeling_deepseek_v2.py): 64*32 + 24*4*32 fewer weights per layer
        assert a.arch.param_count - b.arch.param_count == 2 * (64 * 32 + 24 * 4 * 32)
    p = tmp_path / "v3-head-dim.json"
    p.write_text(json.dumps({**json.loads(Path(tiny("deepseek_v3")).read_text()), "head_dim": 32}))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert (e.value.field, e.value.value) == ("$.head_dim", 32) and "qk_rope_head_dim" in e.value.message
    proc = cli("estimate", "--model", str(p))
    assert proc.returncode == 2 and "head_dim" in proc.stderr and "Traceback" not in proc.stderr


def test_a_string_sliding_window_pattern_is_read_as_the_class_reads_it(tmp_path):
    # Exaone4Config (transformers 5.24 configuration_exaone4.py): sliding_window_pattern: str | int | None = 4; an
    # integer derives layer_types ((i + 1) % pattern != 0 -> sliding), a string ("LLLG", as EXAONE-4.0-32B's
    # config.json states it beside layer_types) derives nothing: the class raises TypeError without layer_types
    from fitplan.arch.archfile import load

    af = load("exaone4")
    lllg = json.loads((CONFIGS / "switch-exaone4-lllg" / "config.json").read_text())
    assert af.layer_kinds(af.symbols(lllg)) == ["0", "0", "0", "1"]  # "1": full attention, layer_types[3]
    fitplan.estimate(model=str(CONFIGS / "switch-exaone4-lllg" / "config.json"), precision="bf16-true",
                     optim="adamw_torch")
    by_int = {k: v for k, v in lllg.items() if k != "layer_types"} | {"sliding_window_pattern": 2}
    assert af.layer_kinds(af.symbols(by_int)) == ["0", "1", "0", "1"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in lllg.items() if k != "layer_types"}))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p))
    assert (e.value.field, e.value.value) == ("$.sliding_window_pattern", "LLLG")
    p.write_text(json.dumps({**lllg, "sliding_window_pattern": [4]}))
    with pytest.raises(FitplanError, match="sliding_window_pattern must be a string or an integer"):
        fitplan.estimate(model=str(p))


ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")
"""Activations of transformers 5.24's ACT2FN (transformers/activations.py) that the catalog's published configs use
(silu, gelu, gelu_new, gelu_pytorch_tanh) and two more; litgpt runs Phi with gelu_pytorch_tanh."""


EVERY_ACTIVATION = {"phi": "hidden_act", "exaone4": "hidden_act", "gpt2": "activation_function", "gpt_neox": "hidden_act",
                    "qwen2": "hidden_act", "llama": "hidden_act",
                    "olmo": "hidden_act", "granite": "hidden_act", "qwen3": "hidden_act",
                    "mistral": "hidden_act", "starcoder2": "hidden_act"}
"""The types relearned with every value of ACTIVATIONS (python -m fitplan_torch.learn.bundle TYPE), and the config
field their class reads the activation from (GPT2Config: ``activation_function``)."""


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("model_type", EVERY_ACTIVATION)
def test_every_activation_is_learned(model_type, act, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**json.loads(Path(tiny(model_type)).read_text()), EVERY_ACTIVATION[model_type]: act}))
    fitplan.estimate(model=str(p), precision="bf16-true", optim="adamw_torch")


@pytest.mark.parametrize("act", [None, "bogus", "swish"])
def test_an_activation_no_learned_combination_states_is_refused_naming_the_config(act, tmp_path):
    # "swish" is a key of transformers' ACT2FN the bundle does not learn; null and "bogus" none of them: each would
    # count no parameter at all (every parameter's switch condition false) rather than be refused
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**json.loads(Path(tiny("llama")).read_text()), "hidden_act": act}))
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model=str(p), precision="bf16-true", optim="adamw_torch")
    assert (e.value.file, e.value.field, e.value.value) == (str(p), "$.hidden_act", act)
    assert "learn-architecture" in e.value.render()


SWITCH_CASES = ("switch-exaone4-lllg", "switch-phi-gelu-tanh", "switch-deepseek-v2-rope32", "switch-deepseek-v3-rope32",
                "switch-phi3-rotary075")
"""Published configs' switches the bundled files were refused on before (issue #25): a tiny config with each."""


@pytest.mark.parametrize("name", SWITCH_CASES)
@pytest.mark.parametrize(("precision", "method", "ckpt"), [("bf16-true", "full", False), ("bf16-mixed", "lora", True)])
def test_newly_accepted_switches_match_the_referee(name, precision, method, ckpt):
    """Every memory category within 1 % of a real step measured by torch (fitplan-torch's CPU referee)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import fitplan_torch

    est = fitplan.estimate(model=str(CONFIGS / name / "config.json"), precision=precision, optim="adamw_torch",
                           method=method, gradient_checkpointing=ckpt, per_device_train_batch_size=2,
                           max_seq_length=32, **({"lora_target_modules": ("all-linear",)} if method == "lora" else {}))
    report = fitplan_torch.validate(est, mode="cpu", memtracker=False)
    off = {k: c["relative_error"] for k, c in report["components"].items()
           if c["measured"] and abs(c["relative_error"]) > 0.01}
    assert off == {}


def test_a_partial_rotary_below_one_is_a_regime_not_a_held_size(tmp_path):
    # transformers 5.24 modeling_phi3.py rotates q[..., :rotary_dim] and concatenates q[..., rotary_dim:]; at
    # partial_rotary_factor 1.0 (Phi-3-mini/medium) the first index covers the whole dimension, which torch's
    # indexing returns as the tensor itself (an alias, no slice op), so Phi-4-mini's 0.75 runs one more op per
    # rotation. The learner knows it as a regime (factor == 1.0 / < 1.0), so nothing is held and 0.75 is estimated.
    from fitplan.arch.archfile import load

    assert "held" not in load("phi3").data
    whens = {v.get("when") or "" for v in load("phi3").variants}
    assert any("partial_rotary_factor == 1.0" in w for w in whens)
    assert any("partial_rotary_factor < 1.0" in w for w in whens)
    cfg = json.loads(Path(tiny("phi3")).read_text())
    full = fitplan.estimate(model=tiny("phi3"), precision="bf16-true", optim="adamw_torch")
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**cfg, "partial_rotary_factor": 0.75}))
    part = fitplan.estimate(model=str(p), precision="bf16-true", optim="adamw_torch")
    assert part.arch.param_count == full.arch.param_count  # the rotary width has no parameter


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
    from fitplan.arch.archexpr import evaluate

    env = {"b": 2, "s": 16, "hidden_size": 64, "num_attention_heads": 4, "f": 0.5, "i": 1,
           "layer_types": ("sliding_attention", "full_attention"), "x": None, "skip": (0,)}
    assert evaluate(src, env) == value


@pytest.mark.parametrize("src", ["__import__('os')", "x.__class__", "open('f')", "lambda: 1", "[1, 2]", "a; b"])
def test_expressions_are_not_python(src):
    from fitplan.arch.archexpr import ExprError, evaluate

    with pytest.raises(ExprError):
        evaluate(src, {"x": 1, "a": 1, "b": 2})


# --------------------------------------------------------------------------- LoRA targets, one rule


def test_all_linear_on_mixtral_matches_peft():
    # measured with peft 0.21.2 on tiny-mixtral (LoraConfig(r=8, target_modules="all-linear")): 61,504
    # trainable parameters; peft converts the fused experts and the router to parameter targets
    e = fitplan.estimate(model=tiny("mixtral"), method="lora", lora_r=8, lora_target_modules=("all-linear",))
    assert e["trainable_param_count"] == 61_504


def test_target_semantics():
    from fitplan.trace.lora_targets import module_matches, peft_target_modules

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
    from fitplan.arch.archfile import peft_table

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

    from fitplan.arch.archfile import load

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
    from fitplan.arch import archfile
    from fitplan.trace import step_trace
    from fitplan.arch import architecture

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
