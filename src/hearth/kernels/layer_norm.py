"""LayerNorm: y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dimension.

Math (per row of N features, statistics in fp32, biased variance like torch):
    mean = sum(x) / N      rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)      xhat = (x - mean) * rstd
    y    = xhat * w + b
    dx   = rstd * (dy*w - sum(dy*w) / N - xhat * sum(dy*w*xhat) / N)
    dw   = sum over rows of dy * xhat          db = sum over rows of dy

Memory traffic for x [M, N] in `b` bytes per element:
    forward  reads x, writes y (+ mean and rstd, 8*M bytes):             2*M*N*b
    backward reads x and dy, writes dx, + partial dw/db (2 x G x N fp32):  3*M*N*b + 4*G*N*4
At 65536x1024 bf16 (Qwen3-0.6B width) that is 128 MiB + 192 MiB = 320 MiB, ~0.08 ms at 4.27 TB/s.

Weight and bias gradients are reduced in two stages like rms_norm (no atomics, LESSON 5): a persistent
grid of G programs keeps fp32 partial dw and db in registers; both partials share one [2, G, N] buffer,
passed to the kernel as one pointer, so one allocation and one column sum finish them (and one cast, when
weight and bias share a 16-bit dtype). An eager fwd+bwd with trained bf16 weight and bias is then 2 Triton
launches + 1 sum + 1 cast, and y, mean, rstd, dx and the partials (+ the sum's and the cast's results). A
frozen norm (weight and bias need no gradient, e.g. under LoRA) skips that work entirely (COMPUTE_DW: no
accumulation, no buffer, no sum).

Launch configs are rms_norm's machinery (_common.pick_config, timed once per width on the GPU; the first
candidate is the CPU / interpreter default): one row per program or, for rows up to NARROW_MAX_BLOCK wide,
[BLOCK_M, BLOCK_N] tiles of rows per program, forward and backward; the backward is persistent and its
row (tile) loop software-pipelined. LayerNorm's backward keeps two fp32 accumulators (dw and db) where
rms_norm keeps one, so its tile candidates are sized for that (_BWD_TILE_CANDIDATES below).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from hearth.kernels._common import autograd_op, cdiv, check_same_device, check_tensor, interpret_mode, pick_config
from hearth.kernels.rms_norm import (
    _X_NDIM,
    MAX_N,
    _bwd_candidates,
    _config,
    _fwd_candidates,
    _row_args,
    _usual_vector,
    bwd_grid,
    sum_partials,
)

# Forward tiles (tile elements, num_warps) for rows <= NARROW_MAX_BLOCK: rms_norm's list (the forward
# keeps one [BLOCK_M, BLOCK_N] tile of x live either way; LayerNorm adds one more row reduction).
_FWD_TILE_CANDIDATES = ((4096, 4), (2048, 4), (8192, 8), (4096, 8), (16384, 16))
# Backward, one row per loop iteration: (programs_per_SM, num_warps, num_stages); the first is the CPU /
# interpreter default. LayerNorm keeps w, dw and db (fp32) per thread for the whole run of rows, so the
# register bill grows with the width faster than rms_norm's (Triton 3.6 sm_90, bf16 with dw, ptxas -v):
#   N=1024: 32-48 registers in every config below        N=4096, 8 warps: 113-128; 16 warps: 64
#   N=5120 (BLOCK_N 8192), 8 warps: 211-250; 16 warps: 113-114
# Up to BLOCK_N 4096 rms_norm's list fits (2 x 8 warps x 128 registers = one SM's 65536). Wider (BLOCK_N
# 8192: Qwen3-14B's 5120) two 8-warp programs no longer fit an SM and a second program per SM would only
# queue behind the first (a second wave over the persistent grid): one program per SM, 16 or 8 warps.
_BWD_CANDIDATES = ((2, 8, 3), (2, 8, 4), (1, 16, 4), (2, 16, 3), (4, 8, 2), (4, 8, 1))
_BWD_WIDE_CANDIDATES = ((1, 16, 3), (1, 16, 4), (1, 16, 2), (1, 8, 3), (1, 8, 4))
# Backward tiles for narrow rows: (tile elements, programs_per_SM, num_warps, num_stages). Each holds two
# [BLOCK_M, BLOCK_N] fp32 accumulators (dw and db), twice rms_norm's, so rms_norm's list does not carry:
# its (4096, 3 per SM, 4 warps) needs 186 registers here (only 2 programs fit) and its 16384-element tile
# over 16 warps spilled (512 threads cap ptxas at 128 registers). Sized so that programs_per_SM programs
# fit an SM (65536 registers, 227 KiB shared memory); checked per candidate with ptxas by
# tests/kernels/test_layer_norm.py (test_tile_candidates_*: sm_90 builds, no spills, they fit).
_BWD_TILE_CANDIDATES = ((4096, 2, 4, 3), (4096, 2, 8, 2), (2048, 4, 4, 2), (2048, 3, 4, 3), (8192, 1, 8, 3),
                        (8192, 1, 16, 2))


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
@triton.jit
def _layer_norm_fwd_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    # shapes
    N, eps,
    # strides (elements between rows; the feature dimension is contiguous)
    stride_x, stride_y,
    # meta-parameters
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    # Masked lanes must not add (0 - mean)^2 to the variance.
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layer_norm_fwd_rows_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    # shapes
    M, N, eps,
    # strides (elements between rows; the feature dimension is contiguous)
    stride_x, stride_y,
    # meta-parameters
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """The forward over a [BLOCK_M, BLOCK_N] tile of rows: the math of _layer_norm_fwd_kernel per row."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    # mean and rstd stored before y is computed: stored after it, ptxas spilled (sm_90, fp32 x, 4 x 1024 tile)
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_rn(a, b, INTERP: tl.constexpr):
    """a * b rounded to nearest as its own instruction (PTX mul.rn.f32: neither LLVM nor ptxas fuses it into a later
    add). The backward's dy * w goes through it: fused, dx = dy*w - c1 - ... became an fma of the unrounded product
    against c1 = sum(dy*w) / N (rounded), so where the terms cancel exactly one rounding error times rstd was left:
    at N = 1 (dx = 0) the H200 returned 3.6e-5 with rstd ~ 316 (GPU suite 2026-12-04, af363f9). Turning fusion off
    for the whole kernel (enable_fp_fusion=False) fixed that but cost registers (one tile candidate spilled 24
    bytes, another no longer fit 2 programs an SM). The interpreter neither fuses nor runs libdevice: a * b."""
    if INTERP:
        return a * b
    return libdevice.mul_rn(a, b)


@triton.jit
def _layer_norm_bwd_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
    # shapes
    M, N,
    # strides
    stride_dy, stride_x, stride_dx,
    # meta-parameters
    BLOCK_N: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,  # one of a few values (see rms_norm.persistent_grid)
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop (1: none)
    COMPUTE_DW: tl.constexpr,  # False when weight and bias need no gradient: partial_ptr is unused
    INTERP: tl.constexpr = False,  # under TRITON_INTERPRET=1 (_mul_rn)
):
    """partial_ptr: the [2, G, N] fp32 partials of the G = num_programs programs, dw's in rows 0..G-1 and db's in
    rows G..2G-1 (one pointer: no views of the buffer to make on the host per call)."""
    pid = tl.program_id(0)
    row_start = pid * ROWS_PER_PROGRAM
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # a compile-time trip count with a row mask: the last program's tail rows load zeros, add nothing
    for i in tl.range(0, ROWS_PER_PROGRAM, num_stages=NUM_STAGES):
        row = row_start + i
        row_ok = row < M
        mask = col_mask & row_ok
        row64 = row.to(tl.int64)
        x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row64, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + row64, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = _mul_rn(dy, w, INTERP)
        c1 = tl.sum(wdy, axis=0) / N
        c2 = tl.sum(wdy * xhat, axis=0) / N
        dx = (wdy - c1 - xhat * c2) * rstd
        tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * xhat
            db_acc += dy
    if COMPUTE_DW:
        tl.store(partial_ptr + pid * N + cols, dw_acc, mask=col_mask)
        tl.store(partial_ptr + (tl.num_programs(0) + pid) * N + cols, db_acc, mask=col_mask)


@triton.jit
def _layer_norm_bwd_rows_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
    # shapes
    M, N,
    tiles_per_program,  # a runtime trip count: one compiled variant for every M
    # strides
    stride_dy, stride_x, stride_dx,
    # meta-parameters
    BLOCK_M: tl.constexpr,  # rows per tile
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the tile loop (1: none)
    COMPUTE_DW: tl.constexpr,  # False when weight and bias need no gradient: partial_ptr is unused
    INTERP: tl.constexpr = False,  # under TRITON_INTERPRET=1 (_mul_rn)
):
    """The backward over [BLOCK_M, BLOCK_N] tiles of narrow rows: the math of _layer_norm_bwd_kernel per row.

    Each program walks tiles_per_program consecutive tiles; the per-row sums sum(dy*w) and sum(dy*w*xhat)
    are reductions along axis 1, and dw / db are accumulated elementwise in [BLOCK_M, BLOCK_N] fp32 tiles
    (no cross-row reduction inside the loop), summed over their rows once at the end. Rows at or past M
    load zeros (xhat is masked to 0): their dx is not stored and they add nothing to dw or db. partial_ptr: the
    [2, G, N] partials as in _layer_norm_bwd_kernel.
    """
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * tiles_per_program * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in tl.range(0, tiles_per_program, num_stages=NUM_STAGES):
        rows = row_start + i * BLOCK_M + tl.arange(0, BLOCK_M)  # int64 (row_start): row * stride may pass 2^31
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = _mul_rn(dy, tl.broadcast_to(w[None, :], (BLOCK_M, BLOCK_N)), INTERP)
        c1 = tl.sum(wdy, axis=1) / N
        c2 = tl.sum(wdy * xhat, axis=1) / N
        dx = (wdy - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * xhat
            db_acc += dy
    if COMPUTE_DW:
        tl.store(partial_ptr + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
        tl.store(partial_ptr + (tl.num_programs(0) + pid) * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launchers: flatten to 2-D [M, N]; BLOCK_N from rms_norm._config, the rest picked per width
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _ln_fwd_candidates(n: int) -> tuple[tuple[str, int, int], ...]:
    """rms_norm._fwd_candidates over layer_norm's tile table: ("row", 1, num_warps) or ("tile", BLOCK_M,
    num_warps), tiles first for narrow rows. Cached per width (a dict hit on the hot path)."""
    return _fwd_candidates(n, _FWD_TILE_CANDIDATES)


@functools.lru_cache(maxsize=None)
def _ln_bwd_candidates(n: int) -> tuple[tuple[str, int, int, int, int], ...]:
    """rms_norm._bwd_candidates over layer_norm's tables: (kind, BLOCK_M, programs_per_SM, num_warps,
    num_stages), tiles first for narrow rows; one program per SM for rows wider than 4096 (BLOCK_N 8192).
    Past BLOCK_N 8192 (no model's LayerNorm is that wide) the rows spill registers in every config, and
    _bwd_candidates lists the unpipelined config first (see there). Cached per width."""
    block = _config(n)[0]
    if block > 8192:
        return _bwd_candidates(n)
    return _bwd_candidates(n, _BWD_CANDIDATES if block <= 4096 else _BWD_WIDE_CANDIDATES, _BWD_TILE_CANDIDATES)


# Sizes as separate ints and outputs passed whole with row stride n, as in rms_norm._forward (host time there).
def _forward(x, weight, bias, eps):
    n = x.shape[-1]
    m = x.numel() // n
    device = x.device
    y = torch.empty(*x.shape, dtype=x.dtype, device=device)
    mean = torch.empty(m, dtype=torch.float32, device=device)
    rstd = torch.empty(m, dtype=torch.float32, device=device)
    if m == 0:
        return y, mean, rstd
    x2, stride_x = _row_args(x, n, m)
    # the kernels read weight / bias at ptr + col: a strided view would read the wrong values
    weight = weight.contiguous()
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight  # never read without HAS_BIAS
    block = _config(n)[0]

    def launch(cfg):
        kind, rows, warps = cfg
        if kind == "row":
            _layer_norm_fwd_kernel[(m,)](
                x2, weight, b, y, mean, rstd, n, eps, stride_x, n,
                BLOCK_N=block, HAS_BIAS=has_bias, num_warps=warps)
        else:
            _layer_norm_fwd_rows_kernel[(cdiv(m, rows),)](
                x2, weight, b, y, mean, rstd, m, n, eps, stride_x, n,
                BLOCK_M=rows, BLOCK_N=block, HAS_BIAS=has_bias, num_warps=warps)

    # idempotent (writes y, mean and rstd only), so candidates are timed on the real arguments
    key = ("layer_norm_fwd", n, x.dtype, weight.dtype, has_bias)
    launch(pick_config(key, _ln_fwd_candidates(n), launch, device, rows=m))
    return y, mean, rstd


def _backward(dy, x, weight, mean, rstd, separate: bool = False, need_dw: bool = True,
              db_dtype: torch.dtype | None = torch.float32):
    """(dx, dweight in weight.dtype, dbias in db_dtype: fp32 by default; None when db_dtype is None, which
    says the caller does not use dbias, and then only dweight is summed). separate=True (the custom op) gives
    dbias in fp32. The partials are summed and written in their dtypes by one launch (rms_norm.sum_partials),
    dweight and dbias as two tensors of their own. need_dw=False (weight and bias frozen): the kernel skips
    the dw / db accumulation, and there is no partial buffer and no reduction; dweight and dbias are then
    None."""
    n = x.shape[-1]
    m = x.numel() // n
    device = x.device
    dx = torch.empty(*x.shape, dtype=x.dtype, device=device)  # passed whole with row stride n, like y
    weight = weight.contiguous()  # read at w_ptr + col (see _forward)
    if m == 0:
        if not need_dw:
            return dx, None, None
        db_dtype = torch.float32 if separate else db_dtype
        return dx, torch.zeros_like(weight), (None if db_dtype is None else torch.zeros_like(weight, dtype=db_dtype))
    x2, stride_x = _row_args(x, n, m)
    dy2, stride_dy = _row_args(dy, n, m)
    block = _config(n)[0]
    interp = interpret_mode()  # _mul_rn: the interpreter cannot run libdevice, whatever device the tensors are on

    def launch(cfg):
        kind, block_m, _, warps, stages = cfg
        grid, per_program = bwd_grid(cfg, m, device)  # rows (kind "row") or tiles per program
        # the dw and db partials share one buffer: one allocation and ONE column-sum launch reduce both; the
        # kernel takes the whole buffer (db's half at row G), so no views of it are made per call. Without dw
        # the kernel never touches the partial pointer: rstd stands in for it
        partial = torch.empty(2, grid, n, dtype=torch.float32, device=device) if need_dw else None
        partial_arg = partial if need_dw else rstd
        if kind == "row":
            _layer_norm_bwd_kernel[(grid,)](
                dy2, x2, weight, mean, rstd, dx, partial_arg, m, n,
                stride_dy, stride_x, n, BLOCK_N=block, num_warps=warps,
                ROWS_PER_PROGRAM=per_program, NUM_STAGES=stages, num_stages=stages, COMPUTE_DW=need_dw,
                INTERP=interp,
            )
        else:
            _layer_norm_bwd_rows_kernel[(grid,)](
                dy2, x2, weight, mean, rstd, dx, partial_arg, m, n, per_program,
                stride_dy, stride_x, n, BLOCK_M=block_m, BLOCK_N=block, num_warps=warps,
                NUM_STAGES=stages, num_stages=stages, COMPUTE_DW=need_dw, INTERP=interp,
            )
        return partial

    # idempotent (writes dx and a fresh partial buffer), so candidates are timed on the real arguments
    key = ("layer_norm_bwd", n, x.dtype, weight.dtype, need_dw)
    # memory tie-break: the fp32 partial buffer is 2 x grid x n (rms_norm.bwd_grid)
    partial = launch(pick_config(key, _ln_bwd_candidates(n), launch, device, rows=m,
                                 memory=(lambda cfg: 2 * bwd_grid(cfg, m, device)[0] * n * 4) if need_dw else None))
    if not need_dw:
        return dx, None, None
    db_dtype = torch.float32 if separate else db_dtype
    dw = torch.empty(n, dtype=weight.dtype, device=device)
    db = None if db_dtype is None else torch.empty(n, dtype=db_dtype, device=device)
    sum_partials(partial, dw, db)
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# torch.library ops + autograd
# --------------------------------------------------------------------------------------------
@torch.library.custom_op("hearth::layer_norm_fwd", mutates_args=())
def _layer_norm_fwd_op(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(x, weight, bias, eps)


@_layer_norm_fwd_op.register_fake
def _(x, weight, bias, eps):
    m = x.numel() // x.shape[-1]
    stat = x.new_empty((m,), dtype=torch.float32)
    return x.new_empty(x.shape), stat, stat.new_empty((m,))


@torch.library.custom_op("hearth::layer_norm_bwd", mutates_args=())
def _layer_norm_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, need_dw: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dx, dweight (weight.dtype) and dbias (fp32; cast to bias.dtype by the caller); with need_dw
    False (weight and bias frozen) dweight and dbias are empty (an op cannot return None)."""
    dx, dw, db = _backward(dy, x, weight, mean, rstd, separate=True, need_dw=need_dw)
    if dw is None:
        return dx, weight.new_empty((0,)), weight.new_empty((0,), dtype=torch.float32)
    return dx, dw, db


@_layer_norm_bwd_op.register_fake
def _(dy, x, weight, mean, rstd, need_dw):
    shape = weight.shape if need_dw else (0,)
    return x.new_empty(x.shape), weight.new_empty(shape), weight.new_empty(shape, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    _y, mean, rstd = output
    # mean and rstd are outputs only so that they can be saved: without these two calls autograd hands
    # the backward a zero tensor for each of them (two allocations + fills, i.e. launches, per backward)
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _autograd_backward(ctx, dy, _dmean, _drstd):
    if dy is None:  # y did not reach the loss (grads are not materialised): nothing flows back
        return None, None, None, None
    x, weight, mean, rstd = ctx.saved_tensors
    need_w, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    # one flag for both partials (they share one buffer and one reduction): frozen weight AND bias skip them
    need_dw = need_w or need_b
    if ctx.eager:  # db comes back in bias.dtype (cast together with dw when the dtypes match)
        dx, dw, db = _backward(dy, x, weight, mean, rstd, need_dw=need_dw, db_dtype=ctx.bias_dtype if need_b else None)
    else:  # the op returns dbias in fp32
        dx, dw, db = torch.ops.hearth.layer_norm_bwd(dy, x, weight, mean, rstd, need_dw)
        db = db.to(ctx.bias_dtype) if need_b else None
    return dx, (dw if need_w else None), (db if need_b else None), None


# eager: a torch.autograd.Function over _forward / _backward; under torch.compile: the custom ops
_layer_norm = autograd_op(_layer_norm_fwd_op, _forward, _setup_context, _autograd_backward, once=True)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension of `x` (like F.layer_norm(x, (N,), weight, bias, eps)).

    Args:
        x: [..., N] float32 / bfloat16 / float16; leading dims flattened to M rows (M may be 0).
        weight: [N] float tensor (any supported float dtype).
        bias: [N] float tensor, or None for no bias.
        eps: added to the biased variance before the square root (a positive float).

    Returns:
        y: x.shape, x.dtype, computed in fp32 and rounded once.

    Gradients flow to x, weight and bias (weight/bias grads reduced in fp32, two stages; not computed at
    all when neither weight nor bias requires grad).
    Bytes moved: forward 2*M*N*b, backward 3*M*N*b (+ 2 x G x N fp32 partial buffers).

    Raises:
        TypeError: a tensor argument has an unsupported dtype or is not a tensor.
        ValueError: weight/bias not 1-D of length N; N == 0 or N > 65536; tensors on different
            devices or not on CUDA (CPU only under TRITON_INTERPRET=1); eps not a positive number.
    """
    check_tensor(x, "x", ndim=_X_NDIM, allow_empty=True)
    n = x.shape[-1]
    if n == 0 or n > MAX_N:
        raise ValueError(f"x must have 1 <= x.shape[-1] <= {MAX_N}, got shape {tuple(x.shape)}")
    device = x.device
    # The usual call (1-D float weight and bias of length n on x's device, a positive float eps) in one test: it
    # implies every check below, which then runs only to raise its message naming the argument (or to pass an
    # unusual but valid call, e.g. an int eps). With x's check: 4.4 us of host time a call for the checks one by
    # one against 1.9 us (CPU, interpreter).
    if not (_usual_vector(weight, n, device) and (bias is None or _usual_vector(bias, n, device))
            and type(eps) is float and eps > 0):
        check_tensor(weight, "weight", ndim=1)
        if bias is not None:
            check_tensor(bias, "bias", ndim=1)
        check_same_device(x=x, weight=weight, bias=bias)
        if weight.shape[0] != n:
            raise ValueError(f"weight must have length x.shape[-1] = {n}, got shape {tuple(weight.shape)}")
        if bias is not None and bias.shape[0] != n:
            raise ValueError(f"bias must have length x.shape[-1] = {n}, got shape {tuple(bias.shape)}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        eps = float(eps)
    y, _mean, _rstd = _layer_norm(x, weight, bias, eps)
    return y
