"""What the GPU must hold beyond tensor bytes, and whether it fits.

``device_total_bytes = peak × allocator_reserve_ratio + CUDA context + cuBLAS workspace``, with the
three terms from the ``[framework]`` ruleset (defaults: PyTorch's caching allocator keeps about 5 %
more reserved than allocated at the peak; the CUDA context of a PyTorch process with cuBLAS/cuDNN
loaded takes 300 MiB – 2 GiB; cuBLAS workspaces are a few MiB per stream). ``fitplan validate
--calibrate-out`` measures them on a real GPU and writes a ruleset that overrides the defaults.
"""

from __future__ import annotations

from ..declarations import quantity
from ..hookspecs import hookimpl


@quantity("bytes", category="memory")
def framework_overhead_bytes(peak_bytes, framework):
    """CUDA context + cuBLAS workspace + allocator reserve ``(ratio − 1) × peak``."""
    return int(framework.cuda_context_bytes + framework.cublas_workspace_bytes
               + (framework.allocator_reserve_ratio - 1) * peak_bytes)


@quantity("bytes", category="memory")
def device_total_bytes(peak_bytes, framework_overhead_bytes):
    """What the GPU must hold: the tensor peak plus framework overhead."""
    return peak_bytes + framework_overhead_bytes


@quantity("bytes")
def usable_bytes(gpu_spec):
    """Memory the GPU offers to a process (``torch.cuda.get_device_properties().total_memory``), or None without ``--gpu``."""
    return None if gpu_spec is None else gpu_spec.usable_bytes


@quantity("bool")
def fits(device_total_bytes, usable_bytes):
    """Whether ``device_total_bytes`` fits in ``usable_bytes`` (None without a GPU)."""
    return None if usable_bytes is None else device_total_bytes <= usable_bytes


@quantity("bytes")
def headroom_bytes(device_total_bytes, usable_bytes):
    """``usable − device_total`` (negative when it does not fit)."""
    return None if usable_bytes is None else usable_bytes - device_total_bytes


@hookimpl
def fitplan_register_quantities(register):
    for q in (framework_overhead_bytes, device_total_bytes, usable_bytes, fits, headroom_bytes):
        register(q)
