"""Softmax over one dimension, forward and backward, in Triton.

Math (per row x of width n, computed in fp32 whatever the storage dtype):
    y  = exp(x - max(x)) / sum(exp(x - max(x)))
    dx = y * (dy - sum(dy * y))

Two paths, chosen by row width in `_config` (the one place BLOCK / num_warps are picked):
  * one pass (n <= ONEPASS_MAX_COLS): the whole row sits in registers; the kernel reads x once and
    writes y once -> 2*M*n*bytes of HBM traffic (backward: reads y, dy, writes dx -> 3*M*n*bytes).
  * wide rows (n > ONEPASS_MAX_COLS, e.g. 262,144 columns where Liger refuses): loop 1 walks the row
    in CHUNK-column chunks keeping an online running max and sum (HBM read once for the statistics);
    loop 2 walks the chunks in REVERSE order and writes the output, so the re-read starts with the
    chunks loop 1 touched last, which are the likeliest to still be in L2. Traffic: 2*M*n*bytes from
    HBM plus the re-read that misses L2 (zero when a row's re-read is served from L2).
    Backward uses the same split: loop 1 accumulates sum(dy*y), loop 2 (reverse) writes dx.
    The wide kernels are persistent (WIDE_PROGRAMS_PER_SM programs per SM, each walking rows p, p+P,
    ...): that bounds the rows in flight, and so the bytes between a row's read and its re-read,
    which is what decides whether the re-read hits L2. On the GPU, (programs per SM, CHUNK, num_warps,
    pipelining depth) is picked once per (n, dtype, row-count bucket) by timing a few candidates
    (`pick_config`), and the one-pass kernels pick their num_warps the same way.
    On Hopper, wide rows that are 16-byte aligned (softmax_gluon.serves) go instead to the cluster
    kernels in Gluon (softmax_gluon.softmax_fwd_smem / softmax_bwd_smem): the row is split over a cluster
    of CTAs, each holding its part in shared memory, so it is read from HBM once (H200, bf16, forward:
    1.20-1.32x the chunked kernel at 4096 x 151936 / 262144, 8192 x 128256 / 131072 / 152064, 16384 x 65536).
    For 16-bit dtypes they also take aligned rows the one-pass kernels would: forward rows over 16384 columns,
    backward rows over 4096 (softmax_gluon.smem_min_cols: 1.13-1.14x forward and 1.09-1.11x backward at 32000 /
    32768 columns; narrower forward rows measured slower there and stay on the one-pass kernel).

Layout: the softmax dim is moved last (`movedim`, a view). Rows are copied to contiguous memory only
when the moved dim does not have stride 1 (or the leading dims cannot be flattened into one row
stride); otherwise the kernel reads the caller's memory in place through its row stride. The output
is allocated row-contiguous in the moved layout and returned as the view moved back, so for dim != -1
it can be a non-contiguous view (values and shape are what torch.softmax returns).

Registered as torch.library custom ops `hearth::softmax_fwd` / `hearth::softmax_bwd` (fake kernels and
autograd registered), so `torch.compile(fullgraph=True)` sees one opaque op and does not break the graph.
Eager calls skip that dispatch: a torch.autograd.Function runs the same launchers (_common.autograd_op).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hearth.kernels._common import autograd_op, check_tensor, next_power_of_2, num_sms, pick_config

try:  # Gluon ships with Triton 3.6; without it every row stays on the Triton kernels below
    from hearth.kernels import softmax_gluon as sg
except (ImportError, AttributeError):  # pragma: no cover - the pinned Triton has it
    sg = None

# Row widths above this use the chunked (online) kernels. Tests lower it (monkeypatch) to exercise the
# wide path on the CPU interpreter. 32768 fp32 values per row = 32 registers/thread at 32 warps.
ONEPASS_MAX_COLS = 32768
# Wide-row kernels (tuning knobs for the H200): column chunk, warps, and persistent programs per SM.
# Rows in flight = SMs * WIDE_PROGRAMS_PER_SM; rows in flight * n * bytes should stay near L2 (~50 MB)
# for loop 2's reverse re-read to hit L2 (4096x262144 bf16: 512 KiB a row, 132 rows = 66 MiB).
WIDE_CHUNK = 16384
WIDE_WARPS = 32
WIDE_PROGRAMS_PER_SM = 1.0

# (largest BLOCK, num_warps) for the one-pass kernels, keyed by next_power_of_2(n).
_ONEPASS_WARPS = ((1024, 4), (4096, 8), (16384, 16), (1 << 62, 32))


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _softmax_row(x):
    """softmax of one fp32 row held whole (the one-pass kernels; inlined)."""
    e = tl.exp(x - tl.max(x, axis=0))
    return e / tl.sum(e, axis=0)


@triton.jit
def _softmax_grad_row(y, dy):
    """dx of one fp32 row held whole: y * (dy - sum(y * dy)) (the one-pass kernels; inlined)."""
    return y * (dy - tl.sum(y * dy, axis=0))


@triton.jit
def _softmax_fwd_onepass_kernel(
    # pointers
    x_ptr, y_ptr,
    # strides (elements; columns have stride 1)
    stride_x, stride_y,
    # shapes
    n_cols,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # evict_first: each byte is read exactly once, keep L2 for others.
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
    y = _softmax_row(x.to(tl.float32))
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_rows_kernel(
    # pointers
    x_ptr, y_ptr,
    # strides (elements; columns have stride 1)
    stride_x, stride_y,
    # shapes
    n_rows, n_cols,
    # meta-parameters
    BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop
):
    """The one-pass forward, persistent: program p walks rows p, p + P, ... and the row loop is software-
    pipelined (cp.async of the next rows into shared memory while this one is reduced). One row per program
    (the plain one-pass kernel) keeps nothing in flight while a program reduces: at 32000 columns and 32 warps
    an SM holds one such program (its 1024 threads need more than 32 registers each), and the H200's forward
    ran at 73% of copy bandwidth."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        row = tl.cast(r, tl.int64)  # see _softmax_fwd_chunked_kernel
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
        y = _softmax_row(x.to(tl.float32))
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_chunked_kernel(
    # pointers
    x_ptr, y_ptr,
    # strides
    stride_x, stride_y,
    # shapes
    n_rows, n_cols,
    # meta-parameters
    CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr = 1,  # software-pipelining depth of the column loops (1: none)
):
    # persistent: program p handles rows p, p + P, ...; P bounds the rows in flight, hence the
    # bytes read between loop 1 and loop 2 of a row (keep them under L2)
    # int64 induction variable: row * stride exceeds 2^31 at real shapes (16384 x 151936)
    for r in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        # int64 on the GPU already (a no-op cast); the CPU interpreter hands the loop a Python int,
        # which it would multiply in int32: the cast keeps the CPU test of the int64 path honest
        row = tl.cast(r, tl.int64)
        x_row = x_ptr + row * stride_x
        y_row = y_ptr + row * stride_y
        offs = tl.arange(0, CHUNK)
        m = -float("inf")  # running max
        s = 0.0  # running sum of exp(x - m)
        for start in tl.range(0, n_cols, CHUNK, num_stages=NUM_STAGES):
            cols = start + offs
            # evict_last: loop 2 re-reads this row; ask L2 to keep it.
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf"), eviction_policy="evict_last")
            x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            # while every value so far is -inf, shift by 0 instead of -inf (avoids -inf - -inf = nan)
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
        inv_s = 1.0 / s  # all -inf row: s == 0 -> inf, and 0 * inf = nan, like torch
        n_chunks = tl.cdiv(n_cols, CHUNK)
        for i in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            cols = (n_chunks - 1 - i) * CHUNK + offs  # reverse: most recently read chunks first
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
            y = tl.exp(x - m) * inv_s
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


@triton.jit
def _softmax_bwd_onepass_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # strides
    stride_y, stride_dy, stride_dx,
    # shapes
    n_cols,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dx = _softmax_grad_row(y, dy)
    tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_rows_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # strides
    stride_y, stride_dy, stride_dx,
    # shapes
    n_rows, n_cols,
    # meta-parameters
    BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,  # software-pipelining depth of the row loop
):
    """The one-pass backward, persistent and pipelined like _softmax_fwd_rows_kernel."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for r in tl.range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0), num_stages=NUM_STAGES):
        row = tl.cast(r, tl.int64)  # see _softmax_fwd_chunked_kernel
        y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = dy.to(tl.float32)
        dx = _softmax_grad_row(y, dy)
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_chunked_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # strides
    stride_y, stride_dy, stride_dx,
    # shapes
    n_rows, n_cols,
    # meta-parameters
    CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr = 1,  # software-pipelining depth of the column loops (1: none)
):
    # persistent: program p handles rows p, p + P, ...; P bounds the rows in flight, hence the
    # bytes read between loop 1 and loop 2 of a row (keep them under L2)
    # int64 induction variable: row * stride exceeds 2^31 at real shapes (16384 x 151936)
    for r in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        # int64 on the GPU already (a no-op cast); the CPU interpreter hands the loop a Python int,
        # which it would multiply in int32: the cast keeps the CPU test of the int64 path honest
        row = tl.cast(r, tl.int64)
        y_row = y_ptr + row * stride_y
        dy_row = dy_ptr + row * stride_dy
        dx_row = dx_ptr + row * stride_dx
        offs = tl.arange(0, CHUNK)
        acc = tl.zeros([CHUNK], dtype=tl.float32)  # lane-wise partial sums: one reduction at the end
        for start in tl.range(0, n_cols, CHUNK, num_stages=NUM_STAGES):
            cols = start + offs
            mask = cols < n_cols
            y = tl.load(y_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        n_chunks = tl.cdiv(n_cols, CHUNK)
        for i in tl.range(0, n_chunks, num_stages=NUM_STAGES):
            cols = (n_chunks - 1 - i) * CHUNK + offs
            mask = cols < n_cols
            y = tl.load(y_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")


# ---------------------------------------------------------------------------------------- launcher
def _config(n_cols: int) -> tuple[bool, int, int]:
    """(chunked?, BLOCK or CHUNK, num_warps) for rows of width n_cols: the one tuning table."""
    return _config_for(n_cols, ONEPASS_MAX_COLS, WIDE_CHUNK, WIDE_WARPS, _ONEPASS_WARPS)


# The launch plans below are pure functions of their arguments and the module's tuning constants, which are passed
# in as arguments so that the caches see a test's lowered constant: built once a width, not on every call (their
# lists cost several microseconds of host time a call, more than the rest of the launcher's Python).
@functools.lru_cache(maxsize=None)
def _config_for(n_cols: int, onepass_max: int, wide_chunk: int, wide_warps: int, onepass_warps) -> tuple[bool, int, int]:
    if n_cols > onepass_max:
        return True, min(wide_chunk, next_power_of_2(n_cols)), wide_warps
    block = next_power_of_2(n_cols)
    warps = next(w for limit, w in onepass_warps if block <= limit)
    return False, block, warps


def _wide_programs(n_rows: int, device: torch.device, per_sm: float | None = None) -> int:
    """Programs of the wide-row kernels: per_sm (default WIDE_PROGRAMS_PER_SM) per SM, at most one per
    row; per_sm 0: one program per row (the hardware keeps as many resident as fit and starts the next
    row as soon as one ends)."""
    per_sm = WIDE_PROGRAMS_PER_SM if per_sm is None else per_sm
    if per_sm <= 0:
        return max(1, n_rows)
    return max(1, min(n_rows, int(num_sms(device) * per_sm)))


def _wide_candidates(n_cols: int, itemsize: int = 2, n_inputs: int = 1) -> tuple[tuple[float, int, int, int], ...]:
    """_wide_candidates_for with the module's constants (cached per width, see _config_for)."""
    return _wide_candidates_for(n_cols, itemsize, n_inputs, WIDE_PROGRAMS_PER_SM, WIDE_CHUNK, WIDE_WARPS)


@functools.lru_cache(maxsize=None)
def _wide_candidates_for(n_cols: int, itemsize: int, n_inputs: int, programs_per_sm: float, wide_chunk: int,
                         wide_warps: int) -> tuple[tuple[float, int, int, int], ...]:
    """(programs_per_SM, CHUNK, num_warps, num_stages) candidates of the wide kernels; the first is the
    default (CPU / interpreter: the module constants, unpipelined). On the GPU the fastest is kept.
    Pipelined loops (num_stages > 1: cp.async into shared memory) keep chunks in flight without more
    programs; fewer programs = fewer rows in flight = more of the reverse re-read served by L2
    (4096 x 262144 bf16: 66 programs x 512 KiB = 33 MiB, under the 50 MB L2; 132 = 66 MiB, over).
    The last two are the other way round: one program per row (programs_per_SM 0), 8 or 16 warps, 3
    stages -- cross-entropy's row kernel, the same two-loop walk, ran 9-20% faster on the H200 that way
    than with 2 persistent programs per SM (ce_rows_probe, 2026-12-02), the re-read missing L2 in both."""
    cap = next_power_of_2(n_cols)
    first = (programs_per_sm, min(wide_chunk, cap), wide_warps, 1)
    cands = [first, (1.0, 16384, 32, 3), (0.5, 16384, 32, 3), (0.5, 16384, 32, 1), (0.5, 16384, 32, 2), (0.25, 16384, 32, 4),
             (0, 4096, 8, 3), (0, 8192, 16, 3)]
    # shared memory of the pipelined loads: (stages - 1) x CHUNK x itemsize per input (the compiled
    # sm_90 kernels hold stages - 1 buffers); keep <= 160 KiB
    # (the H200 allows 227 KiB a block; candidates over it would fail to launch and be skipped anyway)
    fits = [c for c in cands if c[3] == 1 or (c[3] - 1) * min(c[1], cap) * itemsize * n_inputs <= 160 * 1024]
    return tuple(dict.fromkeys((p, min(c, cap), w, s) for p, c, w, s in fits))


def _onepass_candidates(warps: int) -> list[int]:
    """num_warps candidates of the one-pass kernels: the table's value first, then half and double."""
    return list(dict.fromkeys([warps, max(4, warps // 2), min(32, warps * 2)]))


# Persistent, pipelined one-pass kernels (_softmax_fwd_rows_kernel, _softmax_bwd_rows_kernel) for rows of at
# least this BLOCK: (programs_per_SM, num_warps, num_stages); timed by the pick beside the one-row warps.
# Triton's sm_90 build (Triton 3.6) at BLOCK 32768 bf16: 32 warps 63 registers, 16 warps 127, no spills,
# 64 KiB of shared memory a pipelined row; at 8192: 28 / 39 registers. The loads are pipelined (cp.async)
# only when the width is a multiple of 8 elements of 16 bits (the launch specialises widths divisible by
# 16): a per-element mask of 2-byte values cannot be copied asynchronously (4 bytes at least). Two
# programs per SM are offered up to 16384 values of row data a program only (at BLOCK 32768 two 16-warp
# forward programs, at 16384 two backward ones, do not fit the register file together).
ROWS_MIN_BLOCK = 8192
_ROWS_CANDIDATES = ((1, 32, 2), (1, 16, 2), (1, 32, 3), (2, 16, 2))


def _onepass_pick_candidates(block: int, warps: int, itemsize: int, n_inputs: int = 1) -> tuple:
    """_onepass_pick_candidates_for with the module's constants (cached per width, see _config_for)."""
    return _onepass_pick_candidates_for(block, warps, itemsize, n_inputs, ROWS_MIN_BLOCK, _ROWS_CANDIDATES)


@functools.lru_cache(maxsize=None)
def _onepass_pick_candidates_for(block: int, warps: int, itemsize: int, n_inputs: int, rows_min_block: int,
                                 rows_candidates) -> tuple:
    """The one-pass kernels' candidates: num_warps (int) of the one-row kernel, the table's first (the CPU
    default), then for rows of BLOCK >= ROWS_MIN_BLOCK the persistent kernel's (programs_per_SM, num_warps,
    num_stages), kept to those whose pipelined rows ((stages - 1) x BLOCK x itemsize x n_inputs of shared
    memory a program: 1 input forward, 2 backward) fit 160 KiB an SM. Up to n_inputs x BLOCK = 32768 only: the
    backward's y and dy at BLOCK 32768 spilled registers on sm_90 (40 and 88 bytes at 32 and 16 warps)."""
    cands = list(_onepass_candidates(warps))
    if rows_min_block <= block and n_inputs * block <= 32768:
        cands += [c for c in rows_candidates
                  if c[0] * (c[2] - 1) * block * itemsize * n_inputs <= 160 * 1024
                  and c[0] * n_inputs * block <= 32768]  # two programs an SM: half the registers each
    return tuple(cands)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """View `t` (softmax dim last) as [rows, n] with unit column stride; copies only when it must."""
    if t.is_contiguous() and t.dim():  # one view (the launchers pass contiguous tensors of 2+ elements whole)
        return t.view(-1, t.shape[-1])
    if t.dim() == 0:
        t = t.reshape(1)
    if t.stride(-1) != 1:
        t = t.contiguous()
    rows = t.reshape(-1, t.shape[-1])  # a view when the leading dims collapse into one stride
    if rows.stride(-1) != 1:  # (size-1 edge cases)
        rows = rows.contiguous()
    return rows


def _row_args(t: torch.Tensor, numel: int, n_cols: int) -> tuple[torch.Tensor, int]:
    """(what a kernel reads t's rows from, its row stride): a contiguous t of 2+ elements itself with row stride
    n_cols (a launch reads only its pointer; no view is built), anything else _as_rows(t) and its stride(0)."""
    if numel > 1 and t.is_contiguous():
        return t, n_cols
    rows = _as_rows(t)
    return rows, rows.stride(0)


def _softmax_fwd(x: torch.Tensor) -> torch.Tensor:
    """Launch the forward over the last dim of x. Returns a contiguous tensor shaped like x.

    Host time: this runs on every call, so the common case (x contiguous) builds no [rows, n] views (about 1 us
    of host time each): a launch reads only a tensor's pointer, so the kernels take x and y themselves with the
    row stride n_cols, what x.view(-1, n_cols).stride(0) is (except for a single element, which keeps its own
    stride there: numel > 1). The 2-D views are built where they are read: a non-contiguous x (_as_rows) and the
    cluster kernels' routing test."""
    # empty_like: torch.empty(x.shape, dtype=..., device=...) builds and parses a Size and a device (2.5 us of host
    # time against 1.1); contiguous_format: y is row-contiguous whatever x's strides, as before
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    numel = x.numel()
    if numel == 0:
        return y
    n_cols = x.shape[-1]
    n_rows = numel // n_cols
    dtype = x.dtype
    xr, stride_x = _row_args(x, numel, n_cols)
    chunked, block, warps = _config(n_cols)
    key = ("softmax_fwd", n_cols, dtype)
    # both kernels only write y, so candidates are timed on the real arguments
    # Hopper, an aligned row past the cluster's width (softmax_gluon.smem_min_cols): the row split over a cluster.
    # serves takes only CUDA rows wider than min_cols (softmax_gluon.rows_fit), so its 2-D views are built only then
    if sg is not None and x.is_cuda and n_cols > (min_cols := sg.smem_min_cols(dtype)):
        if xr is x:
            xr = x.view(-1, n_cols)  # what _as_rows gives a contiguous x
        if sg.serves(xr, min_cols=min_cols):
            sg.softmax_fwd_smem(xr, out=y.view(-1, n_cols))
            return y
    # y is passed whole: its pointer is that of y.view(-1, n_cols), whose row stride is n_cols
    if chunked:
        def launch(cfg):
            per_sm, chunk, w, stages = cfg
            _softmax_fwd_chunked_kernel[(_wide_programs(n_rows, x.device, per_sm),)](
                xr, y, stride_x, n_cols, n_rows, n_cols, chunk, NUM_STAGES=stages, num_warps=w, num_stages=stages)
        launch(pick_config(key, _wide_candidates(n_cols, x.element_size(), 1), launch, x.device, rows=n_rows))
    else:
        def launch(cfg):
            if isinstance(cfg, int):
                _softmax_fwd_onepass_kernel[(n_rows,)](xr, y, stride_x, n_cols, n_cols, block, num_warps=cfg)
                return
            per_sm, w, stages = cfg
            _softmax_fwd_rows_kernel[(_wide_programs(n_rows, x.device, per_sm),)](
                xr, y, stride_x, n_cols, n_rows, n_cols, block, NUM_STAGES=stages, num_warps=w,
                num_stages=stages)
        launch(pick_config(key, _onepass_pick_candidates(block, warps, x.element_size()), launch, x.device,
                                rows=n_rows))
    return y


def _softmax_bwd(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Launch the backward over the last dim. y, dy shaped alike; returns a contiguous dx.

    As _softmax_fwd: contiguous y and dy (the usual case) are passed whole with row stride n_cols, dx always."""
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    numel = y.numel()
    if numel == 0:
        return dx
    n_cols = y.shape[-1]
    n_rows = numel // n_cols
    dtype = y.dtype
    yr, stride_y = _row_args(y, numel, n_cols)
    if dy.dtype != dtype:
        dy = dy.to(dtype)
    dyr, stride_dy = _row_args(dy, numel, n_cols)
    chunked, block, warps = _config(n_cols)
    key = ("softmax_bwd", n_cols, dtype)
    # both kernels only write dx, so candidates are timed on the real arguments
    # as the forward: the cluster kernels' routing test (and its 2-D views) only for CUDA rows past min_cols
    if sg is not None and y.is_cuda and n_cols > (min_cols := sg.smem_min_cols(dtype, inputs=2)):
        if yr is y:
            yr = y.view(-1, n_cols)
        if dyr is dy:
            dyr = dy.view(-1, n_cols)
        if sg.serves(yr, inputs=2, min_cols=min_cols) and sg.smem_aligned(dyr):
            sg.softmax_bwd_smem(yr, dyr, out=dx.view(-1, n_cols))
            return dx
    if chunked:
        def launch(cfg):
            per_sm, chunk, w, stages = cfg
            _softmax_bwd_chunked_kernel[(_wide_programs(n_rows, y.device, per_sm),)](
                yr, dyr, dx, stride_y, stride_dy, n_cols, n_rows, n_cols, chunk, NUM_STAGES=stages, num_warps=w,
                num_stages=stages)
        launch(pick_config(key, _wide_candidates(n_cols, y.element_size(), 2), launch, y.device, rows=n_rows))
    else:
        def launch(cfg):
            if isinstance(cfg, int):
                _softmax_bwd_onepass_kernel[(n_rows,)](yr, dyr, dx, stride_y, stride_dy, n_cols, n_cols, block,
                                                       num_warps=cfg)
                return
            per_sm, w, stages = cfg
            _softmax_bwd_rows_kernel[(_wide_programs(n_rows, y.device, per_sm),)](
                yr, dyr, dx, stride_y, stride_dy, n_cols, n_rows, n_cols, block, NUM_STAGES=stages, num_warps=w,
                num_stages=stages)
        launch(pick_config(key, _onepass_pick_candidates(block, warps, y.element_size(), 2), launch, y.device,
                                rows=n_rows))
    return dx


# ------------------------------------------------------------------------------- torch.library ops
@torch.library.custom_op("hearth::softmax_fwd", mutates_args=())
def _softmax_fwd_op(x: torch.Tensor) -> torch.Tensor:
    return _softmax_fwd(x)


@_softmax_fwd_op.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("hearth::softmax_bwd", mutates_args=())
def _softmax_bwd_op(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return _softmax_bwd(y, dy)


@_softmax_bwd_op.register_fake
def _(y, dy):
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, grad_y):
    (y,) = ctx.saved_tensors
    return (_softmax_bwd if ctx.eager else _softmax_bwd_op)(y, grad_y)


# eager: a torch.autograd.Function over the launchers; under torch.compile: the custom ops
_softmax = autograd_op(_softmax_fwd_op, _softmax_fwd, _setup_context, _backward, once=True)


# ---------------------------------------------------------------------------------------- public fn
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of `x` along `dim`, like torch.softmax(x, dim); differentiable.

    Args:
        x: any shape (at least 1-D), float32 / bfloat16 / float16, on CUDA (CPU under
            TRITON_INTERPRET=1). Math is done in fp32; the result has x's dtype and shape.
        dim: the dimension to normalise over (negative counts from the end).

    Memory traffic (M rows of n columns, b bytes per element): forward reads x once and writes y once,
    2*M*n*b bytes (wide rows: plus whatever part of the reverse re-read misses L2); backward reads y and
    dy and writes dx, 3*M*n*b. A copy is added only when `dim` is not unit-stride after moving it last.
    An empty x gives an empty result; a row of all -inf gives nan (as torch does).

    Raises:
        TypeError: x is not a tensor or not a float dtype; dim is not an int.
        ValueError: x is 0-D or not on a usable device; dim is out of range.
    """
    check_tensor(x, "x", allow_empty=True)
    nd = x.dim()
    if nd == 0:
        raise ValueError("x must have at least 1 dimension, got a 0-D tensor")
    if type(dim) is int and (dim == -1 or dim == nd - 1):  # the usual call: a plain int naming the last dim
        return _softmax(x)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -nd <= dim < nd:
        raise ValueError(f"dim must be in [{-nd}, {nd - 1}] for x of shape {tuple(x.shape)}, got {dim}")
    dim = dim % nd
    if dim == nd - 1:
        return _softmax(x)
    return _softmax(x.movedim(dim, -1)).movedim(-1, dim)
