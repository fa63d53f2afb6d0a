"""Wide-row softmax forward for Hopper (sm_90) in Gluon: one row held on chip by a thread-block cluster.

Not routed: softmax() does not call it. It is here to be checked and timed on the H200 against the chunked
Triton kernel (softmax.py), which reads a wide row twice (statistics, then output; the re-read from HBM where
it misses L2): 4096 x 262144 bf16 ran at about 2700 GB/s there against a 3800 goal.

Design: a row of n columns is split over CTAS CTAs of one cluster (2, 4, 8 or 16; 16 is past the portable
limit, which Triton's launcher allows), each holding its P = next_pow2(cdiv(n, CTAS)) columns in registers,
so the row is read from HBM once and written once. Each CTA reduces its part to (m_i, s_i) = (max, sum of
exp(x - m_i)); the CTAs exchange the pairs through distributed shared memory and every CTA combines them
into the row's (m, s) = (max m_i, sum s_i exp(m_i - m)): one exchange per row. Triton 3.6 does not build
that exchange from its own ops (a reduce across CTAs and a cross-CTA convert_layout both fail to lower:
scripts/cluster_reduce_probe.py), so it is inline PTX:
  * START, first thing in the kernel: `barrier.cluster.arrive.relaxed` and this CTA's %cluster_ctarank.
  * EXCHANGE: `barrier.cluster.wait` (every CTA of the cluster has started, so its shared memory may be
    written), thread 0 stores (m_i, s_i) into slot `rank` of every CTA's slot buffer (mapa +
    st.shared::cluster), `barrier.cluster.arrive.release` / `wait.acquire`, then every thread reads the
    CTAS local slots and combines them. After that barrier no CTA touches another's shared memory, so a CTA
    may exit as soon as it is done.
The pipelined kernel (pipelined=True) is persistent: G clusters walk the rows c, c + G, ..., and each CTA
copies its part of the next row into one of two shared-memory buffers (cp.async) while it reduces,
exchanges and writes the current one. Its exchanges alternate between two slot regions (rows by parity), so
one cluster barrier a row is enough (exchange_ptx(parity=True)).
The slot buffer is the kernel's first shared-memory allocation and is kept live to the end (a load whose
value goes to a store masked off by the runtime argument `never` = 0), so the compiler puts it at
global_smem + 0, where EXCHANGE addresses it, and its own reduction scratch after it
(tests/kernels/test_softmax_gluon.py checks the build). The compiler sees the row's layout as replicated over
the CTAs; each CTA picks its columns by its rank.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from hearth.kernels._common import cdiv, next_power_of_2, num_sms

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_CTAS = 16  # Triton's launcher sets the non-portable cluster size 16 (8 is the portable limit)
ELEMENTS_PER_THREAD = 32  # register budget for one CTA's part of the row (fp32 values per thread)
MIN_COLS = 32768  # narrower rows fit one program (softmax.py's one-pass kernels read them once already)
SLOT_FLOATS = 256  # the slot buffer: (m, s) pairs of up to MAX_CTAS CTAs, padded (8 warps' threads)
LOG2E = 1.4426950408889634
# the pipelined kernel's register cap: ptxas left to itself gives it 64 a thread (2 CTAs an SM) and spills 8
# bytes at 262144 bf16 columns; 96 spills nothing (offline sm_90 build)
PIPELINED_MAXNREG = 96

START = "barrier.cluster.arrive.relaxed.aligned;\nmov.u32 $0, %cluster_ctarank;"
# the persistent kernel's: a whole cluster barrier at the start, so its per-row exchanges need no first wait
START_SYNC = "barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\nmov.u32 $0, %cluster_ctarank;"


def exchange_ptx(ctas: int, *, parity: bool = False) -> str:
    """Inline PTX for the (max, sum) exchange among `ctas` CTAs: inputs $2 = m_i, $3 = s_i; outputs $0 = m,
    $1 = s. Slots are pairs of fp32 at global_smem + 8 * rank. The pairs are combined as they are read
    (running max and rescaled sum: four live registers whatever `ctas` is).

    parity=False (one row per cluster): it opens with the wait that pairs with START's arrive (every CTA has
    started). parity=True (the persistent kernel, after START_SYNC): input $4 picks one of two slot regions
    (rows alternate), so a CTA that runs ahead to the next row cannot overwrite slots a slower CTA has not read:
    that CTA reads them before it arrives at the next row's barrier, which the fast one must pass first."""
    log2e = "0f3FB8AA3B"  # log2(e) as a PTX fp32 literal
    lines = ["{", ".reg .u32 la, sa, ra, off, t;", ".reg .pred p;", ".reg .f32 mi, si, mx, acc, nm, d;"]
    if not parity:
        lines.append("barrier.cluster.wait.aligned;")  # pairs with START's arrive: every CTA has started
    lines += ["mov.u32 t, %tid.x;", "setp.eq.u32 p, t, 0;", "mov.u32 off, %cluster_ctarank;", "shl.b32 off, off, 3;",
              "mov.u32 la, global_smem;"]
    if parity:
        lines += [f"mul.lo.u32 sa, $4, {8 * ctas};", "add.u32 la, la, sa;"]
    lines.append("add.u32 sa, la, off;")
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


@gluon.jit(do_not_specialize=["never"])  # a plain runtime 0: the keep-alive store's mask must not fold away
def _softmax_fwd_cluster_kernel(
    X, Y, stride_x, stride_y, n_cols, never,
    P: ttgl.constexpr, SLOTS: ttgl.constexpr, layout: ttgl.constexpr, slot_layout: ttgl.constexpr,
    slot_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
):
    """One row per cluster (program_id = the cluster's index); this CTA holds columns [rank * P, rank * P + P)."""
    slots = ttgl.allocate_shared_memory(ttgl.float32, [SLOTS], slot_shared)  # first: at global_smem + 0
    rank = ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    cols = rank * P + ttgl.arange(0, P, layout=layout)
    mask = cols < n_cols
    # x stays in its storage dtype (half the registers of fp32 for bf16); each use converts it
    x = ttgl.load(X + row * stride_x + cols, mask=mask, other=float("-inf"))
    # a part wholly past the row's end has max -inf: -1e30 keeps x - m finite there (exp2 of -inf is 0)
    m_part = ttgl.maximum(ttgl.max(x.to(ttgl.float32), 0), -1.0e30)
    s_part = ttgl.sum(ttgl.exp2((x.to(ttgl.float32) - m_part) * 1.4426950408889634), 0)
    m, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f", [m_part, s_part],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
    y = ttgl.exp2((x.to(ttgl.float32) - m) * 1.4426950408889634) / s
    ttgl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    keep = slots.load(slot_layout)  # the slots stay live to here, so the compiler's scratch goes after them
    idx = ttgl.arange(0, SLOTS, layout=slot_layout)
    ttgl.store(Y + row * stride_y + idx, keep.to(Y.dtype.element_ty), mask=idx < never)


@gluon.jit(do_not_specialize=["never"])
def _softmax_fwd_cluster_pipelined_kernel(
    X, Y, stride_x, stride_y, n_rows, n_cols, never,
    P: ttgl.constexpr, SLOTS: ttgl.constexpr, layout: ttgl.constexpr, slot_layout: ttgl.constexpr,
    slot_shared: ttgl.constexpr, row_shared: ttgl.constexpr, START_ASM: ttgl.constexpr,
    EXCHANGE_ASM: ttgl.constexpr,
):
    """Persistent: cluster c takes rows c, c + G, ... (G clusters). This CTA's part of the next row is copied
    into shared memory (cp.async, two buffers) while the current row is reduced, exchanged and written. Each
    thread reads back exactly the elements it copied (one layout for both), so its own wait_group orders them."""
    slots = ttgl.allocate_shared_memory(ttgl.float32, [SLOTS], slot_shared)  # first: at global_smem + 0
    bufs = ttgl.allocate_shared_memory(X.dtype.element_ty, [2, P], row_shared)
    rank = ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    cols = rank * P + ttgl.arange(0, P, layout=layout)
    mask = cols < n_cols
    first = ttgl.program_id(0)
    step = ttgl.num_programs(0)
    async_copy.async_copy_global_to_shared(bufs.index(0), X + first.to(ttgl.int64) * stride_x + cols,
                                           mask=mask & (first < n_rows))
    async_copy.commit_group()
    i = 0
    for row in range(first, n_rows, step):
        nxt = row + step
        async_copy.async_copy_global_to_shared(bufs.index((i + 1) % 2), X + nxt.to(ttgl.int64) * stride_x + cols,
                                               mask=mask & (nxt < n_rows))
        async_copy.commit_group()
        async_copy.wait_group(1)  # this row's copy (the older group) has landed
        x = ttgl.where(mask, bufs.index(i % 2).load(layout).to(ttgl.float32), float("-inf"))
        m_part = ttgl.maximum(ttgl.max(x, 0), -1.0e30)
        s_part = ttgl.sum(ttgl.exp2((x - m_part) * 1.4426950408889634), 0)
        m, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f,r", [m_part, s_part, i % 2],
                                           dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
        y = ttgl.exp2((x - m) * 1.4426950408889634) / s
        ttgl.store(Y + row.to(ttgl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
        i += 1
    async_copy.wait_group(0)
    keep = slots.load(slot_layout)  # the slots stay live to here, so the compiler's scratch goes after them
    idx = ttgl.arange(0, SLOTS, layout=slot_layout)
    ttgl.store(Y + first.to(ttgl.int64) * stride_y + idx, keep.to(Y.dtype.element_ty), mask=idx < never)


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


def constexprs(ctas: int, p: int, warps: int, pipelined: bool) -> dict:
    """The kernel's constexpr arguments: P, SLOTS, the layouts (the row part, the slots in registers and in
    shared memory, and for the pipelined kernel its two row buffers; all replicated over the `ctas` CTAs as
    far as the compiler knows) and the inline PTX."""
    rep = [[0] for _ in range(ctas.bit_length() - 1)]
    out = dict(
        P=p, SLOTS=SLOT_FLOATS,
        layout=ttgl.BlockedLayout([max(1, p // (32 * warps))], [32], [warps], [0], rep),
        slot_layout=ttgl.BlockedLayout([max(1, SLOT_FLOATS // (32 * warps))], [32], [warps], [0], rep),
        slot_shared=ttgl.SwizzledSharedLayout(1, 1, 1, [0], rep),
        START_ASM=START_SYNC if pipelined else START, EXCHANGE_ASM=exchange_ptx(ctas, parity=pipelined),
    )
    if pipelined:
        out["row_shared"] = ttgl.SwizzledSharedLayout(1, 1, 1, [0], rep)  # one buffer's layout (of [2, P])
    return out


def supported(capability: tuple[int, int] | None, dtype: torch.dtype, n_cols: int) -> bool:
    """Hopper, a served dtype, and a row wide enough to need more than one program and narrow enough for
    MAX_CTAS CTAs at ELEMENTS_PER_THREAD values a thread."""
    return (capability is not None and capability[0] == 9 and dtype in DTYPES
            and MIN_COLS < n_cols <= MAX_CTAS * 16 * 32 * ELEMENTS_PER_THREAD)


def cp_async_ok(x: torch.Tensor) -> bool:
    """The pipelined kernel's row copies (cp.async) move 16-byte pieces: x's start, row stride and row length
    must be multiples of 16 bytes (Triton then knows each thread's run of columns is aligned)."""
    b = x.element_size()
    return x.data_ptr() % 16 == 0 and (x.stride(0) * b) % 16 == 0 and (x.shape[1] * b) % 16 == 0


def softmax_fwd(x: torch.Tensor, *, ctas: int | None = None, pipelined: bool = False,
                clusters: int | None = None, maxnreg: int | None = PIPELINED_MAXNREG) -> torch.Tensor:
    """softmax over the last dim of a 2-D CUDA tensor [M, n] with unit column stride (the caller's rows are
    read in place through their stride), n within `supported`; returns a new row-contiguous [M, n].
    ctas: the cluster size (config's pick when None). pipelined: the persistent kernel, `clusters` of them
    (default min(M, SMs // ctas)), each copying its next row while it works on the current one, built with
    `maxnreg` registers a thread at most (None: ptxas's choice); rows that `cp_async_ok` refuses take the
    one-row-per-cluster kernel."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D with unit column stride, got shape {tuple(x.shape)}, "
                         f"strides {tuple(x.stride())}")
    cap = torch.cuda.get_device_capability(x.device) if x.is_cuda else None
    if not supported(cap, x.dtype, x.shape[1]):
        raise ValueError(f"x: the cluster softmax serves Hopper, {', '.join(map(str, DTYPES))} and "
                         f"{MIN_COLS} < n <= {MAX_CTAS * 16 * 32 * ELEMENTS_PER_THREAD} columns; got {x.dtype}, "
                         f"n = {x.shape[1]}, capability {cap}")
    if clusters is not None and (isinstance(clusters, bool) or not isinstance(clusters, int) or clusters < 1):
        raise ValueError(f"clusters must be a positive int, got {clusters!r}")
    m, n = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m == 0:
        return y
    ctas, p, warps = config(n, ctas)
    pipelined = pipelined and cp_async_ok(x)
    const = constexprs(ctas, p, warps, pipelined)
    with torch.cuda.device(x.device):
        if pipelined:
            grid = min(m, clusters or max(1, num_sms(x.device) // ctas))
            _softmax_fwd_cluster_pipelined_kernel[(grid,)](
                x, y, x.stride(0), y.stride(0), m, n, 0, **const, num_warps=warps, num_ctas=ctas,
                **({"maxnreg": maxnreg} if maxnreg else {}))
        else:
            _softmax_fwd_cluster_kernel[(m,)](x, y, x.stride(0), y.stride(0), n, 0, **const, num_warps=warps,
                                              num_ctas=ctas)
    return y
