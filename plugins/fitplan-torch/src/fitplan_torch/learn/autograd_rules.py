"""What autograd saves for each aten op, and under which condition: PyTorch's own rules, as data.

Source: ``tools/autograd/derivatives.yaml``, shipped in every torch wheel as
``torchgen/packaged/autograd/derivatives.yaml`` and parsed here with torchgen's own
``load_derivatives``. The condition under which a saved tensor is kept is the one
``torchgen/packaged/autograd/gen_variable_type.py`` (``guard_for``) emits into the generated
``VariableType`` kernels: a tensor used by exactly one input's derivative formula is saved only when that
input requires grad (``grad_fn->should_compute_output(edge)``); every other saved tensor is saved
whenever the op creates a node (some input requires grad). Per op the table records:

* ``d``: the inputs with a derivative, in edge order (``args_with_derivatives``; a ``Tensor[]`` argument
  is marked ``*`` and gives one edge per element);
* ``s``: saved tensors: ``[name, guard]``, ``name`` an argument or an output (``result``, ``result0``,
  ``output``, ...), ``guard`` the argument whose requires-grad decides it, or null;
* ``o``: which outputs are differentiable (null: all floating outputs);
* ``p``: per edge, whether the gradient formula passes the incoming gradient through (``grad`` itself,
  possibly wrapped in ``handle_r_to_c`` or ``maybe_multiply``): then no new tensor is allocated when
  shapes and dtypes agree.
* ``pw``: 1 for a pointwise op (the ``pointwise`` tag of ``native_functions.yaml``): a formula that does not
  pass the gradient through computes it at the output's broadcast shape, and autograd's engine reduces it to a
  smaller input's shape afterwards (``validate_outputs`` in torch/csrc/autograd/engine.cpp, ``sum_to``), so a
  broadcast input's gradient is first a tensor of the output's size.

fitplan's core reads the generated file (``rulesets/architectures/autograd.json``) and never imports torch.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

PASS_FORMULAS = (
    re.compile(r"^grad$"),
    re.compile(r"^handle_r_to_c\([a-z_]+, grad\)$"),
    re.compile(r"^handle_r_to_c\([a-z_]+, maybe_multiply\(grad, [a-z_.()]+\)\)$"),
    re.compile(r"^maybe_multiply\(grad, [a-z_.()]+\)$"),
    re.compile(r"^grad\.(view|reshape|view_symint|reshape_symint|expand|t|transpose|permute|squeeze|unsqueeze|"
               r"view_as|reshape_as|alias|conj)(_symint)?\(.*\)$"),
)
VIEW_BACKWARD_PASS = {"view", "_unsafe_view", "reshape", "alias", "t", "transpose.int", "permute", "unsqueeze",
                      "squeeze", "squeeze.dim", "squeeze.dims", "expand", "_reshape_alias", "view_as", "detach",
                      "unflatten.int", "flatten.using_ints"}


def _paths() -> tuple[str, str, str]:
    import torchgen

    base = os.path.join(os.path.dirname(torchgen.__file__), "packaged")
    return (os.path.join(base, "autograd", "derivatives.yaml"), os.path.join(base, "ATen", "native", "native_functions.yaml"),
            os.path.join(base, "ATen", "native", "tags.yaml"))


@functools.lru_cache(maxsize=1)
def _infos() -> dict[str, Any]:
    from torchgen.packaged.autograd.load_derivatives import load_derivatives

    diffs, _ = load_derivatives(*_paths())
    out: dict[str, Any] = {}
    for schema, by_key in diffs.items():
        name = str(schema).split("(")[0]
        info = by_key.get("Default")
        if info is not None:
            out[name] = info
    return out


def _guard(info, arg, args_with_derivatives) -> str | None:
    """gen_variable_type.py ``guard_for``, for one saved attribute."""
    from torchgen.api.types import BaseCType, tensorT

    if any(str(a.type).startswith("Tensor[]") or "[]" in str(a.type) for a in info.func.func.arguments.flat_all
           if str(a.type).startswith("Tensor")):
        return None
    if "backward" in info.name:
        return None
    if len(args_with_derivatives) <= 1:
        return None
    if arg.nctype.type != BaseCType(tensorT):
        return None
    used_in = [d for d in info.derivatives if arg in d.saved_inputs]
    if len(used_in) != 1:
        return None
    derivative = used_in[0]
    if len(derivative.var_names) != 1:
        m = re.search(rf"wrap_opt_if\({re.escape(str(arg.nctype.name))},\s*grad_input_mask\[(\d+)\]\)", derivative.formula)
        if m is None:
            return None
        return args_with_derivatives[int(m.group(1))].name
    return derivative.var_names[0]


def rule(name: str) -> dict[str, Any] | None:
    """The table entry of aten op ``name`` (``mul.Tensor``, ``mm``), or None if it has no derivative."""
    info = _infos().get(name)
    inplace = False
    if info is None:
        base, _, ov = name.partition(".")
        if base.endswith("_") and not base.startswith("_"):
            info = _infos().get(base[:-1] + ("." + ov if ov else ""))
            inplace = info is not None
    if info is None:
        return None
    awd = list(info.args_with_derivatives)
    d = [a.name + ("*" if "List" in str(getattr(a, "argument", a).type) or "[]" in str(getattr(a, "argument", a).type)
                   else "") for a in awd]
    saves: list[list[Any]] = []
    from torchgen.api.types import BaseCType, OptionalCType, tensorT

    tensor_types = (BaseCType(tensorT), OptionalCType(BaseCType(tensorT)))
    for arg in info.all_saved_inputs:
        if arg.nctype.type not in tensor_types and "TensorList" not in str(arg.nctype.type) \
                and "Tensor" not in str(arg.nctype.type):
            continue
        nm = str(arg.nctype.name)
        if not re.fullmatch(r"[A-Za-z_0-9]+", nm) or nm.endswith(("_sym_sizes", "_sym_strides", "_options", "_layout")):
            continue
        saves.append([nm, _guard(info, arg, awd)])
    for arg in info.all_saved_outputs:
        nm = str(arg.nctype.name)
        if arg.nctype.type not in tensor_types and "Tensor" not in str(arg.nctype.type):
            continue
        if nm.endswith(("_sym_sizes", "_sym_strides", "_options", "_layout", "_scalar_type")):
            continue
        saves.append([nm, None])
    passes = []
    for a in awd:
        formula = next((f.formula for f in info.derivatives if a.name in f.var_names and len(f.var_names) == 1), "")
        passes.append(1 if any(p.match(formula.strip()) for p in PASS_FORMULAS) else 0)
    entry: dict[str, Any] = {"d": d, "s": saves, "p": passes}
    rets = info.func.func.returns
    names = [r.name or ("result" if len(rets) == 1 else f"result{k}") for k, r in enumerate(rets)]
    if names != ["result"]:
        entry["r"] = names
    if inplace:
        entry["inplace"] = 1
    if info.output_differentiability is not None:
        entry["o"] = [1 if x else 0 for x in info.output_differentiability]
    if "pointwise" in info.func.tags:
        entry["pw"] = 1
    return entry


def table(ops: set[str]) -> dict[str, Any]:
    """Entries for ``ops`` (op keys as the recorder names them), null for ops without a derivative."""
    return {op: rule(op) for op in sorted(ops)}


def source() -> dict[str, str]:
    import torch

    return {"torch": torch.__version__.split("+")[0], "file": "torchgen/packaged/autograd/derivatives.yaml",
            "guards": "torchgen/packaged/autograd/gen_variable_type.py guard_for"}


ITEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1,
              "c64": 8}
"""Bytes per element of the recorder's dtype codes (learn/record.py ``DTYPES``)."""


def function_temporaries(backward: dict[str, Any], first_input: dict[str, Any] | None) -> float:
    """A custom ``torch.autograd.Function``'s backward transient, in units of its first input's bytes: what its
    node held at its peak beyond the gradients it returned (``peak`` and ``new``, measured by the recorder on the
    node's run: learn/record.py ``_record_backward``). Its backward is Python code (BLOOM's ``GeLUFunction`` calls
    ``bloom_gelu_back``: ``tanh_out``, ``ff`` and the products between them live together, modeling_bloom.py), so
    derivatives.yaml says nothing of it; the core multiplies it by the scenario's input bytes (``bti``,
    fitplan/trace/learned_graph.py ``backward_temporaries``). A whole number when the temporaries are of the
    input's size; 0 when the node holds nothing more. ``first_input``: the recorder's tensor entry (shape, dtype)."""
    if first_input is None:
        return 0
    input_bytes = ITEM_BYTES.get(first_input["dtype"], 0)
    for n in first_input["shape"]:
        input_bytes *= n
    extra = backward.get("peak", 0) - backward.get("new", 0)
    if input_bytes <= 0 or extra <= 0:
        return 0
    ratio = extra / input_bytes
    return round(ratio) if abs(ratio - round(ratio)) < 1e-9 else round(ratio, 6)
