"""hearth.kernels.swiglu and swiglu_mlp against fp32 PyTorch references."""

from __future__ import annotations

import contextlib
import gc
import importlib
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# the module, not the function: hearth.kernels re-exports swiglu() under the submodule's name, so
# `import hearth.kernels.swiglu as ...` can bind the function (depending on import order)
swiglu_module = importlib.import_module("hearth.kernels.swiglu")
from hearth.kernels.swiglu import swiglu, swiglu_mlp
from hearth.nn import SwiGLUMLP
from tests.kernels.launch_log import Launches, kept_pointer, laid_out
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only


def check_swiglu(g, u, dtype):
    g, u = g.detach().requires_grad_(), u.detach().requires_grad_()
    h = swiglu(g, u)
    assert h.shape == g.shape and h.dtype == g.dtype
    dh = torch.randn_like(h)
    dg, du = torch.autograd.grad(h, (g, u), dh)
    gr, ur = g.detach().float().requires_grad_(), u.detach().float().requires_grad_()
    hr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(hr, (gr, ur), dh.float())
    assert_close(h, hr, dtype, msg="h")
    assert_close(dg, dgr, dtype, msg="dgate")
    assert_close(du, dur, dtype, msg="dup")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 80), (17, 130), (2, 3, 1100)], ids=["1row", "17x130", "3d_two_col_blocks"])
def test_swiglu_matches_fp32_reference(dtype, shape):
    torch.manual_seed(0)
    g = (2 * torch.randn(shape, device=DEVICE)).to(dtype)
    u = torch.randn(shape, device=DEVICE).to(dtype)
    check_swiglu(g, u, dtype)


def test_swiglu_strided_views():
    torch.manual_seed(1)
    gu = torch.randn(9, 2 * 40, device=DEVICE)
    check_swiglu(gu[:, :40], gu[:, 40:], torch.float32)  # a fused gate_up output split in two: row-strided
    check_swiglu(torch.randn(40, 9, device=DEVICE).t(), torch.randn(9, 40, device=DEVICE), torch.float32)


def _every_candidate(n: int, flat: bool):
    return swiglu_module._candidates(n, flat)


@pytest.mark.parametrize("cand", _every_candidate(130, True),
                         ids=lambda c: f"{'flat' if c[2] else 'rows'}{c[0]}w{c[1]}")
def test_swiglu_every_candidate_matches_reference(cand, monkeypatch):
    """Each launch config the GPU's pick may choose, forced (the CPU otherwise always runs the first one):
    the row kernels and, for contiguous tensors, the flat kernels (17 x 130 is not a multiple of any block)."""
    asked = []

    def forced(key, cands, launch, device, rows=None):
        asked.append((key, tuple(cands)))
        assert cand in cands, (cand, cands)
        return cand

    monkeypatch.setattr(swiglu_module, "pick_config", forced)
    torch.manual_seed(2)
    check_swiglu(2 * torch.randn(17, 130, device=DEVICE), torch.randn(17, 130, device=DEVICE), torch.float32)
    assert [k[0][0] for k in asked] == ["swiglu_fwd", "swiglu_bwd"] and all(k[0][-1] is True for k in asked)


def test_swiglu_strided_views_get_no_flat_candidate(monkeypatch):
    """A row-strided view (a fused gate_up output split in two) is not one flat run: no flat config is offered."""
    asked = []
    monkeypatch.setattr(swiglu_module, "pick_config",
                        lambda key, cands, launch, device, rows=None: asked.append(cands) or cands[0])
    gu = torch.randn(9, 2 * 40, device=DEVICE)
    check_swiglu(gu[:, :40], gu[:, 40:], torch.float32)
    assert len(asked) == 2 and not any(c[2] for cands in asked for c in cands), asked


# contiguous tensors (N-D, one row, a size-1 dim with an odd stride, one column, one element), row-strided views
# (a fused gate_up output split in two), a transposed (copied) one; "mixed": up alone row-strided
_LAYOUTS = [((17, 130), None), ((2, 3, 70), None), ((1, 80), None), ((1, 80), (999, 1)), ((3, 1, 40), (40, 7, 1)),
            ((5, 1), None), ((1, 1), (5, 7)), ((9, 40), (80, 1)), ((9, 40), (1, 9)), ((17, 130), "mixed")]


@pytest.mark.parametrize("force_flat", [False, True], ids=["first", "flat"])
@pytest.mark.parametrize("shape,strides", _LAYOUTS,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_swiglu_launch_arguments_are_those_of_the_row_views(monkeypatch, shape, strides, force_flat):
    """The standalone op's launchers pass contiguous tensors whole (no [rows, n] views: host time); every launch
    gets the pointers, row strides, sizes and pick key (flat or not) of the views it took before, _rows of the
    inputs and out.view(-1, n), and the values are the reference's. force_flat: the pick returns a flat config
    where one is offered (the CPU's default, the first, is a row config)."""
    keys = []

    def pick(key, cands, launch, device, rows=None):
        keys.append(key)
        flat = [c for c in cands if c[2]]
        return flat[0] if force_flat and flat else cands[0]

    monkeypatch.setattr(swiglu_module, "pick_config", pick)
    kernels = Launches(monkeypatch, swiglu_module, ["_swiglu_fwd_kernel", "_swiglu_fwd_flat_kernel",
                                                    "_swiglu_bwd_kernel", "_swiglu_bwd_flat_kernel"])
    g = laid_out(shape, None if strides == "mixed" else strides)
    u = laid_out(shape, (2 * shape[-1], 1) if strides == "mixed" else strides, seed=1)
    dh = laid_out(shape, None if strides == "mixed" else strides, seed=2)
    h = swiglu_module._swiglu_forward(g, u)
    dg, du = swiglu_module._swiglu_backward_impl(dh, g, u)
    n = shape[-1]
    rows = swiglu_module._rows
    want = []
    for ins, outs in (((g, u), (h,)), ((dh, g, u), (dg, du, dg))):  # the backward's h_out is dg when h is not stored
        views = [rows(t) for t in ins] + [t.view(-1, n) for t in outs]
        m = views[0].shape[0]
        dense = all(v.shape[0] <= 1 or v.stride(0) == n for v in views[:len(ins) + 2])
        ptrs = [kept_pointer(v, t) for v, t in zip(views, (*ins, *outs))]
        want.append((ptrs, [v.stride(0) for v in views], m, dense))
    assert [k[0] for k in keys] == ["swiglu_fwd", "swiglu_bwd"]
    assert len(kernels.log) == 2
    for (name, grid, args), key, (ptrs, strides_, m, dense) in zip(kernels.log, keys, want):
        assert key[-1] is dense and key[1] == n, (key, dense)
        flat = force_flat and dense
        assert ("flat" in name) == flat, name
        k = len(ptrs) - 1 if flat and "bwd" in name else len(ptrs)  # the flat backward takes no h_out
        assert [p if w is not None else None for p, w in zip(args, ptrs[:k])] == ptrs[:k], (name, args)
        if flat:
            assert args[k] == m * n, (name, args)
        else:
            assert args[k] == n and list(args[k + 1:k + 1 + len(strides_)]) == strides_ and grid[0] == m, (name, args)
    gr, ur = g.double().requires_grad_(), u.double().requires_grad_()
    hr = F.silu(gr) * ur
    dgr, dur = torch.autograd.grad(hr, (gr, ur), dh.double())
    for got, ref in ((h, hr), (dg, dgr), (du, dur)):
        assert got.is_contiguous()
        assert_close(got, ref, torch.float32)


def test_swiglu_empty_gives_empty():
    g = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    assert swiglu(g, torch.randn(0, 8, device=DEVICE)).shape == (0, 8)


def test_swiglu_shape_mismatch_names_up():
    with pytest.raises(ValueError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 5, device=DEVICE))


def test_swiglu_dtype_mismatch_names_up():
    with pytest.raises(TypeError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 4, device=DEVICE, dtype=torch.bfloat16))


def test_swiglu_wrong_dtype_names_gate():
    with pytest.raises(TypeError, match=r"^gate\b"):
        swiglu(torch.ones(2, 4, device=DEVICE, dtype=torch.int32), torch.ones(2, 4, device=DEVICE))


def test_swiglu_other_device_names_up():
    with pytest.raises(ValueError, match=r"^up\b"):
        swiglu(torch.ones(2, 4, device=DEVICE), torch.ones(2, 4, device="meta"))


# ----------------------------------------------------------------------------------------------
# swiglu_mlp: one autograd node
# ----------------------------------------------------------------------------------------------
def mlp_params(h, i, dtype, bias):
    torch.manual_seed(2)
    ws = [torch.randn(i, h, device=DEVICE) / h**0.5, torch.randn(i, h, device=DEVICE) / h**0.5,
          torch.randn(h, i, device=DEVICE) / i**0.5]
    bs = [0.1 * torch.randn(n, device=DEVICE) for n in (i, i, h)] if bias else [None] * 3
    return [w.to(dtype) for w in ws], [b.to(dtype) if b is not None else None for b in bs]


def check_mlp(x, ws, bs, dtype, frozen=False, recompute_up=False):
    x = x.detach().requires_grad_()
    ws = [w.detach().requires_grad_(not frozen) for w in ws]
    bs = [b.detach().requires_grad_(not frozen) if b is not None else None for b in bs]
    leaves = [x] + ([] if frozen else ws + [b for b in bs if b is not None])
    out = swiglu_mlp(x, *ws, *bs, recompute_up=recompute_up)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    rx = ref_leaves[0]
    rws = ref_leaves[1:4] if not frozen else [w.detach().float() for w in ws]
    rbs = iter(ref_leaves[4:]) if not frozen else iter([b.float() for b in bs if b is not None])
    rbs = [next(rbs) if b is not None else None for b in bs]
    ref = F.linear(F.silu(F.linear(rx, rws[0], rbs[0])) * F.linear(rx, rws[1], rbs[1]), rws[2], rbs[2])
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.float())
    # PyTorch's own eager MLP in `dtype` is the rule's baseline: its matmuls round the [rows, I] results
    # (g, u, h, dh) to the low precision exactly as hearth's do, and its bias gradients sum rounded dg/du.
    base_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    bx = base_leaves[0]
    bws = base_leaves[1:4] if not frozen else [w.detach() for w in ws]
    bbs_it = iter(base_leaves[4:]) if not frozen else iter([b.detach() for b in bs if b is not None])
    bbs = [next(bbs_it) if b is not None else None for b in bs]
    base = F.linear(F.silu(F.linear(bx, bws[0], bbs[0])) * F.linear(bx, bws[1], bbs[1]), bws[2], bbs[2])
    base_grads = torch.autograd.grad(base, base_leaves, dout)
    assert_close(out, ref, dtype, msg="out", baseline=base)
    for n, (g, r, b) in enumerate(zip(grads, ref_grads, base_grads)):
        assert_close(g, r, dtype, msg=f"grad of leaf {n}", baseline=b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias,recompute_up", [(False, False), (True, False), (True, True)],
                         ids=["nobias", "bias", "bias_recompute_up"])
@pytest.mark.parametrize("budget", [200, 1 << 20], ids=["chunked", "one-chunk"])
def test_mlp_matches_fp32_reference(dtype, bias, recompute_up, budget, monkeypatch):
    # Tiny chunks (budget 200) so the forward's row chunks (5, 5, 3 of 13 rows) and the backward's column
    # chunks (15, 15, 10 of I = 40) both iterate, with ragged last chunks; or one chunk each (the paths
    # without the loops).
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", budget)
    ws, bs = mlp_params(16, 40, dtype, bias)
    x = torch.randn(13, 16, device=DEVICE).to(dtype)
    check_mlp(x, ws, bs, dtype, recompute_up=recompute_up)


@pytest.mark.parametrize("recompute_up", [False, True])
def test_mlp_frozen_weights_give_only_dx(recompute_up):
    ws, bs = mlp_params(8, 24, torch.float32, True)
    check_mlp(torch.randn(2, 5, 8, device=DEVICE), ws, bs, torch.float32, frozen=True, recompute_up=recompute_up)


def test_mlp_second_backward_is_refused():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    out = swiglu_mlp(x, *ws).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError):
        out.backward()


class _DropFirstGrad(torch.autograd.Function):
    """b, with a's gradient undefined: the node that produced a gets None for it."""

    @staticmethod
    def forward(ctx, a, b):
        return b.clone()

    @staticmethod
    def backward(ctx, grad):
        return None, grad


def test_mlp_undefined_output_grad_gives_no_weight_grads():
    # The node does not materialise zero gradients (they cost two [rows, I] buffers at the
    # backward's peak), so its backward must accept dout = None and pass None on.
    ws, _ = mlp_params(8, 24, torch.float32, False)
    ws = [w.requires_grad_() for w in ws]
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    _DropFirstGrad.apply(swiglu_mlp(x, *ws), x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert all(w.grad is None for w in ws)


def test_mlp_w_down_shape_names_w_down():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    with pytest.raises(ValueError, match=r"^w_down\b"):
        swiglu_mlp(torch.randn(3, 8, device=DEVICE), ws[0], ws[1], ws[2][:, :20])


def test_mlp_weight_dtype_names_w_up():
    ws, _ = mlp_params(8, 24, torch.float32, False)
    with pytest.raises(TypeError, match=r"^w_up\b"):
        swiglu_mlp(torch.randn(3, 8, device=DEVICE), ws[0], ws[1].half(), ws[2])


def test_torch_compile_fullgraph():
    torch.manual_seed(3)
    ws, _ = mlp_params(8, 24, torch.float32, False)
    leaves = [torch.randn(3, 8, device=DEVICE, requires_grad=True), torch.randn(3, 24, device=DEVICE, requires_grad=True),
              torch.randn(3, 24, device=DEVICE, requires_grad=True)] + [w.requires_grad_() for w in ws]
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"

    def loss(x, g, u, wg, wu, wd):
        mlp = swiglu_mlp(x, wg, wu, wd).square().sum() + swiglu_mlp(x, wg, wu, wd, recompute_up=True).square().sum()
        return swiglu(g, u).square().sum() + mlp

    got = torch.autograd.grad(torch.compile(loss, backend=backend, fullgraph=True)(*leaves), leaves)
    want = torch.autograd.grad(loss(*leaves), leaves)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_opcheck_swiglu():
    g = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    u = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hearth.swiglu_fwd, (g, u))


def test_opcheck_mlp_backward_op():
    # The forward op is left out on purpose: it returns g and u only so they can be saved, and its
    # backward reuses them as gradient buffers, which opcheck's "outputs are user-visible" tests
    # reject. swiglu_mlp never hands g or u to the caller.
    ws, _ = mlp_params(8, 24, torch.float32, False)
    args = (torch.randn(3, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE), torch.randn(3, 24, device=DEVICE),
            torch.randn(3, 24, device=DEVICE), *ws, None, True, False)
    torch.library.opcheck(torch.ops.hearth.swiglu_mlp_bwd, args)
    torch.library.opcheck(torch.ops.hearth.swiglu_mlp_bwd, args + (False,))


def test_mlp_without_biases_computes_no_bias_sums():
    """An MLP without biases (Qwen3, Llama) must not reduce dg, du and dout over the rows: those sums' bf16
    reductions allocated a 133 MiB fp32 temporary at the backward's peak on the H200 (N=8192, I=14336)."""
    seen = []

    class Sums(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "hearth":  # run hearth's op bodies under the mode too (see LiveBytes)
                from torch._library.custom_ops import OPDEFS

                with self:
                    return OPDEFS[func._schema.name]._init_fn(*args, **kwargs)
            if func.overloadpacket in (torch.ops.aten.sum,):
                seen.append(tuple(args[0].shape))
            return func(*args, **kwargs)

    ws, _ = mlp_params(8, 24, torch.float32, False)
    ws = [w.detach().requires_grad_() for w in ws]
    x = torch.randn(5, 8, device=DEVICE, requires_grad=True)
    out = swiglu_mlp(x, *ws, None, None, None)
    with Sums():
        out.backward(torch.randn_like(out))
    assert seen == [], f"row sums computed for biases that do not exist: {seen}"
    assert all(w.grad is not None for w in ws)

@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("n", [14336, 17408])
def test_swiglu_real_shapes_bf16(n):
    torch.manual_seed(4)
    check_swiglu(torch.randn(4096, n, device=DEVICE, dtype=torch.bfloat16),
                 torch.randn(4096, n, device=DEVICE, dtype=torch.bfloat16), torch.bfloat16)


@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
def test_mlp_real_shape_bf16_numerics():
    ws, _ = mlp_params(4096, 14336, torch.bfloat16, False)
    for recompute_up in (False, True):
        check_mlp(torch.randn(2048, 4096, device=DEVICE, dtype=torch.bfloat16), ws, [None] * 3, torch.bfloat16,
                  recompute_up=recompute_up)


# ----------------------------------------------------------------------------------------------
# swiglu_mlp: peak live memory over forward + backward, measured on the CPU
# ----------------------------------------------------------------------------------------------
class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage created while the mode is on and still alive: `peak`, and `at_peak`
    = [(bytes, "op (shape) dtype")] of the storages alive at that moment.

    A storage counts from the op that returned it (a result sharing an input's storage -- a view,
    an out= or in-place result -- is not new) until it is freed: weakref.finalize on the storage's
    Python object, which torch keeps for as long as the storage lives (also when only autograd's
    saved tensors hold it). Ops of the hearth:: namespace are run through their Python bodies under
    the mode, so their chunk buffers and temporaries count too. Storages created before the mode
    (inputs, weights) are not counted; like the bench's CUDA figure, this is the call's extra.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[int, str]] = {}
        self.now = self.peak = 0
        self.at_peak: list[tuple[int, str]] = []
        self._inside: list[str] = []

    def _free(self, key):
        if key in self.live:  # (a storage released early by resize_(0) was counted off then: see released)
            self.now -= self.live.pop(key)[0]

    def released(self, t):
        """t's storage was shrunk to 0 bytes (swiglu._release_storage): its memory is free from here on."""
        self._free(t.untyped_storage()._cdata)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "hearth":
            from torch._library.custom_ops import OPDEFS

            self._inside.append(func._schema.name)
            with self:  # __torch_dispatch__ runs with the mode popped: push it back for the op's body
                out = OPDEFS[func._schema.name]._init_fn(*args, **kwargs)
            self._inside.pop()
        else:
            out = func(*args, **kwargs)
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {a.untyped_storage()._cdata for a in leaves if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, nbytes = st._cdata, st.nbytes()
            if nbytes == 0 or key in inputs or key in self.live:
                continue
            where = "/".join(self._inside + [func.__name__])
            self.live[key] = (nbytes, f"{where} {tuple(t.shape)} {str(t.dtype)[6:]}")
            self.now += nbytes
            weakref.finalize(st, self._free, key)
            if self.now > self.peak:
                self.peak = self.now
                self.at_peak = sorted(self.live.values(), reverse=True)
        return out


class _IdealMLP(torch.autograd.Function):
    """The memory reference: saves x, g, u only; the backward forms dh = dout @ W_down whole and
    overwrites g, u, dh with dg, du, h in place (fp32 math on narrow column strips)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        g, u = x @ w_gate.t(), x @ w_up.t()
        ctx.save_for_backward(x, g, u, w_gate, w_up, w_down)
        return (F.silu(g) * u) @ w_down.t()

    @staticmethod
    def backward(ctx, dout):
        x, g, u, w_gate, w_up, w_down = ctx.saved_tensors
        dh = dout @ w_down
        step = max(1, g.shape[1] // 32)
        for c in range(0, g.shape[1], step):
            cs = slice(c, c + step)
            gf, uf, dhf = g[:, cs].float(), u[:, cs].float(), dh[:, cs].float()
            s = torch.sigmoid(gf)
            g[:, cs] = dhf * uf * s * (1 + gf * (1 - s))
            u[:, cs] = dhf * gf * s
            dh[:, cs] = gf * s * uf
            del gf, uf, dhf, s
        dw_down = dout.t() @ dh
        del dh
        dx = g @ w_gate
        dx.addmm_(u, w_up)
        return dx, g.t() @ x, u.t() @ x, dw_down


@contextlib.contextmanager
def launches_collected(monkeypatch):
    """The peak-memory tests' setting: the Triton interpreter leaves each launch's arguments in a reference cycle (a
    compiled GPU launch holds nothing), so the swiglu launches collect generation 0 right after they run and freed
    chunk buffers really go; the collector is off otherwise (nothing promoted out of generation 0 behind them)."""
    for name in ("_launch_fwd", "_launch_bwd"):
        launch = getattr(swiglu_module, name)

        def collected(*a, _launch=launch, **k):
            _launch(*a, **k)
            gc.collect(0)

        monkeypatch.setattr(swiglu_module, name, collected)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def peak_live_bytes(kind, n, hidden, inter, dtype):
    """(peak, at_peak) of LiveBytes over out = MLP(x); out.backward(dout), as the bench's
    swiglu_mlp case runs it: no bias, x and the three weights require grad, grads None before,
    out alive during the backward."""
    torch.manual_seed(5)
    mlp = SwiGLUMLP(hidden, inter, device=DEVICE, dtype=dtype)
    x = torch.randn(n, hidden, device=DEVICE, dtype=dtype, requires_grad=True)
    dout = torch.randn(n, hidden, device=DEVICE, dtype=dtype)
    w = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    fn = {
        "hearth": lambda: mlp(x),
        "eager": lambda: F.linear(F.silu(F.linear(x, w[0])) * F.linear(x, w[1]), w[2]),
        "ideal": lambda: _IdealMLP.apply(x, *w),
    }[kind]
    real_release = swiglu_module._release_storage

    def release(t):
        mode.released(t)
        real_release(t)

    with LiveBytes() as mode:
        swiglu_module._release_storage = release
        try:
            fn().backward(dout)
        finally:
            swiglu_module._release_storage = real_release
    assert all(t.grad is not None for t in (x, *w))
    return mode.peak, mode.at_peak


@pytest.mark.parametrize("n,hidden,inter,saved", [(64, 32, 112, 0.5), (32, 40, 136, 1.0)],
                         ids=["bench-8192x4096x14336", "qwen3-14b-4096x5120x17408"])
def test_mlp_peak_memory_fwd_bwd_is_ideal(monkeypatch, n, hidden, inter, saved):
    # A bench case scaled by 1/128 per dim, the chunks like [N, I] (1/16384): the headline case (N=8192 H=4096
    # I=14336: 8 row chunks in the forward, 7 column chunks in the backward, as on the H200) and the model-shape
    # suite's Qwen3-14B case with 4096 tokens (N=4096 H=5120 I=17408), where the weights' gradients are larger
    # than [N, I]. saved: how many [N, I] below the ideal the backward's peak must be.
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", swiglu_module.MLP_CHUNK_ELEMS // 128**2)
    # the GPU's wave floor is not scaled with the dims (it would make one chunk of these): the budget rule alone
    monkeypatch.setattr(swiglu_module, "MLP_MIN_WAVES", 0)
    with launches_collected(monkeypatch):
        peaks = {k: peak_live_bytes(k, n, hidden, inter, torch.bfloat16) for k in ("hearth", "ideal", "eager")}
    ni = n * inter * 2  # one [N, I] bf16 tensor
    hearth, ideal, eager = (peaks[k][0] for k in ("hearth", "ideal", "eager"))
    alive = "\n".join(f"  {b / ni:5.2f} x [N,I]  {d}" for b, d in peaks["hearth"][1] if b >= ni // 8)
    msg = (f"peak in [N, I] units: hearth {hearth / ni:.2f}, ideal {ideal / ni:.2f}, eager {eager / ni:.2f}; "
           f"alive at hearth's peak:\n{alive}")
    # Ideal = gradients (3 weights + dx) + out + the saved g and u. The eager backward frees du before dW_gate
    # is allocated, so its last phase holds one [N, I] less than that (as Liger's unfused MLP does: autograd
    # frees the up projection's gradient before the gate's weight gradient). Where the weights' gradients are
    # smaller than [N, I] (the headline case) the column loop, with g, u, dW_down and dW_up alive, is the peak
    # instead, half an [N, I] below the ideal. The margin is half a chunk.
    assert hearth <= ideal - saved * ni + ni // 16, msg
    assert hearth < eager, msg


def test_mlp_chunk_probe_smoke(tmp_path):
    """scripts/gpu/mlp_chunk_probe.py on the CPU at toy dims: a row per (case, provider, chunk, rule), the eager
    reference first, and hearth's chunk rule put back afterwards."""
    import importlib
    import json
    import runpy
    from pathlib import Path

    sw = importlib.import_module("hearth.kernels.swiglu")
    real = sw._chunk
    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "mlp_chunk_probe.py"
    main = runpy.run_path(str(script), run_name="mlp_chunk_probe")["main"]
    assert main(["--smoke", "--out", str(tmp_path), "--chunks", "600,0", "--reps", "1", "--cases", "0"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "mlp_chunks.jsonl").read_text().splitlines()]
    assert [(r["provider"], r["chunk_mi"], r["rule"]) for r in rows] == [
        ("eager", None, None), ("hearth", 600, "floor"), ("hearth", 600, "balanced"), ("hearth", 0, "one")]
    assert all(r["ms"] > 0 for r in rows) and sw._chunk is real
    rule = runpy.run_path(str(script), run_name="mlp_chunk_probe")["rule_fn"]
    # 1000 rows at 300 a chunk: floor cuts 256 + 256 + 256 + 232, balanced the same four chunks evenly (256 each)
    assert rule("floor", 300 * 10)(1000, 10) == 256 and rule("balanced", 300 * 10)(1000, 10) == 256
    assert rule("floor", 600 * 10)(1000, 10) == 512 and rule("balanced", 600 * 10)(1000, 10) == 512
    assert rule("floor", 700 * 10)(1100, 10) == 512 and rule("balanced", 700 * 10)(1100, 10) == 512
    assert rule("balanced", 5376 * 3072)(16384, 3072) == 4096  # Qwen3-0.6B: 5376 + 5376 + 5376 + 256 -> 4 x 4096
    # waves: Qwen3-4B (12289 rows, H 2560, I 9728) at 16 Mi: the forward's 1536-row down_proj chunks have 120 tiles
    # of 128x256 on 132 SMs; 2 waves need 3380 rows -> 4 chunks of 3328 (the last 2305), 4 waves 6759 rows -> 2
    # chunks of 6400 (the last 5889)
    w2, w4 = rule("waves2", 16 << 20, hidden=2560), rule("waves4", 16 << 20, hidden=2560)
    assert rule("floor", 16 << 20)(12289, 9728) == 1536
    assert w2(12289, 9728) == 3328 and w4(12289, 9728) == 6400
    assert w2(9728, 12289) == 3328 and w4(9728, 12289) == 4864  # the backward's column chunks of I = 9728
    # Qwen3-14B (4096 rows, H 5120, I 17408): 16 Mi gives 768-row chunks; 2 waves need 1690 rows -> 3 chunks of 1536
    assert rule("waves2", 16 << 20, hidden=5120)(4096, 17408) == 1536
    assert rule("waves4", 16 << 20, hidden=1024)(16384, 3072) == 16384  # Qwen3-0.6B: one chunk
    with pytest.raises(ValueError, match="hidden"):
        rule("waves2", 16 << 20)(100, 10)
    # shipped: _chunk itself (its wave floor where sms > 0), at the probe's budget
    assert rule("shipped", 16 << 20)(12289, 9728, 2560, 132) == 3328 and rule("shipped", 16 << 20)(12289, 9728) == 1536


def test_mlp_chunk_wave_floor():
    """_chunk with sms > 0 (the full MLP's backward column chunks on a GPU): the budget's chunk, raised (and then cut
    evenly, multiples of 256) until its weight-gradient GEMMs have MLP_MIN_WAVES waves of 128x256 tiles; where the
    budget's chunk is large enough, or with sms 0 (the CPU, the forward, the LoRA node), the budget rule alone. The
    shapes are the model-shape suite's MLPs on 132 SMs (the row cases show the rule itself, which the forward does
    not ask for)."""
    sw = importlib.import_module("hearth.kernels.swiglu")
    c = sw._chunk
    assert sw.MLP_MIN_WAVES == 2 and sw.MLP_CHUNK_ELEMS == 16 << 20
    # Qwen3-4B, 12289 tokens, H 2560, I 9728: the budget's 1536 rows / 1280 columns (100 tiles) -> 3328 (4 and 3 chunks)
    assert (c(12289, 9728), c(9728, 12289)) == (1536, 1280)
    assert (c(12289, 9728, 2560, 132), c(9728, 12289, 2560, 132)) == (3328, 3328)
    # Qwen3-0.6B, 16384 tokens, H 1024, I 3072: two row chunks of 8192, the columns in one chunk
    assert (c(16384, 3072, 1024, 132), c(3072, 16384, 1024, 132)) == (8192, 3072)
    # Qwen3-14B, 4096 tokens, H 5120, I 17408: the columns' 4096 (640 tiles) stay; 768 rows -> 1536
    assert (c(4096, 17408, 5120, 132), c(17408, 4096, 5120, 132)) == (1536, 4096)
    assert c(5, 40, 16, 132) == 5 and c(37, 40, 16, 0) == 37  # small: one chunk either way


def test_cut_evenly():
    """One helper for the even cut (the wave floor's and the chunk probe's): as many chunks as `size` makes, equal,
    rounded up to a multiple of 256 when asked and never above total; a bad size is refused by name."""
    sw = importlib.import_module("hearth.kernels.swiglu")
    assert sw.cut_evenly(12289, 2458) == 2560  # 5 chunks: 2458 each, up to 2560
    assert sw.cut_evenly(12289, 3100) == 3328  # 4 chunks: 3073 each, up to 3328 (the wave floor at Qwen3-4B's MLP)
    assert sw.cut_evenly(100, 30, to_256=False) == 25 and sw.cut_evenly(300, 256) == 256 and sw.cut_evenly(5, 9) == 5
    for bad in ((0, 4), (10, 0)):
        with pytest.raises(ValueError, match="size"):
            sw.cut_evenly(*bad)


def test_mlp_chunk_wave_floor_can_be_turned_off(monkeypatch):
    sw = importlib.import_module("hearth.kernels.swiglu")
    monkeypatch.setattr(sw, "MLP_MIN_WAVES", 0)
    assert sw._chunk(12289, 9728, 2560, 132) == 1536


def test_mlp_wave_floor_only_for_the_weight_gradient_chunks(monkeypatch):
    """The SMs reach _chunk only for the full MLP's backward column chunks when weight gradients are computed (the
    forward asks for that chunk too, to size its own: _fwd_rows): not from a backward without weight gradients, and
    not from the LoRA node (its frozen base has no weight-gradient GEMMs; the floor measured 4-7% slower there on an
    H100)."""
    sw = importlib.import_module("hearth.kernels.swiglu")
    calls = []
    real = sw._chunk
    monkeypatch.setattr(sw, "_gpu_sms", lambda t: 132)  # as on a GPU
    monkeypatch.setattr(sw, "_chunk", lambda total, other, hidden=0, sms=0, budget=0:
                        calls.append(sms) or real(total, other, budget=budget))
    x = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    ws = [(torch.randn(16, 8, device=DEVICE) * 0.3).requires_grad_(), (torch.randn(16, 8, device=DEVICE) * 0.3).requires_grad_(),
          (torch.randn(8, 16, device=DEVICE) * 0.3).requires_grad_()]
    sw.swiglu_mlp(x, *ws).sum().backward()
    assert calls == [0, 132, 132], calls  # forward rows, the backward's columns (the forward's budget), backward columns
    calls.clear()
    frozen = [w.detach() for w in ws]
    sw.swiglu_mlp(x, *frozen).sum().backward()
    assert calls == [0, 0], calls
    calls.clear()
    from hearth.kernels.lora import lora_swiglu_mlp

    lora = [(torch.randn(*s, device=DEVICE) * 0.1).requires_grad_() for s in ((4, 8), (16, 4), (4, 8), (16, 4), (4, 16), (8, 4))]
    lora_swiglu_mlp(x, *frozen, *lora, 2.0, 2.0, 2.0, compute="base").sum().backward()
    assert calls and set(calls) == {0}, calls


def test_mlp_forward_rows_follow_the_backward_chunk():
    """_fwd_rows: with weight gradients on a GPU the forward's row chunks may hold as many elements as the backward's
    column chunk (its wave floor), cut evenly; otherwise (sms 0: the CPU, frozen weights, no graph) _chunk's budget
    rule. The model-shape suite's MLPs on 132 SMs."""
    sw = importlib.import_module("hearth.kernels.swiglu")
    f = sw._fwd_rows
    assert f(16384, 3072, 1024, 132) == 16384  # Qwen3-0.6B: one chunk (was 5376 x 3 + 256)
    assert f(12289, 9728, 2560, 132) == 3328  # Qwen3-4B: four (3 x 3328 + 2305; was 8 x 1536 + 1)
    assert f(4096, 17408, 5120, 132) == sw._chunk(4096, 17408) == 768  # Qwen3-14B: the budget's chunk already
    assert f(8192, 14336, 4096, 132) == sw._chunk(8192, 14336) == 1024  # the headline MLP: likewise
    assert f(12289, 9728, 2560, 0) == 1536  # no weight gradients / CPU: the budget rule
    for m, inter, hidden in ((16384, 3072, 1024), (12289, 9728, 2560), (4096, 17408, 5120), (65536, 3072, 1024)):
        rows, cols = f(m, inter, hidden, 132), sw._chunk(inter, m, hidden, 132)
        assert rows * inter <= max(sw.MLP_CHUNK_ELEMS, m * cols)  # h's chunk never above dh's


def test_mlp_forward_rows_asked_with_sms_only_for_trainable_weights(monkeypatch):
    """The public function passes weight_grads (grad mode on and a weight or bias that requires grad) so that the
    forward's larger chunks come only where the backward's chunks are as large: frozen weights, torch.no_grad and
    the CPU keep the budget rule (no extra memory for inference)."""
    sw = importlib.import_module("hearth.kernels.swiglu")
    seen = []
    real = sw._fwd_rows
    monkeypatch.setattr(sw, "_gpu_sms", lambda t: 132)
    monkeypatch.setattr(sw, "_fwd_rows", lambda m, inter, hidden, sms: seen.append(sms) or real(m, inter, hidden, sms))
    x = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    ws = [(torch.randn(*s, device=DEVICE) * 0.3).requires_grad_() for s in ((16, 8), (16, 8), (8, 16))]
    sw.swiglu_mlp(x, *ws)
    with torch.no_grad():
        sw.swiglu_mlp(x, *ws)
    sw.swiglu_mlp(x, *[w.detach() for w in ws])
    assert seen == [132, 0, 0], seen


def test_mlp_forward_rows_raised_keep_the_fwd_bwd_peak(monkeypatch):
    """The raised forward chunk (_fwd_rows) leaves fwd+bwd's peak live bytes where the budget rule's chunks put it:
    the backward's dh chunk is as large and lives beside dx and the weight gradients. Qwen3-0.6B's MLP scaled by
    1/128 per dim (16384 x 1024 x 3072 -> 128 x 8 x 24), chunks by 1/16384, one SM so that the wave floor makes the
    backward one column chunk (as on the H200): the forward then runs one row chunk, not three."""
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", swiglu_module.MLP_CHUNK_ELEMS // 128**2)
    monkeypatch.setattr(swiglu_module, "_gpu_sms", lambda t: 1)
    assert swiglu_module._fwd_rows(128, 24, 8, 1) == 128 and swiglu_module._chunk(128, 24) < 128
    with launches_collected(monkeypatch):
        raised = peak_live_bytes("hearth", 128, 8, 24, torch.bfloat16)[0]
        monkeypatch.setattr(swiglu_module, "_fwd_rows", lambda m, inter, hidden, sms: swiglu_module._chunk(m, inter))
        budget = peak_live_bytes("hearth", 128, 8, 24, torch.bfloat16)[0]
    assert raised <= budget, (raised, budget)


@pytest.mark.parametrize("n,hidden,inter", [(32, 8, 24), (16, 40, 136)], ids=["0.6b-like", "wide-hidden"])
def test_mlp_one_column_chunk_backward_holds_no_more_than_the_loop(monkeypatch, n, hidden, inter):
    """The backward's one-chunk path (no column loop, for host time) computes what the loop computes and holds no more
    at the fwd+bwd peak: dh is formed, spent on dW_down and freed before dW_up is allocated, where the loop allocated
    both weight gradients first."""
    monkeypatch.setattr(swiglu_module, "MLP_CHUNK_ELEMS", 4096)  # n x inter fits one chunk
    assert swiglu_module._one_column_chunk(n, inter, hidden, 0)
    with launches_collected(monkeypatch):
        direct = peak_live_bytes("hearth", n, hidden, inter, torch.bfloat16)[0]
        monkeypatch.setattr(swiglu_module, "_one_column_chunk", lambda *a: False)
        loop = peak_live_bytes("hearth", n, hidden, inter, torch.bfloat16)[0]
    assert direct <= loop, (direct, loop)
