"""Training time: tokens, FLOPs, the step model (a roofline over the step trace's kernels), communication,
throughput and its likely range.

The rooms: :mod:`.tokens` (what is processed), :mod:`.flops` (FLOPs per token and the peak),
:mod:`.roofline` (pricing kernels on a GPU, no quantities), :mod:`.step` (one optimizer step's compute),
:mod:`.comm` (communication and offload, their overlap), :mod:`.mfu` (a stated or measured MFU),
:mod:`.calibration` (the user's measured runs), :mod:`.throughput` (tokens/s, seconds, the band, shares),
:mod:`.generation` (GRPO/RLOO's generation rounds).
docs/time-and-cost.md describes the model and its leave-one-out error on published fine-tuning runs.

Quantities are None (not errors) when the dataset, or the GPU the step model needs, is missing.
"""

from __future__ import annotations

from fitplan.builtin.time import calibration, comm, flops, generation, mfu, step, throughput, tokens
from fitplan.pluginmgr.hookspecs import hookimpl

QUANTITIES = (*tokens.QUANTITIES, *flops.QUANTITIES, *mfu.QUANTITIES, *calibration.QUANTITIES, *step.QUANTITIES,
              *comm.QUANTITIES, *throughput.QUANTITIES, *generation.QUANTITIES)


@hookimpl
def fitplan_register_quantities(register):
    for q in QUANTITIES:
        register(q)


@hookimpl
def fitplan_register_reducers(register):
    for r in generation.REDUCERS:
        register(r)
