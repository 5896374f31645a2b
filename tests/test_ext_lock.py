"""A torch extension build lock left by a killed build is named, not waited on forever (fitplan_torch/ext_lock.py).

The folder is checked against torch's own ``cpp_extension._get_build_directory``; the refusal is checked through
the DeepSpeed referee's entry point with a real lock file where torch would look for it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

import fitplan  # noqa: E402
from fitplan.api import FitplanError  # noqa: E402

TINY = str(Path(__file__).resolve().parent / "data" / "configs" / "tiny-llama" / "config.json")


@pytest.mark.parametrize("explicit_root", [True, False])
def test_build_directory_is_torchs(tmp_path, monkeypatch, explicit_root):
    from torch.utils.cpp_extension import _get_build_directory

    from fitplan_torch.ext_lock import DEEPSPEED_SHM_OP, build_directory

    if explicit_root:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    else:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # torch's user cache dir, kept in tmp
    assert build_directory(DEEPSPEED_SHM_OP) == _get_build_directory(DEEPSPEED_SHM_OP, verbose=False)


def _lock(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    return lock


def test_stale_lock_refuses_a_deepspeed_run_naming_the_file(tmp_path, monkeypatch):
    import fitplan_torch
    from fitplan_torch import ext_lock

    lock = _lock(tmp_path, monkeypatch)
    monkeypatch.setattr(ext_lock, "WAIT_S", 0.3)
    est = fitplan.estimate(model=TINY, per_device_train_batch_size=2, max_seq_length=32, zero_stage=2, num_gpus=2,
                           precision="bf16-master", optim="adamw_torch_fused")
    with pytest.raises(FitplanError) as e:
        fitplan_torch.validate(est, mode="cpu")
    assert str(lock) in str(e.value) and e.value.field == "validate"


def test_lock_released_during_the_wait_lets_the_run_go_on(tmp_path, monkeypatch):
    from fitplan_torch.ext_lock import check_extension_lock

    lock = _lock(tmp_path, monkeypatch)
    threading.Timer(0.3, lock.unlink).start()  # another build finishing
    check_extension_lock(wait_s=10.0, poll_s=0.05)
    assert not lock.exists()
