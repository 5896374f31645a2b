"""`fitplan capacity`: the seed's GPU tables recomputed. Model sizes by hand from the Llama shape; the
seed-assumption column derived by hand from the chapter's 12 B/param × 0.7 rule."""

from __future__ import annotations

import json
import math

import pytest

from fitplan.output.capacity import size_text
from fitplan.search import capacity as cap
from fitplan.estimation import evaluate

from conftest import run_cli


def llama_params(L: int) -> int:
    """Parameters of the Llama-shaped model of depth L, by hand: h = 128·L, I = 8h/3 rounded up to 256,
    per layer 4h² (q, k, v, o) + 3hI (gate, up, down) + 2h (norms), plus embeddings and LM head (2·V·h) and
    the final norm (h)."""
    h = 128 * L
    inter = math.ceil((8 * h // 3) / 256) * 256
    return L * (4 * h * h + 3 * h * inter + 2 * h) + 2 * 32000 * h + h


@pytest.fixture(scope="module")
def ctx():
    from fitplan.context import get_context
    from fitplan.pluginmgr.registry import make_registry

    return get_context((), make_registry(entry_points=False, blocked=()))


def test_llama_shape_is_llama_2(ctx):
    assert llama_params(32) == 6_738_415_616  # meta-llama/Llama-2-7b-hf
    assert llama_params(40) == 13_015_864_320  # meta-llama/Llama-2-13b-hf
    for L in (1, 7, 32, 40, 80):
        assert cap.llama_spec(L, ctx.rulesets).param_count == llama_params(L)


def test_seed_assumptions_column_by_hand(ctx):
    """Seed: bf16 weights (2) + gradients (2) + fp32 AdamW states (8) per parameter, plus activations
    b·s·4096·4 bytes, all × 0.7 with checkpointing; no CUDA context. A100-80GB usable: 85,096,136,704 bytes."""
    usable = 85_096_136_704
    activations = 1 * 512 * 4096 * 4
    largest = max(L for L in range(1, 100) if int(0.7 * (12 * llama_params(L) + activations)) <= usable)
    assert largest == 36
    row = cap.largest_model(cap.SEED_FULL, ctx.rulesets.gpu("a100-80gb"), 1, ctx)
    assert row["layers"] == largest
    assert row["params"] == llama_params(36)
    assert size_text(row) == "9.47B"


@pytest.mark.parametrize(("setup", "gpu", "n"), [(cap.FULL, "a100-40gb", 1), (cap.QLORA, "rtx-4090", 1),
                                                 (cap.LORA, "a100-80gb", 4), (cap.FULL, "h100-sxm", 8)])
def test_largest_model_is_the_boundary(ctx, setup, gpu, n):
    g = ctx.rulesets.gpu(gpu)
    row = cap.largest_model(setup, g, n, ctx)
    base = cap._setup_scenario(setup, g, n)

    def fits(L):
        return evaluate(base, ctx.registry, ctx.rulesets, arch=cap.llama_spec(L, ctx.rulesets)).values["fits"]

    L = row["layers"]
    assert L >= 1 and fits(L) and not fits(L + 1)


def test_efficient_fits_more_than_full(ctx):
    for gpu in ("rtx-3090", "a100-80gb"):
        g = ctx.rulesets.gpu(gpu)
        full = cap.largest_model(cap.FULL, g, 1, ctx)["params"]
        lora = cap.largest_model(cap.LORA, g, 1, ctx)["params"]
        qlora = cap.largest_model(cap.QLORA, g, 1, ctx)["params"]
        assert full < lora < qlora


def test_capacity_command_shows_the_seed_beside_fitplan():
    proc = run_cli("capacity", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    seed = {r["gpu"]: (r["seed"]["full"], r["seed"]["efficient"]) for r in data["single_gpu"]}
    assert seed == {"rtx-3090": ("1B", "3B"), "rtx-4090": ("1B", "3B"), "a100-40gb": ("3B", "7B"),
                    "a100-80gb": ("7B", "13B"), "h100-sxm": ("7B", "13B")}
    multi = [(r["gpu"], r["num_gpus"], r["seed"]["efficient"]) for r in data["multi_gpu"]]
    assert multi == [("a100-40gb", 2, "7-13B"), ("a100-80gb", 4, "30-40B"), ("h100-sxm", 8, "70B")]
    assert len(data["notes"]) == 4
    table = run_cli("capacity")
    assert table.returncode == 0
    for text in ("seed: full", "fitplan: full", "seed: efficient", "fitplan: QLoRA", "Why the numbers differ",
                 "9.47B", "7-13B"):
        assert text in table.stdout
    md = run_cli("capacity", "--format", "markdown").stdout
    assert md.startswith("# Largest model per GPU: the seed's tables, recomputed")
