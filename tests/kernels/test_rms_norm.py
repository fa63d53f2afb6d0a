"""hearth.kernels.rms_norm against an fp32 PyTorch reference (interpreter on CPU, real shapes on GPU)."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hearth.kernels.rms_norm import rms_norm
from tests.kernels.offline import run_offline
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only, rows_past_int32


def reference(x, w, eps=1e-6):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def check_fwd_bwd(x, w, dtype, eps=1e-6, grad_scale=2.0):
    """Forward and every gradient vs the fp32 reference on the same (rounded) inputs."""
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    y = rms_norm(x, w, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr = x.detach().float().requires_grad_()
    wr = w.detach().float().requires_grad_()
    yr = reference(xr, wr, eps)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.float())
    assert_close(y, yr, dtype, msg="y")
    assert_close(dx, dxr, dtype, msg="dx")
    # dw sums over rows, but in fp32: its error is one final rounding, so no extra allowance.
    assert_close(dw, dwr, dtype, msg="dw")
    assert dw.dtype == w.dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 80), (17, 130), (2, 3, 64)], ids=["1row", "17rows_130", "3d"])
def test_matches_fp32_reference(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], device=DEVICE)).to(dtype)
    check_fwd_bwd(x, w, dtype)


def test_fp32_weight_with_bf16_input():
    torch.manual_seed(1)
    x = torch.randn(5, 80, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(80, device=DEVICE, dtype=torch.float32)
    check_fwd_bwd(x, w, torch.bfloat16)


def test_rows_step_and_the_persistent_grid_balance(monkeypatch):
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function
    # rows_step: 2^j or 3 * 2^j, the smallest at least k
    allowed = sorted({2**j for j in range(20)} | {3 * 2**j for j in range(19)})
    for k in range(1, 5000):
        want = next(a for a in allowed if a >= k)
        assert rn.rows_step(k) == want, k
        assert want < 1.5 * k or k <= 2, k
    # 132 SMs (an H100 / H200): the grid never exceeds programs_per_sm x SMs, the rows per program are
    # within half again of the even share, and every row is covered once
    monkeypatch.setattr(rn, "num_sms", lambda device: 132)
    for m in (1, 131, 133, 4096, 12289, 16384, 65536, 131072, 100003):
        for pps in (1, 2, 4):
            grid, rows = rn.persistent_grid(m, "cpu", pps)
            target = min(m, pps * 132)
            assert grid <= target and (grid - 1) * rows < m <= grid * rows, (m, pps, grid, rows)
            assert rows < 1.5 * rn.cdiv(m, target) or rows <= 2, (m, pps, rows)
    # the case that moved it: 12289 rows at 2 programs an SM were 193 programs of 64 rows
    assert rn.persistent_grid(12289, "cpu", 2) == (257, 48)
    assert rn.persistent_grid(12289, "cpu", 1) == (129, 96)


def test_many_rows_exercise_the_persistent_grid_tail():
    # 37 rows over the interpreter's 4 "SMs": the last program has a masked tail.
    torch.manual_seed(2)
    x = torch.randn(37, 24, device=DEVICE)
    check_fwd_bwd(x, torch.randn(24, device=DEVICE), torch.float32)


def test_row_strided_and_non_contiguous_inputs():
    torch.manual_seed(3)
    base = torch.randn(9, 100, device=DEVICE)
    w = torch.randn(80, device=DEVICE)
    check_fwd_bwd(base[:, :80], w, torch.float32)  # row stride 100, read in place
    check_fwd_bwd(torch.randn(80, 9, device=DEVICE).t(), w, torch.float32)  # feature stride 9: copied


def test_zero_rows_give_empty_output_and_zero_weight_grad():
    x = torch.randn(0, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    y = rms_norm(x, w)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(16, device=DEVICE))


def test_wrong_dtype_names_x():
    with pytest.raises(TypeError, match=r"^x\b"):
        rms_norm(torch.ones(2, 4, dtype=torch.int32, device=DEVICE), torch.ones(4, device=DEVICE))


def test_weight_length_mismatch_names_weight():
    with pytest.raises(ValueError, match=r"^weight\b"):
        rms_norm(torch.ones(2, 4, device=DEVICE), torch.ones(5, device=DEVICE))


def test_weight_on_other_device_names_weight():
    with pytest.raises(ValueError, match=r"^weight\b"):
        rms_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device="meta"))


def test_zero_width_rows_name_x():
    with pytest.raises(ValueError, match=r"^x\b"):
        rms_norm(torch.ones(2, 0, device=DEVICE), torch.ones(0, device=DEVICE))


def test_bad_eps_names_eps():
    with pytest.raises(ValueError, match=r"^eps\b"):
        rms_norm(torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE), eps=-1.0)


@pytest.mark.parametrize("frozen_weight", [False, True], ids=["trained_weight", "frozen_weight"])
def test_torch_compile_fullgraph(frozen_weight):
    torch.manual_seed(4)
    x = torch.randn(3, 48, device=DEVICE, requires_grad=True)
    w = torch.randn(48, device=DEVICE, requires_grad=not frozen_weight)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    fn = torch.compile(lambda a, b: rms_norm(a, b).square().sum(), backend=backend, fullgraph=True)
    leaves = (x,) if frozen_weight else (x, w)
    got = torch.autograd.grad(fn(x, w), leaves)
    want = torch.autograd.grad(rms_norm(x, w).square().sum(), leaves)
    for g, e in zip(got, want):
        assert_close(g, e, torch.float32)


def test_sum_backward_with_an_expanded_gradient():
    # y.sum().backward() hands the op a stride-0 dy; it must be read correctly.
    torch.manual_seed(6)
    x = torch.randn(5, 24, device=DEVICE, requires_grad=True)
    w = torch.randn(24, device=DEVICE, requires_grad=True)
    rms_norm(x, w).sum().backward()
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    reference(xr, wr).sum().backward()
    assert_close(x.grad, xr.grad, torch.float32)
    assert_close(w.grad, wr.grad, torch.float32)


def test_opcheck():
    x = torch.randn(3, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hearth.rms_norm_fwd, (x, w, 1e-6))
    dy, rstd = torch.randn(3, 8, device=DEVICE), torch.rand(3, device=DEVICE) + 0.5
    for need_dw in (True, False):
        torch.library.opcheck(torch.ops.hearth.rms_norm_bwd, (dy, x.detach(), w.detach(), rstd, need_dw))


@gpu_only
@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@pytest.mark.parametrize("n", [4096, 5120, 17408])
def test_real_shapes_bf16(n):
    torch.manual_seed(5)
    m = 32768 if n == 4096 else (12289 if n == 5120 else 4096)  # 12289: a multiple of no block
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(torch.bfloat16)
    check_fwd_bwd(x, w, torch.bfloat16, grad_scale=4.0)


# ------------------------------------------------------------------------- audit additions (CPU-sized)
def test_strided_weight_is_read_correctly():
    # the kernels index weight as w_ptr + col: a strided view (a column of a [N, 2] tensor) must not
    # be read as if it were contiguous (it was: wrong values, and an expanded weight read out of bounds)
    torch.manual_seed(7)
    x = torch.randn(5, 24, device=DEVICE)
    w2 = torch.randn(24, 2, device=DEVICE)
    check_fwd_bwd(x, w2[:, 1], torch.float32)
    check_fwd_bwd(x, torch.randn(1, device=DEVICE).expand(24), torch.float32)  # stride 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_seventeen_rows_of_4099(dtype):
    torch.manual_seed(8)
    x = torch.randn(17, 4099, device=DEVICE, dtype=dtype)
    check_fwd_bwd(x, (1 + 0.1 * torch.randn(4099, device=DEVICE)).to(dtype), dtype, grad_scale=4.0)


def test_row_offsets_past_int32_are_int64():
    # last row starts past element 2^31 with an int32 row stride: forward and backward must use int64
    # row offsets (~4 GiB of virtual memory; only the touched rows are resident)
    stride = (1 << 30) + 64
    storage = torch.empty(2 * stride + 40, dtype=torch.float16, device=DEVICE)
    x = storage.as_strided((3, 40), (stride, 1))
    x.copy_(torch.randn(3, 40, generator=torch.Generator().manual_seed(9)).to(DEVICE))
    check_fwd_bwd(x, torch.randn(40, device=DEVICE, dtype=torch.float16), torch.float16)


@pytest.mark.parametrize(
    "x, w, exc, name",
    [
        (torch.ones(2, 4, dtype=torch.float64), torch.ones(4), TypeError, "x"),
        (torch.ones(2, 4), torch.ones(4, dtype=torch.int64), TypeError, "weight"),
        (torch.ones(2, 4), torch.ones(4, 1), ValueError, "weight"),
        (torch.ones(2, 4), torch.ones(0), ValueError, "weight"),
        (torch.ones(2, 4, device="meta"), torch.ones(4), ValueError, "x"),
    ],
)
def test_bad_input_names_the_argument(x, w, exc, name):
    x = x if x.device.type == "meta" else x.to(DEVICE)
    with pytest.raises(exc, match=rf"^{name}\b"):
        rms_norm(x, w.to(DEVICE))


# ----------------------------------------------------------------------------------------------
# Narrow rows (N <= rms_norm.NARROW_MAX_BLOCK): the forward's [BLOCK_M, BLOCK_N] tile kernel
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 128), (5, 1), (70, 7), (9, 1000), (2, 3, 5, 64)],
                         ids=["37x128", "5x1", "70x7", "9x1000", "4d_64"])
def test_narrow_rows_tile_kernel_every_candidate(dtype, shape, monkeypatch):
    """Every forward candidate at narrow widths (tiles of several rows, a ragged last tile, the one-row
    kernel) gives the reference's y and rstd; the default for narrow rows is a tile."""
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    n = shape[-1]
    cands = rn._fwd_candidates(n)
    assert cands[0][0] == "tile" and any(c[0] == "row" for c in cands)
    torch.manual_seed(11)
    x = torch.randn(*shape, device=DEVICE).to(dtype)
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    x32 = x.float()
    want_rstd = torch.rsqrt(x32.pow(2).mean(-1) + 1e-6).reshape(-1)
    for cfg in cands:
        monkeypatch.setattr(rn, "pick_config", lambda key, candidates, launch, device, rows=None, memory=None, cfg=cfg: cfg)
        y, rstd = rn._forward(x, w, 1e-6)
        assert_close(y, reference(x, w), dtype, msg=f"y {cfg}")
        torch.testing.assert_close(rstd, want_rstd, rtol=1e-5, atol=1e-6, msg=f"rstd {cfg}")


def test_narrow_rows_fwd_bwd_through_the_public_function():
    # q_norm-like: [B, T, H, 128] normalised over head_dim, rows = B * T * H (a ragged last tile), row-strided
    torch.manual_seed(12)
    base = torch.randn(2, 9, 5, 160, device=DEVICE)
    x = base[..., :128]  # row stride 160, feature stride 1: read in place
    check_fwd_bwd(x, 1 + 0.1 * torch.randn(128, device=DEVICE), torch.float32)


def test_wide_rows_keep_one_row_per_program():
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    assert all(c[0] == "row" for c in rn._fwd_candidates(rn.NARROW_MAX_BLOCK + 1))


# ----------------------------------------------------------------------------------------------
# Narrow rows: the backward's [BLOCK_M, BLOCK_N] tile kernel, every candidate against fp64
# ----------------------------------------------------------------------------------------------
def _bwd_reference(x, w, dy, eps=1e-6):
    """(dx, dw, rstd) of the fp64 reference on the same (rounded) inputs; rstd in fp32 as the forward stores it."""
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    dxr, dwr = torch.autograd.grad(reference(xr, wr, eps), (xr, wr), dy.double())
    rstd = torch.rsqrt(x.detach().float().pow(2).mean(-1) + eps).reshape(-1)
    return dxr, dwr, rstd


# A tile of 2 rows and one of 4 rows at 1 program per SM: several tiles per program at the small M used here,
# so the loop, its ragged last tile and the last program's spare tiles are all walked under the interpreter.
_SMALL_TILES = (("tile", 2, 1, 4, 1), ("tile", 4, 1, 4, 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 128), (1, 128), (70, 7), (9, 1000)], ids=["37x128", "1x128", "70x7", "9x1000"])
def test_narrow_rows_bwd_every_candidate(dtype, shape, monkeypatch):
    """Every backward candidate at narrow widths (tiles first, then the one-row configs) gives the fp64
    reference's dx and dw from row-strided x and dy (row stride > N), with a ragged last tile."""
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    n = shape[-1]
    cands = rn._bwd_candidates(n)
    assert cands[0][0] == "tile" and any(c[0] == "row" for c in cands)
    torch.manual_seed(13)
    # x and dy are views into wider rows: row stride n + 3, read in place
    x = torch.randn(*shape[:-1], n + 3, device=DEVICE).to(dtype)[..., :n]
    dy = torch.randn(*shape[:-1], n + 5, device=DEVICE).to(dtype)[..., :n]
    w = (1 + 0.1 * torch.randn(n, device=DEVICE)).to(dtype)
    dxr, dwr, rstd = _bwd_reference(x, w, dy)
    for cfg in cands + _SMALL_TILES:
        if cfg[0] == "row" and (dtype != torch.float32 or x.numel() // n > 40):
            continue  # the one-row kernel (tested above at wider rows) is walked here in fp32, at M <= 40:
            # the interpreter takes its rows one at a time
        monkeypatch.setattr(rn, "pick_config", lambda key, candidates, launch, device, rows=None, memory=None, cfg=cfg: cfg)
        dx, dw = rn._backward(dy, x, w, rstd)
        assert dx.dtype == dtype and dw.dtype == dtype
        assert_close(dx, dxr, dtype, msg=f"dx {cfg}")
        assert_close(dw, dwr, dtype, msg=f"dw {cfg}")
        if dtype == torch.float32:  # a frozen weight: the same dx, no dw
            dx_only, none = rn._backward(dy, x, w, rstd, need_dw=False)
            assert none is None
            torch.testing.assert_close(dx_only, dx, rtol=0, atol=0, msg=f"dx without dw {cfg}")


def test_rowpair_backward_halves_the_partial_buffer_and_matches_the_reference(monkeypatch):
    """The "rowpair" candidates (wide rows with dw only: the 2-programs-an-SM one-row configs with programs 2i and
    2i+1 adding into one zeroed partial row) give the fp64 reference's dx and dw, the same dx as the one-row form,
    and a partial buffer of cdiv(grid, 2) rows (the memory tie-break's figure); an odd grid leaves its last row
    to one program. Interpreter, fp32, few rows (it walks rows one at a time)."""
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    n = 1100  # BLOCK_N 2048: the one-row kernel's range
    pairs = [c for c in rn._rms_bwd_candidates(n, True) if c[0] == "rowpair"]
    assert pairs == [("rowpair", *c[1:]) for c in rn._bwd_candidates(n) if c[0] == "row" and c[2] == 2]
    assert pairs and rn._rms_bwd_candidates(n, True)[0] == rn._bwd_candidates(n)[0]  # the default stays first
    assert rn._rms_bwd_candidates(n, False) == rn._bwd_candidates(n)  # no dw: nothing to pair
    assert not any(c[0] == "rowpair" for c in rn._rms_bwd_candidates(128, True) + rn._rms_bwd_candidates(20000, True))
    torch.manual_seed(21)
    real_sum = rn.sum_partials
    for m in (11, 9):  # grids of 6 and 5 programs (4 "SMs" under the interpreter, 2 an SM)
        x = torch.randn(m, n, device=DEVICE)
        dy = torch.randn(m, n, device=DEVICE)
        w = 1 + 0.1 * torch.randn(n, device=DEVICE)
        dxr, dwr, rstd = _bwd_reference(x, w, dy)
        grid = rn.bwd_grid(pairs[0], m, x.device)[0]
        assert rn.partial_rows(pairs[0], m, x.device) == (grid + 1) // 2 and grid >= 5
        sizes = []
        monkeypatch.setattr(rn, "sum_partials", lambda partial, out: (sizes.append(partial.shape), real_sum(partial, out)))
        for cfg in (("row", *pairs[0][1:]), pairs[0]):
            monkeypatch.setattr(rn, "pick_config",
                                lambda key, candidates, launch, device, rows=None, memory=None, cfg=cfg: cfg)
            dx, dw = rn._backward(dy, x, w, rstd)
            assert_close(dx, dxr, torch.float32, msg=f"dx {cfg} m={m}")
            assert_close(dw, dwr, torch.float32, msg=f"dw {cfg} m={m}")
        assert sizes == [(grid, n), ((grid + 1) // 2, n)]


def test_narrow_rows_bwd_zero_rows():
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    x = torch.randn(0, 128, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(128, device=DEVICE, dtype=torch.bfloat16)
    dx, dw = rn._backward(torch.randn_like(x), x, w, torch.empty(0, device=DEVICE))
    assert dx.shape == (0, 128) and torch.equal(dw, torch.zeros_like(w))


@pytest.mark.xdist_group("gpu_big")  # a 4 GiB operand: one at a time (scripts/gpu/test.sh)
def test_narrow_rows_bwd_rows_past_int32():
    # the tile kernel's row offsets are int64: the last row starts past element 2^31
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    x = rows_past_int32(3, 40, torch.float16)
    dy = rows_past_int32(3, 40, torch.float16)
    w = torch.randn(40, device=DEVICE, dtype=torch.float16)
    assert rn._bwd_candidates(40)[0][0] == "tile"
    dxr, dwr, rstd = _bwd_reference(x, w, dy)
    dx, dw = rn._backward(dy, x, w, rstd)
    assert_close(dx, dxr, torch.float16, msg="dx")
    assert_close(dw, dwr, torch.float16, msg="dw")


def test_wide_rows_bwd_keep_one_row_per_iteration():
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    assert all(c[0] == "row" and c[1] == 1 for c in rn._bwd_candidates(rn.NARROW_MAX_BLOCK + 1))
    assert all(c[0] == "row" for c in rn._bwd_candidates(20000))


# ----------------------------------------------------------------------------------------------
# Host path: what the backward runs besides its kernel
# ----------------------------------------------------------------------------------------------
class _AtenOps(TorchDispatchMode):
    """Names of the aten ops that reach the dispatcher while the mode is on, and the Triton launches of
    rms_norm's (or layer_norm's) kernels (`watch(monkeypatch)`); ops issued inside a launch (the CPU interpreter copies its
    arguments with aten ops) are not counted."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.launches: list[str] = []
        self.hearth_args: list[tuple] = []  # the arguments of each hearth:: op seen
        self._in_launch = False

    def watch(self, monkeypatch, op="rms_norm"):
        """Count launches of hearth.kernels.<op>'s _<op>_{fwd,bwd}{,_rows}_kernel (layer_norm's tests reuse this)."""
        mod = importlib.import_module(f"hearth.kernels.{op}")  # the package attribute is the function
        rn = importlib.import_module("hearth.kernels.rms_norm")
        kernels = [(name, getattr(mod, name)) for name in
                   (f"_{op}_fwd_kernel", f"_{op}_fwd_rows_kernel", f"_{op}_bwd_kernel", f"_{op}_bwd_rows_kernel")]
        for name, kernel in kernels + [("_sum_partials_kernel", rn._sum_partials_kernel)]:  # both norms' dw sum

            def run(*args, _run=kernel.run, _name=name, **kwargs):
                self.launches.append(_name)
                self._in_launch = True
                try:
                    return _run(*args, **kwargs)
                finally:
                    self._in_launch = False

            monkeypatch.setattr(kernel, "run", run)  # kernel[grid](...) calls self.run
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_launch:
            self.seen.append(func._schema.name.split("::")[-1])
            if func.namespace == "hearth":
                self.hearth_args.append(args)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("route", ["eager", "compile"])
def test_backward_gets_no_materialised_zero_gradient_for_rstd(route):
    """rstd is an output of the op that nothing differentiates: it must not require grad, and autograd must
    not allocate and fill a zero gradient for it on every backward (it did: an aten.zeros of [M] per call)."""
    torch.manual_seed(14)
    x = torch.randn(6, 32, device=DEVICE, requires_grad=True)
    w = torch.randn(32, device=DEVICE, requires_grad=True)
    if route == "eager":
        y, rstd = importlib.import_module("hearth.kernels.rms_norm")._rms_norm(x, w, 1e-6)
    else:  # the custom op's own autograd (the route torch.compile's graph takes)
        y, rstd = torch.ops.hearth.rms_norm_fwd(x, w, 1e-6)
    assert y.requires_grad and not rstd.requires_grad
    dy = torch.randn_like(y)
    with _AtenOps() as ops:
        torch.autograd.backward([y], [dy])
    assert not {"zeros", "zeros_like", "zero_", "fill_"} & set(ops.seen), ops.seen
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.autograd.backward([reference(xr, wr)], [dy])
    assert_close(x.grad, xr.grad, torch.float32, msg="dx")
    assert_close(w.grad, wr.grad, torch.float32, msg="dw")


@pytest.mark.parametrize("route", ["eager", "compile"])
def test_frozen_weight_skips_the_weight_gradient(route, monkeypatch):
    """A weight that needs no gradient (every norm under LoRA) gets none computed: no partial buffer, no
    reduction (before: an fp32 [G, N] buffer, a sum and a cast per backward, then thrown away)."""
    torch.manual_seed(15)
    x = torch.randn(40, 64, device=DEVICE, requires_grad=True)
    w = 1 + 0.1 * torch.randn(64, device=DEVICE)

    def forward():
        if route == "eager":
            return importlib.import_module("hearth.kernels.rms_norm")._rms_norm(x, w, 1e-6)[0]
        return torch.ops.hearth.rms_norm_fwd(x, w, 1e-6)[0]  # the custom op's autograd (torch.compile's route)

    dy = torch.randn(40, 64, device=DEVICE)
    # one backward first: on a GPU the first call autotunes (dozens of timed launches and their buffers)
    torch.autograd.backward([forward()], [dy])
    x.grad = None
    y = forward()
    with _AtenOps().watch(monkeypatch) as ops:
        torch.autograd.backward([y], [dy])
    # one backward kernel (which of the two the autotuner picks is the GPU's call; the interpreter's is the row one)
    assert len(ops.launches) == 1, ops.launches
    assert ops.launches[0] in ("_rms_norm_bwd_rows_kernel", "_rms_norm_bwd_kernel"), ops.launches
    assert "sum" not in ops.seen and "_to_copy" not in ops.seen, ops.seen
    if route == "eager":
        assert ops.seen.count("empty") == 1, ops.seen  # dx only
    else:  # the backward op's body is not seen by the mode: it must have been told to skip dw
        assert ops.seen.count("rms_norm_bwd") == 1 and ops.hearth_args[0][-1] is False, ops.seen
    assert w.grad is None
    xr = x.detach().requires_grad_()
    torch.autograd.backward([reference(xr, w)], [dy])
    assert_close(x.grad, xr.grad, torch.float32, msg="dx")


@gpu_only
def test_narrow_rows_real_shape_every_bwd_candidate_bf16(monkeypatch):
    """Qwen3's q_norm rows on the GPU (head_dim 128, 4096 tokens x 32 heads, + 3 rows: a ragged last tile),
    every backward candidate compiled and run at the real grid, with and without dw."""
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function

    torch.manual_seed(16)
    x = torch.randn(4096 * 32 + 3, 128, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(128, device=DEVICE)).to(torch.bfloat16)
    dxr, dwr, rstd = _bwd_reference(x, w, dy)
    for cfg in rn._bwd_candidates(128):
        monkeypatch.setattr(rn, "pick_config", lambda key, candidates, launch, device, rows=None, memory=None, cfg=cfg: cfg)
        dx, dw = rn._backward(dy, x, w, rstd)
        assert_close(dx, dxr, torch.bfloat16, msg=f"dx {cfg}")
        assert_close(dw, dwr, torch.bfloat16, msg=f"dw {cfg}")
        dx_only, _ = rn._backward(dy, x, w, rstd, need_dw=False)
        torch.testing.assert_close(dx_only, dx, rtol=0, atol=0, msg=f"dx without dw {cfg}")


_SM90_SCRIPT = r"""
import importlib, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

rn = importlib.import_module("hearth.kernels.rms_norm")
fn = rn._rms_norm_bwd_rows_kernel
tiles = [c for c in rn._bwd_candidates(128) if c[0] == "tile"]
# the default in both dtypes with and without dw; every other candidate in bf16 with dw
jobs = [(tiles[0], dt, dw) for dt in ("bf16", "fp32") for dw in (True, False)] + [(c, "bf16", True) for c in tiles[1:]]
done, failed = [], []
for (_, block_m, _, warps, stages), dt, dw in jobs:
    sig = {"dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "rstd_ptr": "*fp32", "dx_ptr": f"*{dt}",
           "dw_partial_ptr": "*fp32", "M": "i32", "N": "i32", "tiles_per_program": "i32",
           "stride_dy": "i32", "stride_x": "i32", "stride_dx": "i32"}
    const = dict(BLOCK_M=block_m, BLOCK_N=128, NUM_STAGES=stages, COMPUTE_DW=dw)
    sig.update({k: "constexpr" for k in const})
    # pointers, N and the row strides divisible by 16, as the launch specialises them at head_dim 128
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in sig
             if k.endswith("_ptr") or k in ("N", "stride_dy", "stride_x", "stride_dx")}
    label = f"{block_m}x128 w{warps} s{stages} {dt} dw={dw}"
    try:
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
        done.append(label)
    except Exception as e:
        failed.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
print(json.dumps({"done": done, "failed": failed}))
"""


def test_narrow_rows_bwd_tile_kernel_compiles_for_sm90():
    """The interpreter never type-checks a kernel: build the tile backward for the H200 (sm_90, Triton's
    bundled ptxas, no GPU needed) for every tile candidate at head_dim 128, with and without dw."""
    out = run_offline(_SM90_SCRIPT)
    assert not out["failed"], "\n".join(out["failed"])
    assert len(out["done"]) == 9


@pytest.mark.parametrize("g, n", [(70, 300), (5, 7), pytest.param(528, 5120, marks=gpu_only)])
def test_sum_partials_sums_every_program_and_column(g, n):
    """rms_norm.sum_partials (both norms' dw / db reduction): every one of G partial rows and every column, past
    the kernel's 32-row and 128-column blocks (70 x 300: three partial blocks each way; 528 x 5120: the GPU's
    grid at Qwen3-14B's width, on the GPU only: 11 s under the interpreter for no logic 70 x 300 does not reach),
    into outputs of two dtypes at once; one slice alone for rms_norm's dw."""
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function
    torch.manual_seed(31)
    partial = torch.randn(2, g, n, device=DEVICE) * 10
    want = partial.double().sum(1)
    dw = torch.full((n,), float("nan"), device=DEVICE)
    db = torch.full((n,), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    rn.sum_partials(partial, dw, db)
    torch.testing.assert_close(dw.double(), want[0], rtol=1e-6, atol=1e-4 * g ** 0.5)
    # bf16: the fp32 sum rounded once (truncated under the interpreter): within one unit in the last place
    torch.testing.assert_close(db.double(), want[1], rtol=2 * torch.finfo(torch.bfloat16).eps, atol=1e-3 * g ** 0.5)
    only = torch.full((n,), float("nan"), device=DEVICE)
    rn.sum_partials(partial[0].contiguous(), only)
    torch.testing.assert_close(only, dw, rtol=0, atol=0)


def test_sum_partials_refuses_a_buffer_it_cannot_read():
    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function
    out = torch.empty(8, device=DEVICE)
    for bad in (torch.zeros(4, 8, device=DEVICE, dtype=torch.bfloat16), torch.zeros(8, 4, device=DEVICE).t()):
        with pytest.raises(ValueError, match="partial must be a contiguous fp32"):
            rn.sum_partials(bad, out)
    with pytest.raises(ValueError, match="out1 needs a"):
        rn.sum_partials(torch.zeros(4, 8, device=DEVICE), out, torch.empty(8, device=DEVICE))


def test_trained_weight_backward_is_one_kernel_and_one_sum_launch(monkeypatch):
    """rms_norm's backward with a trained weight: the backward kernel and the partials' sum kernel, no torch sum
    or cast (the frozen weight's backward has neither partials nor sum: test_frozen_weight_skips_the_weight_gradient)."""
    torch.manual_seed(32)
    x = torch.randn(20, 64, device=DEVICE, requires_grad=True)
    w = (1 + 0.1 * torch.randn(64, device=DEVICE)).to(torch.bfloat16).float().requires_grad_()
    y = rms_norm(x, w)
    torch.autograd.backward([y], [torch.ones_like(y)])  # one backward first: a GPU picks its configs on it
    x.grad = w.grad = None
    y = rms_norm(x, w)
    with _AtenOps().watch(monkeypatch) as ops:
        torch.autograd.backward([y], [torch.ones_like(y)])
    assert len(ops.launches) == 2 and ops.launches[1] == "_sum_partials_kernel", ops.launches
    assert not {"sum", "_to_copy", "clone", "copy_"} & set(ops.seen), ops.seen
    assert w.grad is not None and w.grad.dtype == w.dtype


_ROW_SM90_SCRIPT = r"""
import importlib, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hearth import inspect as hi

rn = importlib.import_module("hearth.kernels.rms_norm")
fn = rn._rms_norm_bwd_kernel
out = {}
for pair in (False, True):
    sig = {"dy_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16", "rstd_ptr": "*fp32", "dx_ptr": "*bf16",
           "dw_partial_ptr": "*fp32", "M": "i32", "N": "i32", "stride_dy": "i32", "stride_x": "i32", "stride_dx": "i32"}
    const = dict(BLOCK_N=8192, ROWS_PER_PROGRAM=16, NUM_STAGES=3, COMPUTE_DW=True, PAIR_DW=pair)
    sig.update({k: "constexpr" for k in const})
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8, "num_stages": 3})
    ptx = k.asm["ptx"]
    out[str(pair)] = {"atomics": ptx.count("red.global") + ptx.count("atom.global"),
                      "spills": hi.report_compiled("rms_norm_bwd", k, sass=False).spill_bytes}
print(json.dumps(out))
"""


def test_rowpair_backward_compiles_for_sm90_with_global_adds():
    """The interpreter never type-checks a kernel: the one-row backward builds for the H200 (sm_90, bundled
    ptxas, no GPU) at 8192 features, 8 warps, 3 stages, with and without PAIR_DW; the paired form's dw goes out
    by global atomic adds (one per feature a thread holds), and it spills no more than the plain form (whose 8
    bytes at this width predate it)."""
    out = run_offline(_ROW_SM90_SCRIPT)
    # one fp32 add per feature a thread holds (8192 over 256 threads), beyond what the plain form's PTX counts
    assert out["True"]["atomics"] - out["False"]["atomics"] >= 8192 // 256, out
    assert out["True"]["spills"] == out["False"]["spills"], out  # no spill the plain form does not have


# ----------------------------------------------------------------------------------------------
# Host trims: contiguous tensors passed whole (no [M, N] views), the usual call's checks in one test
# ----------------------------------------------------------------------------------------------
# contiguous tensors of every kind (N-D, size-1 dims with odd strides, one row, one column), then non-contiguous
# ones (read in place through their row stride, or copied when the feature dimension is strided); then rows wide
# enough for the one-row kernel and its "rowpair" form (1025-8192 features), contiguous, row-strided and one row
_NARROW_LAYOUTS = [((24, 48), None), ((4, 3, 33), None), ((33,), None), ((1, 48), (999, 1)),
                   ((3, 1, 33), (33, 7, 1)), ((5, 1), None), ((6, 1, 1), (1, 9, 3)), ((7, 40), (50, 1)),
                   ((3, 40), (1, 3)), ((2, 3, 20), (100, 20, 1))]
_WIDE_LAYOUTS = [((3, 1100), None), ((2, 2, 1100), None), ((2, 1100), (1200, 1)), ((1, 1100), (5000, 1)),
                 ((1100,), None)]
# (kind, shape, strides, need_dw); "rowpair" is a candidate only with dw
_LAUNCH_CASES = ([(kind, *lay, dw) for kind in ("tile", "row") for lay in _NARROW_LAYOUTS for dw in (True, False)]
                 + [("row", *lay, dw) for lay in _WIDE_LAYOUTS for dw in (True, False)]
                 + [("rowpair", *lay, True) for lay in _WIDE_LAYOUTS])


@pytest.mark.parametrize("kind,shape,strides,need_dw", _LAUNCH_CASES,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else
                         {True: "dw", False: "no_dw", None: "c"}.get(v, v))
def test_launch_arguments_are_those_of_the_row_views(monkeypatch, kind, shape, strides, need_dw):
    """The launchers pass contiguous x, dy, y and dx whole; every launch gets the pointers, row strides, sizes and
    grid of the views it took before, _rows(x) and y.view(-1, n) (forward), _rows of dy and x and dx.view(-1, n)
    (backward), the partial buffer of the config's size (rstd's pointer without dw), and the values are the fp64
    reference's."""
    from tests.kernels.launch_log import Launches, laid_out, row_view_launches

    rn = importlib.import_module("hearth.kernels.rms_norm")  # the package attribute is the function
    n = shape[-1]
    fwd = next(c for c in rn._fwd_candidates(n) if c[0] == ("tile" if kind == "tile" else "row"))
    bwd = next(c for c in rn._rms_bwd_candidates(n, need_dw) if c[0] == kind)
    kernels = Launches(monkeypatch, rn, ["_rms_norm_fwd_kernel", "_rms_norm_fwd_rows_kernel",
                                         "_rms_norm_bwd_kernel", "_rms_norm_bwd_rows_kernel"])
    partials = []
    real_sum = rn.sum_partials
    monkeypatch.setattr(rn, "sum_partials", lambda p, out: (partials.append(p), real_sum(p, out)))
    x, dy = laid_out(shape, strides), laid_out(shape, strides, seed=1)
    w = 1 + 0.1 * laid_out((n,), seed=2)
    for cfg in (fwd, bwd):  # the forward's pick, then the backward's
        monkeypatch.setattr(rn, "pick_config", lambda key, candidates, launch, device, rows=None, memory=None,
                            cfg=cfg: cfg)
        if cfg is fwd:
            y, rstd = rn._forward(x, w, 1e-6)
    dx, dw = rn._backward(dy, x, w, rstd, need_dw)
    want = row_view_launches(n, y, x, dx, dy)
    assert [name for name, _, _ in kernels.log] == (
        ["_rms_norm_fwd_rows_kernel", "_rms_norm_bwd_rows_kernel"] if kind == "tile"
        else ["_rms_norm_fwd_kernel", "_rms_norm_bwd_kernel"])
    (_, grid_f, args_f), (_, grid_b, args_b) = kernels.log
    ptrs, strides_, m = want[0]
    # forward: (x, w, y, rstd, [m,] n, eps, stride_x, stride_y): one program a row ("row"), a tile of rows ("tile")
    got_ptrs = [args_f[0], args_f[2]]
    assert [p if w_ is not None else None for p, w_ in zip(got_ptrs, ptrs)] == ptrs, args_f
    assert args_f[1] == w.data_ptr() and args_f[3] == rstd.data_ptr(), args_f
    assert list(args_f[-2:]) == strides_, args_f
    if kind == "tile":
        assert tuple(args_f[4:6]) == (m, n) and grid_f == (rn.cdiv(m, fwd[1]),), (grid_f, args_f)
    else:
        assert grid_f == (m,) and args_f[4] == n, (grid_f, args_f)
    ptrs, strides_, m = want[1]
    # backward: (dy, x, w, rstd, dx, partial, m, n, [tiles_per_program,] stride_dy, stride_x, stride_dx)
    got_ptrs = [args_b[0], args_b[1], args_b[4]]
    assert [p if w_ is not None else None for p, w_ in zip(got_ptrs, ptrs)] == ptrs, args_b
    assert list(args_b[-3:]) == strides_ and tuple(args_b[6:8]) == (m, n), args_b
    grid, per_program = rn.bwd_grid(bwd, m, x.device)
    assert grid_b == (grid,) and (kind != "tile" or args_b[8] == per_program), (grid_b, args_b)
    if need_dw:
        assert [args_b[5]] == [p.data_ptr() for p in partials], args_b
        assert partials[0].shape == (rn.partial_rows(bwd, m, x.device), n)
    else:
        assert args_b[5] == rstd.data_ptr() and not partials and dw is None, args_b
    assert y.is_contiguous() and dx.is_contiguous() and y.shape == dx.shape == x.shape
    dxr, dwr, rstd_r = _bwd_reference(x, w, dy)
    assert_close(y, reference(x.double(), w.double()), torch.float32, msg="y")
    torch.testing.assert_close(rstd, rstd_r, rtol=1e-5, atol=1e-6)
    assert_close(dx, dxr, torch.float32, msg="dx")
    if need_dw:
        assert_close(dw, dwr, torch.float32, msg="dw")


def test_unusual_valid_arguments_give_the_usual_result():
    """Calls the checks' one-test fast path does not take (an int eps, a numpy float eps, a weight of another float
    dtype, a strided weight) run the checks one by one and pass, with the same result."""
    np = pytest.importorskip("numpy")
    x = torch.randn(6, 32, device=DEVICE)
    w = 1 + 0.1 * torch.randn(32, device=DEVICE)
    torch.testing.assert_close(rms_norm(x, w, 1), rms_norm(x, w, 1.0), rtol=0, atol=0)
    torch.testing.assert_close(rms_norm(x, w, np.float64(1e-3)), rms_norm(x, w, 1e-3), rtol=0, atol=0)
    assert_close(rms_norm(x, w.bfloat16()), reference(x.double(), w.bfloat16().double()), torch.float32)
    wide = torch.randn(32, 2, device=DEVICE)
    assert_close(rms_norm(x, wide[:, 1]), reference(x.double(), wide[:, 1].double()), torch.float32)


@pytest.mark.parametrize("call, exc, message", [
    (lambda x, w: rms_norm(x.double(), w), TypeError, "x must have dtype in (float32, bfloat16, float16), got float64"),
    (lambda x, w: rms_norm(x[..., :0], w), ValueError, "x must have 1 <= x.shape[-1] <= 65536, got shape (3, 0)"),
    (lambda x, w: rms_norm(x, w.tolist()), TypeError, "weight must be a torch.Tensor, got list"),
    (lambda x, w: rms_norm(x, w.double()), TypeError,
     "weight must have dtype in (float32, bfloat16, float16), got float64"),
    (lambda x, w: rms_norm(x, w[None]), ValueError, "weight must have 1 dimensions, got shape (1, 8)"),
    (lambda x, w: rms_norm(x, w[:7]), ValueError, "weight must have length x.shape[-1] = 8, got shape (7,)"),
    (lambda x, w: rms_norm(x, w.to("meta")), ValueError,
     "weight must be a CUDA tensor (CPU tensors run only under TRITON_INTERPRET=1), got device meta"),
    (lambda x, w: rms_norm(x, w, True), ValueError, "eps must be a positive number, got True"),
    (lambda x, w: rms_norm(x, w, 0.0), ValueError, "eps must be a positive number, got 0.0"),
    (lambda x, w: rms_norm(x, w, -1), ValueError, "eps must be a positive number, got -1"),
    (lambda x, w: rms_norm(x, w, float("nan")), ValueError, "eps must be a positive number, got nan"),
    (lambda x, w: rms_norm(x, w, "1e-6"), ValueError, "eps must be a positive number, got '1e-6'"),
])
def test_bad_arguments_raise_the_checks_messages(call, exc, message):
    """Anything the fast path's one test refuses goes through the checks one by one: their exact messages."""
    x, w = torch.randn(3, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    with pytest.raises(exc) as err:
        call(x, w)
    assert str(err.value) == message
