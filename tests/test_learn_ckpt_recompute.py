"""What non-reentrant gradient checkpointing's recomputation keeps (torch 2.13 torch/utils/checkpoint.py), two
constructs of transformers 5.24 types (issue #32):

* a branch whose node died in the forward (it leads nowhere differentiable, e.g. HY-V4's ``HYV4Indexer``, whose
  ``forward`` runs under ``@torch.no_grad()``: its ops save nothing at all): the recomputation's pack hook stores a
  tensor only for a holder still alive (``_recomputation_hook.pack_hook``: ``weak_holders[recomp_idx]()`` is None
  for a dead node), so the recomputed branch keeps nothing past its Python lifetime (``Op.dead``, the replay's
  ``recompute``);
* a module called twice in a layer under LoRA with autocast (ProphetNet's n-gram attention): one adapter pair per
  module, cast once by autocast's cache, while the frozen base weight is cast at every call;
* a module attribute keeping a tensor with autograd history past the forward (RecurrentGemma's
  ``RecurrentGemmaRglru.recurrent_states``): the recomputed history stays alive to the next forward; the learned
  file names it (``kept_graphs``) and the core refuses checkpointing for it (exit 2).

Expected values are measured by torch (the referee's CPU run, or a live-storage counter in the test) or derived by
hand; the learner's output is never the expectation. Tests that build models are slow (tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"


def _quiet(*a) -> None:
    return None


def _bench_config(model_type: str) -> dict:
    """The bench's config for ``model_type`` (bench/learn_breadth.py), shrunk as ``learn-architecture`` shrinks it."""
    from conftest import bench_module

    from fitplan_torch.learn.command import shrink

    return shrink(bench_module("learn_breadth").default_config(model_type))


# --------------------------------------------------------------------------- a dead node in a checkpointed layer


def test_a_module_called_twice_gets_one_adapter_pair():
    from fitplan.trace.learned_graph import Builder
    from fitplan.trace.step_trace import Trace

    b = Builder.__new__(Builder)  # only what ``adapters`` reads
    b.tr, b.lora_pairs = Trace.__new__(Trace), {}
    b.tr.params = []
    first = b.adapters("m.layers.0.out_proj", 8 * 64, 64 * 8, "f32")
    assert b.adapters("m.layers.0.out_proj", 8 * 64, 64 * 8, "f32") == first  # peft: one pair per module
    other = b.adapters("m.layers.1.out_proj", 8 * 64, 64 * 8, "f32")
    assert other[0] is not first[0] and len(b.tr.params) == 4
    assert first[0].name == "m.layers.0.out_proj.lora_A" and first[0].numel == 512


@pytest.mark.slow
def test_hy_v4_checkpointed_lora_peak_recomputes_its_no_grad_indexer_without_keeping_it(monkeypatch):
    """HY-V4's checkpointed LoRA peak was 9.4 % high: the replay's recomputation kept what the indexer's ops
    would save (its ``relu`` / ``bmm`` scores, ~85 KB each here) until the walk reached them, though the indexer
    runs under ``torch.no_grad()`` (modeling_hy_v4.py ``HYV4Indexer.forward``). The referee (torch) measures."""
    from fitplan.api import clear_arch_caches
    from fitplan.trace import step_trace

    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V

    cfg = _bench_config("hy_v4")
    data, _, _ = derive.learn_full(cfg, log=_quiet, variants=(("16", "eager"),), first_only=True)
    held, _, _ = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
    cases = [("32-true", "eager", True, "lora"), ("32-true", "eager", True, "full")]
    problems, rows = V.check_memory(data, held, _quiet, cases=cases)
    assert problems == [], problems
    assert all(abs(r["peak"]) < 0.01 for r in rows)

    # the learner marks the indexer's ops ``ng`` (run with grad mode off: no node, tests/test_learn_grad_mode.py);
    # with those marks dropped, the dead-op rule alone must hold the peak, and the rule before it (the
    # recomputation keeping a dead node's saves) misses the LoRA peak by ~+9 % (control)
    import json

    plain = json.loads(json.dumps(data))
    for seg in plain["segments"].values():
        for o in seg["ops"]:
            if len(o) > 3:
                o[3].pop("ng", None)
    clear_arch_caches()
    problems, rows = V.check_memory(plain, held, _quiet, cases=cases[:1])
    assert problems == [] and abs(rows[0]["peak"]) < 0.01, (problems, rows)
    orig = step_trace.Trace.drop_dead_saves

    def keep_dead(self):
        dead = orig(self)
        for i, op in enumerate(self.ops):
            if op.dead:
                self._own_op(i).dead = False
        return dead

    monkeypatch.setattr(step_trace.Trace, "drop_dead_saves", keep_dead)
    clear_arch_caches()
    bad, rows = V.check_memory(plain, held, _quiet, cases=cases[:1])
    assert bad and "peak predicted" in bad[0] and rows[0]["peak"] > 0.05, (bad, rows)


# --------------------------------------------------------------------------- a module keeping a graph


def _recurrent_gemma(torch, transformers):
    cfg = transformers.RecurrentGemmaConfig(hidden_size=64, lru_width=64, intermediate_size=128, num_hidden_layers=3,
                                            num_attention_heads=4, num_key_value_heads=4, head_dim=16, vocab_size=512,
                                            block_types=["recurrent", "recurrent", "attention"])
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")


@pytest.mark.slow
def test_recurrent_gemma_keeps_a_graph_on_its_rg_lru_and_checkpointing_leaves_its_history_alive():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fitplan_torch.learn.keptgraph import attributes_with_history
    from fitplan_torch.measure import LiveBytes

    b, s, width = 3, 21, 64
    left = {}
    for ckpt in (False, True):
        m = _recurrent_gemma(torch, transformers)
        m.train()
        if ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(0, 512, (b, s))
        c = LiveBytes()
        with c:
            c.track(list(m.parameters()) + list(m.buffers()) + [ids])
            base = c.current
            loss = m(input_ids=ids, labels=ids, use_cache=False).loss
            assert attributes_with_history(m) == ["RecurrentGemmaRglru.recurrent_states"]
            loss.backward()
            grads = sum(p.grad.nbytes for p in m.parameters() if p.grad is not None)
            left[ckpt] = c.current - base - grads
            for mod in m.modules():
                if hasattr(mod, "recurrent_states"):
                    mod.recurrent_states = None
            dropped = c.current - base - grads
        assert dropped == 4  # the loss scalar: what the attributes held was all of it
    # without checkpointing: the loss and each recurrent layer's final state, fp32 b x lru_width (by hand)
    assert left[False] == 4 + 2 * b * width * 4
    # with it: the recomputed scan's history too (every position's saved tensors, far more than the states)
    assert left[True] > 100 * left[False]

    # control: a forward without grad keeps no history
    m = _recurrent_gemma(torch, transformers)
    with torch.no_grad():
        m(input_ids=torch.randint(0, 512, (b, s)), use_cache=False)
    assert attributes_with_history(m) == []


def test_a_learned_file_naming_a_kept_graph_refuses_checkpointing(tmp_path, monkeypatch):
    import fitplan
    from fitplan.api import clear_arch_caches
    from fitplan.errors import FitplanError

    from fitplan_torch.learn import files

    src = json.loads((CONFIGS / "tiny-llama" / "config.json").read_text())
    kw = dict(model=str(CONFIGS / "tiny-llama" / "config.json"), precision="bf16-true", device="cpu",
              per_device_train_batch_size=1, max_seq_length=16)
    data = files.read(ROOT / "rulesets" / "architectures", src["model_type"])
    data["kept_graphs"] = ["LlamaMLP.state"]
    files.write(data, tmp_path)
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(tmp_path))
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    clear_arch_caches()
    try:
        assert fitplan.estimate(**kw)["activation_bytes"] > 0  # without checkpointing: estimated
        with pytest.raises(FitplanError) as e:
            fitplan.estimate(**kw, gradient_checkpointing=True)
        assert e.value.exit_code == 2 and "LlamaMLP.state" in str(e.value) and "module attribute" in str(e.value)
        data["kept_graphs"] = "LlamaMLP.state"  # not a list: named
        files.write(data, tmp_path)
        clear_arch_caches()
        with pytest.raises(FitplanError) as e:
            fitplan.estimate(**kw)
        assert "$.kept_graphs" in str(e.value) or e.value.field == "$.kept_graphs"
    finally:
        monkeypatch.undo()
        clear_arch_caches()


def _live_at_input_grad(torch, branch: str) -> int:
    """Live bytes when the input's gradient is computed (after the recomputation) under non-reentrant
    checkpointing of ``f``: ``x @ w`` to the loss, and a branch ``(x * 3).exp()`` (exp saves its result) whose
    only use is its integer ``argmax``: ``dead`` (grad-tracked, its node dies with its outputs in the forward),
    ``no_grad`` (no node at all) or ``kept`` (the forward's node held outside the function: alive, with the
    holder of what it saved)."""
    from torch.utils.checkpoint import checkpoint

    from fitplan_torch.measure import LiveBytes

    keep = []

    def f(x, w):
        if branch == "no_grad":
            with torch.no_grad():
                e = (x * 3).exp()
        else:
            e = (x * 3).exp()
        if branch == "kept" and not keep:  # the forward's node only (the recomputation runs f again)
            keep.append(e.grad_fn)
        return (x @ w).sum() + e.argmax(-1).sum().float() * 0

    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(256, 8, requires_grad=True)
    c, at = LiveBytes(), []
    x.register_hook(lambda g: at.append(c.current))
    with c:
        c.track([x, w])
        checkpoint(f, x, w, use_reentrant=False).backward()
    return at[0]


@pytest.mark.slow
def test_torch_recomputation_keeps_nothing_a_dead_node_saved():
    """The premise of ``Op.dead``, measured: the recomputed exp output of a dead branch is not alive when the
    input's gradient is computed, exactly as if the branch ran without grad; with its node kept alive (control)
    the recomputation stores it (64 x 256 fp32 = 65536 bytes more)."""
    torch = pytest.importorskip("torch")
    dead, no_grad, kept = (_live_at_input_grad(torch, b) for b in ("dead", "no_grad", "kept"))
    assert dead == no_grad
    assert kept - dead == 64 * 256 * 4


# --------------------------------------------------------------------------- a module called twice under LoRA


@pytest.mark.slow
def test_prophetnet_lora_under_autocast_one_adapter_pair_per_module_and_a_frozen_weight_cast_per_call(monkeypatch):
    """ProphetNet's n-gram attention calls ``out_proj`` and ``relative_pos_embeddings`` on the main and the predicting
    streams (modeling_prophetnet.py ``ProphetNetNgramSelfAttention``). Under LoRA with autocast (bf16-mixed) peft
    has one ``lora_A`` / ``lora_B`` per module, whose 16-bit copies autocast caches once per forward (leaves that
    require grad), while the frozen base weight is cast again at every call (autocast_mode.cpp ``cached_cast``);
    the recording (full fine-tuning) took the second call's base copy from the cache. The referee measures."""
    from fitplan.api import clear_arch_caches
    from fitplan.trace import learned_graph, learned_segment

    from fitplan_torch.learn import derive
    from fitplan_torch.learn import verify as V

    cfg = _bench_config("prophetnet")
    data, _, _ = derive.learn_full(cfg, log=_quiet, variants=(("mixed", "eager"),), first_only=True)
    held, _, _ = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
    cases = [("bf16-mixed", "eager", False, "lora")]
    problems, rows = V.check_memory(data, held, _quiet, cases=cases)
    assert problems == [], problems

    # control 1: the base weight's cast taken from the cache at the second call (the recording as it was)
    monkeypatch.setattr(learned_segment.Segment, "_recast", lambda self, ref, t: t)
    clear_arch_caches()
    _, rows = V.check_memory(data, held, _quiet, cases=cases)
    low = rows[0]["activations"]
    assert low < -0.01, rows
    # control 2: besides, a new adapter pair at every call (one more 16-bit copy of each per call)
    monkeypatch.setattr(learned_graph.Builder, "adapters", _adapters_per_call)
    clear_arch_caches()
    _, rows = V.check_memory(data, held, _quiet, cases=cases)
    assert low < rows[0]["activations"] < -0.005, rows
    monkeypatch.undo()
    clear_arch_caches()


def _adapters_per_call(self, module, a_numel, b_numel, dtype):
    a, b = self.tr.param(a_numel, dtype, True), self.tr.param(b_numel, dtype, True)
    a.name, b.name = module + ".lora_A", module + ".lora_B"
    return a, b
