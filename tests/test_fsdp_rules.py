"""accelerate FSDP's gathered parameters at real size, derived by hand from accelerate 1.16 / torch 2.13's source
(the CPU referee measures the same rules on tiny models: tests/test_stack_referee.py, docs/accuracy-stacks.md).

Llama-2-13B: vocab 32,000, hidden 5,120, 40 layers, untied head; per layer 4·5120² + 3·5120·13824 + 2·5120 =
317,204,480 parameters. Gathered in bf16 (2 bytes) under ``--precision bf16-mixed``; every tensor divides by 8.
"""

from __future__ import annotations

import fitplan

HEAD = 32_000 * 5_120
NORM = 5_120
LAYER = 317_204_480


def fsdp13b(**kw):
    base = dict(model="llama-2-13b", precision="bf16-mixed", num_gpus=8, gpu="a100-40gb", fsdp="full_shard",
                per_device_train_batch_size=1, max_seq_length=2048, gradient_checkpointing=True)
    return fitplan.estimate(**{**base, **kw})


def test_fsdp2_keeps_only_the_tail_unit_gathered_when_the_forward_ends():
    # fsdp_utils.py:884-898: the embedding is its own unit (resharded after its forward), [final norm, lm_head] the
    # tail unit (reshard_after_forward=False). While the loss is computed (inside the root's forward) the tail's
    # parameters and its flat all-gather output are both alive (_fsdp_state.py:333-342 frees the latter after).
    g = fsdp13b()["gathered_param_bytes"]
    tail = 2 * (HEAD + NORM)
    assert g["forward"] == 2 * tail
    assert g["backward"] == tail
    assert g["forward_spike"] == 2 * 2 * LAYER  # the last layer: its parameters and its flat all-gather output
    # in a layer's backward: the layer, the next unit's prefetched flat output (the next layer's, larger than the
    # embedding's 2·HEAD) and the layer's unsharded bf16 gradients beyond the fp32 shards the timeline counts
    # (1 - 4/(8·2) of them)
    assert 2 * LAYER > 2 * HEAD
    assert g["backward_in_layer"] == 2 * LAYER + 2 * LAYER + 2 * LAYER * 3 // 4


def test_fsdp1_keeps_its_root_unit_gathered():
    # FSDP1 (--stack fsdp1): the root unit holds the embedding, the final norm and the head (one flat parameter,
    # every piece a multiple of 8 elements: no alignment padding); it stays unsharded from its forward to the end
    # of the backward. No copy-out: the layer is gathered straight into its padded flat buffer.
    g = fsdp13b(stack="fsdp1")["gathered_param_bytes"]
    root = 2 * (2 * HEAD + NORM)
    assert g["forward"] == g["backward"] == root
    assert g["forward_spike"] == root + 2 * LAYER
