"""The backward's elementwise work as torch's autograd runs it: one kernel per gradient formula, the reduction of a
broadcast input's gradient, and the sums of the gradients a tensor receives from several ops. The rules are
checked twice: their bytes derived by hand (fitplan's functions), and their premises measured on torch itself
(the aten ops the autograd engine dispatches during a backward, on the CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fitplan.trace.op_work import accumulated_gradients, aten
from fitplan.trace.step_trace import T


def test_elementwise_backward_runs_one_formula_per_gradient():
    # torch's derivatives.yaml gives mul one formula per input (self: grad * other, other: grad * self): two
    # kernels, each reading the incoming gradient; a broadcast input (a norm's weight) gets its gradient at the
    # output's shape, which at::sum_to then reduces: the full-size product is written and read once more.
    x, y, out = T(0, 24, "f32", True), T(1, 24, "f32", True), T(2, 24, "f32", True)  # 96 bytes each
    both = aten("mul.Tensor", {"self": x, "other": y}, [out], [x, y], [x, y], [-1, -1], 0, True)
    # 2 × the gradient (96) + the saved x and y (2 × 96) + the two input gradients (2 × 96)
    assert [(k.n, k.n * k.bytes) for k in both.bwd] == [(2, 6 * 96)]
    h, w, hw = T(3, 24, "bf16", True), T(-1, 4, "bf16", True, param=True), T(4, 24, "bf16", True)  # 48, 8, 48 B
    norm = aten("mul.Tensor", {"self": w, "other": h}, [hw], [w, h], [h], [-1], 8, True)
    # 2 × 48 (gradient read twice) + 48 + 8 (saved) + 48 (h's gradient) + 8 (w's) + 2 × 48 (the product summed)
    assert [(k.n, k.n * k.bytes) for k in norm.bwd] == [(2, 96 + 56 + 48 + 8 + 96)]
    one = aten("silu", {"self": x}, [out], [x], [x], [-1], 0, True)
    assert [(k.n, k.bytes) for k in one.bwd] == [(1, 3 * 96)]  # gradient + saved input + input gradient
    assert aten("add.Tensor", {"self": x, "other": y}, [out], [], [x, y], [0, 0], 0, True).bwd == ()  # passes it on


def test_a_tensor_differentiated_by_several_ops_pays_a_sum_per_extra_gradient():
    # autograd's InputBuffer adds each further gradient into the first: one kernel reading two, writing one
    h, y = T(0, 24, "f32", True), T(1, 10, "bf16", True)
    ops = [SimpleNamespace(grad_ins=(h,)), SimpleNamespace(grad_ins=(h, y)), SimpleNamespace(grad_ins=(h,))]
    assert accumulated_gradients(ops) == [96, 96]  # h: three gradients, two sums; y: one, none
    assert accumulated_gradients(ops[:1]) == []


def _backward_ops(loss) -> list[str]:
    """The aten ops torch's autograd engine dispatches for ``loss.backward()`` (CPU)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    grad = torch.ones_like(loss)
    with Log() as log:
        loss.backward(grad)
    return [op for op in log.ops if op != "detach"]  # AccumulateGrad storing a leaf's first gradient


def test_torch_runs_a_formula_per_input_and_sums_a_broadcast_gradient():
    torch = pytest.importorskip("torch")
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    assert _backward_ops(a * b) == ["mul", "mul"]  # grad * b, grad * a
    w, x = torch.randn(8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    ops = _backward_ops(w * x)
    assert (ops.count("mul"), ops.count("sum")) == (2, 1)  # w's gradient at x's shape, then summed to w's


def test_torch_sums_the_gradients_of_a_tensor_read_by_three_ops():
    torch = pytest.importorskip("torch")
    h = torch.randn(4, 8, requires_grad=True)
    ops = _backward_ops(h.sin() + h.cos() + h * 3)  # the adds pass the gradient; sin, cos, mul compute one each
    assert ops.count("add") + ops.count("add_") == 2  # three gradients of h, two sums (nothing else here adds)


def test_a_power_s_gradient_recomputes_the_power_first():
    # pow_backward: grad * (exponent * self.pow(exponent - 1)): a power and a scale of the saved input (each reads and
    # writes its 96 bytes), then the product: the gradient, the saved input, the input gradient
    x, out = T(0, 24, "f32", True), T(1, 24, "f32", True)
    work = aten("pow.Tensor_Scalar", {"self": x}, [out], [x], [x], [-1], 0, True)
    assert [(k.n, k.bytes) for k in work.bwd] == [(1, 3 * 96), (2, 2 * 96)]


def test_torch_runs_three_kernels_for_the_gradients_of_pow_and_rsqrt():
    torch = pytest.importorskip("torch")
    for f in (lambda x: x.pow(2), torch.rsqrt):
        x = (torch.rand(4, 8) + 1).requires_grad_()
        assert _backward_ops(f(x)) == ["pow", "mul", "mul"]


def test_a_slice_s_gradient_is_a_fill_of_the_input_and_a_copy():
    # slice_backward: zeros of the input's size (96 bytes written), then the incoming gradient (48) copied into its
    # half: 48 read + 48 written; nothing forward (a view); a slice taking the whole tensor passes the gradient on
    x, half = T(0, 24, "f32", True), T(0, 12, "f32", True)  # the view shares its input's storage
    work = aten("slice.Tensor", {"self": x}, [half], [], [x], [-1], 0, True)
    assert work.fwd == () and [(k.n, k.bytes) for k in work.bwd] == [(1, 96), (1, 2 * 48)]
    assert aten("slice.Tensor", {"self": x}, [T(0, 24, "f32", True)], [], [x], [0], 0, True) is None
    assert aten("slice.Tensor", {"self": x}, [half], [], [x], [-1], 0, False) is None  # no backward: nothing
    assert aten("view", {"self": x}, [half], [], [x], [-1], 0, True) is None  # other views scatter nothing


def test_torch_fills_and_copies_for_a_slice_s_gradient():
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(4, 8, requires_grad=True)
    y = x[..., 4:]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y.backward(torch.ones_like(y))
    inner = [e.name for e in prof.events() if e.cpu_parent is not None and e.cpu_parent.name == "aten::slice_backward"]
    assert inner == ["aten::zeros", "aten::slice", "aten::copy_"]  # zeros = empty + zero_: a fill, then the copy


def test_a_division_s_divisor_gradient_runs_four_kernels():
    # x / y, both 96 bytes: the dividend's gradient grad / y (96 read twice, 96 written); the divisor's
    # -grad * ((x / y) / y): x / y (3 × 96), ÷ y (3 × 96), -grad (2 × 96), the product (3 × 96): 14 × 96 in 5 kernels
    x, y, out = T(0, 24, "f32", True), T(1, 24, "f32", True), T(2, 24, "f32", True)
    both = aten("div.Tensor", {"self": x, "other": y}, [out], [x, y], [x, y], [-1, -1], 0, True)
    assert sum(k.n for k in both.bwd) == 5 and sum(k.n * k.bytes for k in both.bwd) == 14 * 96
    one = aten("div.Tensor", {"self": x, "other": y}, [out], [y], [x], [-1], 0, True)  # y is a constant
    assert [(k.n, k.bytes) for k in one.bwd] == [(1, 3 * 96)]


def test_torch_runs_five_kernels_for_the_gradients_of_a_division():
    torch = pytest.importorskip("torch")
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    assert sorted(_backward_ops(a / b)) == ["div", "div", "div", "mul", "neg"]
    c = torch.randn(4, 8, requires_grad=True)
    assert _backward_ops(c / torch.randn(4, 8)) == ["div"]  # the dividend alone: grad / other


def test_an_expand_s_gradient_is_one_sum_over_the_broadcast():
    # expand: self: at::sum_to(grad, sizes): one reduction reading the 96-byte gradient and writing the 24-byte input
    k, wide = T(0, 6, "f32", True), T(0, 24, "f32", True)
    work = aten("expand", {"self": k}, [wide], [], [k], [-1], 0, True)
    assert work.fwd == () and [(n.n, n.bytes) for n in work.bwd] == [(1, 96 + 24)]


def test_torch_sums_an_expanded_tensor_s_gradient_once():
    torch = pytest.importorskip("torch")
    k = torch.randn(2, 2, 5, 4, requires_grad=True)  # repeat_kv: (b, kv, s, d) -> (b, kv * 3, s, d)
    ops = _backward_ops(k[:, :, None].expand(2, 2, 3, 5, 4).reshape(2, 6, 5, 4))
    assert [op for op in ops if op not in ("view", "squeeze", "unsqueeze")] == ["sum"]
