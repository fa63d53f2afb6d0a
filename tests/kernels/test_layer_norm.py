"""hearth.kernels.layer_norm against F.layer_norm in fp32 (interpreter on CPU, real shapes on GPU)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels.layer_norm import layer_norm
from tests.kernels.test_rms_norm import _AtenOps
from hearth.kernels._common import interpret_mode
from tests.kernels.launch_log import Launches, laid_out, row_view_launches
from tests.kernels.offline import run_offline
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only, rows_past_int32

ln = importlib.import_module("hearth.kernels.layer_norm")  # the package attribute is the function
rn = importlib.import_module("hearth.kernels.rms_norm")


def check_fwd_bwd(x, w, b, dtype, eps=1e-5, grad_scale=2.0):
    """Forward and every gradient (x, weight, bias) vs fp32 F.layer_norm on the same inputs."""
    leaves = [t.detach().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    x, w = leaves[0], leaves[1]
    b = leaves[2] if b is not None else None
    y = layer_norm(x, w, b, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
    yr = F.layer_norm(ref_leaves[0], (x.shape[-1],), ref_leaves[1], ref_leaves[2] if b is not None else None, eps)
    ref_grads = torch.autograd.grad(yr, ref_leaves, dy.float())
    assert_close(y, yr, dtype, msg="y")
    for name, g, gr, leaf in zip(("dx", "dweight", "dbias"), grads, ref_grads, leaves):
        assert g.dtype == leaf.dtype, name
        assert_close(g, gr, dtype, msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 80), (17, 130), (2, 3, 64)], ids=["1row", "17rows_130", "3d"])
def test_matches_fp32_reference(dtype, shape):
    torch.manual_seed(0)
    x = (torch.randn(shape, device=DEVICE) + 3.0).to(dtype)  # a non-zero mean, so centring matters
    n = shape[-1]
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    check_fwd_bwd(x, w, b, dtype)


def test_without_bias():
    torch.manual_seed(1)
    x = torch.randn(7, 40, device=DEVICE)
    check_fwd_bwd(x, torch.randn(40, device=DEVICE), None, torch.float32)


def test_many_rows_and_row_strided_view():
    torch.manual_seed(2)
    base = torch.randn(37, 30, device=DEVICE)
    check_fwd_bwd(base[:, :24], torch.randn(24, device=DEVICE), torch.randn(24, device=DEVICE), torch.float32)


def test_zero_rows_give_zero_param_grads():
    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, device=DEVICE, requires_grad=True)
    layer_norm(x, w, b).sum().backward()
    assert torch.equal(w.grad, torch.zeros(8, device=DEVICE)) and torch.equal(b.grad, torch.zeros(8, device=DEVICE))


def test_wrong_dtype_names_x():
    with pytest.raises(TypeError, match=r"^x\b"):
        layer_norm(torch.ones(2, 4, dtype=torch.int64, device=DEVICE), torch.ones(4, device=DEVICE), None)


def test_bias_length_mismatch_names_bias():
    with pytest.raises(ValueError, match=r"^bias\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE), torch.ones(3, device=DEVICE))


def test_bias_on_other_device_names_bias():
    with pytest.raises(ValueError, match=r"^bias\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE), torch.ones(4, device="meta"))


def test_empty_weight_names_weight():
    with pytest.raises(ValueError, match=r"^weight\b"):
        layer_norm(torch.ones(2, 4, device=DEVICE), torch.ones(0, device=DEVICE), None)


def test_torch_compile_fullgraph():
    torch.manual_seed(3)
    args = [torch.randn(3, 48, device=DEVICE, requires_grad=True), torch.randn(48, device=DEVICE, requires_grad=True),
            torch.randn(48, device=DEVICE, requires_grad=True)]
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    fn = torch.compile(lambda a, b, c: layer_norm(a, b, c).square().sum(), backend=backend, fullgraph=True)
    got = torch.autograd.grad(fn(*args), args)
    want = torch.autograd.grad(layer_norm(*args).square().sum(), args)
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


def test_opcheck():
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hearth.layer_norm_fwd, (x, w, b, 1e-5))
    dy, mean, rstd = torch.randn(3, 8, device=DEVICE), torch.randn(3, device=DEVICE), torch.rand(3, device=DEVICE) + 0.5
    for need_dw in (True, False):
        torch.library.opcheck(torch.ops.hearth.layer_norm_bwd, (dy, x.detach(), w.detach(), mean, rstd, need_dw))

@gpu_only
@pytest.mark.parametrize("n", [4096, 5120, 17408])
def test_real_shapes_bf16(n):
    torch.manual_seed(4)
    m = 32768 if n == 4096 else (12289 if n == 5120 else 4096)  # 12289: a multiple of no block
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    check_fwd_bwd(x, w, b, torch.bfloat16, grad_scale=4.0)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_strided_weight_and_bias_are_read_correctly():
    # the kernels index weight / bias as ptr + col: strided views must not be read as contiguous
    torch.manual_seed(7)
    x = torch.randn(5, 24, device=DEVICE)
    p = torch.randn(24, 3, device=DEVICE)
    check_fwd_bwd(x, p[:, 0], p[:, 2], torch.float32)
    check_fwd_bwd(x, torch.randn(1, device=DEVICE).expand(24), torch.randn(1, device=DEVICE).expand(24), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_seventeen_rows_of_4099(dtype):
    torch.manual_seed(8)
    x = torch.randn(17, 4099, device=DEVICE, dtype=dtype)
    w = (1 + 0.1 * torch.randn(4099, device=DEVICE)).to(dtype)
    check_fwd_bwd(x, w, (0.1 * torch.randn(4099, device=DEVICE)).to(dtype), dtype, grad_scale=4.0)


def test_row_offsets_past_int32_are_int64():
    # last row starts past element 2^31 with an int32 row stride (~4 GiB virtual, few pages resident)
    stride = (1 << 30) + 64
    storage = torch.empty(2 * stride + 40, dtype=torch.float16, device=DEVICE)
    x = storage.as_strided((3, 40), (stride, 1))
    x.copy_(torch.randn(3, 40, generator=torch.Generator().manual_seed(9)).to(DEVICE))
    w = torch.randn(40, device=DEVICE, dtype=torch.float16)
    check_fwd_bwd(x, w, torch.randn(40, device=DEVICE, dtype=torch.float16), torch.float16)


@pytest.mark.parametrize(
    "x, w, b, exc, name",
    [
        (torch.ones(2, 4, dtype=torch.float64), torch.ones(4), None, TypeError, "x"),
        (torch.ones(2, 4), torch.ones(4, dtype=torch.int64), None, TypeError, "weight"),
        (torch.ones(2, 4), torch.ones(4), torch.ones(4, dtype=torch.int32), TypeError, "bias"),
        (torch.ones(2, 4), torch.ones(5), None, ValueError, "weight"),
        (torch.ones(2, 4), torch.ones(4), torch.ones(4, 1), ValueError, "bias"),
        (torch.ones(2, 4), torch.ones(4, device="meta"), None, ValueError, "weight"),
        (torch.ones(2, 0), torch.ones(0), None, ValueError, "x"),
    ],
)
def test_bad_input_names_the_argument(x, w, b, exc, name):
    to = lambda t: t if t is None or t.device.type == "meta" else t.to(DEVICE)  # noqa: E731
    with pytest.raises(exc, match=rf"^{name}\b"):
        layer_norm(to(x), to(w), to(b))


# ----------------------------------------------------------------------------------------------
# Launch configs (rms_norm's machinery): every forward and backward candidate against fp64
# ----------------------------------------------------------------------------------------------
def _distinct(cands, n_fields):
    """cands, less those equal in their first n_fields under the interpreter: it ignores num_warps and
    num_stages, so a second config differing only there would run the same Python again (on a GPU: all)."""
    if not interpret_mode():
        return tuple(cands)
    return tuple({c[:n_fields]: c for c in reversed(cands)}.values())[::-1]


def _use(monkeypatch, cfg):
    monkeypatch.setattr(ln, "pick_config", lambda key, candidates, launch, device, rows=None, memory=None, cfg=cfg: cfg)


def _fp64(x, w, b, dy=None, eps=1e-5):
    """y (or dx, dw, db with dy) of F.layer_norm in fp64 on the same (rounded) inputs."""
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y = F.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], eps)
    return y if dy is None else torch.autograd.grad(y, leaves, dy.double())


# widths: a power of two, 1, widths that are not (7, 1000), a 4-D x; and one row wider than NARROW_MAX_BLOCK
_FWD_SHAPES = [(37, 128), (5, 1), (70, 7), (9, 1000), (2, 3, 5, 64), (3, 1500)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", _FWD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fwd_every_candidate(dtype, shape, monkeypatch):
    """Every forward candidate (tiles of rows with a ragged last tile; one row per program) gives the
    fp64 reference's y, mean and rstd; narrow rows list a tile first (the CPU default), wide rows none."""
    n = shape[-1]
    cands = ln._ln_fwd_candidates(n)
    narrow = rn._config(n)[0] <= rn.NARROW_MAX_BLOCK
    assert [c[0] for c in cands[:1]] == (["tile"] if narrow else ["row"]) and any(c[0] == "row" for c in cands)
    torch.manual_seed(21)
    x = (torch.randn(*shape, device=DEVICE) * 2 + 3).to(dtype)  # a non-zero mean
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    x64 = x.double().reshape(-1, n)
    want_mean = x64.mean(-1)
    want_rstd = torch.rsqrt(x64.var(-1, unbiased=False) + 1e-5)
    want = _fp64(x, w, b)
    for cfg in _distinct(cands, 2):
        _use(monkeypatch, cfg)
        for bias in (b, None):
            y, mean, rstd = ln._forward(x, w, bias, 1e-5)
            assert_close(y, want if bias is not None else want - b.double(), dtype, msg=f"y {cfg} bias={bias is not None}")
        torch.testing.assert_close(mean.double(), want_mean, rtol=1e-5, atol=1e-5, msg=f"mean {cfg}")
        torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-4, atol=1e-5, msg=f"rstd {cfg}")


# A tile of 2 rows and one of 4 rows at 1 program per SM: several tiles per program at these small M, so the
# loop, its ragged last tile and the last program's spare tiles are all walked under the interpreter.
_SMALL_TILES = (("tile", 2, 1, 4, 1), ("tile", 4, 1, 4, 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 128), (1, 128), (70, 7), (9, 1000), (5, 1500)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bwd_every_candidate(dtype, shape, monkeypatch):
    """Every backward candidate (tiles first for narrow rows, then the one-row configs; the wide table past
    4096) gives the fp64 reference's dx, dw and db from row-strided x and dy; without dw the same dx."""
    n = shape[-1]
    cands = ln._ln_bwd_candidates(n)
    narrow = rn._config(n)[0] <= rn.NARROW_MAX_BLOCK
    assert cands[0][0] == ("tile" if narrow else "row") and any(c[0] == "row" for c in cands)
    torch.manual_seed(22)
    x = (torch.randn(*shape[:-1], n + 3, device=DEVICE) * 2 + 3).to(dtype)[..., :n]  # row stride n + 3
    dy = torch.randn(*shape[:-1], n + 5, device=DEVICE).to(dtype)[..., :n]
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    dxr, dwr, dbr = _fp64(x, w, b, dy)
    _y, mean, rstd = ln._forward(x, w, b, 1e-5)
    m = x.numel() // n
    for i, cfg in enumerate(_distinct(cands, 3) + (_SMALL_TILES if narrow else ())):
        if cfg[0] == "row" and narrow and (dtype != torch.float32 or m > 10):
            continue  # the one-row kernel is walked at the wide shape in every dtype and here in fp32 at M <= 10
            # (the interpreter takes its rows one at a time)
        _use(monkeypatch, cfg)
        for separate in (False, True) if i == 0 else (False,):
            dx, dw, db = ln._backward(dy, x, w, mean, rstd, separate=separate)
            assert dx.dtype == dtype and dw.dtype == dtype and db.dtype == torch.float32
            assert_close(dx, dxr, dtype, msg=f"dx {cfg}")
            assert_close(dw, dwr, dtype, msg=f"dw {cfg}")
            assert_close(db, dbr, torch.float32 if dtype == torch.float32 else dtype, msg=f"db {cfg}")
        dx_only, none_w, none_b = ln._backward(dy, x, w, mean, rstd, need_dw=False)
        assert none_w is None and none_b is None
        torch.testing.assert_close(dx_only, dx, rtol=0, atol=0, msg=f"dx without dw {cfg}")


def test_candidate_lists():
    """Narrow rows: tiles first (the CPU default), wide rows: one row per program only; past BLOCK_N 4096
    the backward's one-row list is the wide one (one program per SM), at any width every entry unique."""
    for n in (1, 7, 128, 1000, 1024):
        assert ln._ln_bwd_candidates(n)[0][0] == "tile"
        assert ln._ln_fwd_candidates(n)[0][0] == "tile"
    for n in (1025, 4096, 5120, 8192):
        assert all(c[0] == "row" for c in ln._ln_bwd_candidates(n) + ln._ln_fwd_candidates(n))
    assert {c[2] for c in ln._ln_bwd_candidates(5120)} == {1}
    assert ln._ln_bwd_candidates(4096) == tuple(("row", 1, *c) for c in ln._BWD_CANDIDATES)
    for n in (128, 1024, 4096, 5120):
        c = ln._ln_bwd_candidates(n)
        assert len(set(c)) == len(c)


def test_bwd_tile_kernel_rows_past_int32():
    # the tile kernels' row offsets are int64: the last row starts past element 2^31
    x = rows_past_int32(3, 40, torch.float16)
    dy = rows_past_int32(3, 40, torch.float16)
    w = torch.randn(40, device=DEVICE, dtype=torch.float16)
    b = torch.randn(40, device=DEVICE, dtype=torch.float16)
    assert ln._ln_bwd_candidates(40)[0][0] == "tile"
    y, mean, rstd = ln._forward(x, w, b, 1e-5)
    assert_close(y, _fp64(x, w, b), torch.float16, msg="y")
    dxr, dwr, dbr = _fp64(x, w, b, dy)
    dx, dw, db = ln._backward(dy, x, w, mean, rstd)
    assert_close(dx, dxr, torch.float16, msg="dx")
    assert_close(dw, dwr, torch.float16, msg="dw")
    assert_close(db, dbr, torch.float16, msg="db")


def test_zero_rows_frozen_backward():
    x = torch.randn(0, 16, device=DEVICE)
    dx, dw, db = ln._backward(x, x, torch.ones(16, device=DEVICE), x[:, 0], x[:, 0], need_dw=False)
    assert dx.shape == (0, 16) and dw is None and db is None


# ----------------------------------------------------------------------------------------------
# A frozen norm (weight and bias need no gradient, e.g. under LoRA): no dw / db work at all
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["eager", "compile"])
def test_frozen_norm_skips_the_parameter_gradients(route, monkeypatch):
    """Before: a [2, G, N] fp32 partial buffer, a column sum and casts on every backward, then thrown away."""
    torch.manual_seed(23)
    x = torch.randn(40, 64, device=DEVICE, requires_grad=True)
    w, b = 1 + 0.1 * torch.randn(64, device=DEVICE), 0.1 * torch.randn(64, device=DEVICE)

    def forward():
        if route == "eager":
            return ln._layer_norm(x, w, b, 1e-5)[0]
        return torch.ops.hearth.layer_norm_fwd(x, w, b, 1e-5)[0]  # the custom op's autograd (torch.compile's route)

    dy = torch.randn(40, 64, device=DEVICE)
    # one backward first: on a GPU the first call times the candidates (dozens of launches and buffers)
    torch.autograd.backward([forward()], [dy])
    x.grad = None
    y = forward()
    with _AtenOps().watch(monkeypatch, "layer_norm") as ops:
        torch.autograd.backward([y], [dy])
    # one backward kernel (which of the two is the GPU's pick; the interpreter's default is the tile one)
    assert len(ops.launches) == 1, ops.launches
    assert ops.launches[0] in ("_layer_norm_bwd_rows_kernel", "_layer_norm_bwd_kernel"), ops.launches
    assert "sum" not in ops.seen and "_to_copy" not in ops.seen, ops.seen
    if route == "eager":
        assert ops.seen.count("empty") == 1, ops.seen  # dx only
    else:  # the backward op's body is not seen by the mode: it must have been told to skip dw
        assert ops.seen.count("layer_norm_bwd") == 1 and ops.hearth_args[0][-1] is False, ops.seen
    assert w.grad is None and b.grad is None
    dxr = _fp64(x, w, b, dy)[0]
    assert_close(x.grad, dxr, torch.float32, msg="dx")


@pytest.mark.parametrize("route", ["eager", "compile"])
def test_backward_gets_no_materialised_zero_gradient_for_mean_and_rstd(route):
    """mean and rstd are outputs only to be saved: they must not require grad, and autograd must not
    allocate and fill a zero gradient for each of them on every backward."""
    torch.manual_seed(26)
    x = torch.randn(6, 32, device=DEVICE, requires_grad=True)
    w = torch.randn(32, device=DEVICE, requires_grad=True)
    b = torch.randn(32, device=DEVICE, requires_grad=True)
    fn = ln._layer_norm if route == "eager" else torch.ops.hearth.layer_norm_fwd
    y, mean, rstd = fn(x, w, b, 1e-5)
    assert y.requires_grad and not mean.requires_grad and not rstd.requires_grad
    dy = torch.randn_like(y)
    with _AtenOps() as ops:
        torch.autograd.backward([y], [dy])
    assert not {"zeros", "zeros_like", "zero_", "fill_"} & set(ops.seen), ops.seen
    for got, want, name in zip((x.grad, w.grad, b.grad), _fp64(x, w, b, dy), ("dx", "dw", "db")):
        assert_close(got, want, torch.float32, msg=name)


@pytest.mark.parametrize("trained", ["weight", "bias"])
def test_one_trained_parameter_gets_its_gradient(trained):
    """weight frozen and bias trained (or the reverse): the trained one's gradient is right, the other None."""
    torch.manual_seed(24)
    x = torch.randn(9, 48, device=DEVICE, requires_grad=True)
    w = (1 + 0.1 * torch.randn(48, device=DEVICE)).requires_grad_(trained == "weight")
    b = (0.1 * torch.randn(48, device=DEVICE)).requires_grad_(trained == "bias")
    dy = torch.randn(9, 48, device=DEVICE)
    torch.autograd.backward([layer_norm(x, w, b)], [dy])
    dxr, dwr, dbr = _fp64(x, w, b, dy)
    assert_close(x.grad, dxr, torch.float32, msg="dx")
    if trained == "weight":
        assert b.grad is None
        assert_close(w.grad, dwr, torch.float32, msg="dw")
    else:
        assert w.grad is None
        assert_close(b.grad, dbr, torch.float32, msg="db")


_BF, _F16, _F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize("wdt, bdt", [(_BF, _BF), (_F16, _F16), (_F32, _F32), (_BF, _F32), (_F32, _BF), (_BF, _F16)],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_eager_backward_sums_weight_and_bias_grads_in_one_launch(wdt, bdt, monkeypatch):
    """Weight and bias gradients, whatever their dtypes, come from ONE launch that sums the [2, G, N] fp32
    partials and writes each in its own dtype (before: a torch sum, then a cast per 16-bit dtype): no torch
    sum, cast or copy in the backward; the values are the fp32 sums rounded once (bit for bit the default
    fp32 dbias cast afterwards). Autograd stores the two tensors as they are, no clone."""
    torch.manual_seed(27)
    x = (torch.randn(13, 96, device=DEVICE) + 1).to(wdt).requires_grad_()
    w = (1 + 0.1 * torch.randn(96, device=DEVICE)).to(wdt).requires_grad_()
    b = (0.1 * torch.randn(96, device=DEVICE)).to(bdt).requires_grad_()
    dy = torch.randn(13, 96, device=DEVICE).to(wdt)
    torch.autograd.backward([layer_norm(x, w, b)], [dy])  # one backward first: a GPU picks its configs on it
    x.grad = w.grad = b.grad = None
    y = layer_norm(x, w, b)
    with _AtenOps().watch(monkeypatch, "layer_norm") as ops:  # (the interpreter's own aten ops not counted)
        torch.autograd.backward([y], [dy])
    assert len(ops.launches) == 2 and ops.launches[1] == "_sum_partials_kernel", ops.launches
    assert not {"sum", "_to_copy", "clone", "copy_"} & set(ops.seen), ops.seen
    assert x.grad.dtype == wdt and w.grad.dtype == wdt and b.grad.dtype == bdt
    _y, mean, rstd = ln._forward(x.detach(), w.detach(), b.detach(), 1e-5)
    dx, dw, db32 = ln._backward(dy, x.detach(), w.detach(), mean, rstd)  # the default: dbias in fp32
    assert db32.dtype == torch.float32
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, dw, rtol=0, atol=0)
    if DEVICE.type == "cuda":  # the kernel rounds to nearest, as torch's cast does
        torch.testing.assert_close(b.grad, db32.to(bdt), rtol=0, atol=0)
    else:  # the interpreter truncates fp32 -> bf16 where torch rounds: one unit in the last place at most
        torch.testing.assert_close(b.grad.float(), db32, rtol=torch.finfo(bdt).eps, atol=0)
    dxr, dwr, dbr = _fp64(x, w, b, dy)
    assert_close(w.grad, dwr, wdt, msg="dw")
    assert_close(b.grad, dbr, bdt, msg="db")


@pytest.mark.parametrize("wdt, bdt", [(_BF, _BF), (_F32, _BF), (_BF, _F32)], ids=lambda d: str(d).replace("torch.", ""))
def test_zero_rows_give_zero_param_grads_in_their_dtypes(wdt, bdt):
    x = torch.randn(0, 8, device=DEVICE, dtype=wdt, requires_grad=True)
    w = torch.randn(8, device=DEVICE, dtype=wdt, requires_grad=True)
    b = torch.randn(8, device=DEVICE, dtype=bdt, requires_grad=True)
    layer_norm(x, w, b).sum().backward()
    assert w.grad.dtype == wdt and b.grad.dtype == bdt
    assert not w.grad.any() and not b.grad.any()


# ----------------------------------------------------------------------------------------------
# Host trims: contiguous tensors passed whole (no [M, N] views), the usual call's checks in one test
# ----------------------------------------------------------------------------------------------
# contiguous tensors of every kind (N-D, size-1 dims with odd strides, one row, one column), then non-contiguous
# ones (read in place through their row stride, or copied when the feature dimension is strided)
_LAYOUTS = [((24, 48), None), ((4, 3, 33), None), ((33,), None), ((1, 48), (999, 1)), ((3, 1, 33), (33, 7, 1)),
            ((5, 1), None), ((6, 1, 1), (1, 9, 3)), ((7, 40), (50, 1)), ((3, 40), (1, 3)), ((2, 3, 20), (100, 20, 1))]


@pytest.mark.parametrize("kind", ["tile", "row"])
@pytest.mark.parametrize("shape,strides", _LAYOUTS, ids=lambda v: "x".join(map(str, v)) if v else "c")
def test_launch_arguments_are_those_of_the_row_views(monkeypatch, kind, shape, strides):
    """The launchers pass contiguous x, dy, y and dx whole; every launch gets the pointers, row strides and sizes of
    the views it took before, rms_norm._rows(x) and y.view(-1, n) (forward), _rows of dy and x and dx.view(-1, n)
    (backward), and the values are torch's."""
    n = shape[-1]
    fwd = next(c for c in ln._ln_fwd_candidates(n) if c[0] == kind)
    bwd = next(c for c in ln._ln_bwd_candidates(n) if c[0] == kind)
    kernels = Launches(monkeypatch, ln, ["_layer_norm_fwd_kernel", "_layer_norm_fwd_rows_kernel",
                                         "_layer_norm_bwd_kernel", "_layer_norm_bwd_rows_kernel"])
    x, dy = laid_out(shape, strides), laid_out(shape, strides, seed=1)
    w, b = 1 + 0.1 * laid_out((n,), seed=2), laid_out((n,), seed=3)
    _use(monkeypatch, fwd)
    y, mean, rstd = ln._forward(x, w, b, 1e-5)
    _use(monkeypatch, bwd)
    dx, dw, db = ln._backward(dy, x, w, mean, rstd)
    want = row_view_launches(n, y, x, dx, dy)
    assert [name for name, _, _ in kernels.log] == (
        ["_layer_norm_fwd_rows_kernel", "_layer_norm_bwd_rows_kernel"] if kind == "tile"
        else ["_layer_norm_fwd_kernel", "_layer_norm_bwd_kernel"])
    (_, grid_f, args_f), (_, _, args_b) = kernels.log
    ptrs, strides_, m = want[0]
    # forward: (x, w, b, y, mean, rstd, [m,] n, eps, stride_x, stride_y), one program a row for "row"
    got_ptrs = [args_f[0], args_f[3]]
    assert [p if w_ is not None else None for p, w_ in zip(got_ptrs, ptrs)] == ptrs, args_f
    assert list(args_f[-2:]) == strides_, args_f
    assert (tuple(args_f[6:8]) == (m, n)) if kind == "tile" else (grid_f == (m,) and args_f[6] == n), args_f
    ptrs, strides_, m = want[1]
    # backward: (dy, x, w, mean, rstd, dx, partial, m, n, [per_program,] stride_dy, stride_x, stride_dx)
    got_ptrs = [args_b[0], args_b[1], args_b[5]]
    assert [p if w_ is not None else None for p, w_ in zip(got_ptrs, ptrs)] == ptrs, args_b
    assert list(args_b[-3:]) == strides_ and tuple(args_b[7:9]) == (m, n), args_b
    assert y.is_contiguous() and dx.is_contiguous() and y.shape == dx.shape == x.shape
    assert_close(y, _fp64(x, w, b), torch.float32, msg="y")
    for got, ref, name in zip((dx, dw, db), _fp64(x, w, b, dy), ("dx", "dw", "db")):
        assert_close(got, ref, torch.float32, msg=name)


def test_unusual_valid_arguments_give_the_usual_result():
    """Calls the checks' one-test fast path does not take (an int eps, a numpy float eps, no bias, a weight of
    another float dtype, a strided weight) run the checks one by one and pass, with the same result."""
    np = pytest.importorskip("numpy")
    x = torch.randn(6, 32, device=DEVICE)
    w, b = 1 + 0.1 * torch.randn(32, device=DEVICE), 0.1 * torch.randn(32, device=DEVICE)
    torch.testing.assert_close(layer_norm(x, w, b, 1), layer_norm(x, w, b, 1.0), rtol=0, atol=0)
    torch.testing.assert_close(layer_norm(x, w, b, np.float64(1e-3)), layer_norm(x, w, b, 1e-3), rtol=0, atol=0)
    torch.testing.assert_close(layer_norm(x, w, None), _fp64(x, w, torch.zeros_like(w)).float(), rtol=1e-5, atol=1e-5)
    assert_close(layer_norm(x, w.bfloat16(), b.half()), _fp64(x, w.bfloat16(), b.half()), torch.float32)
    wide = torch.randn(32, 2, device=DEVICE)
    assert_close(layer_norm(x, wide[:, 0], wide[:, 1]), _fp64(x, wide[:, 0], wide[:, 1]), torch.float32)


@pytest.mark.parametrize("call, exc, message", [
    (lambda x, w, b: layer_norm(x, w.tolist(), b), TypeError, "weight must be a torch.Tensor, got list"),
    (lambda x, w, b: layer_norm(x, w.double(), b), TypeError,
     "weight must have dtype in (float32, bfloat16, float16), got float64"),
    (lambda x, w, b: layer_norm(x, w[None], b), ValueError, "weight must have 1 dimensions, got shape (1, 8)"),
    (lambda x, w, b: layer_norm(x, w[:7], b), ValueError, "weight must have length x.shape[-1] = 8, got shape (7,)"),
    (lambda x, w, b: layer_norm(x, w, b.to("meta")), ValueError,
     "bias must be a CUDA tensor (CPU tensors run only under TRITON_INTERPRET=1), got device meta"),
    (lambda x, w, b: layer_norm(x, w, b.long()), TypeError,
     "bias must have dtype in (float32, bfloat16, float16), got int64"),
    (lambda x, w, b: layer_norm(x, w, b[:4]), ValueError, "bias must have length x.shape[-1] = 8, got shape (4,)"),
    (lambda x, w, b: layer_norm(x, w, b, True), ValueError, "eps must be a positive number, got True"),
    (lambda x, w, b: layer_norm(x, w, b, 0.0), ValueError, "eps must be a positive number, got 0.0"),
    (lambda x, w, b: layer_norm(x, w, b, float("nan")), ValueError, "eps must be a positive number, got nan"),
    (lambda x, w, b: layer_norm(x, w, b, "1e-5"), ValueError, "eps must be a positive number, got '1e-5'"),
])
def test_bad_arguments_raise_the_checks_messages(call, exc, message):
    """Anything the fast path's one test refuses goes through the checks one by one: their exact messages."""
    x, w, b = torch.randn(3, 8, device=DEVICE), torch.ones(8, device=DEVICE), torch.zeros(8, device=DEVICE)
    with pytest.raises(exc) as err:
        call(x, w, b)
    assert str(err.value) == message


# ----------------------------------------------------------------------------------------------
# GPU: the model shapes of issue 17, every candidate at the real grid
# ----------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.parametrize("n, m", [(1024, 65536), (5120, 12289)], ids=["qwen3-0.6b_1024x65536", "qwen3-14b_5120x12289"])
def test_model_shapes_every_candidate_bf16(n, m, monkeypatch):
    """fwd + bwd in bf16 against fp32 references for every forward and backward candidate, with and
    without dw, and once through the public function (the pick's own choice)."""
    torch.manual_seed(25)
    x = (torch.randn(m, n, device=DEVICE) + 1).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    check_fwd_bwd(x, w, b, torch.bfloat16)
    dy = torch.randn_like(x)
    leaves = [t.detach().float().requires_grad_() for t in (x, w, b)]
    yr = F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5)
    dxr, dwr, dbr = torch.autograd.grad(yr, leaves, dy.float())
    for cfg in ln._ln_fwd_candidates(n):
        _use(monkeypatch, cfg)
        y, mean, rstd = ln._forward(x, w, b, 1e-5)
        assert_close(y, yr, torch.bfloat16, msg=f"y {cfg}")
    for cfg in ln._ln_bwd_candidates(n):
        _use(monkeypatch, cfg)
        dx, dw, db = ln._backward(dy, x, w, mean, rstd)
        assert_close(dx, dxr, torch.bfloat16, msg=f"dx {cfg}")
        assert_close(dw, dwr, torch.bfloat16, msg=f"dw {cfg}")
        assert_close(db, dbr, torch.bfloat16, msg=f"db {cfg}")
        dx_only, _, _ = ln._backward(dy, x, w, mean, rstd, need_dw=False)
        torch.testing.assert_close(dx_only, dx, rtol=0, atol=0, msg=f"dx without dw {cfg}")


# ----------------------------------------------------------------------------------------------
# sm_90 (H200) builds of every tiled candidate, offline: compiles, no spills, programs_per_SM fit an SM
# ----------------------------------------------------------------------------------------------
_SM90_SCRIPT = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hearth import inspect as hi

ln = importlib.import_module("hearth.kernels.layer_norm")
rn = importlib.import_module("hearth.kernels.rms_norm")
group = sys.argv[1]
out = []
def build(fn, sig, const, warps, stages, label, programs_per_sm):
    sig = dict(sig, **{k: "constexpr" for k in const})
    # pointers, N and the row strides divisible by 16, as the launch specialises them at these widths
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in sig
             if k.endswith("_ptr") or k in ("N", "stride_dy", "stride_x", "stride_dx", "stride_y")}
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    except Exception as e:
        out.append(dict(label=label, error=f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"))
        return
    usage = hi.parse_res_usage(hi._cuobjdump(k.asm["cubin"], "-res-usage") or "")
    res = usage.get(k.metadata.name, {})
    out.append(dict(label=label, registers=res.get("REG"), spill=res.get("STACK", 0) + res.get("LOCAL", 0),
                    shared=k.metadata.shared, warps=warps, programs_per_sm=programs_per_sm,
                    mul_rn=k.asm["ptx"].count("mul.rn")))

if group.startswith("bwd"):
    _, dt, n = group.split("_")
    n = int(n)
    sig = {"dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "mean_ptr": "*fp32", "rstd_ptr": "*fp32",
           "dx_ptr": f"*{dt}", "partial_ptr": "*fp32", "M": "i32", "N": "i32",
           "tiles_per_program": "i32", "stride_dy": "i32", "stride_x": "i32", "stride_dx": "i32"}
    for _, block_m, pps, warps, stages in [c for c in ln._ln_bwd_candidates(n) if c[0] == "tile"]:
        const = dict(BLOCK_M=block_m, BLOCK_N=n, NUM_STAGES=stages, COMPUTE_DW=True)
        build(ln._layer_norm_bwd_rows_kernel, sig, const, warps, stages,
              f"bwd {block_m}x{n} {pps}/SM w{warps} s{stages} {dt}", pps)
elif group == "wide":  # the untimed default of the widest rows, one-row kernel (these spill: not checked)
    for dt, n in (("bf16", 65536),):
        sig = {"dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "mean_ptr": "*fp32", "rstd_ptr": "*fp32",
               "dx_ptr": f"*{dt}", "partial_ptr": "*fp32", "M": "i32", "N": "i32",
               "stride_dy": "i32", "stride_x": "i32", "stride_dx": "i32"}
        _, _, pps, warps, stages = ln._ln_bwd_candidates(n)[0]
        const = dict(BLOCK_N=n, ROWS_PER_PROGRAM=16, NUM_STAGES=stages, COMPUTE_DW=True)
        build(ln._layer_norm_bwd_kernel, sig, const, warps, stages, f"wide default bwd row {n} w{warps} s{stages} {dt}", pps)
else:
    _, dt, n = group.split("_")
    n = int(n)
    sig = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "y_ptr": f"*{dt}", "mean_ptr": "*fp32",
           "rstd_ptr": "*fp32", "M": "i32", "N": "i32", "eps": "fp32", "stride_x": "i32", "stride_y": "i32"}
    for _, block_m, warps in [c for c in ln._ln_fwd_candidates(n) if c[0] == "tile"]:
        build(ln._layer_norm_fwd_rows_kernel, sig, dict(BLOCK_M=block_m, BLOCK_N=n, HAS_BIAS=True), warps, 1,
              f"fwd {block_m}x{n} w{warps} {dt}", 1)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sm90_tile_builds():
    """Every tile candidate built for sm_90 with Triton's bundled ptxas (no GPU): the backward (two fp32
    [BLOCK_M, BLOCK_N] accumulators, with dw: its most registers) at N=1024 (Qwen3-0.6B; more registers
    than narrower rows) in bf16 and fp32, the forward in fp32 at N=1024 (its 4x1024 tile spilled 16 bytes
    until mean / rstd were stored before y was computed; bf16 needs fewer registers), and the widest rows'
    default (65536 bf16).
    Subprocesses (the interpreter flag must be off for triton.compile), two at a time on CI's two cores."""
    groups = ("bwd_fp32_1024", "bwd_bf16_1024", "fwd_fp32_1024", "wide")
    builds = [b for group in run_offline(_SM90_SCRIPT, *((g,) for g in groups)) for b in group]
    if any(b.get("registers") is None and "error" not in b for b in builds):
        pytest.skip("cuobjdump is missing: no register figures")
    return builds


def test_tile_candidates_compile_for_sm90_without_spills(sm90_tile_builds):
    n_bwd = sum(c[0] == "tile" for c in ln._ln_bwd_candidates(128))
    n_fwd = sum(c[0] == "tile" for c in ln._ln_fwd_candidates(1024))
    assert len(sm90_tile_builds) == 2 * n_bwd + n_fwd + 1
    errors = [f"{b['label']}: {b['error']}" for b in sm90_tile_builds if "error" in b]
    assert not errors, "\n".join(errors)
    for b in sm90_tile_builds:
        if "bwd" in b["label"]:  # dy * w by layer_norm._mul_rn: a product no later add fuses with
            assert b["mul_rn"] > 0, f"{b['label']}: no mul.rn in the PTX"
        if b["label"].startswith("wide"):
            continue  # the whole row and three fp32 vectors in registers: spills at any num_warps (see _ln_bwd_candidates)
        assert b["spill"] == 0, f"{b['label']}: {b['spill']} bytes spilled ({b['registers']} registers)"


def test_tile_candidates_fit_their_programs_per_sm(sm90_tile_builds):
    """programs_per_SM programs of each backward tile candidate are resident at once on an H200 SM (65536
    registers, allocated per warp in units of 256 = 8 per thread; 227 KiB of shared memory per SM): a
    program that does not fit would queue behind the others, a second wave over the persistent grid.
    And the widest rows' default config fits its shared memory (it is launched untimed under capture)."""
    for b in sm90_tile_builds:
        # the default config of the widest rows runs untimed (CUDA-graph capture): it must launch
        assert b["shared"] * b["programs_per_sm"] <= 227 * 1024, f"{b['label']}: {b['shared']} B shared memory"
        if b["label"].startswith("wide"):
            continue
        regs = -(-b["registers"] // 8) * 8 * 32 * b["warps"] * b["programs_per_sm"]
        assert regs <= 65536, f"{b['label']}: {b['registers']} registers x {b['warps']} warps x {b['programs_per_sm']}"
