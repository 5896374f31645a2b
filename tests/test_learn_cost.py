"""What a learning costs (issue #32, item 4: a type learns in <= 60 CPU s and <= 3 GB resident): the work the learner
no longer repeats must give what repeating it gave.

* one recording per config: a repeated ``derive.run`` of the same config is the same recording, equal by hash to a
  fresh one (a hit changes nothing that a fresh run would record), and another batch shape is another recording;
* the recorder's identity maps: a number per object, never kept alive, never given to another object at a freed
  ``id``;
* the graph check's held-out config is recorded at once, and step-checked per variable only where it does not run
  (CodeGen's ``rotary_dim`` at 5/2 of 16 does not rotate: modeling_codegen.py);
* the memory check's LoRA targets skip the modules peft 0.21 refuses on Mamba-based types (peft's own check);
* the memory check's LoRA targets leave out an ``nn.Linear`` returning a tuple (Llama-4's router);
* shrinking cuts widths named ``<prefix>_<kind>`` (NemotronH's ``mamba_num_heads``; Blenderbot's ``*_ffn_dim``).
* the learning bounds torch's oneDNN kernel caches (a new shape each recording grew Lara-Mini ~30 MB resident).

These build and step tiny models: slow (marked referee/slow by tests/conftest.py's importorskip rule).
"""

from __future__ import annotations

import gc
import hashlib
import json

import pytest


def _defaults(model_type: str) -> dict:
    from transformers import AutoConfig

    return json.loads(json.dumps({**AutoConfig.for_model(model_type).to_dict(), "model_type": model_type}))


def _digest(rec) -> str:
    return hashlib.sha1(json.dumps(vars(rec), sort_keys=True, default=repr).encode()).hexdigest()


def test_a_config_recorded_twice_is_one_recording_equal_to_a_fresh_one():
    """``derive.run`` of a config it recorded is the same object, and that object equals (by hash of every field:
    ops, tensors, storages with their deaths, saves, sites) a recording made afresh from a new model; another
    sequence length records anew. Llama, precision class 16, SDPA, b=2, s=16."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink

    cfg = shrink(_defaults("llama"))
    derive.RECENT.clear()
    first = derive.run(cfg, "16", "sdpa", 2, 16)
    assert derive.run(json.loads(json.dumps(cfg)), "16", "sdpa", 2, 16) is first  # an equal config, another dict
    fresh = derive._run(cfg, "16", "sdpa", 2, 16, backward=False)
    assert fresh is not first and _digest(fresh) == _digest(first)
    longer = derive.run(cfg, "16", "sdpa", 2, 18)
    assert longer is not first and _digest(longer) != _digest(first)
    with_backward = derive.run(cfg, "16", "sdpa", 2, 16, backward=True)  # never from the cache: it records more
    assert with_backward is not first and with_backward.backward and not first.backward
    derive.RECENT.clear()


def test_config_keys_tell_apart_what_builds_another_model():
    """1 and 1.0 and True, a list and a tuple, are different configs to the key (a dict's order is not)."""
    from fitplan_torch.learn.record import config_key

    assert config_key({"a": 1, "b": [1, 2]}) == config_key({"b": [1, 2], "a": 1})
    assert len({config_key({"a": v}) for v in (1, 1.0, True, "1", None)}) == 5
    assert config_key({"a": [1, 2]}) != config_key({"a": (1, 2)})


def test_the_recorders_identity_map_keeps_nothing_alive():
    """A number per object while it lives; the map does not keep it alive; a new object at a freed object's id is
    not taken for it (``torch.utils.weak.WeakIdKeyDictionary``'s contract)."""
    torch = pytest.importorskip("torch")
    import weakref

    from fitplan_torch.learn.record import _IdMap

    m = _IdMap()
    t = torch.zeros(3)
    m[t] = 7
    assert m.get(t) == 7 and m.get(t.view(3)) is None  # a view is another tensor object
    alive = weakref.ref(t)
    old_id = id(t)
    del t
    gc.collect()
    assert alive() is None
    reused = next((x for x in (torch.zeros(3) for _ in range(10000)) if id(x) == old_id), None)
    if reused is not None:  # CPython gave the freed id to a new tensor: the map must not match it
        assert m.get(reused) is None


def test_the_heldout_config_is_step_checked_only_where_it_does_not_run():
    """CodeGen with ``rotary_dim`` a variable (tests/test_learn_breadth.py ``test_heldout_configs_run``): 40, the
    first held-out size, records nothing (a 16-wide head cannot rotate 40 dims), so the sizes checked by a step
    are taken (``rotary_dim`` <= 16); with ``head_dim`` instead, the first sizes run and are recorded as found."""
    pytest.importorskip("torch")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.verify import _heldout_run, heldout

    base = derive.hf_config(shrink(_defaults("codegen"))).to_dict()
    as_given = derive.Regime("as given", None)
    res = {"probes": [derive.Probe(base, 2, 16, {})]}
    cfg, b, s, rec = _heldout_run(res, ["rotary_dim"], as_given, "16", "eager")
    assert cfg["rotary_dim"] <= 16 and rec.ops and (b, s) == (3, 21)
    first, _, _ = heldout(base, ["n_embd"], as_given, 2, 16)
    cfg, _, _, _ = _heldout_run(res, ["n_embd"], as_given, "16", "eager")
    assert cfg == first and cfg["n_embd"] != base["n_embd"]


def test_lora_targets_skip_what_peft_refuses_on_mamba_types():
    """Falcon-H1: peft 0.21 refuses LoRA on a Mamba ``out_proj`` (peft/tuners/tuners_utils.py
    ``_check_lora_target_modules_mamba``), ``all-linear`` included; the memory check's targets are every other
    linear layer, which peft then adapts on the real model. Llama keeps ``all-linear``."""
    pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.verify import lora_targets

    cfg = shrink(_defaults("falcon_h1"))
    model, _ = derive.build(cfg, "16", "eager")
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"}
                    - {"lm_head"})
    data = {"model_type": "falcon_h1", "params": [[f"x.{n}.weight", [], f"linear:{n}"] for n in linear]}
    targets = lora_targets(data)
    assert "out_proj" in linear and set(targets) == set(linear) - {"out_proj"}
    with pytest.raises(ValueError, match="out_proj"):
        peft.get_peft_model(derive.build(cfg, "16", "eager")[0], peft.LoraConfig(target_modules="all-linear"))
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules=list(targets)))
    assert any("lora_A" in n for n, _ in adapted.named_parameters())
    assert lora_targets({"model_type": "llama", "params": data["params"]}) == ("all-linear",)


def test_lora_targets_leave_out_a_router_that_returns_a_tuple():
    """PhiMoE's router subclasses ``nn.Linear`` and returns ``(logits, ...)``: peft 0.21 adapts it under
    ``all-linear`` and the forward fails (peft/tuners/lora/layer.py, ``result.dtype`` on a tuple). With the
    learned file's ``lora.non_tensor_linears`` the memory check names every other linear layer, and peft trains
    with those on the real model; without that entry it would ask for ``all-linear`` (the control)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from fitplan_torch.learn import derive
    from fitplan_torch.learn.shrink import shrink
    from fitplan_torch.learn.verify import lora_targets

    cfg = shrink(_defaults("phimoe"))
    model, _ = derive.build(cfg, "32", "eager")
    linears = {n.rsplit(".", 1)[-1]: type(m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    plain = sorted(k for k, t in linears.items() if t is torch.nn.Linear and k != "lm_head")
    routers = sorted(k for k, t in linears.items() if t is not torch.nn.Linear)
    assert routers == ["router"]
    data = {"model_type": "phimoe", "params": [[f"x.{n}.weight", [], f"linear:{n}"] for n in plain],
            "lora": {"non_tensor_linears": ["model.layers.{i}.mlp.router"]}}
    targets = lora_targets(data)
    assert set(targets) == set(plain)
    assert lora_targets({**data, "lora": {}}) == ("all-linear",)
    ids = torch.randint(0, cfg["vocab_size"], (1, 8))
    with pytest.raises(AttributeError, match="tuple"):
        peft.get_peft_model(derive.build(cfg, "32", "eager")[0], peft.LoraConfig(target_modules="all-linear"))(
            input_ids=ids, labels=ids)
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules=list(targets)))
    adapted(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in adapted.named_parameters() if "lora_" in n)


def test_shrink_cuts_prefixed_widths():
    """Widths named ``<prefix>_<kind>`` of a kind the shrink table names: NemotronH's 128 Mamba heads and its
    7688-wide shared expert (configuration_nemotron_h.py defaults), Blenderbot's 10240-wide encoder and decoder
    feed-forward beside a 64-wide model (configuration_blenderbot.py); the shrunk configs still run (shrink runs
    them)."""
    pytest.importorskip("torch")
    from fitplan_torch.learn.shrink import shrink

    nem = shrink(_defaults("nemotron_h"))
    assert nem["mamba_num_heads"] == 8  # SMALL's num_heads
    assert nem["moe_shared_expert_intermediate_size"] == 128  # SMALL's intermediate_size
    blender = shrink(_defaults("blenderbot"))
    assert blender["encoder_ffn_dim"] == blender["decoder_ffn_dim"] == 128


_SHAPES = """
import sys
if sys.argv[1] == "bound":
    from fitplan_torch.learn.command import bound_kernel_caches
    bound_kernel_caches()
import torch
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
w = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
for i in range(160):
    x = torch.randn(2, 8 + i, 64, dtype=torch.bfloat16, requires_grad=True)
    (x @ w).sum().backward()
    if i == 9:
        start = rss()
print(rss() - start)
"""


def test_the_learning_bounds_the_cpu_kernel_caches():
    """A bf16 matmul at 150 new shapes grows resident memory by megabytes a shape with torch's default oneDNN
    kernel caches (1024 entries each: the control, which must grow > 150 MB for the test to tell anything); with
    ``bound_kernel_caches`` (what ``learn-architecture`` calls first) it grows less than a third of that. A value
    the environment sets is kept. Each in a fresh process: the caches read their capacity once."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    from fitplan_torch.learn import command

    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}

    def growth(how: str) -> int:
        out = subprocess.run([sys.executable, "-c", _SHAPES, how], env=env, capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    default, bound = growth("default"), growth("bound")
    assert default > 150, default
    assert bound < default / 3, (bound, default)
    old = os.environ.get("LRU_CACHE_CAPACITY")
    os.environ["LRU_CACHE_CAPACITY"] = "7"
    try:
        command.bound_kernel_caches()
        assert os.environ["LRU_CACHE_CAPACITY"] == "7"
    finally:
        if old is None:
            os.environ.pop("LRU_CACHE_CAPACITY")
        else:
            os.environ["LRU_CACHE_CAPACITY"] = old
