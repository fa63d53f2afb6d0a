"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension.

Math (per row of N features, statistics in fp32):
    rstd = 1 / sqrt(sum(x^2) / N + eps)        xhat = x * rstd        y = xhat * w
    dx   = rstd * (dy*w - xhat * sum(dy*w*xhat) / N)
    dw   = sum over rows of dy * xhat

Memory traffic for x [M, N] in `b` bytes per element (weight is negligible):
    forward  reads x, writes y (and rstd, 4*M bytes):          2*M*N*b
    backward reads x and dy, writes dx, plus the partial dw
             buffer of G x N fp32 (G ~ a few x num_SMs):       3*M*N*b + 2*G*N*4
At 32768x4096 bf16 that is 256 MiB + 384 MiB = 640 MiB, ~0.16 ms at 4.27 TB/s copy bandwidth.

The weight gradient is a sum over every row. It is reduced in two stages (LESSON 5): a persistent grid of G
programs each walks a contiguous run of rows and keeps its partial dw in fp32 registers, writes one row of a
[G, N] fp32 buffer, and one small kernel (sum_partials) sums over G and writes dw in the weight's dtype. No
atomics, except in the "rowpair" form the GPU may pick at wide rows, where programs 2i and 2i+1 add into one
zeroed row (half the buffer; two fp32 adds onto 0 give the same bits in either order). (A torch sum and a cast
did that before: three torch calls and about 70 us of host time a backward on the H200's host against one
launch.)
The row loop is software-pipelined (the next rows' x and dy stream into shared memory while one row
is computed); G, num_warps and the pipelining depth are picked on the GPU (see _BWD_CANDIDATES).
Narrow rows (N <= NARROW_MAX_BLOCK, e.g. head_dim 128 for Qwen3's q_norm / k_norm) are walked in
[BLOCK_M, N] tiles instead of one row at a time, forward and backward: same bytes, fewer and larger
loads, one reduction per tile.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hearth.kernels._common import (
    FLOAT_DTYPES, autograd_op, cdiv, check_same_device, check_tensor, next_power_of_2, num_sms, pick_config,
)

# Largest feature width kept in registers as one block (fp32 [BLOCK_N] per live tensor).
MAX_N = 65536
# Backward persistent grid = programs_per_SM * num_SMs programs. The row loop is software-pipelined
# (tl.range num_stages: cp.async copies of the next rows into shared memory while this row is
# computed), so each program keeps num_stages - 1 rows' loads in flight; without it (the first
# H200 run) a program waited on every row's loads: load -> reduce -> store, one row at a time.
# Candidate (programs_per_SM, num_warps, num_stages); the first is the default (CPU / interpreter),
# the GPU times all of them once per (N, dtype) and keeps the fastest (_common.pick_config).
# At N=4096 bf16, 8 warps: 119 registers/thread -> 2 programs fit an SM; stages=3 -> 32 KiB smem.
_BWD_CANDIDATES = ((2, 8, 3), (2, 8, 4), (1, 16, 4), (2, 16, 3), (4, 8, 2), (4, 8, 1))
PROGRAMS_PER_SM = _BWD_CANDIDATES[0][0]
# Forward: one row per program; candidate num_warps multipliers of the _config default.
_FWD_WARP_SCALE = (1, 2, 0.5)
# Narrow rows (next_power_of_2(N) <= NARROW_MAX_BLOCK, e.g. Qwen3's q_norm / k_norm over head_dim 128:
# M = tokens x heads rows): one program per row left 128 threads for 128 values and a grid of 160k
# tiny programs (0.25x the best peer on the H200). The forward then takes a [BLOCK_M, BLOCK_N] tile of
# rows per program (_rms_norm_fwd_rows_kernel). Candidates (tile elements, num_warps), timed on the GPU
# with the one-row configs (pick_config keeps the fastest); the first is the default.
NARROW_MAX_BLOCK = 1024
_FWD_TILE_CANDIDATES = ((4096, 4), (2048, 4), (8192, 8), (4096, 8), (16384, 16))
# The backward over narrow rows walked one row per loop iteration: a 256-byte load of x and of dy, a
# reduction and a store per row, latency-bound (0.32x torch.compile's fwd+bwd at 131072 x 128 on the
# H200, where the backward moves only 3 x 32 MiB in bf16: ~24 us at 4.27 TB/s). It takes
# [BLOCK_M, BLOCK_N] tiles too (_rms_norm_bwd_rows_kernel), persistent and pipelined like the one-row
# kernel. Candidates (tile elements, programs_per_SM, num_warps, num_stages), timed on the GPU together
# with the one-row _BWD_CANDIDATES; the first is the default. Each is sized so that programs_per_SM
# programs fit an SM at once (65536 registers, 228 KiB shared memory), from Triton 3.6's sm_90 build at
# N=128 bf16 with dw (ptxas -v; no spills in any, bf16 or fp32, with or without dw):
#   4096 x 4 warps x 3 stages: 149 registers, 33 KiB   4096 x 8 warps x 2: 80 registers, 16 KiB
#   2048 x 4 warps x 2 stages:  80 registers,  8 KiB   8192 x 8 warps x 3: 149 registers, 66 KiB
#   16384 x 16 warps x 2:      112 registers, 66 KiB   (fp32 x: twice the shared memory; no dw: ~half the registers)
_BWD_TILE_CANDIDATES = ((4096, 2, 4, 3), (4096, 3, 4, 3), (4096, 3, 8, 2), (2048, 4, 4, 2), (8192, 1, 8, 3),
                        (16384, 1, 16, 2))
# x's allowed ranks (check_tensor's ndim), built once, not on every call
_X_NDIM = tuple(range(1, 9))


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
@triton.jit
def _rms_norm_fwd_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr, rstd_ptr,
    # shapes
    N, eps,
    # strides (elements between rows; the feature dimension is contiguous)
    stride_x, stride_y,
    # meta-parameters
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    # Loads go to fp32 first: statistics are fp32, and the interpreter cannot mix bf16 and scalars.
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_fwd_rows_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr, rstd_ptr,
    # shapes
    M, N, eps,
    # strides (elements between rows; the feature dimension is contiguous)
    stride_x, stride_y,
    # meta-parameters
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,
):
    """The forward over a [BLOCK_M, BLOCK_N] tile of rows: the math of _rms_norm_fwd_kernel per row."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _rms_norm_bwd_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    # shapes
    M, N,
    # strides
    stride_dy, stride_x, stride_dx,
    # meta-parameters
    BLOCK_N: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,  # one of a few values (see persistent_grid)
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop (1: none)
    COMPUTE_DW: tl.constexpr,  # False when weight needs no gradient: no dw work, dw_partial_ptr unused
    PAIR_DW: tl.constexpr = False,  # programs 2i and 2i+1 add into partial row i (zeroed): half the buffer
):
    pid = tl.program_id(0)
    row_start = pid * ROWS_PER_PROGRAM
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # A compile-time trip count with a row mask: the last program's tail rows load zeros and add
    # nothing to dw.
    for i in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
        row = row_start + i
        mask = col_mask & (row < M)
        row64 = row.to(tl.int64)
        x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row64, mask=row < M, other=0.0)
        xhat = x * rstd
        wdy = dy * w
        c = tl.sum(wdy * xhat, axis=0) / N
        dx = (wdy - xhat * c) * rstd
        tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * xhat
    if COMPUTE_DW:
        if PAIR_DW:  # two fp32 adds onto 0 give the same bits in either order: still deterministic
            tl.atomic_add(dw_partial_ptr + (pid // 2) * N + cols, dw_acc, mask=col_mask, sem="relaxed")
        else:
            tl.store(dw_partial_ptr + pid * N + cols, dw_acc, mask=col_mask)


@triton.jit
def _rms_norm_bwd_rows_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    # shapes
    M, N,
    tiles_per_program,  # a runtime trip count: one compiled variant for every M (no power-of-two rounding)
    # strides
    stride_dy, stride_x, stride_dx,
    # meta-parameters
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the tile loop (1: none)
    COMPUTE_DW: tl.constexpr,  # False when weight needs no gradient: no dw work, dw_partial_ptr unused
):
    """The backward over [BLOCK_M, BLOCK_N] tiles of narrow rows: the math of _rms_norm_bwd_kernel per row.

    Each program walks tiles_per_program consecutive tiles; the per-row dot product sum(dy*w*xhat) is a
    reduction along axis 1, and dw is accumulated elementwise in a [BLOCK_M, BLOCK_N] fp32 tile (no
    reduction inside the loop), summed over its rows once at the end into this program's partial row.
    Rows at or past M (the ragged last tile, the last program's spare tiles) load zeros: their dx is
    not stored and they add nothing to dw.
    """
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * tiles_per_program * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in tl.range(0, tiles_per_program, num_stages=NUM_STAGES):
        rows = row_start + i * BLOCK_M + tl.arange(0, BLOCK_M)  # int64 (row_start): row * stride may pass 2^31
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = x * rstd[:, None]
        wdy = dy * w[None, :]
        c = tl.sum(wdy * xhat, axis=1) / N
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * xhat
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


def persistent_grid(m: int, device: torch.device, programs_per_sm: int = PROGRAMS_PER_SM) -> tuple[int, int]:
    """(programs, rows_per_program) for a persistent pass over m rows.

    rows_per_program is passed as a constexpr (the loop has a compile-time trip count), so it is rounded up
    to a few values only: a power of two or three quarters of one (1, 2, 3, 4, 6, 8, 12, ..., 48, 64, 96,
    ...: about 2 log2(M) variants ever compiled, see rows_step). Powers of two alone left SMs idle at row
    counts just past a power of two times the SM count: 12289 rows at 2 programs an SM of 132 gave 193
    programs of 64 rows (61 SMs running two, 71 one); rounded to 48 they are 257 programs, at most two
    an SM. (The narrow-row tile backward takes a runtime trip count instead, see _backward; the
    interpreter runs such loops through _common's scalar-index fix.)
    """
    target = max(1, min(m, programs_per_sm * num_sms(device)))
    rows = rows_step(cdiv(m, target))
    return cdiv(m, rows), rows


def rows_step(k: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^j and 3 * 2^j) that is at least k >= 1: at most
    less than half again k, where the next power of two can be nearly double it."""
    p = next_power_of_2(k)
    three_quarters = 3 * p // 4
    return three_quarters if p >= 4 and three_quarters >= k else p


def persistent_tile_grid(m: int, block_m: int, device: torch.device, programs_per_sm: int) -> tuple[int, int]:
    """(programs, tiles_per_program) for a persistent pass over m rows in tiles of block_m rows, as evenly
    as a runtime trip count allows (the last program may walk spare tiles past m: they are masked)."""
    tiles = cdiv(m, block_m)
    tiles_per_program = cdiv(tiles, min(tiles, programs_per_sm * num_sms(device)))
    return cdiv(tiles, tiles_per_program), tiles_per_program


def partial_rows(cfg: tuple, m: int, device: torch.device) -> int:
    """Rows of the fp32 dw partial buffer a backward candidate writes: one a program, half that ("rowpair")."""
    grid = bwd_grid(cfg, m, device)[0]
    return cdiv(grid, 2) if cfg[0] == "rowpair" else grid


def bwd_grid(cfg: tuple, m: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows or tiles per program) of a backward candidate (kind, BLOCK_M, programs_per_SM, ...) over m
    rows (rms_norm's and layer_norm's): its grid also sizes the fp32 partial buffer, which pick_config's memory
    tie-break weighs."""
    kind, block_m, programs_per_sm = cfg[:3]
    if kind != "tile":
        return persistent_grid(m, device, programs_per_sm)
    return persistent_tile_grid(m, block_m, device, programs_per_sm)


# --------------------------------------------------------------------------------------------
# Launchers: flatten to 2-D [M, N], choose BLOCK_N / num_warps in one place
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _config(n: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) for a row of n features: the whole row lives in registers."""
    block = next_power_of_2(n)
    num_warps = 4 if block <= 1024 else 8 if block <= 8192 else 16 if block <= 16384 else 32
    return block, num_warps


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """View t as [M, n] rows with a contiguous feature dimension (copies only if it must)."""
    t2 = t.reshape(-1, n)
    if t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


def _usual_vector(t, n: int, device: torch.device) -> bool:
    """True for the usual weight (or bias): a 1-D float tensor of length n on `device`. The public functions' fast
    check (one test that implies each argument check, which then runs only to raise its message); layer_norm's
    too."""
    return (isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES and t.dim() == 1 and t.shape[0] == n
            and t.device == device)


def _row_args(t: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, int]:
    """(the tensor a kernel reads t's [m, n] rows from, its row stride). A contiguous t of 2+ rows is passed whole
    with row stride n (what t.reshape(-1, n).stride(0) is then; one row goes to _rows, as in layer_norm: its
    size-1 dimension may carry any stride): a launch reads only its pointer, and the view costs about 0.7 us of
    host time, its stride(0) 0.15 (CPU, torch 2.x). Anything else takes _rows (a view through its row stride, or a
    copy when the feature dimension is strided). layer_norm's too."""
    if m > 1 and t.is_contiguous():
        return t, n
    t2 = _rows(t, n)
    return t2, t2.stride(0)


# Allocations on the hot path take their sizes as separate ints: torch.empty(x.shape, ...) parses a Size (or a
# tuple) and cost 1.9 us of host time against 1.0 us for torch.empty(*x.shape, ...) (0.9 us against 1.3 us for a
# [m] buffer given as (m,)), the same aten.empty op. Outputs are contiguous either way, so y and dx are passed
# whole with row stride n (y.view(-1, n).stride(0) is n for any contiguous y). With _row_args: _forward's host
# time 9.5 -> 5.5 us a call, _backward's 16.3 -> 10.4 us (CPU, launches stubbed, x [64, 256] with dw).
def _forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    m = x.numel() // n
    device = x.device
    y = torch.empty(*x.shape, dtype=x.dtype, device=device)
    rstd = torch.empty(m, dtype=torch.float32, device=device)
    if m == 0:
        return y, rstd
    x2, stride_x = _row_args(x, n, m)
    weight = weight.contiguous()  # the kernels read weight at w_ptr + col: a strided view would read the wrong values
    block = _config(n)[0]

    def launch(cfg):
        kind, rows, warps = cfg
        if kind == "row":
            _rms_norm_fwd_kernel[(m,)](x2, weight, y, rstd, n, eps, stride_x, n, BLOCK_N=block, num_warps=warps)
        else:
            _rms_norm_fwd_rows_kernel[(cdiv(m, rows),)](
                x2, weight, y, rstd, m, n, eps, stride_x, n, BLOCK_M=rows, BLOCK_N=block, num_warps=warps)

    # idempotent (writes y and rstd only), so candidates are timed on the real arguments
    launch(pick_config(("rms_norm_fwd", n, x.dtype, weight.dtype), _fwd_candidates(n), launch, device, rows=m))
    return y, rstd


@functools.lru_cache(maxsize=None)
def _fwd_candidates(n: int, tile_table=_FWD_TILE_CANDIDATES) -> tuple[tuple[str, int, int], ...]:
    """("row", 1, num_warps): one row per program; ("tile", BLOCK_M, num_warps): BLOCK_M rows per program
    (narrow rows only, listed first there). tile_table: (tile elements, num_warps) rows, e.g.
    _FWD_TILE_CANDIDATES (layer_norm passes its own). Cached per width: a dict hit on the hot path."""
    block, num_warps = _config(n)
    rows = [("row", 1, w) for w in dict.fromkeys(max(1, min(32, int(num_warps * f))) for f in _FWD_WARP_SCALE)]
    if block > NARROW_MAX_BLOCK:
        return tuple(rows)
    tiles = [("tile", max(1, elems // block), w) for elems, w in tile_table]
    return tuple(dict.fromkeys(tiles + rows))


@triton.jit
def _sum_partials_kernel(partial_ptr, out0_ptr, out1_ptr, G, N, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr):
    """out<k>[c] = sum over g of partial[k, g, c] (fp32), stored in out<k>'s dtype; program (i, k) sums columns
    [i * BLOCK_N, (i + 1) * BLOCK_N) of slice k (the grid's second axis: 1 or 2 slices)."""
    k = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    base = partial_ptr + k.to(tl.int64) * G * N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        gs = g0 + tl.arange(0, BLOCK_G)
        tile = tl.load(base + gs[:, None] * N + cols[None, :], mask=(gs[:, None] < G) & col_mask[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    if k == 0:
        tl.store(out0_ptr + cols, acc.to(out0_ptr.dtype.element_ty), mask=col_mask)
    else:
        tl.store(out1_ptr + cols, acc.to(out1_ptr.dtype.element_ty), mask=col_mask)


SUM_BLOCK_N, SUM_BLOCK_G = 128, 32


def sum_partials(partial: torch.Tensor, out0: torch.Tensor, out1: torch.Tensor | None = None) -> None:
    """out0 = partial[0].sum(0) and, when out1 is given, out1 = partial[1].sum(0), each in its own dtype, in
    one launch. partial: contiguous fp32 [G, N] (out0 only) or [2, G, N] (out1 None: the first slice only);
    out0 / out1: contiguous [N]."""
    n = partial.shape[-1]
    g = partial.shape[-2]
    # the kernel's in-slice offsets are int32 and it reads the buffer densely: a caller's bug, said plainly
    if partial.dtype != torch.float32 or not partial.is_contiguous() or g * n >= 2**31 or partial.dim() not in (2, 3):
        raise ValueError(f"partial must be a contiguous fp32 [G, N] or [2, G, N] buffer with G * N < 2^31, got "
                         f"{partial.dtype} {tuple(partial.shape)} (contiguous: {partial.is_contiguous()})")
    if out1 is not None and not (partial.dim() == 3 and partial.shape[0] == 2):
        raise ValueError(f"out1 needs a [2, G, N] partial buffer (its second slice), got {tuple(partial.shape)}")
    _sum_partials_kernel[(cdiv(n, SUM_BLOCK_N), 1 if out1 is None else 2)](
        partial, out0, out0 if out1 is None else out1, g, n, BLOCK_N=SUM_BLOCK_N, BLOCK_G=SUM_BLOCK_G, num_warps=4)


def _backward(dy, x, weight, rstd, need_dw: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dw); dw is None when need_dw is False (a frozen weight, e.g. every norm under LoRA): the
    kernel then skips the dw accumulation, and there is no partial buffer and no reduction (an
    allocation and one or two launches fewer per call)."""
    n = x.shape[-1]
    m = x.numel() // n
    device = x.device
    weight = weight.contiguous()  # read at w_ptr + col (see _forward); dw is allocated dense anyway
    dx = torch.empty(*x.shape, dtype=x.dtype, device=device)  # passed whole with row stride n, like y
    if m == 0:
        return dx, (torch.zeros_like(weight) if need_dw else None)
    x2, stride_x = _row_args(x, n, m)
    dy2, stride_dy = _row_args(dy, n, m)
    block = _config(n)[0]

    def launch(cfg):
        kind, block_m, _, warps, stages = cfg
        grid, per_program = bwd_grid(cfg, m, device)  # rows (kind "row" / "rowpair") or tiles per program
        # without dw the kernel never touches dw_partial_ptr: rstd stands in for the pointer
        if not need_dw:
            partial = rstd
        elif kind == "rowpair":  # programs add into shared rows: zeroed
            partial = torch.zeros(cdiv(grid, 2), n, dtype=torch.float32, device=device)
        else:
            partial = torch.empty(grid, n, dtype=torch.float32, device=device)
        if kind != "tile":
            _rms_norm_bwd_kernel[(grid,)](
                dy2, x2, weight, rstd, dx, partial, m, n,
                stride_dy, stride_x, n, BLOCK_N=block, num_warps=warps,
                ROWS_PER_PROGRAM=per_program, NUM_STAGES=stages, num_stages=stages, COMPUTE_DW=need_dw,
                PAIR_DW=kind == "rowpair",  # offered only with dw (_rms_bwd_candidates)
            )
        else:
            _rms_norm_bwd_rows_kernel[(grid,)](
                dy2, x2, weight, rstd, dx, partial, m, n, per_program,
                stride_dy, stride_x, n, BLOCK_M=block_m, BLOCK_N=block, num_warps=warps,
                NUM_STAGES=stages, num_stages=stages, COMPUTE_DW=need_dw,
            )
        return partial

    # idempotent (writes dx and a fresh partial buffer), so candidates are timed on the real arguments
    key = ("rms_norm_bwd", n, x.dtype, weight.dtype, need_dw)
    # memory tie-break: the fp32 partial buffer is grid x n (a grid of 2 programs an SM doubles it; "rowpair" halves)
    partial = launch(pick_config(key, _rms_bwd_candidates(n, need_dw), launch, device, rows=m,
                                 memory=(lambda cfg: partial_rows(cfg, m, device) * n * 4) if need_dw else None))
    if not need_dw:
        return dx, None
    dw = torch.empty(n, dtype=weight.dtype, device=device)
    sum_partials(partial, dw)
    return dx, dw


@functools.lru_cache(maxsize=None)
def _rms_bwd_candidates(n: int, need_dw: bool) -> tuple[tuple[str, int, int, int, int], ...]:
    """_bwd_candidates(n), and with dw at rows of 2049-8192 features (the one-row kernel's pipelined range) the
    "rowpair" form of its 2-programs-an-SM configs: the same kernel with programs 2i and 2i+1 adding their dw rows
    into one zeroed row (PAIR_DW), so the fp32 partial buffer holds one row an SM, not two. At Llama-3.1-70B's
    8192 features x 4096 rows the [264, 8192] buffer (8.6 MiB) put hearth's fwd+bwd 4 MiB over quack's (which
    keeps one row an SM) on the H200; the GPU times both forms and the memory tie-break keeps the smaller within
    PICK_MEMORY_TIE. Listed after the others (the first is still the CPU / interpreter default). Cached."""
    base = _bwd_candidates(n)
    block, _ = _config(n)
    if not need_dw or block <= NARROW_MAX_BLOCK or block > 8192:
        return base
    return base + tuple(("rowpair", *c[1:]) for c in base if c[0] == "row" and c[2] == 2)


@functools.lru_cache(maxsize=None)
def _bwd_candidates(n: int, row_table=_BWD_CANDIDATES, tile_table=_BWD_TILE_CANDIDATES
                    ) -> tuple[tuple[str, int, int, int, int], ...]:
    """(kind, BLOCK_M, programs_per_SM, num_warps, num_stages) candidates for rows of n features.

    kind "row": one row per loop iteration (BLOCK_M 1), from row_table's (programs_per_SM, num_warps,
    num_stages); "tile": BLOCK_M rows per iteration, from tile_table's (tile elements, programs_per_SM,
    num_warps, num_stages), narrow rows only, listed first there (the interpreter / CPU default). The
    tables default to rms_norm's (layer_norm passes its own). Rows wider than 8192 keep the _config warps
    (registers), unpipelined first: the first candidate is launched untimed (CPU, CUDA-graph capture), and
    the 2-deep pipeline needs 256 KiB of shared memory at BLOCK_N 65536 bf16 / 32768 fp32 (an H200 SM has
    227); the one-row table is tuned for N <= 8192. Cached per width."""
    block, num_warps = _config(n)
    if block > 8192:
        return (("row", 1, 1, num_warps, 1), ("row", 1, 1, num_warps, 2))
    rows = [("row", 1, *cfg) for cfg in row_table]
    if block > NARROW_MAX_BLOCK:
        return tuple(rows)
    tiles = [("tile", max(1, elems // block), pps, w, st) for elems, pps, w, st in tile_table]
    return tuple(dict.fromkeys(tiles + rows))


# --------------------------------------------------------------------------------------------
# torch.library ops + autograd (torch.compile sees them as opaque nodes: no graph break)
# --------------------------------------------------------------------------------------------
@torch.library.custom_op("hearth::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(x, weight, eps)


@_rms_norm_fwd_op.register_fake
def _(x, weight, eps):
    m = x.numel() // x.shape[-1]
    return x.new_empty(x.shape), x.new_empty((m,), dtype=torch.float32)


@torch.library.custom_op("hearth::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, need_dw: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = _backward(dy, x, weight, rstd, need_dw)
    return dx, (weight.new_empty((0,)) if dw is None else dw)  # an op cannot return None: an empty dw


@_rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd, need_dw):
    return x.new_empty(x.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    # rstd is saved for the backward, not differentiated. Non-differentiable, and no materialised
    # gradient for it: by default autograd hands the backward a torch.zeros([M]) for every output
    # that got no gradient (an allocation and a fill launch on every backward).
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)


def _autograd_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = (_backward if ctx.eager else torch.ops.hearth.rms_norm_bwd)(dy, x, weight, rstd, need_dw)
    return dx, (dw if need_dw else None), None


# eager: a torch.autograd.Function over _forward / _backward; under torch.compile: the custom ops
_rms_norm = autograd_op(_rms_norm_fwd_op, _forward, _setup_context, _autograd_backward, once=True)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of `x`, fused forward and backward.

    Args:
        x: [..., N] float32 / bfloat16 / float16 (leading dims are flattened to M rows; a
            non-contiguous x is read through its row stride when the last dim is contiguous,
            copied otherwise). M may be 0.
        weight: [N], any of the same float dtypes (e.g. fp32 master weights with bf16 x).
        eps: added to mean(x^2) before the square root (a positive float).

    Returns:
        y: x.shape, x.dtype, y = x * rsqrt(mean(x^2) + eps) * weight computed in fp32 and rounded once.

    Gradients flow to x and weight (dw is reduced in fp32 in two stages, returned in weight.dtype;
    not computed at all when weight does not require grad).
    Bytes moved: forward 2*M*N*b, backward 3*M*N*b (+ a G x N fp32 partial buffer, G ~ 4 x SMs).

    Raises:
        TypeError: x or weight is not a tensor of a supported float dtype.
        ValueError: weight is not 1-D of length N; x has N == 0 or N > 65536; tensors on different
            devices or not on CUDA (CPU only under TRITON_INTERPRET=1); eps not a positive number.
    """
    check_tensor(x, "x", ndim=_X_NDIM, allow_empty=True)
    n = x.shape[-1]
    if n == 0 or n > MAX_N:
        raise ValueError(f"x must have 1 <= x.shape[-1] <= {MAX_N}, got shape {tuple(x.shape)}")
    # The usual call (a 1-D float weight of length n on x's device, a positive float eps) in one test: it implies
    # every check below, which then runs only to raise its message naming the argument (or to pass an unusual but
    # valid call, e.g. an int eps). With x's check: 3.1 us of host time a call for the checks one by one against
    # 1.6 us (CPU, interpreter, x [64, 256]).
    if not (_usual_vector(weight, n, x.device) and type(eps) is float and eps > 0):
        check_tensor(weight, "weight", ndim=1)
        check_same_device(x=x, weight=weight)
        if weight.shape[0] != n:
            raise ValueError(f"weight must have length x.shape[-1] = {n}, got shape {tuple(weight.shape)}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        eps = float(eps)
    y, _rstd = _rms_norm(x, weight, eps)
    return y
