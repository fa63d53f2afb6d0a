"""Host cost of the eager autograd glue: what an op's forward and backward ask of PyTorch besides the
Triton launches. On a GPU every torch op (an allocation, a fill, a sum, a cast) is a launch and
microseconds of host time; under the interpreter they are counted here with a TorchDispatchMode (the
Triton launches themselves are stubbed: only the host path is exercised, tiny shapes, no kernel runs).
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hearth.kernels as hk
from hearth.kernels._common import interpret_mode
from tests.kernels.tolerance import DEVICE

# importlib: `hearth.kernels.rope` as an attribute is the function, not the module
attention_mod, ce_mod, lce_mod, ln_mod, mm_mod, rope_mod = (
    importlib.import_module(f"hearth.kernels.{m}")
    for m in ("attention", "cross_entropy", "linear_cross_entropy", "layer_norm", "matmul", "rope")
)

# metadata-only ops: no allocation, no launch (autograd's own detach / alias bookkeeping included)
VIEWS = {"view", "_unsafe_view", "reshape", "detach", "alias", "t", "transpose", "permute", "slice", "select",
         "unbind", "split", "as_strided", "expand", "squeeze", "unsqueeze", "movedim"}


class _AtenOps(TorchDispatchMode):
    """The aten ops (overload packet names) that reach the dispatcher while the mode is on."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def work(self) -> Counter:
        """The ops that are a launch or an allocation on the GPU."""
        return Counter(op for op in self.seen if op not in VIEWS)


@pytest.fixture
def launches(monkeypatch):
    """Under the interpreter, Triton launches are counted and not run (outputs stay uninitialised: these
    tests count host work only), except the cross-entropy target check's, whose count the host reads back and
    acts on: it runs, counted, with the aten-op modes off (the interpreter's own tensor work is not the op's). On
    a GPU the kernels run, uncounted (count stays None)."""
    count = [None]
    if interpret_mode():
        from torch.utils._python_dispatch import _disable_current_modes
        from triton.runtime.interpreter import InterpretedFunction

        count[0] = 0
        real = InterpretedFunction.run

        def stub(self, *args, **kwargs):
            count[0] += 1
            if self.fn.__name__ == "_target_stats_kernel":
                with _disable_current_modes():
                    real(self, *args, **kwargs)

        monkeypatch.setattr(InterpretedFunction, "run", stub)
    return count


def _leaf(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype).requires_grad_()


def _backward_ops(out, grad=None) -> _AtenOps:
    """The aten ops of a plain backward through `out` (grad: ones)."""
    grad = torch.ones_like(out) if grad is None else grad
    with _AtenOps() as mode:
        torch.autograd.backward([out], [grad])
    return mode


# ------------------------------------------------------------------ zero gradients of saved-only outputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_backward_is_one_partial_buffer_and_one_sum(launches, dtype):
    """mean / rstd are outputs only to be saved: no zero gradient is made for them (two zeros launches per
    backward before), and the dw / db partials are summed and written in the parameters' dtypes by ONE
    launch (before: two torch sums and a cast each, then one sum and one cast, all torch ops)."""
    x, w, b = _leaf(8, 32, dtype=dtype), _leaf(32, dtype=dtype), _leaf(32, dtype=dtype)
    # one backward first: on a GPU the first call picks its backward config (timed launches, their buffers)
    _backward_ops(hk.layer_norm(x, w, b))
    x.grad = w.grad = b.grad = None
    if launches[0] is not None:
        launches[0] = 0
    y = hk.layer_norm(x, w, b)
    mode = _backward_ops(y)
    # dx, the [2, G, N] fp32 partials, dw and db (written by the sum kernel in their dtypes: no torch sum,
    # cast or clone)
    assert mode.work() == Counter({"empty": 4}), mode.seen
    assert launches[0] in (None, 1 + 2)  # the forward, the backward and the sum kernel (under the interpreter)
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_layer_norm_reduction_matches_fp64_on_both_routes():
    """The eager route (dbias in the bias dtype, here bf16) and the custom op's route (dbias in fp32, separate
    tensors) against the fp64 sums of the same partial products: dx, dw and db."""
    x, w = _leaf(37, 48), _leaf(48)
    dy = torch.randn_like(x)
    _, mean, rstd = ln_mod._forward(x.detach(), w.detach(), torch.zeros_like(w.detach()), 1e-5)
    xd, dyd = x.detach().double(), dy.double()
    xhat = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-5)
    want_dw, want_db = (dyd * xhat).sum(0), dyd.sum(0)
    eager = ln_mod._backward(dy, x.detach(), w.detach(), mean, rstd, db_dtype=torch.bfloat16)
    separate = ln_mod._backward(dy, x.detach(), w.detach(), mean, rstd, separate=True)
    assert eager[2].dtype == torch.bfloat16 and separate[2].dtype == torch.float32
    torch.testing.assert_close(eager[0], separate[0], rtol=0, atol=0)
    for dw, db, tol in ((separate[1], separate[2], 1e-5), (eager[1], eager[2], 2 * torch.finfo(torch.bfloat16).eps)):
        torch.testing.assert_close(dw.double(), want_dw, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(db.double(), want_db, rtol=tol, atol=1e-5)
    assert separate[1].untyped_storage().data_ptr() != separate[2].untyped_storage().data_ptr()


def test_attention_backward_adds_nothing_to_the_launcher(launches):
    """lse is saved-only (non-differentiable): the backward is exactly the launcher's ops, without a zero
    [B, Hq, Tq] gradient for lse (one zeros launch per backward before)."""
    q, k, v = _leaf(1, 2, 16, 16), _leaf(1, 1, 16, 16), _leaf(1, 1, 16, 16)
    out = hk.attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    mode = _backward_ops(out, do)
    _, lse = attention_mod._attention_forward(q.detach(), k.detach(), v.detach(), True, 0.25)
    with _AtenOps() as direct:
        attention_mod._attention_backward(do, q.detach(), k.detach(), v.detach(), out.detach(), lse, True, 0.25)
    assert mode.work() == direct.work(), (mode.seen, direct.seen)


def test_the_op_probe_sees_a_zero_gradient_materialisation():
    """The probe above can fail: a Function returning a saved-only output WITHOUT set_materialize_grads(False)
    shows autograd's zeros in its backward."""

    class Leaky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            stat = x.new_empty(x.shape[0])
            ctx.mark_non_differentiable(stat)
            return x * 2, stat

        @staticmethod
        def backward(ctx, dy, _dstat):
            return dy * 2

    y, _ = Leaky.apply(_leaf(4, 8))
    assert _backward_ops(y).work()["zeros"] == 1


# ------------------------------------------------------------------------ one scale for every gradient
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_cross_entropy_backward_makes_the_scale_once(launches, with_bias):
    """grad_output * factor is one launch for grad_x, grad_W (and grad_b), not one per gradient; the
    in-place scalings are Triton launches."""
    x, w = _leaf(8, 16), _leaf(32, 16, scale=0.3)
    b = _leaf(32) if with_bias else None
    target = torch.randint(0, 32, (8,), device=DEVICE)
    loss = hk.linear_cross_entropy(x, w, target, linear_bias=b)
    before = launches[0] or 0
    mode = _backward_ops(loss)
    assert mode.work() == Counter({"mul": 1}), mode.seen  # fp32: no cast of grad_output or of grad_b
    if launches[0] is not None:  # the in-place scalings, one Triton launch per gradient
        assert launches[0] - before == (3 if with_bias else 2)


# ------------------------------------------------------------------- no Function glue in a plain backward
@pytest.mark.parametrize("mod,attr,make", [
    (rope_mod, "_rope", lambda: hk.rope(_leaf(1, 2, 4, 8), _leaf(1, 1, 4, 8), torch.randn(1, 4, 8, device=DEVICE),
                                        torch.randn(1, 4, 8, device=DEVICE))[0]),
    (mm_mod, "_matmul_diff", lambda: hk.matmul(_leaf(8, 16), _leaf(16, 8))),
], ids=["rope", "matmul"])
def test_plain_backward_calls_the_launcher_not_the_function(launches, monkeypatch, mod, attr, make):
    """rope's and matmul's backward is the op again: through autograd.Function only when a double backward
    records it (create_graph=True); a plain backward calls the launcher (no ctx, no setup_context)."""
    calls = []
    real = getattr(mod, attr)

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(mod, attr, counted)
    out = make()
    calls.clear()
    _backward_ops(out)
    assert calls == []
    out = make()
    calls.clear()
    torch.autograd.grad(out, _leaves_of(out), torch.ones_like(out), create_graph=True)
    assert len(calls) >= 1  # the probe can fail: a recorded backward does go through the Function


def _leaves_of(out):
    seen, stack, leaves = set(), [out.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            leaves.append(fn.variable)
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


def test_rope_double_backward_matches_torch():
    """create_graph=True still records rope's backward (differentiable): the grad of a function of the
    first gradient matches the PyTorch formula."""
    from tests.kernels.test_rope import reference, tables

    cos, sin = tables(1, 6, 8, torch.float32)

    def run(fn, q, k):
        qo, ko = fn(q, k)
        dq, dk = torch.autograd.grad(qo.square().sum() + (ko * 3).square().sum(), (q, k), create_graph=True)
        return torch.autograd.grad((dq * dq.detach()).sum() + dk.sum() * 0.5 + dk.square().sum(), (q, k))

    q, k = _leaf(1, 2, 6, 8), _leaf(1, 1, 6, 8)
    got = run(lambda a, b: hk.rope(a, b, cos, sin), q, k)
    want = run(lambda a, b: (reference(a, cos, sin), reference(b, cos, sin)), q, k)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_matmul_double_backward_matches_torch():
    a, b = _leaf(8, 16), _leaf(16, 4)

    def run(mm):
        c = mm(a, b)
        da, db = torch.autograd.grad(c.square().sum(), (a, b), create_graph=True)
        return torch.autograd.grad(da.square().sum() + (db * b).sum(), (a, b))

    got = run(hk.matmul)
    want = run(torch.matmul)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-3)


# -------------------------------------------------------------------------- the cross-entropy forward
def test_cross_entropy_forward_check_and_count_are_one_launch(launches):
    """The target check and 1/n_valid come from one Triton launch (_target_stats: two 0-d outputs), so the
    forward's torch ops are its allocations, the loss's sum and mean, and the one host read of the check (the
    count of bad targets, which also gates the kernel; on CUDA a pinned copy and an event instead of the scalar
    read here): 6 torch ops and 2 launches, where the torch form of the check took 12 ops and 1 launch."""
    x = _leaf(8, 16)
    t = torch.randint(0, 16, (8,), device=DEVICE)
    with _AtenOps() as mode:
        hk.cross_entropy(x, t)
    want = Counter({"empty": 3, "sum": 1, "mul": 1, "_local_scalar_dense": 1})
    if DEVICE.type == "cuda":  # the count's pinned host buffer and its copy (the scalar read is then of that buffer)
        want += Counter({"empty": 1, "copy_": 1})
    assert mode.work() == want, mode.seen
    assert launches[0] in (None, 2)


@pytest.mark.parametrize("ignore_index", [-100, 3, 16, 2**40])
def test_target_check_accepts_and_refuses_what_the_rule_says(ignore_index):
    """Every non-ignored target in [0, V): the one-launch check accepts and refuses exactly those (V = 16), names
    the first bad value, counts the bad targets into the gate, and gives 1 / n_valid bit for bit as the torch form
    it replaced."""
    cases = [[0, 15, 3, 7], [0, 16, 1, 2], [-1, 0, 1, 2], [2**62, 0, 0, 0], [-2**62, 5, 5, 5], [ignore_index, 2, 16, 0],
             [ignore_index] * 4, [5, ignore_index, -7, 1]]
    for values in cases:
        t = torch.tensor(values, device=DEVICE)
        bad = [v for v in values if v != ignore_index and not 0 <= v < 16]
        n = sum(v != ignore_index for v in values)
        old_formula = 1.0 / torch.tensor(n, device=DEVICE).clamp(min=1).to(torch.float32)
        gate, inv_n = ce_mod._target_stats(t, 16, ignore_index)
        assert gate.dtype == torch.int32 and gate.dim() == 0 and int(gate) == len(bad)
        assert torch.equal(inv_n, old_formula)  # bit for bit, fp32, 0-d
        if bad:
            with pytest.raises(ValueError, match=rf"must be in \[0, 16\) or equal ignore_index={ignore_index}, found {bad[0]}$"):
                ce_mod._check_targets(t, 16, ignore_index)
        else:
            assert torch.equal(ce_mod._check_targets(t, 16, ignore_index), old_formula)


@pytest.mark.parametrize("n", [0, 1, 4097, 9000])
def test_target_stats_walks_every_tile_of_a_long_target(n):
    """_target_stats' one program loops over the target in tiles of up to TARGET_STATS_BLOCK: the count of bad
    targets and 1 / n_valid match torch's at lengths of none, one, and more than one tile (a ragged last one)."""
    g = torch.Generator(device="cpu").manual_seed(n)
    t = torch.randint(-3, 40, (n,), generator=g)
    t[torch.rand(n, generator=g) < 0.3] = -100
    t = t.to(DEVICE)
    gate, inv_n = ce_mod._target_stats(t, 37, -100)
    valid = t != -100
    assert int(gate) == int((((t < 0) | (t >= 37)) & valid).sum())
    assert torch.equal(inv_n, 1.0 / valid.sum().clamp(min=1).to(torch.float32))


# --------------------------------------------------------------------------------------- the LoRA nodes
def test_lora_mlp_eager_backward_bumps_the_overwritten_saved_tensors():
    """The eager LoRA MLP backward (no dispatcher) overwrites g and u as the custom op did: their version
    counters are bumped, so a second backward through the graph is refused, not silently wrong."""
    from hearth.kernels.lora import lora_swiglu_mlp

    x = _leaf(4, 8)
    base = [torch.randn(16, 8, device=DEVICE) * 0.3, torch.randn(16, 8, device=DEVICE) * 0.3,
            torch.randn(8, 16, device=DEVICE) * 0.3]
    lora = [_leaf(2, 8, scale=0.3), _leaf(16, 2, scale=0.3), _leaf(2, 8, scale=0.3), _leaf(16, 2, scale=0.3),
            _leaf(2, 16, scale=0.3), _leaf(8, 2, scale=0.3)]
    out = lora_swiglu_mlp(x, *base, *lora, 0.5, 0.5, 0.5)
    assert type(out.grad_fn).__name__ == "LoraSwigluMlpFwdFunctionBackward"  # the eager route
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# ------------------------------------------------------------------ no view nodes around the fused nodes
def _mlp_call(x):
    from hearth.kernels.swiglu import swiglu_mlp

    g = torch.Generator(device=DEVICE).manual_seed(1)
    ws = [torch.randn(*s, device=DEVICE, generator=g) * 0.3 for s in ((16, 8), (16, 8), (8, 16))]
    return swiglu_mlp(x, *ws)


def _lora_linear_call(x):
    from hearth.kernels.lora import lora_linear

    g = torch.Generator(device=DEVICE).manual_seed(2)
    w, a, b = (torch.randn(*s, device=DEVICE, generator=g) * 0.3 for s in ((12, 8), (2, 8), (12, 2)))
    return lora_linear(x, w, None, a, b, 0.5)


def _lora_mlp_call(x, recompute_up=False):
    from hearth.kernels.lora import lora_swiglu_mlp

    g = torch.Generator(device=DEVICE).manual_seed(3)
    shapes = ((16, 8), (16, 8), (8, 16), (2, 8), (16, 2), (2, 8), (16, 2), (2, 16), (8, 2))
    ts = [torch.randn(*s, device=DEVICE, generator=g) * 0.3 for s in shapes]
    return lora_swiglu_mlp(x, *ts, 0.5, 0.5, 0.5, recompute_up=recompute_up)


NODE_CALLS = {"swiglu_mlp": _mlp_call, "lora_linear": _lora_linear_call, "lora_swiglu_mlp": _lora_mlp_call,
              "lora_swiglu_mlp_recompute": lambda x: _lora_mlp_call(x, recompute_up=True)}


@pytest.mark.parametrize("name", sorted(NODE_CALLS))
def test_fused_node_takes_leading_dims_without_view_nodes(name):
    """[B, T, H] input: the leading dims are flattened INSIDE the node, so the graph is the node itself, not
    view -> node -> view (two autograd nodes of host time each way before); values and gradients are the
    flattened call's, and the output (not a view) may be modified in place."""
    call = NODE_CALLS[name]
    x3 = _leaf(2, 3, 8)
    out3 = call(x3)
    assert out3.shape == (2, 3, out3.shape[-1])
    assert "Function" in type(out3.grad_fn).__name__, type(out3.grad_fn).__name__
    assert [type(f).__name__ for f, _ in out3.grad_fn.next_functions][0] == "AccumulateGrad"  # x3 itself
    dy = torch.randn_like(out3)
    (g3,) = torch.autograd.grad(out3, x3, dy)
    x2 = x3.detach().reshape(6, 8).requires_grad_()
    out2 = call(x2)
    (g2,) = torch.autograd.grad(out2, x2, dy.reshape(6, -1))
    torch.testing.assert_close(out3.detach().reshape(6, -1), out2.detach(), rtol=0, atol=0)
    torch.testing.assert_close(g3.reshape(6, 8), g2, rtol=0, atol=0)
    out = call(x3)
    out += 1.0  # a Function output that were a view would refuse this
    out.sum().backward()
    assert x3.grad is not None


@pytest.mark.parametrize("op", ["matmul", "linear_cross_entropy"])
def test_two_dim_call_has_no_view_nodes(launches, op):
    """A 2-D input needs no flattening: the op's own node is the graph (a no-op reshape before, and for
    matmul a reshape of the result, were view nodes of host time forward and backward)."""
    x = _leaf(8, 16)
    if op == "matmul":
        out = hk.matmul(x, _leaf(16, 4))
    else:
        out = hk.linear_cross_entropy(x, _leaf(32, 16, scale=0.3), torch.randint(0, 32, (8,), device=DEVICE))
    assert "Function" in type(out.grad_fn).__name__, type(out.grad_fn).__name__
    assert type(out.grad_fn.next_functions[0][0]).__name__ == "AccumulateGrad"


# --------------------------------------------------------------------- one-chunk calls: no buffer + copy
def test_linear_cross_entropy_one_chunk_forward_copies_no_losses(launches):
    """When one chunk covers every row, the row kernel's [N] result is the losses: no [N] buffer and no
    copy launch (several chunks still fill one buffer; their values are tested in test_linear_cross_entropy)."""
    x, w = _leaf(8, 16), _leaf(32, 16, scale=0.3)
    t = torch.randint(0, 32, (8,), device=DEVICE)
    with _AtenOps() as mode:
        hk.linear_cross_entropy(x, w, t)
    assert "copy_" not in mode.work(), mode.seen
    with _AtenOps() as chunked:
        hk.linear_cross_entropy(x, w, t, chunk_rows=3)
    assert chunked.work()["copy_"] == 3  # the probe can fail: 3 chunks are copied into the buffer


def test_swiglu_mlp_backward_writes_dw_down_in_place(launches, monkeypatch):
    """The dW_down GEMM writes the gradient itself (no temporary + copy launch), with one column chunk and with
    several (each chunk's GEMM writes its columns through a row-strided view)."""
    swiglu_mod = importlib.import_module("hearth.kernels.swiglu")
    x = _leaf(4, 8)
    ws = [_leaf(16, 8, scale=0.3), _leaf(16, 8, scale=0.3), _leaf(8, 16, scale=0.3)]
    mode = _backward_ops(swiglu_mod.swiglu_mlp(x, *ws))
    assert "copy_" not in mode.work(), mode.seen
    monkeypatch.setattr(swiglu_mod, "MLP_CHUNK_ELEMS", 4 * 8)  # 8 of the 16 columns a chunk: two chunks
    mode = _backward_ops(swiglu_mod.swiglu_mlp(x, *ws))
    assert "copy_" not in mode.work() and mode.work()["mm"] >= 2, mode.seen


def test_lora_mlp_backward_writes_da_down_in_place(launches, monkeypatch):
    """The LoRA MLP's dA_down chunk GEMMs write the gradient themselves, with one column chunk and with two."""
    swiglu_mod = importlib.import_module("hearth.kernels.swiglu")
    x = _leaf(4, 8)
    mode = _backward_ops(_lora_mlp_call(x))
    assert "copy_" not in mode.work(), mode.seen
    monkeypatch.setattr(swiglu_mod, "MLP_CHUNK_ELEMS", 4 * 8)  # two column chunks of the 16
    mode = _backward_ops(_lora_mlp_call(x))
    assert "copy_" not in mode.work(), mode.seen
