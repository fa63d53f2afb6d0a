"""LayerNorm: y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dimension.

Math (per row of N features, statistics in fp32, biased variance like torch):
    mean = sum(x) / N      rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)      xhat = (x - mean) * rstd
    y    = xhat * w + b
    dx   = rstd * (dy*w - sum(dy*w) / N - xhat * sum(dy*w*xhat) / N)
    dw   = sum over rows of dy * xhat          db = sum over rows of dy

Memory traffic for x [M, N] in `b` bytes per element:
    forward  reads x, writes y (+ mean and rstd, 8*M bytes):             2*M*N*b
    backward reads x and dy, writes dx, + partial dw/db (2 x G x N fp32):  3*M*N*b + 4*G*N*4
Weight and bias gradients are reduced in two stages exactly like rms_norm (no atomics, LESSON 5).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from hearth.kernels._common import autograd_op, check_same_device, check_tensor
from hearth.kernels.rms_norm import MAX_N, _config, _rows, persistent_grid


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
def _layer_norm_bwd_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    # shapes
    M, N,
    # strides
    stride_dy, stride_x, stride_dx,
    # meta-parameters
    BLOCK_N: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,  # a power of two (see rms_norm.persistent_grid)
):
    pid = tl.program_id(0)
    row_start = pid * ROWS_PER_PROGRAM
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(0, ROWS_PER_PROGRAM):
        row = row_start + i
        row_ok = row < M
        mask = col_mask & row_ok
        row64 = row.to(tl.int64)
        x = tl.load(x_ptr + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row64, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + row64, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = dy * w
        c1 = tl.sum(wdy, axis=0) / N
        c2 = tl.sum(wdy * xhat, axis=0) / N
        dx = (wdy - c1 - xhat * c2) * rstd
        tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(dw_partial_ptr + pid * N + cols, dw_acc, mask=col_mask)
    tl.store(db_partial_ptr + pid * N + cols, db_acc, mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launchers: flatten to 2-D [M, N]; BLOCK_N / num_warps come from rms_norm._config
# --------------------------------------------------------------------------------------------
def _forward(x, weight, bias, eps):
    n = x.shape[-1]
    x2 = _rows(x, n)
    # the kernels read weight / bias at ptr + col: a strided view would read the wrong values
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    m = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty((m,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return y, mean, rstd
    block, num_warps = _config(n)
    y2 = y.view(-1, n)
    _layer_norm_fwd_kernel[(m,)](
        x2, weight, bias if bias is not None else weight, y2, mean, rstd, n, eps, x2.stride(0), y2.stride(0),
        BLOCK_N=block, HAS_BIAS=bias is not None, num_warps=num_warps,
    )
    return y, mean, rstd


def _backward(dy, x, weight, mean, rstd, separate: bool = False):
    """(dx, dweight in weight.dtype, dbias fp32). separate=True reduces dw and db into two tensors of their
    own (a custom op's outputs may not share memory); the default (eager route) one launch for both."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    weight = weight.contiguous()  # read at w_ptr + col (see _forward)
    dy2 = _rows(dy, n)
    m = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if m == 0:
        return dx, torch.zeros_like(weight), torch.zeros_like(weight)
    grid, rows_per_program = persistent_grid(m, x.device, 4)  # 4 programs per SM (unpipelined loop)
    # the dw and db partials share one buffer, so one allocation and ONE column-sum launch reduce both
    # (two of each before: on the GPU every torch op is a launch, microseconds of host time a call)
    partial = torch.empty((2, grid, n), dtype=torch.float32, device=x.device)
    block, num_warps = _config(n)
    dx2 = dx.view(-1, n)
    _layer_norm_bwd_kernel[(grid,)](
        dy2, x2, weight, mean, rstd, dx2, partial[0], partial[1], m, n,
        dy2.stride(0), x2.stride(0), dx2.stride(0),
        BLOCK_N=block, ROWS_PER_PROGRAM=rows_per_program, num_warps=num_warps,
    )
    if not separate:
        dw, db = partial.sum(1)  # views of one [2, N] result (dw's too when weight is fp32)
        return dx, dw.to(weight.dtype), db
    return dx, partial[0].sum(0).to(weight.dtype), partial[1].sum(0)


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
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dx, dweight (weight.dtype) and dbias (fp32; cast to bias.dtype by the caller)."""
    return _backward(dy, x, weight, mean, rstd, separate=True)


@_layer_norm_bwd_op.register_fake
def _(dy, x, weight, mean, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape, dtype=torch.float32)


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
    dx, dw, db = (_backward if ctx.eager else torch.ops.hearth.layer_norm_bwd)(dy, x, weight, mean, rstd)
    db = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None else None
    return dx, dw, db, None


# eager: a torch.autograd.Function over _forward / _backward; under torch.compile: the custom ops
_layer_norm = autograd_op(_layer_norm_fwd_op, _forward, _setup_context, _autograd_backward)


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

    Gradients flow to x, weight and bias (weight/bias grads reduced in fp32, two stages).
    Bytes moved: forward 2*M*N*b, backward 3*M*N*b (+ 2 x G x N fp32 partial buffers).

    Raises:
        TypeError: a tensor argument has an unsupported dtype or is not a tensor.
        ValueError: weight/bias not 1-D of length N; N == 0 or N > 65536; tensors on different
            devices or not on CUDA (CPU only under TRITON_INTERPRET=1); eps not a positive number.
    """
    check_tensor(x, "x", ndim=tuple(range(1, 9)), allow_empty=True)
    n = x.shape[-1]
    if n == 0 or n > MAX_N:
        raise ValueError(f"x must have 1 <= x.shape[-1] <= {MAX_N}, got shape {tuple(x.shape)}")
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
    y, _mean, _rstd = _layer_norm(x, weight, bias, float(eps))
    return y
