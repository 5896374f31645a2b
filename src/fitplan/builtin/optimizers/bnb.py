"""bitsandbytes 0.50.2 optimizers as the HF Trainer builds them (``_get_bitsandbytes_optimizer``): AdamW,
AdEMAMix, Lion and RMSprop in 8-bit (blockwise) and 32-bit, paged or not.

State bytes follow ``bitsandbytes/optim/optimizer.py`` (``Optimizer1State`` / ``Optimizer2State.init_state``)
and ``ademamix.py``; they are measured exactly by the referee on this CPU (bitsandbytes' CPU backend) in fp32
and bf16 (``tests/test_optimizer_names.py``). Paged variants allocate the same bytes, on CUDA in unified memory
(``cudaMallocManaged``, outside PyTorch's caching allocator) for tensors of 1e5 elements or more, which the
driver may evict to host RAM under pressure; fitplan counts them on the GPU. The CUDA kernels
(``backends/cuda/ops.py``) update in place: no step temporaries (source; the CPU backend's dequantised
temporaries are not what a GPU allocates).
"""

from __future__ import annotations

from fitplan.builtin.optimizers import step_work as sw
from fitplan.builtin.optimizers._common import TF, bnb_states
from fitplan.inputs.optimizer import OptimizerSpec

SRC = "bitsandbytes 0.50.2 bitsandbytes/optim/optimizer.py"


def _states(states: int, eight_bit: bool, maps: int):
    def f(ctx):
        return bnb_states(ctx, states, eight_bit=eight_bit, maps=maps)

    f.__doc__ = (f"{states} state(s) per tensor, " + ("blockwise 8-bit (fp32 below 4,096 elements and for "
                 "nn.Embedding weights)" if eight_bit else "fp32 whatever the parameter dtype")
                 + (f", {maps} shared 1 KiB quantisation map(s)" if maps and eight_bit else ""))
    return f


def _no_bf16_32bit_kernel(run):
    """bitsandbytes' 32-bit CUDA kernel table (``backends/cuda/ops.py``) has no bf16 entry for RMSprop:
    ``_optimizer_update_32bit_impl`` raises "Gradient+optimizer bit data type combination not supported"."""
    if run.device == "cuda" and run.grad_dtype == "bf16":
        return ("bitsandbytes 0.50.2 has no bf16-gradient kernel for 32-bit RMSprop on CUDA (backends/cuda/ops.py: "
                "ValueError 'Gradient+optimizer bit data type combination not supported'); the 8-bit variant uses it "
                "for tensors under 4,096 elements too. Use fp32 trainable weights (bf16-mixed) or another optim")
    return None


def _step_work(cls, states, eight_bit) -> dict:
    """8-bit blockwise AdamW: one ``optimizer_update_8bit_blockwise`` kernel per tensor (plus its absmax pass),
    priced by :func:`~fitplan.builtin.optimizers.step_work.adam8bit_bytes`; the others: the default single pass."""
    if cls == "AdamW" and eight_bit and states == 2:
        return {"step_bytes": sw.adam8bit_bytes, "step_kernels": lambda ctx: 2 * ctx.num_tensors}
    return {}


def _spec(name, cls, states, eight_bit, maps, flops, *, paged=False, aliases=(), check=None, doc="", search=False):
    kind = "8-bit blockwise" if eight_bit else "32-bit"
    return OptimizerSpec(
        name=name, aliases=aliases, state_bytes=_states(states, eight_bit, maps), flops_per_param=flops,
        states_per_param=states * (0.25 if eight_bit else 1.0), hf=True, measured_on_cpu=True, check=check, search=search,
        torch_class=f"bitsandbytes.optim.{cls}", torch_kwargs={"optim_bits": 8 if eight_bit else 32} |
        ({"is_paged": paged} if "RMSprop" not in cls else {}),
        doc=f"bitsandbytes {cls} {kind}{' (paged: CUDA unified memory)' if paged else ''}: {doc}",
        source=f"{SRC}; {TF} _get_bitsandbytes_optimizer; transformers 5.24 trainer.py (Embedding 32-bit override)",
        **_step_work(cls, states, eight_bit),
    )


ADAM = "exp_avg + exp_avg_sq"
ADEMAMIX = "two EMAs (m1, m2: one (2, *shape) state) + nu"
LION = "one momentum state"
RMS = "square_avg"

SPECS = (
    _spec("adamw_8bit", "AdamW", 2, True, 2, 14, aliases=("adamw_bnb_8bit",), doc=ADAM, search=True),
    _spec("paged_adamw_8bit", "AdamW", 2, True, 2, 14, paged=True, doc=ADAM, search=True),
    _spec("paged_adamw_32bit", "AdamW", 2, False, 0, 12, paged=True, doc=ADAM),
    _spec("ademamix", "AdEMAMix", 3, False, 0, 18, doc=ADEMAMIX),
    _spec("ademamix_8bit", "AdEMAMix", 3, True, 2, 22, doc=ADEMAMIX),
    _spec("paged_ademamix_32bit", "AdEMAMix", 3, False, 0, 18, paged=True, doc=ADEMAMIX),
    _spec("paged_ademamix_8bit", "AdEMAMix", 3, True, 2, 22, paged=True, doc=ADEMAMIX),
    _spec("lion_8bit", "Lion", 1, True, 1, 11, doc=LION),
    _spec("lion_32bit", "Lion", 1, False, 0, 9, doc=LION),
    _spec("paged_lion_8bit", "Lion", 1, True, 1, 11, paged=True, doc=LION),
    _spec("paged_lion_32bit", "Lion", 1, False, 0, 9, paged=True, doc=LION),
    _spec("rmsprop_bnb", "RMSprop", 1, False, 0, 8, aliases=("rmsprop_bnb_32bit",), check=_no_bf16_32bit_kernel, doc=RMS),
    _spec("rmsprop_bnb_8bit", "RMSprop", 1, True, 1, 10, check=_no_bf16_32bit_kernel, doc=RMS),
)
