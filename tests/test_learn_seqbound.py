"""A learned graph of a chunked mixer holds up to one chunk (issue #32): Mamba-2's ``torch_forward`` pads the
sequence to a multiple of ``chunk_size`` (transformers 5.24 modeling_mamba2.py ``pad_tensor_by_size``, aten
``constant_pad_nd``), so at probes below one chunk the padded length is ``chunk_size`` itself and the learned file
holds for ``s <= chunk_size`` only (fitplan_torch/learn/seqbound.py). The bound is derived by hand from that
padding (``chunk_size * ceil(s / chunk_size) == chunk_size`` exactly when ``s <= chunk_size``), never read off the
learner's output. Tests that import torch are referee/slow (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import bench_module

from fitplan_torch.learn.seqbound import bounded, sequence_bounds


def _seg(src: list[str], dst: list[str]) -> dict:
    return {"t": [[src, "f32", None], [dst, "f32", None]], "ops": [["constant_pad_nd", [["self", "t0"]], ["t1"]]]}


def test_a_pad_to_a_chunk_bounds_the_sequence():
    """Mamba-2's pad ``[b, s, heads, d] -> [b, chunk_size, heads, d]`` and the gated delta rule's hard-coded 64
    (modeling_qwen3_next.py ``torch_chunk_gated_delta_rule(chunk_size=64)``) each bound ``s``; controls: the
    labels' shift pad ``[b, s] -> [b, 1 + s]`` keeps ``s`` (no bound), and a pad of a size that never had ``s``
    (a convolution's ``d_conv - 1`` state) bounds nothing."""
    assert sequence_bounds([_seg(["b", "s", "8", "16"], ["b", "chunk_size", "8", "16"])]) == ["chunk_size"]
    assert bounded("b != 1", [_seg(["b", "s", "4"], ["b", "64", "4"])]) == "(b != 1) and s <= 64"
    assert bounded(None, [_seg(["b", "s"], ["b", "2*chunk"])]) == "s <= (2*chunk)"
    assert sequence_bounds([_seg(["b", "s"], ["b", "1 + s"])]) == []
    assert sequence_bounds([_seg(["b", "8", "1"], ["b", "8", "2"])]) == []
    assert bounded("b != 1", [_seg(["b", "s"], ["b", "1 + s"])]) == "b != 1"


def test_the_fitter_writes_a_length_padded_to_a_chunk():
    """Mamba-2's padded length ``chunk*ceil(s/chunk)`` and chunk count ``ceil(s/chunk)`` at probes over two to four
    chunks, by hand: (s, chunk) = (16, 6) pads to 18 in 3 chunks, (20, 6) to 24 in 4, (16, 12) to 24 in 2, (20, 12)
    to 24 in 2, (22, 18) to 36 in 2. A constant chunk (the gated delta rule's 64) at s = 100, 150, 130, 90: 128, 192,
    192, 128 in 2, 3, 3, 2 chunks. Controls: ``s + 1`` and ``2*s`` (no padding) keep their forms; without the
    padded form no expression fits (checked by removing ``_padded`` from ``_fit_over``: FitError)."""
    from fitplan_torch.learn.fit import Fitter

    pts = [(16, 6), (20, 6), (16, 12), (20, 12), (22, 18)]
    f = Fitter([{"b": 2, "s": s, "chunk_size": c} for s, c in pts], {"s": 1, "chunk_size": 2})
    assert f.fit([18, 24, 24, 24, 36]) == "chunk_size*ceil_div(s, chunk_size)"
    assert f.fit([3, 4, 2, 2, 2]) == "ceil_div(s, chunk_size)"
    g = Fitter([{"b": 2, "s": s} for s in (100, 150, 130, 90)], {"s": 1})
    assert g.fit([128, 192, 192, 128]) == "64*ceil_div(s, 64)"
    assert g.fit([2, 3, 3, 2]) == "ceil_div(s, 64)"
    assert g.fit([101, 151, 131, 91]) == "1 + s" and g.fit([200, 300, 260, 180]) == "2*s"


def _learned(model_type: str, tmp_path):
    from fitplan.arch.archfile import ArchFile

    from fitplan_torch.learn import derive, learner
    from fitplan_torch.learn.command import shrink

    cfg = shrink(bench_module("learn_breadth").default_config(model_type))
    data, _, _ = derive.learn_full(cfg, log=lambda *a: None, variants=(("16", "eager"),), first_only=True)
    paths = learner.write_learned(data, tmp_path / "arch", log=lambda *a: None)
    (tmp_path / "config.json").write_text(json.dumps(cfg, default=str))
    return cfg, data, ArchFile(paths[0]), derive.hf_config(cfg).to_dict()


def test_mamba2_file_holds_up_to_one_chunk_and_refuses_beyond(tmp_path):
    """mamba2 shrunk (chunk 256, probes at s = 16..20): every variant holds where ``s <= chunk_size``; the core
    takes s = 256 and refuses s = 257 naming the bound and the config's values, and the CLI exits 2 with it."""
    pytest.importorskip("torch")
    from fitplan.errors import FitplanError

    cfg, data, arch, env = _learned("mamba2", tmp_path)
    assert cfg["chunk_size"] == 256
    assert all(v["when"].endswith(" and s <= chunk_size") for v in data["variants"]), data["variants"]
    assert arch.variant("16", "eager", {**env, "b": 2, "s": 256})
    with pytest.raises(FitplanError, match=r"s=257.*s <= chunk_size"):
        arch.variant("16", "eager", {**env, "b": 2, "s": 257})
    run = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--model", str(tmp_path / "config.json"),
                          "--max-seq-length", "300", "--per-device-train-batch-size", "2"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "FITPLAN_ARCH_DIR": str(tmp_path / "arch"), "FITPLAN_NO_CACHE": "1"})
    assert run.returncode == 2, run.stderr[-2000:]
    said = " ".join((run.stderr + run.stdout).split())  # the CLI wraps long messages at the terminal's width
    assert "s=300" in said and "s <= chunk_size" in said and "Traceback" not in said


def test_llama_file_has_no_sequence_bound(tmp_path):
    """Control: llama pads nothing along the sequence (its labels' shift pad keeps ``s``): no ``s <=`` bound."""
    pytest.importorskip("torch")
    _, data, _, _ = _learned("llama", tmp_path)
    assert not any("s <=" in (v["when"] or "") for v in data["variants"]), data["variants"]
