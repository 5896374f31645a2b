"""What the GPU must hold beyond tensor bytes, and whether it fits.

CUDA realities, each a named term calibratable through the ``[framework]`` ruleset
(``rulesets/framework/framework.toml``; ``fitplan validate --calibrate-out`` measures them on a GPU):

* ``allocator_block_bytes`` (512): the caching allocator rounds every allocation up to a multiple of
  512 bytes. Already inside ``peak_bytes`` (the step trace rounds activations and gradients,
  ``allocator_rounding_bytes`` the model states), because ``torch.cuda.max_memory_allocated`` counts it.
* ``allocator_reserve_ratio`` (1.05): reserved / allocated at the peak (fragmentation of the caching
  allocator's segments): ``(ratio − 1) × peak``.
* ``cuda_context_bytes`` (500 MiB): the CUDA context of a PyTorch process with cuBLAS/cuDNN loaded
  (300 MiB – 2 GiB depending on GPU and libraries; not visible to ``memory_allocated``).
* ``cublas_workspace_bytes`` (8 MiB): cuBLAS workspaces (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, 4 MiB × 2).

``device_total_bytes = peak + (ratio − 1) × peak + context + workspace``. On ``device = "cpu"`` (the
CPU referee) none of these exist: the overhead is 0.
"""

from __future__ import annotations

from fitplan.engine.declarations import quantity
from fitplan.pluginmgr.hookspecs import hookimpl


@quantity("bytes", category="memory", label="CUDA context + allocator reserve", short_label="CUDA context + reserve", json_key="memory.per_gpu_bytes.framework_overhead", row="framework_overhead", role="overhead")
def framework_overhead_bytes(peak_bytes, framework, device):
    """CUDA context + cuBLAS workspace + allocator reserve ``(ratio − 1) × peak`` (0 on the CPU)."""
    if device == "cpu":
        return 0
    return int(framework.cuda_context_bytes + framework.cublas_workspace_bytes
               + (framework.allocator_reserve_ratio - 1) * peak_bytes)


@quantity("bytes", category="memory", label="device total", json_key="memory.per_gpu_bytes.device_total", short="device_total", role="device_total")
def device_total_bytes(peak_bytes, framework_overhead_bytes):
    """What the GPU must hold: the tensor peak plus framework overhead."""
    return peak_bytes + framework_overhead_bytes


@quantity("bytes", json_key="memory.usable_bytes", role="usable")
def usable_bytes(gpu_spec):
    """Memory the GPU offers to a process (``torch.cuda.get_device_properties().total_memory``), or None without ``--gpu``."""
    return None if gpu_spec is None else gpu_spec.usable_bytes


@quantity("bool", json_key="memory.fits", role="fit", type="bool")
def fits(device_total_bytes, usable_bytes):
    """Whether ``device_total_bytes`` fits in ``usable_bytes`` (None without a GPU)."""
    return None if usable_bytes is None else device_total_bytes <= usable_bytes


@quantity("bytes", json_key="memory.headroom_bytes", role="headroom")
def headroom_bytes(device_total_bytes, usable_bytes):
    """``usable − device_total`` (negative when it does not fit)."""
    return None if usable_bytes is None else usable_bytes - device_total_bytes


@hookimpl
def fitplan_register_quantities(register):
    for q in (framework_overhead_bytes, device_total_bytes, usable_bytes, fits, headroom_bytes):
        register(q)
