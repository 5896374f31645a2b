"""``--model ORG/NAME[@revision]``: config.json from a Hugging Face cache laid out as ``huggingface_hub`` lays it
out (``models--ORG--NAME/{refs,snapshots,blobs}``), built in a temp dir; no network (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fitplan import estimate
from fitplan.errors import FitplanError

DATA = Path(__file__).parent / "data" / "configs"


def _cache_repo(cache: Path, repo: str, config: dict, *, revision: str = "main", commit: str | None = None) -> str:
    """Lay out ``repo``'s config.json as huggingface_hub does: the file is a blob named by its hash,
    ``snapshots/<commit>/config.json`` a relative symlink to it, ``refs/<revision>`` the commit."""
    text = json.dumps(config).encode()
    commit = commit or hashlib.sha1(repo.encode() + revision.encode()).hexdigest()
    folder = cache / ("models--" + repo.replace("/", "--"))
    blob = folder / "blobs" / hashlib.sha256(text).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(text)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    return commit


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_id_from_cache_offline(hf_cache):
    cfg = json.loads((DATA / "tiny-llama" / "config.json").read_text())
    _cache_repo(hf_cache, "acme-research/tiny-llama-test", cfg)
    est = estimate(model="acme-research/tiny-llama-test", gpu="a100-80gb")
    by_file = estimate(model=str(DATA / "tiny-llama" / "config.json"), gpu="a100-80gb")
    assert est.arch.name == "acme-research/tiny-llama-test"
    assert "Hugging Face Hub" in est.arch.source
    assert est["peak_bytes"] == by_file["peak_bytes"]
    assert est["param_count"] == by_file["param_count"]


def test_hub_revision_resolves_through_refs(hf_cache):
    """``@v2`` reads refs/v2 (a tag) and its snapshot, not main's."""
    small = json.loads((DATA / "tiny-llama" / "config.json").read_text())
    big = {**small, "num_hidden_layers": small["num_hidden_layers"] * 2}
    _cache_repo(hf_cache, "acme-research/tiny", small)
    _cache_repo(hf_cache, "acme-research/tiny", big, revision="v2", commit="b" * 40)
    a = estimate(model="acme-research/tiny")
    b = estimate(model="acme-research/tiny@v2")
    assert b.arch.num_hidden_layers == 2 * a.arch.num_hidden_layers
    c = estimate(model="acme-research/tiny@" + "b" * 40)  # a commit hash names its snapshot directly
    assert c.arch.num_hidden_layers == b.arch.num_hidden_layers


def test_hub_id_not_cached_offline_is_a_clean_error(hf_cache):
    with pytest.raises(FitplanError) as e:
        estimate(model="acme-research/not-downloaded")
    text = e.value.render()
    assert "acme-research/not-downloaded" in text and "HF_HUB_OFFLINE" in text
    assert e.value.exit_code == 2


def test_catalog_names_and_aliases_win_over_the_hub(hf_cache):
    """A catalog alias that looks like a Hub id never reaches the cache (nothing is cached here)."""
    est = estimate(model="meta-llama/Llama-2-7b-hf")
    assert est.arch.name == "llama-2-7b"


def test_unknown_plain_name_is_still_a_catalog_error(hf_cache):
    with pytest.raises(FitplanError) as e:
        estimate(model="lama-2-7b")
    assert "did you mean" in e.value.render()


def test_cli_hub_id_offline_exit_2_no_traceback(hf_cache, tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "fitplan", "estimate", "--model", "nobody/nothing", "--gpu", "a100-80gb"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "nobody/nothing" in r.stderr
