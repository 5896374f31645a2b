"""The page's "cheapest plan that fits" card: the ``/api/recommend`` query that searches plans for the page's
training (docs/serve.md).

The recommender keeps a field the user set (``fitplan recommend --gpu a100-80gb`` searches only that GPU), and
the page's scenario always sets a GPU, a micro-batch and more. So the card's query is the page's scenario
without the fields a plan chooses (:func:`searched`: GPU type and count, nodes, provider, instance and region,
micro-batch and accumulation, checkpointing, ZeRO stage and offload, attention kernel), with the page's
effective batch as ``effective-batch-size``: the method, optimizer, precision, sequence length, dataset and
effective batch stay the page's, so plan 1 trains the same model the same way. It ranks by cost when the
scenario has a dataset size, else by GPUs (``--objective cost`` needs one).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from fitplan.search.plans import plan_fields
from fitplan.search.space import VARY_DIMENSIONS
from fitplan.web.params import SCENARIO_PARAMS



def searched() -> tuple[str, ...]:
    """The scenario fields a plan chooses (``search/plans.py`` ``plan_fields``, plugin settings included, less the
    ``--vary`` dimensions, which change the trained model), plus the instance and region, which belong to a
    provider."""
    return tuple(f for f in plan_fields() if f not in VARY_DIMENSIONS) + ("instance", "region")


def effective_batch_size(flat: dict[str, Any]) -> int:
    """Sequences per optimizer step over all GPUs, as ``fitplan recommend --effective-batch-size`` counts them:
    micro-batch × accumulation × data-parallel replicas, the replicas being world size / tensor-parallel degree
    (``builtin/sharding/common.py`` ``data_parallel_degree``)."""
    world = flat["num_gpus"] * flat["num_nodes"]
    replicas = max(1, world // flat["tensor_parallel"])
    return flat["per_device_train_batch_size"] * flat["gradient_accumulation_steps"] * replicas


def request(flat: dict[str, Any], query: Any, wait_seconds: float) -> dict[str, Any]:
    """The card's search for the scenario ``flat`` (flattened) given by ``query`` (the page's pairs):
    ``query`` (what the page appends to ``/api/recommend?``), ``objective``, ``effective_batch_size``,
    ``dataset_size`` (False: ranked by GPUs, no time or cost), ``searched`` (the flags a plan sets, which
    the page resets before it applies one) and ``longest_seconds`` (the wait for a running search plus this
    one: the server answers within it)."""
    from fitplan.search.recommend import has_dataset_size

    flag_of = {field: name for name, field in SCENARIO_PARAMS.items()}
    dropped = {flag_of[f] for f in searched()}
    sized = has_dataset_size(flat)
    objective = "cost" if sized else "gpus"
    batch = effective_batch_size(flat)
    pairs = [(k, v) for k, v in query if k not in dropped and v != ""]
    pairs += [("effective-batch-size", str(batch)), ("objective", objective), ("top", "1"),
              ("wait", f"{wait_seconds:g}")]
    return {"query": urllib.parse.urlencode(pairs), "objective": objective, "effective_batch_size": batch,
            "dataset_size": sized, "searched": sorted(dropped), "longest_seconds": 2 * wait_seconds}
