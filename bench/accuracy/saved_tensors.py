"""What autograd saves for backward, tensor by tensor: the evidence behind an activation discrepancy.

    .venv/bin/python bench/accuracy/saved_tensors.py tests/data/configs/tiny-llama/config.json \
        --precision bf16-true --attn sdpa --batch 2 --seq 128 [--method lora] [--checkpointing]

Runs one forward pass of the tiny model on the CPU under ``saved_tensors_hooks`` and prints every saved
storage (deduplicated, parameters excluded) with the innermost module that saved it, its shape, dtype and
bytes, then the totals per decoder layer and outside the layers, next to fitplan's per-layer prediction.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import warnings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--precision", default="bf16-true")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--method", default="full")
    ap.add_argument("--lora-targets", default="q_proj,v_proj", help="comma-separated LoRA target modules")
    ap.add_argument("--checkpointing", action="store_true",
                    help="(tensors saved inside checkpointed layers are checkpoint's, not listed)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")

    import torch
    from torch.utils.module_tracker import ModuleTracker
    from torch.utils.weak import WeakIdKeyDictionary

    import fitplan
    from fitplan_torch import build

    cfg = json.load(open(args.config, encoding="utf-8"))
    targets = tuple(args.lora_targets.split(","))
    model = build.build_model(cfg, precision=args.precision, attn_implementation=args.attn, method=args.method,
                              gradient_checkpointing=args.checkpointing, lora={"lora_target_modules": targets})
    batch = build.make_batch(build.vocab_size_of(model), args.batch, args.seq, device="cpu")
    params = {id(p.untyped_storage()) for p in model.parameters()}
    seen = WeakIdKeyDictionary()
    tracker = ModuleTracker()

    def pack(t):
        st = t.untyped_storage()
        if id(st) not in params and st not in seen:
            inner = max(tracker.parents, key=len) if tracker.parents else "?"
            seen[st] = (inner, tuple(t.shape), str(t.dtype).removeprefix("torch."), st.nbytes())
        return t

    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), build.autocast(args.precision, "cpu"):
        out = model(**batch)
    loss = out.loss
    del out
    per_layer: dict[str, int] = collections.Counter()
    total = 0
    print(f"{'bytes':>12}  {'dtype':9} {'shape':22} module")
    for inner, shape, dtype, n in sorted(seen.values(), key=lambda r: r[0]):
        print(f"{n:12d}  {dtype:9} {str(shape):22} {inner}")
        m = re.search(r"layers\.(\d+)|\.h\.(\d+)", inner)
        per_layer[f"layer {m.group(1) or m.group(2)}" if m else "outside layers"] += n
        total += n
    print()
    for k, v in sorted(per_layer.items()):
        print(f"{k:16s} {v:12d}")
    print(f"{'total':16s} {total:12d}")
    est = fitplan.estimate(model=args.config, precision=args.precision, attn_implementation=args.attn,
                           per_device_train_batch_size=args.batch, max_seq_length=args.seq, method=args.method,
                           gradient_checkpointing=args.checkpointing,
                           **({"lora_target_modules": targets} if args.method != "full" else {}))
    print(f"\nfitplan: activation_bytes_per_layer {est['activation_bytes_per_layer']}, activation_bytes {est['activation_bytes']}, "
          f"logits_bytes {est['logits_bytes']}, autocast copies {est['autocast_weight_copy_bytes']}, "
          f"saved_for_backward_bytes {est['saved_for_backward_bytes']}")
    del loss
    return 0


if __name__ == "__main__":
    sys.exit(main())
