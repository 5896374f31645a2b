"""The referee for ``TrainingArguments.optim``: the real HF Trainer builds the optimizer and runs one step on the
CPU; the optimizer's state bytes are then counted tensor by tensor.

:func:`measure_hf_optimizer` builds the model from an HF ``config.json`` dict (random weights, nothing
downloaded) in fp32 or bf16, runs ``Trainer.train()`` for one step (``use_cpu=True``, ``max_steps=1``) with
``optim``, ``optim_args`` and ``optim_target_modules``, and sums the bytes of every tensor the optimizer keeps,
each storage once (bitsandbytes' shared quantisation maps, views): ``optimizer.state`` (of each per-parameter
optimizer for the layer-wise variants), GrokAdamW's ``param_groups[i]["state"]``, the tensors inside tensor
subclasses (torchao's quantised states) and inside state objects (GaLore / APOLLO projectors). bitsandbytes,
torchao, galore-torch, apollo-torch, schedulefree, lomo-optim, grokadamw and torch-optimi must be installed
for their names (``make install-test`` pins them).
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

from . import _deps


def _leaves(t, torch) -> list:
    """The plain tensors backing ``t`` (recursing into tensor subclasses such as torchao's ``OptimState8bit``)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [leaf for n in names for leaf in _leaves(getattr(t, n), torch)]
    return [t]


def _state_tensors(value, torch) -> list:
    if isinstance(value, torch.Tensor):
        return _leaves(value, torch)
    if hasattr(value, "__dict__"):  # GaLoreProjector, APOLLO's GradientProjector
        return [leaf for x in vars(value).values() if isinstance(x, torch.Tensor) for leaf in _leaves(x, torch)]
    return []


def optimizer_states(optimizer) -> list[dict]:
    """The per-parameter state dicts of an HF-built optimizer (layer-wise dummies and GrokAdamW included)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    out: list[dict] = []
    optimizer_dict = getattr(inner, "optimizer_dict", None)
    for opt in (optimizer_dict.values() if optimizer_dict else [inner]):
        out += list(opt.state.values())
        for g in opt.param_groups:
            if isinstance(g.get("state"), dict):  # GrokAdamW keeps its states in the param group
                out += list(g["state"].values())
    return out


def state_bytes(optimizer) -> int:
    """Bytes of every tensor the optimizer keeps, each storage counted once."""
    torch = _deps.torch()
    seen: dict[int, int] = {}
    for st in optimizer_states(optimizer):
        for value in st.values():
            for t in _state_tensors(value, torch):
                storage = t.untyped_storage()
                seen.setdefault(storage.data_ptr() or id(storage), storage.nbytes())
    return sum(seen.values())


class _Batches:
    """A few causal-LM examples of random token ids (``input_ids`` = ``labels``)."""

    def __init__(self, vocab: int, seq: int, n: int = 4) -> None:
        self.vocab, self.seq, self.n = vocab, seq, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        torch = _deps.torch()
        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def measure_hf_optimizer(config: dict[str, Any], optim: str, dtype: str = "fp32", *, optim_args: str | None = None,
                         target_modules: list[str] | None = None, seq: int = 16) -> dict[str, Any]:
    """One ``Trainer.train()`` step with ``optim`` on the CPU: ``{"state_bytes", "optimizer_class"}``."""
    torch = _deps.torch()
    transformers = _deps.transformers()
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**copy.deepcopy(config))
    model = transformers.AutoModelForCausalLM.from_config(cfg).to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    with tempfile.TemporaryDirectory() as d:
        args = transformers.TrainingArguments(
            output_dir=d, optim=optim, optim_args=optim_args, optim_target_modules=target_modules, use_cpu=True,
            report_to="none", save_strategy="no", logging_strategy="no", max_steps=1, per_device_train_batch_size=2,
            disable_tqdm=True, dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Batches(cfg.vocab_size, seq))
        trainer.train()
        inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        return {"state_bytes": state_bytes(trainer.optimizer),
                "optimizer_class": f"{type(inner).__module__}.{type(inner).__qualname__}"}
