"""hearth.kernels.softmax against an fp32 PyTorch reference (CPU interpreter at tiny shapes; real
shapes on CUDA only)."""

from __future__ import annotations

import importlib

import pytest
import torch

# the module, not the function: hearth.kernels re-exports softmax() under the submodule's name, so
# `import hearth.kernels.softmax as sm` can bind the function (depending on import order)
sm = importlib.import_module("hearth.kernels.softmax")
from hearth.kernels.softmax import softmax
from tests.kernels.launch_log import Launches, kept_pointer, laid_out
from tests.kernels.tolerance import DEVICE, DTYPES, assert_close, gpu_only, rows_past_int32


def _check(x_fp32: torch.Tensor, dtype: torch.dtype, dim: int = -1, seed: int = 0) -> None:
    """Forward and input gradient of softmax(x.to(dtype), dim) vs torch in fp32 from the same values."""
    x = x_fp32.to(dtype).detach().requires_grad_()
    y = softmax(x, dim)
    assert y.dtype == dtype and y.shape == x.shape
    x_ref = x.detach().float().requires_grad_()
    y_ref = torch.softmax(x_ref, dim)
    # the rule's baseline: PyTorch's softmax in `dtype`; its backward, like hearth's, reads the saved
    # output y rounded to `dtype`
    x_base = x.detach().clone().requires_grad_()
    y_base = torch.softmax(x_base, dim)
    assert_close(y, y_ref, dtype, msg="forward", baseline=y_base)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dy = torch.randn(x.shape, generator=gen).to(x.device)
    y.backward(dy.to(dtype))
    y_ref.backward(dy.to(dtype).float())
    y_base.backward(dy.to(dtype))
    assert_close(x.grad, x_ref.grad, dtype, msg="grad", baseline=x_base.grad)


@pytest.fixture(params=[(None, 1), (None, 3), (0, 3)], ids=["unpipelined", "pipelined", "program-per-row"])
def wide_path(monkeypatch, request):
    """Force the chunked (online max/sum, reverse second loop) kernels at tiny widths, with the
    column loops unpipelined or software-pipelined 3 deep, on the persistent grid or with one program
    per row (one launch config each: no GPU tuning, so every variant is checked on the GPU; the
    interpreter ignores the pipelining depth)."""
    monkeypatch.setattr(sm, "ONEPASS_MAX_COLS", 64)
    monkeypatch.setattr(sm, "WIDE_CHUNK", 32)
    per_sm, stages = request.param
    cfg = (sm.WIDE_PROGRAMS_PER_SM if per_sm is None else per_sm, 32, sm.WIDE_WARPS if stages == 1 else 1, stages)
    monkeypatch.setattr(sm, "_wide_candidates", lambda *args: [cfg])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(33,), (1, 7), (17, 4099), (4, 3, 33)])
def test_matches_reference(shape, dtype):
    _check(torch.randn(shape, device=DEVICE) * 4, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 65), (5, 301), (2, 3, 128)])
def test_wide_path_matches_reference(wide_path, shape, dtype):
    assert sm._config(shape[-1])[0], "the chunked kernels must be the ones under test"
    _check(torch.randn(shape, device=DEVICE) * 4, dtype)


def test_wide_path_leading_masked_chunk(wide_path):
    # A first chunk of all -inf (e.g. a masked prefix) must not turn the running sum into nan.
    x = torch.randn(3, 200, device=DEVICE)
    x[:, :70] = float("-inf")
    y = softmax(x)
    assert_close(y, torch.softmax(x, -1), torch.float32)
    assert torch.all(y[:, :70] == 0)


@pytest.mark.parametrize("cfg", sm._ROWS_CANDIDATES, ids=lambda c: f"{c[0]}perSM-w{c[1]}-s{c[2]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_persistent_onepass_kernels_every_candidate(monkeypatch, cfg, dtype):
    """The persistent, pipelined one-pass forward and backward (GPU pick candidates for rows of BLOCK >=
    ROWS_MIN_BLOCK), forced at a small width: more rows than programs, a width that is not a power of two, a
    strided view."""
    monkeypatch.setattr(sm, "ROWS_MIN_BLOCK", 64)
    asked = []

    def forced(key, cands, launch, device, rows=None):
        asked.append(list(cands))
        return cfg

    monkeypatch.setattr(sm, "pick_config", forced)
    monkeypatch.setattr(sm, "num_sms", lambda device: 3)  # 3 or 6 programs over 37 rows
    torch.manual_seed(3)
    _check(torch.randn(37, 300, device=DEVICE) * 4, dtype)
    assert len(asked) == 2 and all(cfg in a and isinstance(a[0], int) for a in asked)  # one-row kernel first
    rows = (torch.randn(37, 400, device=DEVICE) * 4)[:, :300]  # row stride 400: read in place
    assert_close(softmax(rows), torch.softmax(rows, -1), torch.float32)


def test_wide_candidates_include_one_program_per_row_within_shared_memory():
    """The chunked kernels' GPU candidates keep the CPU default first and end with the one-program-per-row
    grids (programs_per_SM 0 -> one program per row, never fewer); each pipelined candidate's buffers fit
    160 KiB, the backward's two inputs counted."""
    for n_cols, itemsize, n_inputs in ((262144, 2, 1), (262144, 2, 2), (65537, 4, 2), (40000, 2, 1)):
        cands = sm._wide_candidates(n_cols, itemsize, n_inputs)
        assert cands[0] == (sm.WIDE_PROGRAMS_PER_SM, min(sm.WIDE_CHUNK, sm.next_power_of_2(n_cols)), sm.WIDE_WARPS, 1)
        assert (0, 4096, 8, 3) in cands and (0, 8192, 16, 3) in cands, cands
        assert all(s == 1 or (s - 1) * c * itemsize * n_inputs <= 160 * 1024 for _, c, _, s in cands), cands
    assert sm._wide_programs(4097, torch.device("cpu"), 0) == 4097
    assert sm._wide_programs(0, torch.device("cpu"), 0) == 1


@gpu_only
@pytest.mark.parametrize("n_rows,n_cols", [(133, 65537), (7, 262144)])
def test_gpu_every_wide_candidate(monkeypatch, n_rows, n_cols):
    """Every chunked-kernel candidate the GPU pick may choose, forced, forward and backward in bf16 against fp32
    (a candidate that fails to compile or is wrong would otherwise surface only when the pick chose it)."""
    cands = sm._wide_candidates(n_cols, 2, 1) + sm._wide_candidates(n_cols, 2, 2)
    monkeypatch.setattr(sm.sg, "ROUTE", False)  # the Triton forward, which Hopper sends to the cluster kernel
    for cfg in dict.fromkeys(cands):
        # forced where it is a candidate of that pass (forward: 1 input, backward: 2), else that list's first
        monkeypatch.setattr(sm, "pick_config",
                            lambda key, c, launch, device, rows=None, cfg=cfg: cfg if cfg in c else c[0])
        torch.manual_seed(1)
        x = (torch.randn(n_rows, n_cols, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
        y = softmax(x)
        ref = torch.softmax(x.detach().float(), -1)
        assert_close(y, ref, torch.bfloat16, msg=f"fwd {cfg}")
        dy = torch.randn_like(y)
        y.backward(dy)
        ref_grad = ref * (dy.float() - (dy.float() * ref).sum(-1, keepdim=True))
        assert_close(x.grad, ref_grad, torch.bfloat16, msg=f"bwd {cfg}")


def test_persistent_candidates_fit_shared_memory():
    """Only candidates whose pipelined rows fit 160 KiB of shared memory an SM are offered."""
    assert all(isinstance(c, int) for c in sm._onepass_pick_candidates(4096, 8, 2))  # narrow rows: one-row only
    for block, itemsize in ((8192, 2), (32768, 2), (32768, 4)):
        rows = [c for c in sm._onepass_pick_candidates(block, 32, itemsize) if not isinstance(c, int)]
        assert rows and all(p * (st - 1) * block * itemsize <= 160 * 1024 for p, _, st in rows), (block, rows)
    assert (1, 32, 3) not in sm._onepass_pick_candidates(32768, 32, 4)  # 2 x 128 KiB
    assert (1, 32, 3) not in sm._onepass_pick_candidates(32768, 32, 2, n_inputs=2)  # the backward reads y and dy


@pytest.mark.parametrize("use_wide", [False, True])
def test_rows_sum_to_one(monkeypatch, use_wide):
    if use_wide:
        monkeypatch.setattr(sm, "ONEPASS_MAX_COLS", 64)
        monkeypatch.setattr(sm, "WIDE_CHUNK", 32)
    x = torch.randn(9, 257, device=DEVICE) * 10
    y = softmax(x)
    assert torch.all(y >= 0)
    torch.testing.assert_close(y.sum(-1), torch.ones(9, device=DEVICE), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dim", [0, 1, -1, -3])
def test_any_dim(dim):
    _check(torch.randn(5, 6, 37, device=DEVICE), torch.float32, dim=dim)


def test_non_contiguous_inputs():
    base = torch.randn(37, 12, device=DEVICE)
    _check(base.t(), torch.float32)  # column stride 37: copied to contiguous rows
    _check(base[:, ::2], torch.float32)  # row stride 24, column stride 2
    _check(torch.randn(8, 40, device=DEVICE)[::2, 3:], torch.float32)  # strided rows, read in place


# contiguous tensors of every kind (N-D, size-1 dims with odd strides, one element, one column), then
# non-contiguous ones (copied or read in place through their row stride)
_LAYOUTS = [((24, 48), None), ((4, 3, 33), None), ((33,), None), ((1, 256), (999, 1)), ((3, 1, 33), (33, 7, 1)),
            ((1, 1), (5, 7)), ((5, 1), None), ((6, 1, 1), (1, 9, 3)), ((7, 40), (50, 1)), ((3, 40), (1, 3)),
            ((2, 3, 20), (100, 20, 1))]


@pytest.mark.parametrize("use_wide", [False, True])
@pytest.mark.parametrize("shape,strides", _LAYOUTS, ids=lambda v: "x".join(map(str, v)) if v else "c")
def test_launch_arguments_are_those_of_the_row_views(monkeypatch, use_wide, shape, strides):
    """The launchers pass contiguous tensors whole (no [rows, n] views: host time); every launch gets the pointers,
    row strides and sizes of the views it took before, _as_rows(x) and y.view(-1, n) (forward), _as_rows of y and
    dy and dx.view(-1, n) (backward), and the values are torch's."""
    if use_wide:
        monkeypatch.setattr(sm, "ONEPASS_MAX_COLS", 16)
        monkeypatch.setattr(sm, "WIDE_CHUNK", 8)
    # the default config, untimed (on the GPU the pick would time every candidate through the same launches)
    monkeypatch.setattr(sm, "pick_config", lambda key, candidates, launch, device, rows=None: candidates[0])
    kernels = Launches(monkeypatch, sm, ["_softmax_fwd_onepass_kernel", "_softmax_fwd_chunked_kernel",
                                           "_softmax_bwd_onepass_kernel", "_softmax_bwd_chunked_kernel"])
    x = laid_out(shape, strides)
    dy = laid_out(shape, strides, seed=1)
    y = sm._softmax_fwd(x)
    dx = sm._softmax_bwd(y, dy)
    n = shape[-1]
    want = []
    for ins, out in (((x,), y), ((y, dy), dx)):
        rows = [sm._as_rows(t) for t in (*ins, out)]
        ptrs = [kept_pointer(r, t) for r, t in zip(rows, (*ins, out))]
        want.append((ptrs, [r.stride(0) for r in rows], rows[0].shape[0]))
    assert len(kernels.log) == 2
    for (name, grid, args), (ptrs, strides_, m) in zip(kernels.log, want):
        k = len(ptrs)
        assert [p if w is not None else None for p, w in zip(args, ptrs)] == ptrs, (name, args)
        assert list(args[k:2 * k]) == strides_, (name, args)
        sizes = (grid[0], args[2 * k]) if "onepass" in name else args[2 * k:2 * k + 2]
        assert tuple(sizes) == (m, n) and ("chunked" in name) == (use_wide and n > 16), (name, args)
    assert y.is_contiguous() and dx.is_contiguous()
    ref = torch.softmax(x.double(), -1)
    assert_close(y, ref, torch.float32)
    assert_close(dx, ref * (dy.double() - (dy.double() * ref).sum(-1, keepdim=True)), torch.float32)


def test_last_dim_by_either_index_and_no_bool_dim():
    """softmax(x, x.dim() - 1) takes the same route as dim=-1; a bool is not an int dim, even where it names the
    last dim (True == 1 for a 2-D x)."""
    x = torch.randn(4, 3, 33, device=DEVICE)
    torch.testing.assert_close(softmax(x, 2), softmax(x, -1), rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"^dim must be an int, got bool$"):
        softmax(torch.ones(3, 4, device=DEVICE), dim=True)


def test_does_not_modify_input():
    x = torch.randn(4, 50, device=DEVICE)
    before = x.clone()
    softmax(x)
    assert torch.equal(x, before)


def test_empty_input_gives_empty_output():
    x = torch.empty(0, 5, device=DEVICE, requires_grad=True)
    y = softmax(x)
    assert y.shape == (0, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 5)


@pytest.mark.parametrize(
    "call, exc, name",
    [
        (lambda: softmax([1.0, 2.0]), TypeError, "x"),
        (lambda: softmax(torch.ones(3, 4, dtype=torch.int32, device=DEVICE)), TypeError, "x"),
        (lambda: softmax(torch.ones(3, 4, dtype=torch.float64, device=DEVICE)), TypeError, "x"),
        (lambda: softmax(torch.tensor(1.0, device=DEVICE)), ValueError, "x"),
        (lambda: softmax(torch.ones(3, 4, device=DEVICE), dim=2), ValueError, "dim"),
        (lambda: softmax(torch.ones(3, 4, device=DEVICE), dim=-3), ValueError, "dim"),
        (lambda: softmax(torch.ones(3, 4, device=DEVICE), dim=1.0), TypeError, "dim"),
        (lambda: softmax(torch.ones(3, 4, device="meta")), ValueError, "x"),
    ],
)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_compile_fullgraph_cpu_or_gpu():
    """torch.compile(fullgraph=True) over softmax: no graph break, same values and gradients."""
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    torch._dynamo.reset()

    def f(x):
        return (softmax(x, 0) * x).sum() + softmax(x * 2.0, -1).pow(2).sum()

    x = torch.randn(6, 70, device=DEVICE, requires_grad=True)
    out = torch.compile(f, fullgraph=True, backend=backend)(x)
    out.backward()
    x_ref = x.detach().clone().requires_grad_()
    ref = (torch.softmax(x_ref, 0) * x_ref).sum() + torch.softmax(x_ref * 2.0, -1).pow(2).sum()
    ref.backward()
    assert_close(out, ref, torch.float32)
    assert_close(x.grad, x_ref.grad, torch.float32)


# ------------------------------------------------------------------------------- real shapes (GPU)
@pytest.mark.xdist_group("gpu_big")  # big fp32/fp64 references: one at a time (scripts/gpu/test.sh)
@gpu_only
@pytest.mark.parametrize("shape", [(16384, 8192), (4096, 262144)])
def test_real_shapes_bf16(shape):
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
    assert sm._config(shape[1])[0] == (shape[1] > sm.ONEPASS_MAX_COLS)
    y = softmax(x)
    ref = torch.softmax(x.detach().float(), -1)
    assert_close(y, ref, torch.bfloat16)
    torch.testing.assert_close(y.float().sum(-1), torch.ones(shape[0], device="cuda"), atol=2e-2, rtol=0)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref_grad = ref * (dy.float() - (dy.float() * ref).sum(-1, keepdim=True))
    assert_close(x.grad, ref_grad, torch.bfloat16)




# ------------------------------------------------------------------- int64 offsets (audit, CPU-sized)
@pytest.mark.parametrize("use_wide", [False, True])
def test_row_offsets_past_int32_are_int64(monkeypatch, use_wide):
    if use_wide:
        monkeypatch.setattr(sm, "ONEPASS_MAX_COLS", 64)
        monkeypatch.setattr(sm, "WIDE_CHUNK", 32)
    x = rows_past_int32(3, 100, torch.float16)
    y = softmax(x)  # read in place through the huge row stride (no copy: the column stride is 1)
    assert_close(y, torch.softmax(x.float(), -1), torch.float16)


def test_odd_rows_and_columns_with_gradient():
    # the odd shapes: one row, 17 rows, 4099 columns (not a power of two: masked last block)
    _check(torch.randn(1, 4099, device=DEVICE) * 4, torch.bfloat16)
    _check(torch.randn(17, 4099, device=DEVICE) * 4, torch.float16)
