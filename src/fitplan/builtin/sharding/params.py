"""The parameter tensors in ``model.parameters()`` order, with what the stacks need to know about each.

Stacks that flatten or partition (DeepSpeed, FSDP1) depend on the order and on the optimizer groups: the HF
Trainer makes two groups, weight decay and none (transformers/trainer.py:1273-1286), the second holding
every bias and every norm weight (``get_decay_parameter_names``, trainer.py:1408-1418: names matching
``bias``, ``layernorm``, ``rmsnorm``, ``norm.``, ``_norm.`` and ``nn.LayerNorm`` modules).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple


class P(NamedTuple):
    """One parameter tensor: element count, shape, optimizer group (``decay``), whether it trains, its leaf
    module (``layer.index/module`` or ``root/module``) and its dtype bytes before any stack casts it. A named
    tuple: a 100,000-layer model has about a million of them, made in a second rather than in ten."""

    numel: int
    shape: tuple[int, ...]
    decay: bool
    trainable: bool
    module: str
    nbytes: float
    layer: int = -1


def _no_decay(name: str, module: str) -> bool:
    return module == "norm" or name.endswith(".bias")


@functools.lru_cache(maxsize=128)
def ordered(arch, method: str, trainable_tensors, weight_dtype_bytes: float, trainable_dtype_bytes: float,
            tensor_parallel: int = 1) -> tuple[P, ...]:
    """Every parameter tensor of ``arch`` in ``model.parameters()`` order (LoRA adapters after the frozen
    weight of the Linear they adapt; counts split evenly over the decoder layers). Tensor parallelism
    divides each tensor's elements (approximately: rank 0's slice). Cached: searches ask again and again."""
    groups = arch.param_groups()
    L = max(1, arch.num_hidden_layers)
    full = method == "full"
    t = max(1, tensor_parallel)

    def part(n: int) -> int:
        return -(-n // t)

    before, layer, after = [], [], []
    seen_layer = False
    for g in groups:
        if g.layer:
            seen_layer = True
            layer.append(g)
        else:
            (after if seen_layer else before).append(g)
    adapters: list[tuple[tuple[int, ...], int]] = [] if full else list(trainable_tensors)
    out: list[P] = []

    fixed = {id(g): (part(g.numel), g.shape, not _no_decay(g.name, g.module), g.name.rsplit(".", 1)[0]) for g in groups}

    def add(g, li: int) -> None:
        n, shape, decay, module = fixed[id(g)]
        out.append(P(n, shape, decay, full, (f"layer.{li}/" if li >= 0 else "root/") + module, weight_dtype_bytes, li))

    for g in before:
        for _ in range(g.count):
            add(g, -1)
    per_layer_adapters = [(shape, max(1, count // L)) for shape, count in adapters]
    per_layer = [(g, max(1, g.count // L)) for g in layer]
    for li in range(L):
        for g, reps in per_layer:
            for _ in range(reps):
                add(g, li)
        for k, (shape, reps) in enumerate(per_layer_adapters):
            for r in range(reps):
                out.append(P(part(math.prod(shape)), shape, True, True, f"layer.{li}/lora.{k}.{r}", trainable_dtype_bytes, li))
    for g in after:
        for _ in range(g.count):
            add(g, -1)
    return tuple(out)


def bare(count: int, weight_dtype_bytes: float) -> list[P]:
    """A bare parameter count (``--params 7B``): one flat tensor."""
    return [P(int(count), (int(count),), True, True, "root/params", weight_dtype_bytes)]


def ceil_div(a: float, b: float) -> int:
    return -(-int(a) // int(b))
