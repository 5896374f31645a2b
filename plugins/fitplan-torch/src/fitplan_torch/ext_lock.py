"""A torch extension build lock left behind, named instead of waited on forever.

DeepSpeed's CPU communication wrapper loads its shared-memory op on every rank
(deepspeed 0.19.8 ``comm/torch.py`` ``build_shm_op`` -> ``ShareMemCommBuilder`` ``deepspeed_shm_comm``,
``ops/op_builder/cpu/comm.py``) through torch's JIT loader, which takes a lock file in the extension's build
directory for every load, built or not (torch 2.13 ``utils/cpp_extension.py`` ``_jit_compile``: a
``FileBaton`` on ``<build dir>/lock``). A process killed while holding it leaves the file, and every later load
waits on it with no time limit (``utils/file_baton.py`` ``FileBaton.wait``): the referee would hang. Before a
DeepSpeed run, :func:`check_extension_lock` waits a bounded time for a lock another build holds, then refuses,
naming the file.
"""

from __future__ import annotations

import os
import sys
import time

from fitplan.api import FitplanError

DEEPSPEED_SHM_OP = "deepspeed_shm_comm"
"""``ShareMemCommBuilder.NAME`` (deepspeed/ops/op_builder/cpu/comm.py)."""

WAIT_S = 60.0
"""How long a lock may stay before it is taken for stale (a real build of the op takes seconds)."""


def build_directory(name: str) -> str:
    """The folder torch builds extension ``name`` in on a CPU build of torch, computed as
    ``cpp_extension._get_build_directory`` does without creating it: ``$TORCH_EXTENSIONS_DIR/name``, else
    ``<user cache>/torch_extensions/py<major><minor><abiflags>_cpu/name``."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_cpu"
        root = os.path.join(get_default_build_root(), tag)
    return os.path.join(root, name)


def check_extension_lock(name: str = DEEPSPEED_SHM_OP, wait_s: float | None = None, poll_s: float = 0.2) -> None:
    """Return once extension ``name`` has no build lock; refuse (exit 2) naming the file if it outlives ``wait_s``
    (default :data:`WAIT_S`)."""
    wait_s = WAIT_S if wait_s is None else wait_s
    lock = os.path.join(build_directory(name), "lock")
    deadline = time.monotonic() + wait_s
    while os.path.exists(lock):
        if time.monotonic() >= deadline:
            raise FitplanError(
                f"torch's build lock for {name} has stayed {wait_s:.0f} s: {lock} (a build killed part-way leaves "
                "it, and torch then waits on it forever)", field="validate",
                suggestion=f"if no other DeepSpeed run is building the op, delete {lock}")
        time.sleep(poll_s)
