"""The dataset's part in an estimate (``--dataset``): tokens per epoch and the sequence length memory sees.

With a dataset, :func:`fitplan.estimation.build_inputs` puts its summary in ``dataset_summary`` and its examples
and tokens in ``num_examples`` and ``total_tokens``. Here:

* ``dataset_batching``: the chosen ``--padding`` mode over one epoch (:mod:`fitplan.data.padding`);
* reducers replace the time model's ``epoch_tokens``, ``padding_tokens`` and ``truncated_tokens`` with the
  dataset's (computed tokens of the mode; padding; tokens cut by truncation or in examples TRL drops), so that
  time and cost are those of ``--total-tokens N`` with N the computed tokens;
* ``realized_seq_length``: the sequence length the memory model uses: the longest (truncated) example when
  padding to the longest, ``max_seq_length`` when padding to it or packing, and without a dataset simply
  ``max_seq_length``.

The section ``dataset`` of the estimate report says which, and the ``dataset`` report kind (``fitplan
dataset``) is rendered by the ``table`` and ``json`` formats declared here.
"""

from __future__ import annotations

from typing import Any

from fitplan.engine.declarations import quantity, reducer
from fitplan.errors import FitplanError
from fitplan.output.formats import OutputFormat, RenderOptions, ReportSection
from fitplan.pluginmgr.hookspecs import hookimpl

NEEDS_LENGTHS = ("longest", "group_by_length", "padding_free")
"""Padding modes that need the examples' lengths, not only their count."""


@quantity("object", type="object")
def dataset_batching(dataset_summary, padding, max_seq_length, per_device_train_batch_size, gradient_accumulation_steps):
    """The ``--padding`` mode over one epoch of ``--dataset`` (``fitplan.data.padding.Batching``: computed and
    real tokens, the realized sequence length, how each is known). None without a dataset."""
    if dataset_summary is None:
        if padding in NEEDS_LENGTHS:
            raise FitplanError(f"--padding {padding} needs the examples' lengths", field="padding", value=padding,
                               suggestion="add --dataset PATH (or a summary from `fitplan dataset --out`), "
                                          "or use --padding pack or pad")
        return None
    from fitplan.data.figures import batching

    return batching(dataset_summary, padding, max_seq_length, per_device_train_batch_size, gradient_accumulation_steps)


@quantity("tokens", label="sequence length in memory")
def realized_seq_length(max_seq_length, dataset_batching):
    """The sequence length of the micro-batch the memory model sizes: with ``--dataset``, the realized one
    (``longest`` / ``group_by_length``: the longest example after truncation, which pads its batch;
    ``pad`` and ``pack``: ``max_seq_length``; ``padding_free``: the largest micro-batch's tokens per example);
    without a dataset, ``max_seq_length``."""
    return max_seq_length if dataset_batching is None else dataset_batching.seq_length


@quantity("text", type="text")
def realized_seq_length_basis(dataset_batching):
    """What ``realized_seq_length`` is: ``max_seq_length``, or which example or batch of the dataset."""
    return "max_seq_length" if dataset_batching is None else dataset_batching.seq_length_basis


@reducer("epoch_tokens", when=lambda dataset_batching: dataset_batching is not None)
def dataset_epoch_tokens(value, dataset_batching):
    """Tokens computed per epoch under the ``--padding`` mode, counted on the dataset (real tokens plus the
    padding of each micro-batch)."""
    return dataset_batching.computed_tokens


@reducer("padding_tokens", when=lambda dataset_batching: dataset_batching is not None)
def dataset_padding_tokens(value, dataset_batching, num_train_epochs):
    """Pad tokens computed over the run: (computed − real tokens) × epochs, counted on the dataset."""
    return dataset_batching.padding_tokens * num_train_epochs


@reducer("truncated_tokens", when=lambda dataset_batching: dataset_batching is not None)
def dataset_truncated_tokens(value, dataset_batching, dataset_tokens, num_train_epochs):
    """Tokens not trained on over the run: cut by truncation at ``max_seq_length``, or in the examples TRL
    drops: (dataset tokens − real tokens) × epochs."""
    return max(0.0, dataset_tokens - dataset_batching.real_tokens) * num_train_epochs


# --------------------------------------------------------------------------- the estimate report's section


def dataset_json(est) -> dict[str, Any] | None:
    summary, b = est.values.get("dataset_summary"), est.values.get("dataset_batching")
    if summary is None or b is None:
        return None
    return {"dataset": {
        "path": est.scenario.dataset.dataset_path, "kind": summary.kind, "examples": summary.examples,
        "read": summary.read, "tokens": est.values["dataset_tokens"], "padding": b.mode,
        "computed_tokens_per_epoch": b.computed_tokens, "real_tokens_per_epoch": b.real_tokens,
        "efficiency": b.efficiency, "basis": b.basis, "sequence_length": est.values["realized_seq_length"],
        "sequence_length_basis": est.values["realized_seq_length_basis"], "tokenizer": summary.tokenizer.get("name")}}


def dataset_lines(est, units: str) -> list[tuple[str, str]]:
    data = dataset_json(est)
    if data is None:
        return []
    d, summary = data["dataset"], est.values["dataset_summary"]
    from fitplan.data.padding import DESCRIPTIONS

    read = f", {summary.read:,} read (a sample)" if summary.sampled else ""
    h = summary.lengths
    return [
        ("dataset", f"{d['path']}: {d['examples']:,} examples{read}, {d['tokens']:,.0f} tokens (mean {h.mean:,.0f}, "
                    f"p99 {h.percentile(99):,}, max {h.max:,}; {d['tokenizer']})"),
        ("padding", f"{DESCRIPTIONS[d['padding']]}: {d['computed_tokens_per_epoch']:,.0f} tokens computed per epoch, "
                    f"{100 * d['efficiency']:.1f} % of them real ({d['basis']})"),
        ("sequence length", f"memory sized at {d['sequence_length']:,} tokens per sequence: {d['sequence_length_basis']}"),
    ]


# --------------------------------------------------------------------------- the `fitplan dataset` report


def _table(kind: str, report: Any, options: RenderOptions) -> str:
    from fitplan.output.dataset_report import to_terminal

    return to_terminal(report, options)


def _json(kind: str, report: Any, options: RenderOptions) -> str:
    from fitplan.output.console import dumps_json

    return dumps_json(report)


@hookimpl
def fitplan_register_quantities(register):
    for q in (dataset_batching, realized_seq_length, realized_seq_length_basis):
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in (dataset_epoch_tokens, dataset_padding_tokens, dataset_truncated_tokens):
        register(r)


@hookimpl
def fitplan_register_report_sections(register):
    register(ReportSection("dataset", dataset_json, dataset_lines, order=15))


@hookimpl
def fitplan_register_formats(register):
    register(OutputFormat("table", ".txt", ("dataset",), _table, "rich text for the terminal"))
    register(OutputFormat("json", ".json", ("dataset",), _json, "indented JSON"))
