"""The SDPA and in-place rules of the step trace (``trace/kernels.py``, ``trace/learned_graph.py``), checked
against values derived by hand from the PyTorch sources they cite or measured by torch (no torch needed here).

* An in-place op whose derivative uses ``self`` saves ``original_self = self.clone()`` (torchgen
  ``gen_variable_type.py``), not the storage it overwrites.
* Every SDPA backend converts a boolean ``attn_mask`` to q's dtype at each call (``attention.cpp``
  ``convert_boolean_attn_mask``): the kernel saves that new (b, 1, s, s) tensor, one per attention layer.
* The CPU flash kernel (``sdp_utils_cpp.cpp``) and CUDA flash accept different q and k/v head counts only with
  ``enable_gqa``; CUDA memory-efficient attention never (``check_batch_size_and_num_heads_dense<false>``):
  otherwise the math path runs, which materialises the scores.
"""

from __future__ import annotations

from pathlib import Path

import fitplan
from fitplan.trace.step_trace import TraceSpec, build
from fitplan.arch.architecture import load_config_json

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "configs"


def saved(name: str, precision: str = "32-true", *, b: int = 2, s: int = 128, device: str = "cpu") -> dict[str, int]:
    arch = load_config_json(CONFIGS / name / "config.json")
    return dict(build(TraceSpec(arch, b, s, precision, "sdpa", False, "full", 8, (), 0.0, device, 512)).saved)


def test_clamp_in_place_saves_a_clone_and_sdpa_saves_the_clamped_value():
    # tiny-olmo (clip_qkv 8.0: q, k, v projections clamped in place), 32-true, SDPA, b=2, s=128, hidden 64,
    # 4 heads of 16, 2 kv heads (k, v 32 wide), intermediate 128, LayerNorm without weights. Layer 1 keeps:
    b, s, h, kv, inter, f = 2, 128, 64, 32, 128, 4
    norm = b * s * h * f + 2 * b * s * f  # layer norm: input, mean, rstd
    proj_in = b * s * h * f  # q/k/v projections' input (the norm's output, one storage)
    clones = (b * s * h + 2 * b * s * kv) * f  # clamp_'s original_self: one clone each of q, k, v before clamping
    attn = (b * s * h + 2 * b * s * kv) * f  # SDPA: rotated q and k (new), v (the clamped projection output)
    attn += b * s * h * f + b * 4 * s * f  # SDPA's output (o_proj's input too) and fp32 logsumexp
    mlp = b * s * h * f + 4 * b * s * inter * f  # norm output; gate out, silu, up out, product
    layer = norm + proj_in + clones + attn + norm + mlp
    # bench/accuracy/saved_tensors.py (torch 2.13, saved_tensors_hooks) measured layer 1 at 1,122,304 bytes
    assert layer == 1_122_304
    e = fitplan.estimate(model=str(CONFIGS / "tiny-olmo" / "config.json"), precision="32-true", attn_implementation="sdpa",
                         per_device_train_batch_size=b, max_seq_length=s, device="cpu")
    assert e["activation_bytes_per_layer"] == layer
    assert saved("tiny-olmo")["layer 1: clamp_.original_self"] == clones


def test_boolean_mask_is_converted_per_layer_in_q_dtype():
    # tiny-falcon builds its causal mask as a bool (b, 1, s, s) tensor (allow_is_causal_skip=False) shared by the
    # layers; SDPA turns it into q's dtype in each layer (fp32 at 32-true, bf16 otherwise: autocast casts q first)
    b, s = 2, 128
    for precision, nbytes in (("32-true", 4), ("bf16-true", 2), ("bf16-mixed", 2)):
        got = saved("tiny-falcon", precision)
        assert got["layer 0: sdpa.mask"] == got["layer 1: sdpa.mask"] == b * s * s * nbytes, precision
        assert not any(k.startswith("prologue") and "bool" in k for k in got)


def test_efficient_attention_pads_the_bias_to_a_multiple_of_8():
    # CUDA, bf16 with a mask: memory-efficient attention; preprocess_mask pads the key length to a multiple of 8
    # when it is not one (a new tensor, saved), then expands it (a view); the allocator rounds to 512 bytes
    b = 2
    aligned = saved("tiny-falcon", "bf16-true", s=128, device="cuda")
    assert aligned["layer 1: sdpa.mask"] == b * 128 * 128 * 2
    assert not any("mask_padded" in k for k in aligned)
    padded = saved("tiny-falcon", "bf16-true", s=100, device="cuda")
    assert padded["layer 1: sdpa.mask_padded"] == -(-(b * 100 * 104 * 2) // 512) * 512
    assert "layer 1: sdpa.mask" not in padded  # the unpadded conversion is a temporary


def test_one_kv_head_without_enable_gqa_takes_the_math_path():
    # falcon-7b (multi_query: 71 query heads, one k/v head, passed to SDPA without enable_gqa): neither the CPU
    # flash kernel nor CUDA's fused kernels take it; the math path keeps the fp32 softmax (b, 71, s, s)
    s = 512
    for device in ("cpu", "cuda"):
        arch = fitplan.estimate(model="falcon-7b").arch
        got = dict(build(TraceSpec(arch, 1, s, "bf16-true", "sdpa", False, "full", 8, (), 0.0, device, 512)).saved)
        assert any(k.endswith("sdpa.math_softmax") and v % (71 * s * s * 4) == 0 for k, v in got.items()), device
        assert not any(k.endswith("sdpa.logsumexp") for k in got), device
    e = fitplan.estimate(model="falcon-7b", precision="bf16-true", attn_implementation="sdpa",
                         per_device_train_batch_size=1, max_seq_length=s, device="cpu")
    # fitplan-torch under FakeTensorMode (bench/accuracy, falcon-7b b1 s512 bf16-true sdpa) measured 4,469,103,116
    # bytes retained; 512 of them are two 1-element int64 index tensors per layer (``qkv[..., [-2], :]``), which
    # the learned file records as constants
    assert e["saved_for_backward_bytes"] == 4_469_103_116 - 32 * 2 * 8


def _timeline(name: str, precision: str, attn: str, *, ckpt: bool = False, b: int = 2, s: int = 128) -> list:
    from fitplan.trace import step_trace

    arch = load_config_json(CONFIGS / name / "config.json")
    step_trace.DEBUG = timeline = []
    try:
        step_trace.build_afresh(TraceSpec(arch, b, s, precision, attn, ckpt, "full", 8, (), 0.0, "cpu", 512))
    finally:
        step_trace.DEBUG = None
    return timeline


def test_copy_into_slices_of_a_new_buffer_backpropagates_through_copy_slices():
    # DeepSeek-V3's expand_kv fills its keys with key[..., :nope].copy_(k_nope), key[..., nope:].copy_(k_rot) into
    # a new_empty buffer; the attention reads the whole buffer, so its gradient goes to the base's CopySlices
    # node (tensor.cpp CopySlices_apply_functional, torch 2.13): ``result`` (a copy of the incoming gradient at
    # the base's size) plus a contiguous clone of the slice, which copy_'s backward passes to src; the second
    # copy also computes zeros for the slice (its base requires grad after the first copy) and hands ``result``
    # on; the first drops it (the new_empty buffer never required grad).
    b, s, heads, nope, rope, f = 2, 128, 4, 16, 64, 4  # tiny-deepseek-v3, 32-true
    base = b * heads * s * (nope + rope) * f  # 327,680
    timeline = _timeline("tiny-deepseek-v3", "32-true", "eager")
    copies = [e for e in timeline if e[0] == "backward" and e[1] == "copy_"]
    # per layer, in backward order: the second copy (zeros for the rope slice as its temporary), then the first
    # (``result`` dropped: the base's size as its temporary)
    assert [e[4] for e in copies] == [b * heads * s * rope * f, base] * 2
    # every gradient reaches a leaf: none is left waiting for a node that never runs (before: the key buffer's)
    assert [e for e in timeline if e[0] == "end" and e[1].startswith("pending")] == [("end", "pending: ", 0)]


def test_math_sdpa_keeps_its_fp32_copies_until_it_returns():
    # _scaled_dot_product_attention_math on 16-bit CPU inputs: q, k, v upcast to fp32 are C++ locals freed when the
    # function returns, after the output's cast (torch 2.13, torch.profiler allocator events); under autocast,
    # the 16-bit casts of q, k, v are the autocast wrapper's locals, alive as long. tiny-deepseek-v3 takes the math
    # path (q/k head dim 16 + 64, v 16); its rotary output is fp32 under autocast, so q is cast to bf16 first.
    from fitplan.arch.archfile import load
    from fitplan.trace.learned_graph import Builder
    from fitplan.trace.step_trace import Trace

    b, s, heads, qk = 2, 128, 4, 16 + 64
    for precision, autocast_q in (("bf16-true", 0), ("bf16-mixed", b * heads * s * qk * 2)):
        arch = load_config_json(CONFIGS / "tiny-deepseek-v3" / "config.json")
        tr = Trace(TraceSpec(arch, b, s, precision, "sdpa", False, "full", 8, (), 0.0, "cpu", 512))
        Builder(tr, load(arch.model_type), dict(arch.symbols)).run()
        names = [op.name for op in tr.ops]
        cast = names.index("sdpa.math_out_cast")
        hold = tr.ops[cast + 1]  # the return: what the function's frames held goes now
        held = sorted((tr.label[sid], tr.size[sid]) for sid in hold.reads)
        expected = [("sdpa.math_acc", b * heads * s * qk * 4)] * 2 + [("sdpa.math_causal_mask", s * s * 4)]
        expected += [("sdpa.math_weights_cast", b * heads * s * s * 2)]
        # v (bf16 in both: under autocast too, kv_b_proj's output) is a head-transposed slice of kv_b_proj: its fp32
        # copy keeps the layout, so at::matmul copies it again (what bmm saves) and the fp32 copy is one more local
        # (measured on axk1: tests/test_learn_lora_moe_peak.py)
        expected += [("sdpa.math_acc", b * heads * s * 16 * 4)]
        assert hold.name == "hold" and held == sorted(expected), precision
        after = tr.ops[cast + 2]  # then the casts autocast made around the call
        got = sorted(tr.size[sid] for sid in after.reads) if after.name == "hold" else []
        assert sum(got) == autocast_q, precision
