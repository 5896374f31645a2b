"""Where a learned graph holds along the sequence: a size padded up to one chunk (issue #32).

Chunked SSM / linear-attention mixers pad the sequence to a multiple of a chunk and compute per chunk: Mamba-2's
``torch_forward`` (transformers 5.24 modeling_mamba2.py, also nemotron_h, bamba, falcon_h1, granitemoehybrid,
zamba2) pads by ``pad_size = (chunk_size - seq_len % chunk_size) % chunk_size`` (``pad_tensor_by_size``:
``torch.nn.functional.pad``, aten ``constant_pad_nd``) and reshapes to ``[b, n_chunks, chunk_size, ...]``;
the gated delta rule (modeling_qwen3_next.py ``torch_chunk_gated_delta_rule``, ``chunk_size=64``) pads the same
way. The padded length is ``chunk_size * ceil(s / chunk_size)``; at every probed sequence below one chunk it is
``chunk_size`` itself, so the fitted size of the pad's output has no ``s`` while its input's has. The graph
learned there is exact for ``s <= chunk_size`` only: beyond, the model runs ``n_chunks > 1`` (other sizes, and
the gated delta rule's Python loop runs more iterations). :func:`sequence_bounds` finds such pads in a variant's
segments and :func:`bounded` writes ``s <= <the padded size>`` into the variant's ``when``, so the core refuses a
longer sequence by name (src/fitplan/arch/archfile.py ``ArchFile.variant``: no learned graph applies, the learned
ones hold where ...), instead of replaying one chunk's sizes.
"""

from __future__ import annotations

import re
from typing import Any

_LOCAL = re.compile(r"t(\d+)")
_S = re.compile(r"\bs\b")


def _pad_op(name: str) -> bool:
    """aten's padding ops: ``constant_pad_nd`` (``F.pad`` with a constant), ``reflection_pad*``,
    ``replication_pad*``, ``pad``."""
    return name == "pad" or name.startswith(("constant_pad", "reflection_pad", "replication_pad"))


def _first_local(ins: list[Any]) -> int | None:
    for arg in ins:
        ref = arg[1] if isinstance(arg, (list, tuple)) and len(arg) > 1 else arg
        if isinstance(ref, str) and (m := _LOCAL.fullmatch(ref)):
            return int(m.group(1))
    return None


def sequence_bounds(segs: list[dict[str, Any]]) -> list[str]:
    """The padded sizes (expressions without ``s``) of every pad whose input's size at the same dimension has
    ``s``: the lengths the probed sequences were padded up to (module doc). Sorted, each once."""
    out: set[str] = set()
    for seg in segs:
        tensors = seg.get("t", ())
        for op in seg.get("ops", ()):
            if not _pad_op(op[0]) or not op[2]:
                continue
            src, dst = _first_local(op[1]), _first_local([op[2][0]])
            if src is None or dst is None or src >= len(tensors) or dst >= len(tensors):
                continue
            a, b = tensors[src][0], tensors[dst][0]
            if len(a) != len(b):
                continue
            for da, db in zip(a, b):
                if _S.search(str(da)) and not _S.search(str(db)):
                    out.add(str(db))
    return sorted(out)


def bounded(when: str | None, segs: list[dict[str, Any]]) -> str | None:
    """``when`` and ``s <= <padded size>`` for each of :func:`sequence_bounds` (``when`` unchanged if none)."""
    terms = [f"s <= {e}" if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|\d+", e) else f"s <= ({e})"
             for e in sequence_bounds(segs)]
    terms = [x for x in terms if not re.search(rf"\b{re.escape(x)}(?![\w.])", when or "")]  # one chunk's regime says it
    if not terms:
        return when
    bound = " and ".join(terms)
    return f"({when}) and {bound}" if when else bound
