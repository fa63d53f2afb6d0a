"""Wide-row softmax forward for Hopper (sm_90) in Gluon: one row held on chip by a thread-block cluster.

Two forms. softmax_fwd_smem (the shared-memory form, end of this file: each CTA's part copied into shared
memory by cp.async and worked a chunk at a time in registers) is what softmax() routes a wide forward row to
on Hopper when the row is 16-byte aligned (`serves`, the rule both softmax.py and cross_entropy.py call), and,
for 16-bit rows, narrower ones too: forward rows over 16384 columns, backward rows over 4096 (`smem_min_cols`,
with its measurements).
Measured on the H200 (bf16, forward, scripts/gpu/softmax_cluster_probe.py, 2026-12-03) against the chunked
Triton kernel (softmax.py, which reads a wide row twice: statistics, then output), at 4 warps a CTA:
4096 x 262144 1.201 / 1.582 ms (1.32x, 3576 GB/s against a device copy of 4251), 4096 x 151936 0.746 /
0.905 (1.21x), 8192 x 131072 1.173 / 1.528 (1.30x), 8192 x 152064 1.480 / 1.777 (1.20x), 8192 x 128256
1.148 / 1.504 (1.31x), 16384 x 65536 1.117 / 1.457 (1.30x). Those are at 16 CTAs for 151936 / 152064 columns;
smem_config now takes 8 there (SMEM_PART_BYTES): 0.692 against 0.745 ms at 4096 x 151936 in a later run.
softmax_fwd (the register form, below) holds a CTA's whole part in registers (64 a thread, 2 CTAs an SM),
so an SM has two parts' loads in flight and each row costs the latency of its load, exchange and store;
its parts are powers of two, and the time follows the padded width. Same run: 1.06-1.09x the chunked
kernel at 8192 x 131072 and 16384 x 65536, 0.94x at 4096 x 262144 (1.681 ms), 0.55-0.56x at 151936 and
152064. It is not routed. A persistent register form (a cluster looping over rows) was 2.0-2.4x slower
still (110 registers a thread, 1 CTA an SM) and was removed.

Design: a row of n columns is split over CTAS CTAs of one cluster (2, 4, 8 or 16; 16 is past the portable
limit, which Triton's launcher allows), each holding its P = next_pow2(cdiv(n, CTAS)) columns in registers,
so the row is read from HBM once and written once. The kernel sees the row as a [CTAS, P] tensor whose layout
splits dim 0 over the cluster's CTAs (a CGA layout), so each CTA holds one [1, P] part and the compiler knows
the parts differ (a layout it believed replicated had every store predicated to CTA 0: caught in review
before any GPU run). Each CTA reduces its part along dim 1 to (m_i, s_i) = (max, sum of exp(x - m_i)); the
CTAs exchange the pairs through distributed shared memory and every CTA combines them into the row's
(m, s) = (max m_i, sum s_i exp(m_i - m)): one exchange per row. Triton 3.6 does not build that exchange from
its own ops (a reduce across CTAs and a cross-CTA convert_layout both fail to lower:
scripts/cluster_reduce_probe.py), so it is inline PTX on the [CTAS] vector of partials (one element per CTA):
  * START, first thing in the kernel: `barrier.cluster.arrive.relaxed`.
  * EXCHANGE: `barrier.cluster.wait` (every CTA of the cluster has started, so its shared memory may be
    written), thread 0 stores (m_i, s_i) into slot `rank` of every CTA's slot buffer (mapa +
    st.shared::cluster), `barrier.cluster.arrive.release` / `wait.acquire`, then every thread reads the
    CTAS local slots and combines them. After that barrier no CTA touches another's shared memory, so a CTA
    may exit as soon as it is done.
The slot buffer is the kernel's only shared-memory allocation, larger than the compiler's reduction scratch
and kept live to the end (`_keep_alive`), so the allocator puts it at global_smem + 0, where EXCHANGE
addresses it, and the scratch after it (tests/kernels/test_softmax_gluon.py checks the build's LLVM IR).
A part wholly past the row's end (or all -inf) has max -inf: it is exchanged as the lowest finite float, so
no -inf - -inf appears, and a row of real values below -1e30 still normalises.
A persistent form that copied the next row by cp.async was written and removed before any GPU run: its row
buffers, the larger allocation, took offset 0 from the slots.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from hearth.kernels._common import capability, cdiv, next_power_of_2, on_device

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_CTAS = 16  # Triton's launcher sets the non-portable cluster size 16 (8 is the portable limit)
ELEMENTS_PER_THREAD = 32  # register budget for one CTA's part of the row (fp32 values per thread)
MIN_COLS = 32768  # narrower rows fit one program (softmax.py's one-pass kernels read them once already)
MAX_COLS = MAX_CTAS * 16 * 32 * ELEMENTS_PER_THREAD  # 262144: MAX_CTAS CTAs of 16 warps at that register budget
SLOT_FLOATS = 1024  # the slot buffer (4 KiB: (m, s) pairs of up to MAX_CTAS CTAs), larger than the scratch
LOG2E = 1.4426950408889634
LOWEST = ttgl.constexpr(-3.4028234663852886e38)  # the lowest finite fp32: the max of a part that is all -inf

START = "barrier.cluster.arrive.relaxed.aligned;\nmov.u32 $0, %cluster_ctarank;"


def exchange_ptx(ctas: int) -> str:
    """Inline PTX for the (max, sum) exchange among `ctas` CTAs: inputs $2 = m_i, $3 = s_i; outputs $0 = m,
    $1 = s. Slots are pairs of fp32 at global_smem + 8 * rank. The pairs are combined as they are read
    (running max and rescaled sum: four live registers whatever `ctas` is). It opens with the wait that pairs
    with START's arrive (every CTA has started)."""
    log2e = "0f3FB8AA3B"  # log2(e) as a PTX fp32 literal
    lines = ["{", ".reg .u32 la, sa, ra, off, t;", ".reg .pred p;", ".reg .f32 mi, si, mx, acc, nm, d;",
             "barrier.cluster.wait.aligned;",
             "mov.u32 t, %tid.x;", "setp.eq.u32 p, t, 0;", "mov.u32 off, %cluster_ctarank;", "shl.b32 off, off, 3;",
             "mov.u32 la, global_smem;", "add.u32 sa, la, off;"]
    for peer in range(ctas):
        lines += [f"mapa.shared::cluster.u32 ra, sa, {peer};", "@p st.shared::cluster.v2.f32 [ra], {$2, $3};"]
    lines += ["barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;",
              "ld.shared.v2.f32 {mx, acc}, [la];"]
    for i in range(1, ctas):  # (mx, acc) <- (max(mx, mi), acc 2^((mx - nm) log2 e) + si 2^((mi - nm) log2 e))
        lines += [f"ld.shared.v2.f32 {{mi, si}}, [la+{8 * i}];", "max.f32 nm, mx, mi;",
                  "sub.f32 d, mx, nm;", f"mul.f32 d, d, {log2e};", "ex2.approx.ftz.f32 d, d;", "mul.f32 acc, acc, d;",
                  "sub.f32 d, mi, nm;", f"mul.f32 d, d, {log2e};", "ex2.approx.ftz.f32 d, d;",
                  "fma.rn.f32 acc, si, d, acc;", "mov.f32 mx, nm;"]
    lines += ["mov.f32 $0, mx;", "mov.f32 $1, acc;", "}"]
    return "\n".join(lines)


@gluon.jit
def _softmax_fwd_cluster_kernel(
    X, Y, stride_x, stride_y, n_cols,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, SLOTS: ttgl.constexpr, layout: ttgl.constexpr,
    slot_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
):
    """One row per cluster (program_id = the cluster's index), seen as [CTAS, P]: CTA i holds row i of it,
    columns [i * P, i * P + P)."""
    slots = ttgl.allocate_shared_memory(ttgl.float32, [SLOTS], slot_shared)  # at global_smem + 0
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    part = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    cols = part[:, None] * P + ttgl.arange(0, P, layout=ttgl.SliceLayout(0, layout))[None, :]
    mask = cols < n_cols
    x = ttgl.load(X + row * stride_x + cols, mask=mask, other=float("-inf")).to(ttgl.float32)
    mx = ttgl.max(x, 1)  # [CTAS]: this CTA's element is its part's max
    m_part = ttgl.where(mx == float("-inf"), LOWEST, mx)
    s_part = ttgl.sum(ttgl.exp2((x - m_part[:, None]) * 1.4426950408889634), 1)
    m, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f", [m_part, s_part],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
    y = ttgl.exp2((x - m[:, None]) * 1.4426950408889634) * (1.0 / s)[:, None]
    ttgl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    slots._keep_alive()  # live to here: the compiler's scratch may not take its bytes


def config(n_cols: int, ctas: int | None = None) -> tuple[int, int, int]:
    """(CTAS, P, num_warps) for rows of n_cols: the fewest CTAs (2, 4, 8, 16) whose part of the row fits
    ELEMENTS_PER_THREAD values a thread at 16 warps (at 32 the offline sm_90 build spills nothing; at 64, 8
    CTAs for 262144 columns, it spills 48 bytes), or `ctas` when given; P = the part's width (a power of
    two)."""
    if ctas is None:
        ctas = 2
        while ctas < MAX_CTAS and cdiv(n_cols, ctas) > ELEMENTS_PER_THREAD * 32 * 16:
            ctas *= 2
    elif ctas not in (2, 4, 8, 16):
        raise ValueError(f"ctas must be 2, 4, 8 or 16, got {ctas!r}")
    p = next_power_of_2(cdiv(n_cols, ctas))
    warps = max(4, min(16, p // (32 * ELEMENTS_PER_THREAD)))
    return ctas, p, warps


def constexprs(ctas: int, p: int, warps: int, elem_bytes: int) -> dict:
    """The kernel's constexpr arguments: CTAS, P, SLOTS, the row layout ([CTAS, P], dim 0 split over the
    cluster's CTAs, dim 1 over each CTA's threads), the slots' shared layout (replicated: every CTA has its
    own) and the inline PTX. A thread holds 16 bytes of adjacent columns per repeat (elem_bytes: the row's
    element size), so one warp-wide access covers 512 contiguous bytes; the first GPU run gave each thread
    all of its columns in one run (64 bytes apart between lanes): 2.600 ms at 4096 x 262144 bf16, 1.681
    with this layout."""
    bits = ctas.bit_length() - 1
    vec = max(1, min(16 // elem_bytes, p // (32 * warps)))
    return dict(
        CTAS=ctas, P=p, SLOTS=SLOT_FLOATS,
        layout=ttgl.BlockedLayout([1, vec], [1, 32], [1, warps], [1, 0],
                                  [[1 << i, 0] for i in range(bits)]),
        slot_shared=ttgl.SwizzledSharedLayout(1, 1, 1, [0], [[0] for _ in range(bits)]),
        START_ASM=START, EXCHANGE_ASM=exchange_ptx(ctas),
    )


def supported(capability: tuple[int, int] | None, dtype: torch.dtype, n_cols: int, min_cols: int | None = None
              ) -> bool:
    """Hopper, a served dtype, and a row wider than min_cols (default MIN_COLS: wide enough to need more than
    one program) and narrow enough for MAX_CTAS CTAs at ELEMENTS_PER_THREAD values a thread."""
    low = MIN_COLS if min_cols is None else min_cols
    return (capability is not None and capability[0] == 9 and dtype in DTYPES
            and low < n_cols <= MAX_COLS)


def check_rows(t: torch.Tensor, name: str, what: str, width: str, min_cols: int | None = None) -> None:
    """The argument checks of the cluster kernels' wrappers: `t` (called `name`) 2-D with unit column stride,
    and within `supported` (`what` names the kernel, `width` the row width, in the error; min_cols as there)."""
    if t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"{name} must be 2-D with unit column stride, got shape {tuple(t.shape)}, "
                         f"strides {tuple(t.stride())}")
    cap = capability(t.device)
    if not supported(cap, t.dtype, t.shape[1], min_cols):
        low = MIN_COLS if min_cols is None else min_cols
        raise ValueError(f"{name}: {what} serves Hopper, {', '.join(map(str, DTYPES))} and {low} < {width} "
                         f"<= {MAX_COLS} columns; got {t.dtype}, "
                         f"{width} = {t.shape[1]}, capability {cap}")


# The shared-memory forms also take softmax rows narrow enough for softmax.py's one-pass kernels, which read
# them once too, where they measured faster: H200, bf16, 16384 rows (scripts/gpu/softmax_cluster_probe.py
# --min-cols 2048, 2026-12-04), shared-memory form / one-pass kernel at its picked config, ms:
#   forward   32000: 0.520 / 0.595 (1.14x)   32768: 0.529 / 0.600 (1.13x)   16384: 0.281 / 0.275 (0.98x)
#             8192: 0.153 / 0.135 (0.88x)    4096 (32768 rows): 0.179 / 0.140 (0.78x)
#   backward  32000: 0.733 / 0.802 (1.09x)   32768: 0.744 / 0.824 (1.11x)   16384: 0.375 / 0.390 (1.04x)
#             8192: 0.191 / 0.196 (1.03x)    4096 (32768 rows): 0.202 / 0.208 (1.03x)
# A one-pass row at 32768 bf16 columns is one 32-warp program an SM (the register file), which loads, reduces
# and stores one row at a time; the cluster splits the row over 2-4 CTAs that keep several rows' copies in
# flight an SM. So for 16-bit dtypes the forward takes rows over SMEM_FWD_MIN_COLS columns and the backward
# rows over SMEM_BWD_MIN_COLS (4096 itself, at 1.03x, stays on the one-pass kernel: within a run's spread).
# fp32 rows this narrow were not measured: they keep MIN_COLS. Cross-entropy keeps MIN_COLS (not measured).
SMEM_FWD_MIN_COLS = 16384
SMEM_BWD_MIN_COLS = 4096


def smem_min_cols(dtype: torch.dtype, inputs: int = 1) -> int:
    """The width the softmax rows of `dtype` must pass for the shared-memory forms (inputs 1: the forward, 2:
    the backward's y and dy); never above MIN_COLS (the probe lowers that one to explore)."""
    if dtype.itemsize != 2:
        return MIN_COLS
    return min(MIN_COLS, SMEM_FWD_MIN_COLS if inputs == 1 else SMEM_BWD_MIN_COLS)


def softmax_fwd(x: torch.Tensor, *, ctas: int | None = None) -> torch.Tensor:
    """softmax over the last dim of a 2-D CUDA tensor [M, n] with unit column stride (the caller's rows are
    read in place through their stride), n within `supported`; returns a new row-contiguous [M, n].
    ctas: the cluster size (config's pick when None)."""
    check_rows(x, "x", "the cluster softmax", "n")
    m, n = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m == 0:
        return y
    ctas, p, warps = config(n, ctas)
    with on_device(x.device):
        _softmax_fwd_cluster_kernel[(m,)](x, y, x.stride(0), y.stride(0), n,
                                          **constexprs(ctas, p, warps, x.element_size()),
                                          num_warps=warps, num_ctas=ctas)
    return y


# ---------------------------------------------------------------------------------------------------------
# The shared-memory form (routed: softmax() on Hopper, see `serves`). The register form above holds a CTA's
# whole part in registers (64 a thread, 2 CTAs an SM), so an SM has at most two parts' loads in flight and
# each row costs the latency of its load, exchange and store: it measured 0.94x the chunked kernel at
# 4096 x 262144. Here a CTA copies its part into shared memory with cp.async (16 bytes a lane, no registers
# held while in flight) in CHUNK-wide chunks, and works on one chunk at a time in registers, so a CTA needs
# about 32-40 KiB of shared memory and 64-85 registers a thread at 4 warps, and 5-6 CTAs an SM keep their
# loads in flight.
# Chunk 0 is loaded into registers instead and stays there to the end; its bytes at the start of the CTA's
# buffer (the buffer is the kernel's only allocation, so at global_smem + 0) are never written by the
# compiler's code and serve as the exchange's slots (exchange_ptx addresses global_smem + 8 * rank).
CHUNK_BYTES = 4096  # a chunk: 16 bytes a lane, two vectors at 4 warps; also the slot area (>= 8 * MAX_CTAS bytes)
# the part a CTA takes when smem_config may choose (the fewest CTAs whose part fits this). 40 KiB, not 32: at
# rows of 151936-152064 bf16 columns 8 CTAs (38 KiB parts, 10 chunks) against 16 (19 KiB, 5 chunks) took the
# softmax forward at 4096 rows from 0.745 to 0.692 ms and cross-entropy at 16384 x 151936 from 3.072 to 2.872
# ms (4096 x 152064: 0.777 to 0.728; H200, 2026-12-03, softmax_cluster_probe.py, same run). It halves the
# cluster at (131072, 163840] bf16 columns (16 -> 8 CTAs, the measured case) and also at (32768, 40960] and
# (65536, 81920] (4 -> 2, 8 -> 4; no probe has timed those widths). Larger parts were probed and not adopted:
# at 262144 columns 8 CTAs (64 KiB parts) were 2% faster in the forward and equal in cross-entropy, and 64-74 KiB
# parts were 3-4% faster in the forward at 65536 / 131072 columns but 2-13% slower at 151936 and in
# cross-entropy (a later run).
SMEM_PART_BYTES = 40960
SMEM_MAX_PART_BYTES = 98304  # the largest part a CTA may hold (a given ctas too small for the row fails)
# warps a CTA: 4 measured fastest or within 2% of the best form at every probed shape (H200, 2026-12-03,
# softmax 4096 x 262144 / 151936, 8192 x 131072 / 152064 / 128256, 16384 x 65536; cross-entropy 8192 x
# 131072, 16384 x 151936, 4096 x 262144): 8 warps at the same cluster size were 10-27% slower; 8 warps over
# 8 CTAs (64 KiB parts) were 2% faster at 4096 x 262144 and equal at 4096 x 151936
SMEM_WARPS = 4


def smem_config(n_cols: int, elem_bytes: int, ctas: int | None = None, inputs: int = 1) -> tuple[int, int, int]:
    """(CTAS, CHUNK, CHUNKS) for the shared-memory forms: the fewest CTAs (2, 4, 8, 16) whose part of the
    row, times `inputs` (the rows held: 1, or 2 for the backward's y and dy), fits SMEM_PART_BYTES (16 when
    none does), or `ctas` when given; CHUNK = CHUNK_BYTES of columns, CHUNKS a part's chunks (the part need
    not be a power of two: P = CHUNKS * CHUNK)."""
    chunk = CHUNK_BYTES // elem_bytes
    if ctas is None:
        ctas = 2
        while ctas < MAX_CTAS and cdiv(n_cols, ctas) * elem_bytes * inputs > SMEM_PART_BYTES:
            ctas *= 2
    elif ctas not in (2, 4, 8, 16):
        raise ValueError(f"ctas must be 2, 4, 8 or 16, got {ctas!r}")
    chunks = cdiv(cdiv(n_cols, ctas), chunk)
    if chunks * CHUNK_BYTES * inputs > SMEM_MAX_PART_BYTES:
        raise ValueError(f"n_cols: {n_cols} columns over {ctas} CTAs is {chunks * CHUNK_BYTES * inputs} bytes a CTA, "
                         f"over {SMEM_MAX_PART_BYTES}")
    return ctas, chunk, chunks


@functools.lru_cache(maxsize=64)  # built once a shape (the host cost of a call); callers must not mutate it
def smem_constexprs(ctas: int, chunk: int, chunks: int, elem_bytes: int, warps: int) -> dict:
    """The shared-memory kernel's constexprs: the [CTAS, CHUNK] register layout (dim 0 split over the
    cluster's CTAs, 16 bytes of adjacent columns a lane), the [CHUNKS, CTAS, CHUNK] buffer's shared
    layout (unswizzled, dim CTAS split over the CTAs, so each CTA's chunk c starts at c * CHUNK_BYTES) and
    the inline PTX."""
    bits = ctas.bit_length() - 1
    split = [[1 << i, 0] for i in range(bits)]
    vec = 16 // elem_bytes
    if chunk % (vec * 32 * warps):
        raise ValueError(f"warps: a chunk of {chunk} columns is not a whole number of {warps}-warp rows of "
                         f"{vec}-column vectors")
    return dict(
        CTAS=ctas, P=chunk * chunks, CHUNK=chunk, CHUNKS=chunks,
        layout=ttgl.BlockedLayout([1, vec], [1, 32], [1, warps], [1, 0], split),
        buf_shared=ttgl.SwizzledSharedLayout(1, 1, 1, [1, 0], split),
        START_ASM=START, EXCHANGE_ASM=exchange_ptx(ctas),
    )


@gluon.jit
def _smem_row_stats(x0, buf, c0, left, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr, layout: ttgl.constexpr,
                    EXCHANGE_ASM: ttgl.constexpr):
    """The row's (max, sum of exp(x - max)) in every CTA of the cluster, from this CTA's part: chunk 0 in
    registers (x0, fp32), chunks 1.. in `buf` as their cp.async groups land (one group a chunk, issued in
    order). Two sweeps with one cross-warp reduction each (elementwise maxima as the chunks land, then
    elementwise sums of exp against the part's max), then the exchange. c0: the chunk's column offsets
    ([1, CHUNK]); left: [CTAS], the row's columns from this CTA's first one (masks compare the two)."""
    mx = x0
    for c in ttgl.static_range(1, CHUNKS):
        async_copy.wait_group(CHUNKS - 1 - c)  # chunk c has landed (the compiler adds the CTA barrier)
        x = buf.index(c).load(layout).to(ttgl.float32)
        mx = ttgl.maximum(mx, ttgl.where(c0 < (left - c * CHUNK)[:, None], x, float("-inf")))
    m_part = ttgl.maximum(ttgl.max(mx, 1), LOWEST)  # a part all -inf (or past n) is exchanged as LOWEST
    se = ttgl.exp2((x0 - m_part[:, None]) * 1.4426950408889634)
    for c in ttgl.static_range(1, CHUNKS):
        x = buf.index(c).load(layout).to(ttgl.float32)
        e = ttgl.exp2((x - m_part[:, None]) * 1.4426950408889634)
        se += ttgl.where(c0 < (left - c * CHUNK)[:, None], e, 0.0)
    s_part = ttgl.sum(se, 1)
    return ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f", [m_part, s_part],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)


@gluon.jit
def _softmax_fwd_cluster_smem_kernel(
    X, Y, stride_x, stride_y, n_cols,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr,
    layout: ttgl.constexpr, buf_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
):
    """One row per cluster; CTA i holds columns [i * P, i * P + P) as CHUNKS chunks: chunk 0 in registers,
    the others in shared memory (buffer chunk c). Statistics in two sweeps with one cross-warp reduction
    each (elementwise maxima as the chunks land, then elementwise sums of exp against the part's max), the
    exchange, then the output chunk by chunk. Masks compare the chunk's column offsets c0 with the columns
    left to this CTA's chunk (a [CTAS] vector): full column indices per chunk would be held live across the
    sweeps."""
    buf = ttgl.allocate_shared_memory(X.dtype.element_ty, [CHUNKS, CTAS, CHUNK], buf_shared)
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    part = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    c0 = ttgl.arange(0, CHUNK, layout=ttgl.SliceLayout(0, layout))[None, :]
    left = n_cols - part * P  # [CTAS]: the row's columns from this CTA's first one
    cols0 = part[:, None] * P + c0
    # chunk 0's load first: the compiler puts a CTA barrier between the copies' issues
    x0 = ttgl.load(X + row * stride_x + cols0, mask=c0 < left[:, None], other=float("-inf")).to(ttgl.float32)
    for c in ttgl.static_range(1, CHUNKS):
        async_copy.async_copy_global_to_shared(buf.index(c), X + row * stride_x + cols0 + c * CHUNK,
                                               mask=c0 < (left - c * CHUNK)[:, None])
        async_copy.commit_group()
    m, s = _smem_row_stats(x0, buf, c0, left, CHUNK, CHUNKS, layout, EXCHANGE_ASM)
    inv = 1.0 / s
    out = Y + row * stride_y + cols0
    y0 = ttgl.exp2((x0 - m[:, None]) * 1.4426950408889634) * inv[:, None]
    ttgl.store(out, y0.to(Y.dtype.element_ty), mask=c0 < left[:, None])
    for c in ttgl.static_range(1, CHUNKS):
        x = buf.index(c).load(layout).to(ttgl.float32)
        y = ttgl.exp2((x - m[:, None]) * 1.4426950408889634) * inv[:, None]
        ttgl.store(out + c * CHUNK, y.to(Y.dtype.element_ty), mask=c0 < (left - c * CHUNK)[:, None])
    buf._keep_alive()  # live to the end: nothing else may take the slot bytes at global_smem + 0


def smem_aligned(t: torch.Tensor) -> bool:
    """Whether the shared-memory forms can copy `t`'s rows (2-D) 16 bytes at a time: the pointer 16-byte
    aligned, the width and the row stride multiples of 16 elements (what a launch specializes on; without
    it the copies of a 2-byte dtype would be 2 bytes, which cp.async does not have, and the build fails)."""
    return _aligned(t.data_ptr(), t.shape[1], t.stride(0))


def _aligned(pointer: int, width: int, row_stride: int) -> bool:
    """smem_aligned's test on plain numbers (rows_fit uses it too)."""
    return pointer % 16 == 0 and width % 16 == 0 and row_stride % 16 == 0


def _check_aligned(t: torch.Tensor, name: str, what: str, width: str) -> None:
    if t.dim() == 2 and t.stride(1) == 1 and not smem_aligned(t):
        raise ValueError(f"{name}: {what} (shared-memory form) needs 16-byte aligned rows: pointer % 16 == 0, "
                         f"{width} and the row stride multiples of 16 elements; got pointer % 16 = "
                         f"{t.data_ptr() % 16}, {width} = {t.shape[1]}, stride {t.stride(0)}")


def check_smem_rows(t: torch.Tensor, name: str, what: str, width: str, min_cols: int | None = None) -> None:
    """smem_aligned (checked first, before the device is asked: the message is the same on any machine),
    then check_rows."""
    _check_aligned(t, name, what, width)
    check_rows(t, name, what, width, min_cols)


def _out_like(ref: torch.Tensor, out: torch.Tensor | None, name: str) -> torch.Tensor:
    """A new row-contiguous tensor like `ref` when `out` is None; else `out` (called `name`), which must have
    ref's shape, dtype and device and a unit column stride (a ValueError naming it otherwise)."""
    if out is None:
        return torch.empty_like(ref, memory_format=torch.contiguous_format)
    if out.shape != ref.shape or out.dtype != ref.dtype or out.device != ref.device or out.stride(1) != 1:
        raise ValueError(f"{name} must be {ref.dtype} {tuple(ref.shape)} on {ref.device} with unit column stride, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}, strides {tuple(out.stride())}")
    return out


def softmax_fwd_smem(x: torch.Tensor, *, ctas: int | None = None, warps: int = SMEM_WARPS,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax_fwd's contract through the shared-memory form (smem_config picks the cluster size when
    ctas is None), for rows that are smem_aligned; out: a [M, n] tensor of x's dtype and device with unit
    column stride to write into (a new row-contiguous one when None)."""
    check_smem_rows(x, "x", "the cluster softmax", "n", smem_min_cols(x.dtype))
    m, n = x.shape
    ctas, chunk, chunks = smem_config(n, x.element_size(), ctas)
    out = _out_like(x, out, "out")
    if m == 0:
        return out
    with on_device(x.device):
        _softmax_fwd_cluster_smem_kernel[(m,)](
            x, out, x.stride(0), out.stride(0), n, **smem_constexprs(ctas, chunk, chunks, x.element_size(), warps),
            num_warps=warps, num_ctas=ctas)
    return out


@gluon.jit
def _softmax_bwd_cluster_smem_kernel(
    Y, DY, DX, stride_y, stride_dy, stride_dx, n_cols,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr,
    layout: ttgl.constexpr, buf_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
):
    """dx = y * (dy - sum(dy * y)) for one row per cluster: CTA i holds columns [i * P, i * P + P) of y and
    dy as CHUNKS chunks each, chunk 0 of both in registers, chunk c of y in buffer chunk c and of dy in
    buffer chunk CHUNKS - 1 + c (buffer chunk 0's bytes are the exchange's slots, as in the forward). One
    sweep sums y * dy as the chunks land; the CTAs exchange their partial sums (as (max, sum) pairs with
    max 0, which the exchange combines into the plain sum), then dx is written chunk by chunk."""
    buf = ttgl.allocate_shared_memory(Y.dtype.element_ty, [2 * CHUNKS - 1, CTAS, CHUNK], buf_shared)
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    part = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    c0 = ttgl.arange(0, CHUNK, layout=ttgl.SliceLayout(0, layout))[None, :]
    left = n_cols - part * P  # [CTAS]: the row's columns from this CTA's first one
    yb = Y + row * stride_y + part[:, None] * P + c0
    db = DY + row * stride_dy + part[:, None] * P + c0
    y0 = ttgl.load(yb, mask=c0 < left[:, None], other=0.0).to(ttgl.float32)
    d0 = ttgl.load(db, mask=c0 < left[:, None], other=0.0).to(ttgl.float32)
    for c in ttgl.static_range(1, CHUNKS):
        mask = c0 < (left - c * CHUNK)[:, None]
        async_copy.async_copy_global_to_shared(buf.index(c), yb + c * CHUNK, mask=mask)
        async_copy.async_copy_global_to_shared(buf.index(CHUNKS - 1 + c), db + c * CHUNK, mask=mask)
        async_copy.commit_group()
    acc = y0 * d0
    for c in ttgl.static_range(1, CHUNKS):
        async_copy.wait_group(CHUNKS - 1 - c)  # chunk c of both has landed (the compiler adds the barrier)
        y = buf.index(c).load(layout).to(ttgl.float32)
        d = buf.index(CHUNKS - 1 + c).load(layout).to(ttgl.float32)
        acc += ttgl.where(c0 < (left - c * CHUNK)[:, None], y * d, 0.0)
    s_part = ttgl.sum(acc, 1)
    _, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f", [ttgl.zeros_like(s_part), s_part],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
    out = DX + row * stride_dx + part[:, None] * P + c0
    ttgl.store(out, (y0 * (d0 - s[:, None])).to(DX.dtype.element_ty), mask=c0 < left[:, None])
    for c in ttgl.static_range(1, CHUNKS):
        y = buf.index(c).load(layout).to(ttgl.float32)
        d = buf.index(CHUNKS - 1 + c).load(layout).to(ttgl.float32)
        ttgl.store(out + c * CHUNK, (y * (d - s[:, None])).to(DX.dtype.element_ty),
                   mask=c0 < (left - c * CHUNK)[:, None])
    buf._keep_alive()  # live to the end: nothing else may take the slot bytes at global_smem + 0


def softmax_bwd_smem(y: torch.Tensor, dy: torch.Tensor, *, ctas: int | None = None, warps: int = SMEM_WARPS,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax backward dx = y * (dy - sum(dy * y, -1)) over [M, n] rows through the shared-memory form:
    y and dy of one dtype and shape, each smem_aligned, within `supported`; out as in softmax_fwd_smem (a new
    row-contiguous tensor when None)."""
    for t, name in ((y, "y"), (dy, "dy")):
        _check_aligned(t, name, "the cluster softmax backward", "n")
    low = smem_min_cols(y.dtype, inputs=2)
    check_rows(y, "y", "the cluster softmax backward", "n", low)
    check_rows(dy, "dy", "the cluster softmax backward", "n", low)
    if dy.shape != y.shape or dy.dtype != y.dtype or dy.device != y.device:
        raise ValueError(f"dy must be {y.dtype} {tuple(y.shape)} on {y.device}, got {dy.dtype} {tuple(dy.shape)} "
                         f"on {dy.device}")
    m, n = y.shape
    ctas, chunk, chunks = smem_config(n, y.element_size(), ctas, inputs=2)
    out = _out_like(y, out, "out")
    if m == 0:
        return out
    with on_device(y.device):
        _softmax_bwd_cluster_smem_kernel[(m,)](
            y, dy, out, y.stride(0), dy.stride(0), out.stride(0), n,
            **smem_constexprs(ctas, chunk, chunks, y.element_size(), warps), num_warps=warps, num_ctas=ctas)
    return out


# ---------------------------------------------------------------------------------------------------------
# Routing: softmax() and cross_entropy() (hence linear_cross_entropy's row kernel) send a row here when
# `serves` says so, and keep their Triton kernels otherwise: the one rule, in one place.
ROUTE = True  # False: the Triton kernels everywhere (the benchmarks' A/B switch; tests)


def rows_fit(dtype: torch.dtype, shape: tuple, strides: tuple, pointer: int, inputs: int = 1,
             min_cols: int | None = None) -> bool:
    """The shape side of the routing rule, a pure function: 2-D rows with unit column stride, a served dtype,
    min_cols (default MIN_COLS; softmax passes smem_min_cols) < width <= the register form's limit (the widths
    measured), 16-byte aligned rows (smem_aligned's test on these numbers), and `inputs` such rows (2: the
    backward's y and dy) fitting SMEM_MAX_PART_BYTES a CTA over MAX_CTAS CTAs (fp32 at 262144 columns does
    not, in the backward)."""
    low = MIN_COLS if min_cols is None else min_cols
    if not (len(shape) == 2 and strides[1] == 1 and dtype in DTYPES
            and low < shape[1] <= MAX_COLS):
        return False
    chunk = CHUNK_BYTES // dtype.itemsize
    return (cdiv(cdiv(shape[1], MAX_CTAS), chunk) * CHUNK_BYTES * inputs <= SMEM_MAX_PART_BYTES
            and _aligned(pointer, shape[1], strides[0]))


def serves(t: torch.Tensor, inputs: int = 1, min_cols: int | None = None) -> bool:
    """Whether the shared-memory cluster form takes the rows of `t`: ROUTE on, an NVIDIA Hopper GPU (not ROCm,
    whose gfx9 parts also report major 9), and rows_fit (min_cols as there)."""
    return (ROUTE and t.is_cuda and torch.version.hip is None
            and rows_fit(t.dtype, tuple(t.shape), tuple(t.stride()), t.data_ptr(), inputs, min_cols)
            and capability(t.device)[0] == 9)
