"""SwiGLU: h = silu(gate) * up, and the SwiGLU MLP built around it.

Math (fp32 inside the kernel):
    s = sigmoid(g)     h = g * s * u
    dg = dh * u * s * (1 + g * (1 - s))       du = dh * g * s
The backward recomputes s from g instead of storing silu(g).

Memory traffic for [M, N] in b bytes per element:
    forward  reads g, u, writes h:            3*M*N*b
    backward reads dh, g, u, writes dg, du:   5*M*N*b (+ M*N*b when it also re-emits h for the MLP)

swiglu_mlp (LESSON 9): one autograd node for down(swiglu(gate(x), up(x))). Only x, g and u are
saved; h = silu(g) * u lives only inside the forward (one row chunk at a time) and is recomputed
from g and u in the backward, where dg and du overwrite g and u in place (they are dead after),
so the backward's only extra [rows, I] memory is one column chunk of dh, freed before the final
[rows, H] / [I, H] gradients are allocated. g and u leave the forward op only to be saved: they are
non-differentiable and grads are not materialised, else autograd would hand the backward a zero
[rows, I] tensor for each (+448 MiB at the peak for N=8192, I=14336 bf16, the first H200 run).
Peak over forward + backward: the four gradients + out + g and u (tests/kernels/test_swiglu.py
measures it). With recompute_up, u is not saved either (recomputed per column chunk in the
backward: one extra matmul).
"""

from __future__ import annotations

import functools

import math
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hearth.kernels._common import (autograd_op, cdiv, check_same_device, check_same_dtype, check_tensor, next_power_of_2,
                                    num_sms, pick_config)

BLOCK_COLS = 1024  # columns per program; a [rows, cols] grid keeps row-strided views usable
NUM_WARPS = 4  # 8 elements (16 bytes of bf16) per thread per tensor at BLOCK_COLS = 1024
# swiglu_mlp works on chunks of about this many elements of [rows, I] at a time (h in the forward,
# dh in the backward): 16 Mi elements = 32 MiB in bf16, still big enough for full-speed matmuls.
MLP_CHUNK_ELEMS = 16 * 1024 * 1024
# ... and on a GPU at least this many waves of WAVE_TILE-element output tiles in each chunk's projection GEMM (_chunk)
MLP_MIN_WAVES = 2
WAVE_TILE = 128 * 256  # output elements of one of cuBLAS's usual Hopper tiles (128x256 / 256x128)
# The out-of-place elementwise ops (swiglu) time these (BLOCK_COLS, num_warps) once per (n, dtype) on
# the GPU and keep the fastest (_common.pick_config); the first is the default. Bigger programs cut
# the per-program cost of a 114,688-program grid (8192 x 14336 at 1024 columns). The in-place MLP
# backward keeps the default (a candidate run there would overwrite its inputs).
_CANDIDATES = ((BLOCK_COLS, NUM_WARPS), (2048, 4), (2048, 8), (4096, 8), (8192, 16))
# Contiguous tensors may also run as one flat run of elements (_swiglu_*_flat_kernel): these (BLOCK,
# num_warps) join the list then. On the H200 the row kernels ran at 0.95-0.97x torch.compile's fwd+bwd at
# widths 14336-28672 (a ragged block per row where the width is not a multiple of the block, e.g. 17408 and
# 25600 at 2048); compile's own pointwise kernels index the flat run.
_FLAT_CANDIDATES = ((1024, 4), (2048, 4), (2048, 8), (4096, 8))


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
@triton.jit
def _swiglu_grads(dh, g, u):
    """(dg, du, silu(g)) in fp32 from fp32 dh, g, u (inlined into both backward kernels)."""
    s = tl.sigmoid(g)
    silu = g * s
    return dh * u * s * (1.0 + g * (1.0 - s)), dh * silu, silu


@triton.jit
def _swiglu_fwd_kernel(
    # pointers
    g_ptr, u_ptr, h_ptr,
    # shapes
    N,
    # strides (between rows; columns are contiguous)
    stride_g, stride_u, stride_h,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u
    tl.store(h_ptr + row * stride_h + cols, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    # pointers (dg/du may alias g/u and h may alias dh: every element is read before it is written)
    dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, h_ptr,
    # shapes
    N,
    # strides
    stride_dh, stride_g, stride_u, stride_dg, stride_du, stride_h,
    # meta-parameters
    BLOCK: tl.constexpr,
    STORE_H: tl.constexpr,  # also write h = silu(g) * u (the MLP needs it for the down-proj grad)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    dh = tl.load(dh_ptr + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dg, du, silu = _swiglu_grads(dh, g, u)
    tl.store(dg_ptr + row * stride_dg + cols, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + row * stride_du + cols, du.to(du_ptr.dtype.element_ty), mask=mask)
    if STORE_H:
        tl.store(h_ptr + row * stride_h + cols, (silu * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_fwd_flat_kernel(g_ptr, u_ptr, h_ptr, TOTAL, BLOCK: tl.constexpr):
    """The forward over contiguous tensors as one flat run of TOTAL elements: no ragged block at the end
    of every row (a 17408-wide row is 8.5 blocks of 2048), one offset per element, a 1-D grid."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + offs, (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_flat_kernel(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, TOTAL, BLOCK: tl.constexpr):
    """The backward over contiguous, non-aliased tensors as one flat run (the standalone op only)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dg, du, _ = _swiglu_grads(dh, g, u)
    tl.store(dg_ptr + offs, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, du.to(du_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers: 2-D [M, N] views whose last dim is contiguous (row strides may be anything)
# --------------------------------------------------------------------------------------------
def _grid(m: int, n: int, block: int = BLOCK_COLS):
    return (m, cdiv(n, block))


def _candidates(n: int, flat: bool = False) -> tuple[tuple[int, int, bool], ...]:
    """(BLOCK, num_warps, flat) candidates for rows of n columns (no row block wider than the row needs);
    flat=True when every tensor of the call is contiguous: the flat kernels' blocks join the list. Built once a
    width (_candidates_for; the module's tables are part of the cache key): the list cost several microseconds
    of host time a call."""
    return _candidates_for(n, flat, BLOCK_COLS, _CANDIDATES, _FLAT_CANDIDATES)


@functools.lru_cache(maxsize=None)
def _candidates_for(n: int, flat: bool, block_cols: int, table, flat_table) -> tuple[tuple[int, int, bool], ...]:
    cap = max(block_cols, next_power_of_2(n))
    rows = tuple((b, w, False) for b, w in table if b <= cap)
    return rows + tuple((b, w, True) for b, w in flat_table) if flat else rows


def _launch_fwd(g2, u2, h2, tune: bool = False) -> None:
    m, n = g2.shape
    if m and n:
        _launch_fwd_rows(g2, u2, h2, m, n, g2.stride(0), u2.stride(0), h2.stride(0), tune)


def _launch_fwd_rows(g, u, h, m: int, n: int, stride_g: int, stride_u: int, stride_h: int, tune: bool) -> None:
    """_launch_fwd on m > 0 rows of n > 0 columns given as numbers: the tensors only give their pointers, so a
    caller with contiguous tensors of any shape passes them whole (row strides n), without [m, n] views."""
    def launch(cfg):
        block, warps, flat = cfg
        if flat:
            _swiglu_fwd_flat_kernel[(cdiv(m * n, block),)](g, u, h, m * n, BLOCK=block, num_warps=warps)
        else:
            _swiglu_fwd_kernel[_grid(m, n, block)](g, u, h, n, stride_g, stride_u, stride_h,
                                                   BLOCK=block, num_warps=warps)

    if not tune:
        return launch((BLOCK_COLS, NUM_WARPS, False))
    flat = m <= 1 or stride_g == stride_u == stride_h == n  # every [m, n] is one contiguous run (rows back to back)
    launch(pick_config(("swiglu_fwd", n, g.dtype, flat), _candidates(n, flat), launch, g.device, rows=m))


def _launch_bwd(dh2, g2, u2, dg2, du2, h2=None, tune: bool = False) -> None:
    """tune=True only when dg2/du2/h2 do not alias the inputs (candidates run several times)."""
    m, n = g2.shape
    if m and n:
        h_out = h2 if h2 is not None else dg2
        _launch_bwd_rows(dh2, g2, u2, dg2, du2, h2, m, n, (dh2.stride(0), g2.stride(0), u2.stride(0), dg2.stride(0),
                                                           du2.stride(0), h_out.stride(0)), tune)


def _launch_bwd_rows(dh, g, u, dg, du, h, m: int, n: int, strides, tune: bool) -> None:
    """_launch_bwd on m > 0 rows of n > 0 columns given as numbers (see _launch_fwd_rows); strides: the row
    strides of dh, g, u, dg, du and h (dg's when h is None)."""
    h_out = h if h is not None else dg

    def launch(cfg):
        block, warps, flat = cfg
        if flat:
            _swiglu_bwd_flat_kernel[(cdiv(m * n, block),)](dh, g, u, dg, du, m * n, BLOCK=block, num_warps=warps)
            return
        _swiglu_bwd_kernel[_grid(m, n, block)](
            dh, g, u, dg, du, h_out, n, *strides, BLOCK=block, STORE_H=h is not None, num_warps=warps,
        )

    if not tune:
        return launch((BLOCK_COLS, NUM_WARPS, False))
    flat = h is None and (m <= 1 or all(s == n for s in strides[:5]))  # as the forward's
    launch(pick_config(("swiglu_bwd", n, g.dtype, h is not None, flat), _candidates(n, flat), launch,
                       g.device, rows=m))


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _dense_rows(n: int, *ts: torch.Tensor) -> int:
    """Rows m of the [m, n] views of ts (n: their last dim) when every t is contiguous and m > 1, else 0.
    Then each view's row stride is n (for 2-D tensors too: contiguity fixes the row stride only when there is
    more than one row), so the launchers take the tensors themselves (a launch reads only their pointers): the
    views cost about 1 us of host time each, their strides a few tenths."""
    if not n:
        return 0
    m = ts[0].numel() // n
    if m < 2:
        return 0
    for t in ts:
        if not t.is_contiguous():
            return 0
    return m


# --------------------------------------------------------------------------------------------
# torch.library ops + autograd: elementwise swiglu
# --------------------------------------------------------------------------------------------
# The outputs: empty_like, not torch.empty(x.shape, dtype=..., device=...), which builds and parses a Size and a
# device (2.5 us of host time against 1.1); contiguous_format: a contiguous output whatever the inputs' strides.
def _swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    h = torch.empty_like(gate, memory_format=torch.contiguous_format)
    n = gate.shape[-1]
    m = _dense_rows(n, gate, up)
    if m:  # the common case: contiguous gate and up, passed whole (h is contiguous)
        _launch_fwd_rows(gate, up, h, m, n, n, n, n, True)
    else:
        _launch_fwd(_rows(gate), _rows(up), h.view(-1, n), tune=True)
    return h


def _swiglu_backward_impl(dh: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dg = torch.empty_like(gate, memory_format=torch.contiguous_format)
    du = torch.empty_like(up, memory_format=torch.contiguous_format)
    n = gate.shape[-1]
    m = _dense_rows(n, gate, up, dh)
    if m:  # as the forward
        _launch_bwd_rows(dh, gate, up, dg, du, None, m, n, (n, n, n, n, n, n), True)
    else:
        _launch_bwd(_rows(dh), _rows(gate), _rows(up), dg.view(-1, n), du.view(-1, n), tune=True)
    return dg, du


_swiglu_fwd_op = torch.library.custom_op("hearth::swiglu_fwd", mutates_args=())(_swiglu_forward)


@_swiglu_fwd_op.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


_swiglu_bwd_op = torch.library.custom_op("hearth::swiglu_bwd", mutates_args=())(_swiglu_backward_impl)


@_swiglu_bwd_op.register_fake
def _(dh, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dh):
    gate, up = ctx.saved_tensors
    return (_swiglu_backward_impl if ctx.eager else torch.ops.hearth.swiglu_bwd)(dh, gate, up)


# eager: a torch.autograd.Function over the launchers; under torch.compile: the custom ops
_swiglu = autograd_op(_swiglu_fwd_op, _swiglu_forward, _swiglu_setup, _swiglu_backward, once=True)


# --------------------------------------------------------------------------------------------
# torch.library ops + autograd: the SwiGLU MLP as one node (LESSON 9)
# --------------------------------------------------------------------------------------------
def _chunk(total: int, other: int, hidden: int = 0, sms: int = 0, budget: int = 0) -> int:
    """Rows (or columns) per chunk so that chunk x other ~ MLP_CHUNK_ELEMS; a multiple of 256 when
    that large, so every chunk's matmul tiles evenly.

    With sms > 0 and hidden = the model's H (the full MLP's backward column chunks, on a GPU) a chunk is also at
    least large enough that its weight-gradient GEMMs ([H, cols] and [cols, H], over K = all rows) have
    MLP_MIN_WAVES waves of WAVE_TILE-element output tiles on the SMs; when that floor raises the chunk, the chunks
    are cut evenly (multiples of 256). Why: on an H100 (2026-12-05, host_trace_probe --shapes) the backward's
    seven 1280-column weight-gradient GEMMs at Qwen3-4B's MLP (12289 x 2560 x 9728; [2560, 1280] outputs, 100
    tiles of 128x256 on 132 SMs) took 1362 + 1349 us against 808 + 843 us unchunked, while the forward's row
    chunks ran at the unchunked GEMM's speed (BENCHMARKS.md). budget: elements a chunk in place of MLP_CHUNK_ELEMS
    (_fwd_rows)."""
    size = (budget or MLP_CHUNK_ELEMS) // max(1, other)
    if size >= 256:
        size -= size % 256
    size = max(1, min(total, size))
    if hidden > 0 and sms > 0 and MLP_MIN_WAVES > 0:
        need = -(-MLP_MIN_WAVES * sms * WAVE_TILE // hidden)
        if need > size:  # cut_evenly never returns more than total
            size = cut_evenly(total, need)
    return size


def cut_evenly(total: int, size: int, to_256: bool = True) -> int:
    """The chunk size that cuts `total` into as many chunks as `size` makes, all of one size (rounded up to a
    multiple of 256 when to_256, never above total): _chunk's wave floor, and the chunk probe's even rules."""
    if total < 1 or size < 1:
        raise ValueError(f"cut_evenly: total and size must be >= 1, got total={total}, size={size}")
    even = -(-total // -(-total // size))
    if to_256:
        even = -(-even // 256) * 256
    return min(total, even)


def _gpu_sms(t: torch.Tensor) -> int:
    """The SMs _chunk's wave floor counts: the device's on a GPU, 0 elsewhere (no floor: the chunk budget alone)."""
    return num_sms(t.device) if t.is_cuda else 0


def _linear_into(out, a, w, b) -> None:
    """out = a @ w.T (+ b), written into the given (contiguous) buffer."""
    if b is None:
        torch.mm(a, w.t(), out=out)
    else:
        torch.addmm(b, a, w.t(), out=out)


def _mlp_forward(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    b_gate: Optional[torch.Tensor], b_up: Optional[torch.Tensor], b_down: Optional[torch.Tensor],
    recompute_up: bool, weight_grads: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., H] -> (out [..., H], g [M, I], u [M, I] or an empty [0] tensor when recompute_up; M = x's rows).

    h (and, when recompute_up, u) is formed one row chunk at a time and never held whole. The leading dims
    are flattened in here, not around the autograd node (no view nodes in the graph: host time forward
    and backward); out is allocated in its final shape (a Function may not return a view).
    weight_grads: the backward will compute weight gradients (the caller records a graph for trainable
    weights): the row chunks may then hold as many elements as the backward's column chunks (_fwd_rows)."""
    x2 = x.reshape(-1, x.shape[-1])
    g = F.linear(x2, w_gate, b_gate)
    u = x.new_empty(0) if recompute_up else F.linear(x2, w_up, b_up)
    out = x.new_empty((*x.shape[:-1], w_down.shape[0]))
    rows = _fwd_rows(*g.shape, x.shape[-1], _gpu_sms(g) if weight_grads else 0)
    _down_by_row_chunks(x2, g, u, w_up, b_up, w_down, b_down, recompute_up, out=out.view(-1, w_down.shape[0]),
                        rows=rows)
    return out, g, u


def _fwd_rows(m: int, inter: int, hidden: int, sms: int) -> int:
    """Rows per forward chunk of the full MLP: _chunk's budget rule, and with sms > 0 (weight gradients on a GPU)
    a budget raised to the elements of the backward's column chunk ([m, _chunk(inter, m, hidden, sms)]: its
    wave floor), cut evenly. The h chunk then never holds more than the backward's dh chunk, which is alive
    beside as large tensors (dx, the weight gradients) as the forward's out, so fwd+bwd's peak does not move,
    and small MLPs run fewer launches: Qwen3-0.6B's 16384 x 1024 x 3072 one chunk, not four (three of 5376
    rows and one of 256); Qwen3-4B's 12289 x 2560 x 9728 four, not nine (the last of one row)."""
    rows = _chunk(m, inter)
    if sms <= 0:
        return rows
    budget = m * _chunk(inter, m, hidden, sms)
    if budget <= rows * inter:
        return rows
    return cut_evenly(m, _chunk(m, inter, budget=budget))


def _backward_by_column_chunks(dout, x, g, u, w_up, b_up, w_down, recompute_up, dx, *, want_h=True, fix_dh=None,
                               fix_u=None, weight_grads=False):
    """The MLP backward's loop over column chunks of I (chunk buffers freed when it ends). Per chunk: dh = dout
    W_down[:, chunk] (then fix_dh(dh, c0, c1) may add to it in place), u's chunk (recomputed from x when
    recompute_up, then fix_u(u, c0, c1)), and the swiglu backward IN PLACE: g's chunk becomes dg, u's du, and
    the dh buffer h (when want_h). Yields (c0, c1, h or spent dh, dg, du) chunks; after the caller's turn, with
    recompute_up, the du chunk is folded into dx (dx += du W_up[chunk]) before its buffer is reused."""
    m, inter = g.shape
    # the wave floor where each chunk's weight-gradient GEMMs run (full MLP, trainable weights): not for the LoRA
    # node, whose frozen base has none (there the floor measured 4-7% slower on an H100)
    cols = _chunk(inter, m, dout.shape[-1], _gpu_sms(g) if weight_grads else 0)
    dh_buf = g.new_empty(m * min(cols, inter))
    u_buf = g.new_empty(m * min(cols, inter)) if recompute_up else None
    for c0 in range(0, inter, cols):
        c1 = min(inter, c0 + cols)
        width = c1 - c0
        dhc = dh_buf[: m * width].view(m, width)  # contiguous, also for the ragged last chunk
        torch.mm(dout, w_down[:, c0:c1], out=dhc)
        if fix_dh is not None:
            fix_dh(dhc, c0, c1)
        gc = g[:, c0:c1]
        if recompute_up:
            uc = u_buf[: m * width].view(m, width)
            _linear_into(uc, x, w_up[c0:c1], b_up[c0:c1] if b_up is not None else None)
            if fix_u is not None:
                fix_u(uc, c0, c1)
        else:
            uc = u[:, c0:c1]
        _launch_bwd(dhc, gc, uc, gc, uc, dhc if want_h else None)  # dg -> g, du -> u, h -> dh, in place
        yield c0, c1, dhc, gc, uc
        if recompute_up:  # the du chunk dies here: fold it into dx now
            dx.addmm_(uc, w_up[c0:c1])


def _one_column_chunk(m: int, inter: int, hidden: int, sms: int) -> bool:
    """Whether the MLP backward's column loop (_backward_by_column_chunks) would run one chunk: the body then does
    its work directly (_mlp_backward_body)."""
    return _chunk(inter, m, hidden, sms) >= inter


def _down_by_row_chunks(x, g, u, w_up, b_up, w_down, b_down, recompute_up, fix_up=None, on_h=None,
                        out=None, rows=0) -> torch.Tensor:
    """out = down(silu(g) * u) [M, H], h formed one row chunk at a time (never held whole); with recompute_up
    each chunk's u is recomputed from x (then fix_up(u_chunk, r0, r1) may add to it in place, e.g. a LoRA
    term). on_h(h_chunk, r0, r1), if given, sees each h chunk before it is reused (e.g. for a LoRA A product).
    out: a contiguous [M, H] buffer to write (default: a new one). rows: rows per chunk (default _chunk's
    budget rule; the full MLP passes _fwd_rows)."""
    m, inter = g.shape
    if out is None:
        out = x.new_empty((m, w_down.shape[0]))
    # the forward's down_proj chunks ran at the unchunked GEMM's speed: no wave floor of their own
    rows = rows or _chunk(m, inter)
    if rows >= m and not recompute_up:  # one chunk: the loop's work without its row views (host time a call)
        h = g.new_empty((m, inter))
        _launch_fwd(g, u, h)
        _linear_into(out, h, w_down, b_down)
        if on_h is not None:
            on_h(h, 0, m)
        return out
    h_buf = g.new_empty((min(rows, m), inter))
    u_buf = g.new_empty((min(rows, m), inter)) if recompute_up else None
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        hc = h_buf[: r1 - r0]
        if recompute_up:
            uc = u_buf[: r1 - r0]
            _linear_into(uc, x[r0:r1], w_up, b_up)
            if fix_up is not None:
                fix_up(uc, r0, r1)
        else:
            uc = u[r0:r1]
        _launch_fwd(g[r0:r1], uc, hc)
        _linear_into(out[r0:r1], hc, w_down, b_down)
        if on_h is not None:
            on_h(hc, r0, r1)
    return out


_mlp_fwd_op = torch.library.custom_op("hearth::swiglu_mlp_fwd", mutates_args=())(_mlp_forward)


@_mlp_fwd_op.register_fake
def _(x, w_gate, w_up, w_down, b_gate, b_up, b_down, recompute_up, weight_grads=False):
    m = math.prod(x.shape[:-1])
    inter = w_gate.shape[0]
    u = x.new_empty(0) if recompute_up else x.new_empty((m, inter))
    return x.new_empty((*x.shape[:-1], w_down.shape[0])), x.new_empty((m, inter)), u


def _mlp_backward_body(
    dout: torch.Tensor, x: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, b_up: Optional[torch.Tensor],
    need_weight_grads: bool, recompute_up: bool, need_bias_grads: bool = True, *, eager: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns dx, dW_gate, dW_up, dW_down, db_gate, db_up, db_down (weight grads are empty [0]
    tensors when need_weight_grads is False, bias grads when either flag is False: an MLP without
    biases skips the three column sums, whose bf16 reductions allocated a 133 MiB fp32 temporary at the
    backward's peak on the H200). Overwrites g with dg and u with du; when
    recompute_up, u is an empty placeholder and each column chunk of u is recomputed from x. x and dout may have
    leading dims ([..., H]); dx has x's shape. eager (the Function's route, _mlp_backward_eager): u is freed after
    its last use, and the gradients not computed are None instead of the op's distinct empty placeholders."""
    x_shape = x.shape
    none = (lambda t: None) if eager else (lambda t: t.new_empty(0))  # custom op outputs may not alias each other
    x = x.reshape(-1, x.shape[-1])
    dout = dout.reshape(-1, dout.shape[-1]).contiguous()
    m, inter = g.shape
    need_w = need_weight_grads
    need_b = need_w and need_bias_grads
    if not recompute_up and _one_column_chunk(m, inter, dout.shape[-1], _gpu_sms(g) if need_w else 0):
        # one column chunk (small MLPs, and Qwen3-0.6B's on a GPU through the wave floor): the loop's work without
        # its buffers, views and generator (host time a call), in the same order, so the same peak
        dh = torch.mm(dout, w_down)
        _launch_bwd(dh, g, u, g, u, dh if need_w else None)  # dg -> g, du -> u, h -> dh, in place
        dw_down = torch.mm(dout.t(), dh) if need_w else none(w_down)
        dh = None
        dw_up = torch.mm(u.t(), x) if need_w else none(w_up)
        db_up = u.sum(0) if need_b else none(x)
        dx = None
    else:
        dw_down = w_down.new_empty(w_down.shape) if need_w else none(w_down)
        dw_up = w_up.new_empty(w_up.shape) if need_w else none(w_up)
        db_up = x.new_empty((inter,)) if need_b else none(x)
        dx = torch.zeros_like(x) if recompute_up else None
        # Column chunks of I: each chunk of dW_down (and dW_up) is produced whole by one matmul.
        for c0, c1, hc, _, uc in _backward_by_column_chunks(dout, x, g, u, w_up, b_up, w_down, recompute_up, dx,
                                                              want_h=need_w, weight_grads=need_w):
            if need_w:
                # The GEMM writes its columns of dW_down in place: the [H, chunk] view has row stride I, which
                # cuBLAS takes as the output's leading dimension (no temporary and no copy launch per chunk; the
                # copies cost 0.23 ms of a 9.4 ms fwd+bwd at Qwen3-14B's shape on the H200).
                torch.mm(dout.t(), hc, out=dw_down[:, c0:c1])
                torch.mm(uc.t(), x, out=dw_up[c0:c1])
                if need_b:
                    db_up[c0:c1] = uc.sum(0)
        # The chunk buffers are dead: free them before the [I, H] / [rows, H] results below are allocated.
        hc = uc = None
    dg = g
    if recompute_up:
        dx.addmm_(dg, w_gate)
    else:
        dx = torch.mm(dg, w_gate)
        dx.addmm_(u, w_up)
        if eager:  # du's last use: give its [rows, I] back before dW_gate's [I, H] is allocated
            _release_storage(u)
    dw_gate = dg.t() @ x if need_w else none(x)
    if need_b:
        db_gate, db_down = dg.sum(0), dout.sum(0)
    else:
        db_gate, db_down = none(x), none(x)
    return dx.view(x_shape) if len(x_shape) != 2 else dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down


def _mlp_backward_impl(
    dout: torch.Tensor, x: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, b_up: Optional[torch.Tensor],
    need_weight_grads: bool, recompute_up: bool, need_bias_grads: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The custom op's body (torch.compile's route): _mlp_backward_body, keeping every input's memory."""
    return _mlp_backward_body(dout, x, g, u, w_gate, w_up, w_down, b_up, need_weight_grads, recompute_up,
                              need_bias_grads)


def _release_storage(t: torch.Tensor) -> None:
    """Free t's memory now: its storage shrinks to 0 bytes while autograd's saved-tensor slot still names it
    (the eager backward's du, dead after its last product; a second backward through the graph is refused
    by the version check before anything could read it)."""
    t.untyped_storage().resize_(0)


def _mlp_backward_eager(dout, x, g, u, *args):
    """The eager route: the launcher called directly. g and u are overwritten by Triton (which autograd
    does not see), so their version counters are bumped here, as the custom op's mutates_args does:
    a second backward through the same graph then fails autograd's saved-tensor check. u (du by then) is
    freed after its last use, before dW_gate is allocated: the backward's peak then holds one [rows, I]
    tensor less (the full backward's peak was out + g + u + the three weight gradients + dx)."""
    grads = _mlp_backward_body(dout, x, g, u, *args, eager=True)
    torch.autograd.graph.increment_version([g, u])
    return grads


_mlp_bwd_op = torch.library.custom_op("hearth::swiglu_mlp_bwd", mutates_args=("g", "u"))(_mlp_backward_impl)


@_mlp_bwd_op.register_fake
def _(dout, x, g, u, w_gate, w_up, w_down, b_up, need_weight_grads, recompute_up, need_bias_grads=True):
    if need_weight_grads:
        grads = [w_gate.new_empty(w_gate.shape), w_up.new_empty(w_up.shape), w_down.new_empty(w_down.shape)]
    else:
        grads = [x.new_empty(0) for _ in range(3)]
    if need_weight_grads and need_bias_grads:
        grads += [x.new_empty((w_gate.shape[0],)), x.new_empty((w_up.shape[0],)), x.new_empty((w_down.shape[0],))]
    else:
        grads += [x.new_empty(0) for _ in range(3)]
    return (x.new_empty(x.shape), *grads)


def _mlp_setup(ctx, inputs, output):
    x, w_gate, w_up, w_down, b_gate, b_up, b_down, recompute_up, *_ = inputs  # (then weight_grads, if passed)
    _out, g, u = output
    # g and u are op outputs only so that they can be saved; nothing differentiates through them.
    # Without set_materialize_grads(False) autograd hands the backward a zero tensor for each of them:
    # two [rows, I] allocations alive at the backward's peak (+448 MiB at N=8192, I=14336 in bf16).
    ctx.mark_non_differentiable(g, u)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, g, u, w_gate, w_up, w_down, b_up)
    ctx.has_bias = (b_gate is not None, b_up is not None, b_down is not None)
    ctx.recompute_up = recompute_up


def _mlp_backward(ctx, dout, _dg, _du):
    if dout is None:  # the output did not reach the loss (grads are not materialised): nothing flows back
        return (None,) * 9
    x, g, u, w_gate, w_up, w_down, b_up = ctx.saved_tensors
    need_w = any(ctx.needs_input_grad[1:7])
    dx, dwg, dwu, dwd, dbg, dbu, dbd = (_mlp_backward_eager if ctx.eager else torch.ops.hearth.swiglu_mlp_bwd)(
        dout, x, g, u, w_gate, w_up, w_down, b_up, need_w, ctx.recompute_up, any(ctx.has_bias)
    )
    if not need_w:
        return dx, None, None, None, None, None, None, None, None
    bg, bu, bd = ctx.has_bias
    return dx, dwg, dwu, dwd, dbg if bg else None, dbu if bu else None, dbd if bd else None, None, None


# eager: a torch.autograd.Function over _mlp_forward / _mlp_backward_impl; under torch.compile: the custom ops
_mlp = autograd_op(_mlp_fwd_op, _mlp_forward, _mlp_setup, _mlp_backward, once=True)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, fused; the backward recomputes silu from gate.

    Args:
        gate, up: same shape [..., N], same float dtype (float32 / bfloat16 / float16), same device.
            Views whose last dim is contiguous are read through their row stride; others are copied.
            Empty tensors give an empty result.

    Returns:
        h: gate.shape, gate.dtype (computed in fp32, rounded once).

    Bytes moved: forward 3*numel*b, backward 5*numel*b.

    Raises:
        TypeError: not tensors, unsupported dtype, or dtypes differ.
        ValueError: shapes differ, 0-d tensors, different devices, not on CUDA (CPU only under
            TRITON_INTERPRET=1).
    """
    check_tensor(gate, "gate", allow_empty=True)
    check_tensor(up, "up", allow_empty=True)
    # the pair checks' own tests first: the helpers (a kwargs dict and a loop each) run only to raise their messages
    if up.dtype != gate.dtype:
        check_same_dtype(gate=gate, up=up)
    if up.device != gate.device:
        check_same_device(gate=gate, up=up)
    if gate.dim() == 0:
        raise ValueError("gate must have at least one dimension, got a 0-d tensor")
    if gate.shape != up.shape:
        raise ValueError(f"up must have the shape of gate {tuple(gate.shape)}, got {tuple(up.shape)}")
    return _swiglu(gate, up)


def swiglu_mlp(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None,
    *, recompute_up: bool = False,
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) as ONE autograd node (weights in nn.Linear layout [out, in]).

    Args:
        x: [..., H]; w_gate, w_up: [I, H]; w_down: [H, I]; optional biases [I], [I], [H].
            All the same float dtype and device (cast before calling under autocast).

    Returns:
        [..., H] in x.dtype.

    Saved for backward: x, g = gate(x) and u = up(x) only (2 x rows x I elements); h is never held
    whole. recompute_up=True saves only x and g and recomputes u chunk by chunk in the backward:
    half the [rows, I] memory for one more x @ W_up matmul (2*rows*H*I FLOPs, ~+11% MLP time).
    Extra memory beyond the saved tensors: a ~32 MiB (bf16) chunk of h (forward) / dh (backward),
    see MLP_CHUNK_ELEMS. The backward may run only once per forward (it reuses g and u
    as the buffers of their own gradients; a second backward raises autograd's saved-tensor error).

    Raises:
        TypeError / ValueError naming the argument, as for the other ops.
    """
    check_tensor(x, "x", allow_empty=True)
    names = {"w_gate": w_gate, "w_up": w_up, "w_down": w_down, "b_gate": b_gate, "b_up": b_up, "b_down": b_down}
    for name, t in names.items():
        if t is not None:
            check_tensor(t, name, ndim=2 if name.startswith("w") else 1)
    check_same_dtype(x=x, **names)
    check_same_device(x=x, **names)
    if x.dim() == 0:  # [..., H] of any rank but 0 (shape[-1] below would raise a bare IndexError)
        raise ValueError("x must have at least 1 dimension [..., H], got a 0-D tensor")
    hidden = x.shape[-1]
    inter = w_gate.shape[0]
    if tuple(w_gate.shape) != (inter, hidden):
        raise ValueError(f"w_gate must be [I, {hidden}], got {tuple(w_gate.shape)}")
    if tuple(w_up.shape) != (inter, hidden):
        raise ValueError(f"w_up must have the shape of w_gate {(inter, hidden)}, got {tuple(w_up.shape)}")
    if tuple(w_down.shape) != (hidden, inter):
        raise ValueError(f"w_down must be [{hidden}, {inter}], got {tuple(w_down.shape)}")
    for name, t, size in (("b_gate", b_gate, inter), ("b_up", b_up, inter), ("b_down", b_down, hidden)):
        if t is not None and t.shape[0] != size:
            raise ValueError(f"{name} must have length {size}, got {tuple(t.shape)}")
    # a graph is recorded for trainable weights: the forward's row chunks may match the backward's column chunks
    weight_grads = torch.is_grad_enabled() and (w_gate.requires_grad or w_up.requires_grad or w_down.requires_grad or any(
        b is not None and b.requires_grad for b in (b_gate, b_up, b_down)))
    out, _g, _u = _mlp(x, w_gate, w_up, w_down, b_gate, b_up, b_down, bool(recompute_up), weight_grads)  # [..., H]
    return out
