"""What the learner cannot record as it runs, and what it does instead: layer skipping (``layerdrop``) is recorded
off and stated as the file's assumption; ops whose output size depends on the data (MoE routing counts) are named
in the error when no expression over the config fits a size.
"""

from __future__ import annotations

from typing import Any

LAYERDROP_WHY = ("every decoder layer runs: in training each is skipped with probability layerdrop (OPT, XGLM: "
                 "modeling_opt.py ``if self.training and self.layerdrop > 0.0``), so the figures are the upper bound")
"""Why a file assumes layerdrop 0 (docs/architectures.md "What the learner assumes")."""
SCAN_WHY = ("the model's Python loop over the sequence (its reference scan, learn/seqloop.py), which transformers "
            "runs off CUDA and wherever the optional fused kernels (mamba_ssm, causal_conv1d, ...) are not installed: "
            "every position's saved tensors and work are counted; with the kernels installed a step holds less")
"""Why a file with a folded sequence loop states the kernel path it assumes."""


def dropout_fields(base: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The config's dropout probabilities (float fields named ``*drop*``), each recorded at a distinct value so a
    dropout call site names its field, and its layer-skipping probabilities (``layerdrop``), which are not: a
    skipped layer runs no ops at all, so the recorded ops would change from run to run. The learner records every
    layer (layerdrop 0) and the file states it (``assumed``)."""
    drops, skipping = [], []
    for k, v in base.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and "drop" in k.lower():
            if "layerdrop" in k.lower().replace("_", ""):
                skipping.append(k)
            elif isinstance(v, float):
                drops.append(k)
    return drops, skipping


DATA_DEPENDENT = ("nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "bincount",
                  "repeat_interleave.Tensor", "masked_scatter", "argwhere")
"""aten ops whose output size depends on the values of their input, not on the config (MoE routing's
``torch.nonzero`` / ``torch.where(mask)`` per expert, ``bincount`` of routed tokens: ``max(input) + 1`` entries).
Not ``histc``: it has ``bins`` entries whatever the data (torch 2.13 ``torch.histc``; transformers 5.24's
``grouped_mm`` experts, integrations/moe.py, and DeepSeek-V4's load-balancing loss count tokens per expert with
``bins=num_experts``), so a size that no expression fits next to it is no routing count."""


def data_dependent_note(seg: dict[str, Any]) -> str:
    """A sentence naming the segment's ops whose sizes depend on the data, or ''. A size that no expression over
    the config fits, in a segment with such an op, is a routing count: the bundled MoE types avoid it (transformers
    5's ``grouped_mm`` experts process every token with exactly k experts); learning it needs a declared routing
    assumption (docs/architectures.md "Limits")."""
    ops = sorted({o[0] if isinstance(o, (list, tuple)) else o.get("name", "") for o in seg.get("ops", ())}
                 & set(DATA_DEPENDENT))
    if not ops:
        return ""
    return (f"; this segment runs {', '.join('aten.' + o for o in ops)}, whose output size depends on the data "
            "(MoE routing counts), which a learned file cannot express yet")


def first_line(e: Exception) -> str:
    """The line of an exception's message worth quoting (its ``ValueError`` line, else its last), at most 200
    characters: what a refusal names when the config class or the model rejects a shrunk config."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    detail = next((x for x in lines if x.startswith("ValueError")), lines[-1] if lines else type(e).__name__)
    return detail[:200]
