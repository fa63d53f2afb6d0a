"""Flash attention forward for Hopper (sm_90) written in Gluon (``triton.experimental.gluon``, Triton 3.6).

Same contract as ``attention._attention_forward``: q [B, Hq, Tq, D], k/v [B, Hk, Tk, D] (any strides with
a contiguous last dim and 16-byte aligned outer strides), GQA when Hk < Hq (query head h reads KV head
h // (Hq // Hk)), causal (top-left aligned, Tq == Tk) or not, any T (ragged tails masked). Writes O
[B, Hq, Tq, D] in the input dtype and lse [B, Hq, Tq] fp32 in natural-log units -- the same convention
as the Triton forward, so the existing backward kernels consume it unchanged.

Design (one program per BLOCK_M query rows of one (b, h); one partition, software-pipelined):
  * Q, K and V tiles move by TMA (device-side tensor descriptors over the (b, h) [T, D] plane, so any
    [B, H, T, D] strides work; TMA zero-fills rows past T and clips the O store at T).
  * K and V stream through a NUM_STAGES-deep shared-memory ring; each slot has one mbarrier for its K
    tile and one for its V tile (expect-tx + TMA arrive), waited on with the slot's phase bit. The
    loads of key block j + NUM_STAGES are issued as soon as block j's PV product is done, so TMA
    runs ahead of the tensor cores by NUM_STAGES - 1 blocks.
  * S = Q K^T by warpgroup_mma with both operands in shared memory (K viewed transposed); the online
    softmax runs in the wgmma accumulator layout in registers (exp2 with log2(e) folded into the
    scale); P is cast to the input dtype and fed to the second warpgroup_mma (P V) as a register A
    operand, V from shared memory. The QK^T wgmma of block j + 1 is issued asynchronously before
    block j's softmax so the tensor cores work while the softmax runs (FlashAttention-3's
    intra-warpgroup overlap).
  * Causal: key blocks wholly below the diagonal run mask-free; only the diagonal blocks (and a ragged
    tail) apply the mask -- the same split as the Triton kernel.
  * O goes registers -> shared memory (Q's buffer, free by then) -> TMA store; lse by a masked store, or
    not at all when no backward will run (the STORE_LSE constexpr; Lse is then None).

Warp specialisation (env HEARTH_ATTN_GLUON_WS=1, the WARP_SPECIALIZE constexpr): Triton 3.6's Gluon
``ttgl.warp_specialize`` does compile for sm_90. The variant runs the same consumer code in the kernel's
NUM_WARPS warps (the default partition) and a producer partition of one warp that builds the K/V descriptors and
issues all K/V loads, waiting on a per-slot "empty" mbarrier the consumers arrive on (one arrive after a
partition-wide bar.sync) once a slot's PV product is done. Triton pads the producer to a warpgroup (384 threads for 8
consumer warps) and emits setmaxnreg: 240 registers for the consumers, 24 for the producer (the PTX shows it;
cuobjdump's REG figure is the launch allocation, 168).

Ping-pong (env HEARTH_ATTN_GLUON_PP=1, the PING_PONG flag; replaces the two variants above when set):
FlashAttention-3's inter-warpgroup schedule. A program owns two query tiles of BLOCK_M rows (PP_CONFIGS),
each taken whole by its own consumer warpgroup -- warpgroup 0 is the default partition (4 warps),
warpgroup 1 a 4-warp worker -- and one producer warp streams the K/V blocks both tiles read through one
ring. Each consumer loads its own Q, runs its own key blocks and causal mask (the two tiles sit at
different diagonal positions, so they may visit different numbers of blocks) and stores its own O and
lse. Per key block a consumer takes a turn: it waits on its turn mbarrier, issues QK^T(j) and PV(j - 1)
asynchronously, arrives on the other warpgroup's turn mbarrier, then runs block j's softmax while the
tensor cores run the other warpgroup's pair (Gluon 3.6 has no named-barrier op: mbarriers with count 1
stand in for FlashAttention-3's bar.sync / bar.arrive pair). Waits for a turn the other warpgroup never
takes are skipped, so unequal block counts cannot hang. A slot has one "released" mbarrier per consumer;
the producer refills it when every consumer that reads its block has released it. setmaxnreg gives
each consumer warpgroup CONSUMER_REGS registers and the producer PRODUCER_REGS (384 threads a program).
A persistent form (_attn_fwd_gluon_pps_kernel) runs one program per SM over all the tiles. A form with three
consumer warpgroups (FlashAttention-3's at small head dims) was built and timed on the H200; it was slower
than the Triton forward at head_dim 64 (BENCHMARKS.md) and was removed.

On the H200 (BENCHMARKS.md) the single-partition and warp-specialised variants are correct but slower
than the Triton forward: attention() uses them only under HEARTH_ATTN_GLUON=1. The ping-pong variant is
faster than the Triton forward at head_dim 128 (causal B4 H32 T4096: 496 against 431 TFLOP/s in one run,
non-causal 559 against 476), so attention.forward_kernel makes it the default there (GLUON_PP_DEFAULT); at
D64 it is slower (348 against 377) and D64 stays Triton. Its four TMA descriptors are built on the host,
4-D over [B, H, T, D] with a [1, 1, rows, D] box (the two other variants build theirs on the device, in a
global scratch buffer of 128 B per descriptor and program).

Backward: a dK/dV kernel and a dQ kernel (opt-in, each by its env var; within 3% of the Triton kernels on the
H200), and a fused 5-matmul kernel (_attn_bwd_fused_gluon_kernel): two consumer warpgroups of 64 keys and a TMA
producer warp that also stages each step's lse / delta, dS^T through shared memory, dQ^T = K^T dS^T added in fp32
to a [heads, D, T] buffer by TMA reduce-adds and cast into dq by dq_from_acc. At head_dim 128 it runs
FlashAttention-3's 64-query steps with dQ^T split over both warpgroups. On the H200 it ran 14-24% faster than the
Triton backward at the issue's four cases (BENCHMARKS.md), so attention.backward_kernel routes Hopper's bf16 / fp16
head_dim 64 / 128 backward to it (HEARTH_ATTN_GLUON_BWD_FUSED=0: the Triton kernels); its transient fp32 buffer is
bounded to FB_ACC_MIB, and under grouped-query attention to half its whole size (FB_ACC_GQA_SPLIT), except at
short causal sequences (up to FB_GQA_GROUP_MAX_KB key blocks, where the grouped grid order runs): there the whole
buffer up to FB_ACC_SHORT_MIB, one launch.

Not served here (``supported`` says no, and attention.py keeps the Triton kernel): fp32, head dims
other than 64 / 128, GPUs other than compute capability 9.x, tensors TMA cannot address.
"""

from __future__ import annotations

import functools
import itertools
import os

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from triton._C.libtriton import ir as _ir
from triton.experimental.gluon.language._core import builtin as _builtin

from hearth.kernels._common import (  # noqa: F401 (tma_addressable: this module's serving check, as attention calls it)
    cdiv, empty_heads_like, num_sms, on_device, packed_planes, tma_addressable, tma_scratch,
)

LOG2E = 1.4426950408889634
LN2 = ttgl.constexpr(0.6931471805599453)
LOG2E_C = ttgl.constexpr(LOG2E)
HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)

# (BLOCK_M, BLOCK_N, num_warps, NUM_STAGES) per head dim. num_warps 8 = two warpgroups sharing one
# 128-row tile (64 rows each); 4 = one warpgroup on a 64-row tile. Chosen so that ptxas reports no
# spills for sm_90 (tests/kernels/test_attention_gluon.py checks it); timed on the H200 (BENCHMARKS.md), where this
# single-partition kernel is slower than the Triton forward and the ping-pong one below.
CONFIGS = {
    64: (128, 128, 8, 2),
    128: (128, 128, 8, 2),
}
# What scripts/gpu/attention_gluon_probe.py --sweep times (the first of each is CONFIGS'). All compile for
# sm_90 without spills, either variant, causal bf16 (the most registers): d128 128x128 s3 uses 224 KiB of
# the 227 KiB of shared memory. 4 warps / 64 rows: smaller tiles, so two programs can share an SM and
# one's softmax overlaps the other's wgmma (what FlashAttention-3's ping-pong schedules explicitly).
CANDIDATES = {
    128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 4, 2), (64, 64, 4, 3)],
    64: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 3), (64, 128, 4, 2), (64, 64, 4, 3)],
}
# Producer/consumer variant (env HEARTH_ATTN_GLUON_WS=1): one TMA warp with few registers feeds the ring.
WARP_SPECIALIZE = os.environ.get("HEARTH_ATTN_GLUON_WS", "0") == "1"
PRODUCER_WARPS = 1
PRODUCER_REGS = 24
# Ping-pong variant (env HEARTH_ATTN_GLUON_PP=1, read here only; it replaces the variants above when set):
# (BLOCK_M rows per consumer warpgroup, BLOCK_N, NUM_STAGES) per head dim; a program owns 2 * BLOCK_M rows.
# A warpgroup holds S, the P of the previous block (its PV is still in flight) and O at once: 64-row tiles
# fit CONSUMER_REGS (2 x 128 x 128 spills at D 64; D 64 takes 128 rows only with 64-key blocks).
# All of PP_CANDIDATES compile for sm_90 without spills; the first of each is PP_CONFIGS'.
PING_PONG = os.environ.get("HEARTH_ATTN_GLUON_PP", "0") == "1"
PP_CONFIGS = {
    64: (64, 128, 3),
    128: (64, 128, 3),  # the probe's sweep on the H200 (2026-12-02): 519 TFLOP/s against 476 at 2 stages
}
PP_CANDIDATES = {
    128: [(64, 128, 3), (64, 128, 2), (64, 64, 3)],
    64: [(64, 128, 3), (64, 128, 2), (64, 128, 4), (128, 64, 3)],
}
PP_WARPS = 4  # the default partition: consumer warpgroup 0
# The persistent form of the two-consumer ping-pong forward: one program per SM walks the (query block,
# batch * head) tiles, heaviest first under the causal mask, so a tile's epilogue and the next tile's first loads
# overlap instead of paying a program launch, barrier set-up and cold loads per tile (the ping-pong forward is
# furthest behind cuDNN at short sequences). attention.forward_kernel picks it by query length; PERSISTENT
# (env HEARTH_ATTN_GLUON_PERSIST=1) is what a direct call of forward() with persistent=None runs.
PERSISTENT = os.environ.get("HEARTH_ATTN_GLUON_PERSIST", "0") == "1"
# The persistent forward walks its tiles in sections of query heads whose keys and values fit this many bytes,
# so the programs running at once read the K/V of a few heads, as the per-tile grid's (query blocks fastest)
# do, and L2 serves the re-reads. With batch * head fastest over all heads (its first order) 132 programs read
# 132 heads' K/V: at B4 H32 T4096 D128 that is 264 MiB against the H200's 50 MB L2, and the H200 measured it
# 0.87x (causal) and 0.82x (non-causal) the per-tile kernel, where GQA 40/8 (a fifth the K/V) measured 1.03x.
# In this order it measured 1.01x causal and 0.96x non-causal at that shape (attention.PERSIST_MAX_T says where
# it runs).
PPS_KV_BYTES = 32 * 2**20


def pps_section(bh: int, group: int, tk: int, head_dim: int, elt: int, budget: int = PPS_KV_BYTES) -> int:
    """Rows of batch * head per section of the persistent forward's tile order: whole GQA groups (so a section
    holds whole K/V heads) of the most K/V heads that fit `budget` bytes (K and V, tk x head_dim each) and
    divide the bh // group K/V heads evenly (every section full: the kernel keeps no last-section case, which
    cost registers), at least one."""
    kv_total = bh // group
    fit = max(1, budget // (2 * tk * head_dim * elt))
    return group * max(d for d in range(1, min(fit, kv_total) + 1) if kv_total % d == 0)


def pps_tile_order(bh: int, n_m: int, section: int, causal: bool) -> list[tuple[int, int]]:
    """(start_m, bh) of every persistent tile in tile_id order: the host's spelling of _pps_tile (the tests
    check that it visits every tile once, longest first within a section). section divides bh."""
    if bh % section:
        raise ValueError(f"section must divide bh, got section={section} bh={bh}")
    out = []
    for tile_id in range(bh * n_m):
        q = tile_id // section
        sec = q // n_m
        start_m = q - sec * n_m
        out.append((n_m - 1 - start_m if causal else start_m, tile_id - q * section + sec * section))
    return out


# Which program runs which persistent tile. Round robin (tile_id = program, program + grid, ...) leaves the
# programs unequal under the causal mask: tiles cost 1 to n_m key blocks, and where a program's share is a few
# tiles the one that drew the heavy ones sets the kernel's end (at B4 H32 T2048 D128 causal, 2048 tiles on 132
# SMs, the busiest program's blocks are 1.14x the mean). The schedule walks the same tile order and gives each
# tile to the program whose tiles so far cost least (a tile costs its turns plus PPS_TILE_COST for its Q load
# and epilogue; ties to the lowest program), what a work queue would do at run time without its atomics: the
# busiest then holds 1.01x the mean. Env HEARTH_ATTN_PPS_BALANCE=0 (a probe's A/B) keeps round robin,
# HEARTH_ATTN_PPS_TILE_COST overrides the cost.
PPS_TILE_COST = 1.0
# A Q prefetch a tile ahead (issued once a tile's last QK^T had read q_smem, O then stored through pointers) measured
# 6-12% slower on the H200 at six cases (BENCHMARKS.md) and was removed: Q is loaded at the start of each tile.


def pps_tile_turns(start_m: int, tq: int, tk: int, causal: bool, block_m: int, block_n: int) -> int:
    """The host's spelling of _pps_tile_turns: key blocks the persistent tile start_m streams (the larger count of
    its two query tiles; 0 for a tile wholly past the queries' end)."""
    def blocks(tile):
        lo = tile * block_m
        if lo >= tq:
            return 0
        return cdiv(min(lo + block_m, tk) if causal else tk, block_n)
    return max(blocks(2 * start_m), blocks(2 * start_m + 1))


def pps_schedule(bh: int, n_m: int, section: int, causal: bool, programs: int, tq: int, tk: int, block_m: int,
                 block_n: int, balance: bool = True, tile_cost: float = PPS_TILE_COST) -> list[list[int]]:
    """The tile ids each of `programs` programs runs, in that order (ascending: the tile order of pps_tile_order, so
    the programs running at once stay within a section). balance: each tile, in tile order, to the least-loaded
    program (turns + tile_cost a tile; ties to the lowest program); else round robin."""
    total = bh * n_m
    if programs < 1 or programs > total:
        raise ValueError(f"programs must be in [1, {total}] (the tiles), got {programs}")
    if not balance:
        return [list(range(p, total, programs)) for p in range(programs)]
    return _least_loaded(((tile_id, pps_tile_turns(start_m, tq, tk, causal, block_m, block_n))
                          for tile_id, (start_m, _) in enumerate(pps_tile_order(bh, n_m, section, causal))),
                         programs, tile_cost)


def _least_loaded(items, programs: int, tile_cost: float) -> list[list[int]]:
    """The persistent schedules' placement: each (tile, turns) of `items`, in order, to the program whose tiles so far
    cost least (a tile costs its turns + tile_cost; ties to the lowest program) -> each program's tiles in run
    order. pps_schedule's and varlen_pps_schedule's."""
    import heapq

    per = [[] for _ in range(programs)]
    heap = [(0.0, p) for p in range(programs)]
    for tile, turns in items:
        load, p = heapq.heappop(heap)
        per[p].append(tile)
        heapq.heappush(heap, (load + turns + tile_cost, p))
    return per


def _schedule_table(per: list[list[int]], device: torch.device) -> torch.Tensor:
    """A schedule as the persistent kernel reads it: int32 [1 + most tiles a program runs, programs], row n program
    p's n-th tile, -1 past its tiles (every column ends in one)."""
    rows = 1 + max(len(tiles) for tiles in per)
    # column p: program p's tiles, then -1; built as rows of columns and transposed
    table = torch.tensor([tiles + [-1] * (rows - len(tiles)) for tiles in per], dtype=torch.int32)
    return table.t().contiguous().to(device)


def _pps_tile_cost(env=None) -> float:
    """PPS_TILE_COST, or HEARTH_ATTN_PPS_TILE_COST where set (a probe's override)."""
    return float((os.environ if env is None else env).get("HEARTH_ATTN_PPS_TILE_COST", PPS_TILE_COST))


@functools.lru_cache(maxsize=256)
def _pps_schedule_tensor(bh: int, n_m: int, section: int, causal: bool, programs: int, tq: int, tk: int, block_m: int,
                         block_n: int, balance: bool, tile_cost: float, device: torch.device) -> torch.Tensor:
    """pps_schedule as the kernel reads it (_schedule_table: tile ids). Built and copied once per shape."""
    return _schedule_table(pps_schedule(bh, n_m, section, causal, programs, tq, tk, block_m, block_n, balance,
                                        tile_cost), device)


def varlen_pps_schedule(lens_q, lens_k, h_q: int, causal: bool, programs: int, block_m: int, block_n: int,
                        tile_cost: float = PPS_TILE_COST) -> tuple[list[list[int]], int]:
    """The persistent forward's schedule over packed sequences (lens_q / lens_k: each sequence's query / key count,
    host ints): (each program's tile codes in run order, N_M). A tile is query block start_m (2 * block_m rows)
    of sequence s and query head h, code (s * N_M + start_m) * h_q + h with N_M = cdiv(max(lens_q), 2 * block_m);
    only the blocks that start inside their sequence are listed (a sequence without keys still lists its query
    blocks: the kernel stores their zeros). Longest-processing-time first: tiles by cost (the key blocks they stream
    plus tile_cost, as pps_schedule counts) from the heaviest, each to the program whose tiles so far cost least
    (ties to the lowest program; equal costs keep sequence, block, head order). programs: at most this many
    (fewer when there are fewer tiles); ValueError when a code would not fit int32."""
    if len(lens_q) != len(lens_k):
        raise ValueError(f"lens_q and lens_k must have one length per sequence, got {len(lens_q)} and {len(lens_k)}")
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    rows = 2 * block_m
    n_m = max(1, cdiv(max(lens_q, default=0), rows))
    if len(lens_q) * n_m * h_q >= 2**31:
        raise ValueError(f"{len(lens_q)} sequences x {n_m} query blocks x {h_q} heads do not fit int32 tile codes")
    blocks = []  # (turns, first code) per (sequence, query block); its h_q heads follow
    for s, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        for m in range(cdiv(nq, rows)):
            blocks.append((pps_tile_turns(m, nq, nk, causal, block_m, block_n), (s * n_m + m) * h_q))
    blocks.sort(key=lambda b: -b[0])  # stable: equal costs keep their order
    tiles = ((first + h, turns) for turns, first in blocks for h in range(h_q))
    return _least_loaded(tiles, min(programs, len(blocks) * h_q), tile_cost), n_m


@functools.lru_cache(maxsize=64)
def _varlen_pps_schedule_tensor(lens_q: tuple, lens_k: tuple, h_q: int, causal: bool, programs: int, block_m: int,
                                block_n: int, tile_cost: float, device: torch.device):
    """varlen_pps_schedule as the kernel reads it, (int32 [1 + most tiles a program runs, programs] with -1 past
    each program's tiles, N_M, programs), or None where there is no tile (no query in the pack). Built once per
    pack (the layers of one packed forward share it)."""
    per, n_m = varlen_pps_schedule(lens_q, lens_k, h_q, causal, programs, block_m, block_n, tile_cost)
    if not per:
        return None
    return _schedule_table(per, device), n_m, len(per)


CONSUMER_REGS = 240


@gluon.constexpr_function
def _wgmma_layouts(num_warps, score_cols, head_dim):
    """(score, accumulator, A operand) register layouts shared by every kernel here: wgmma accumulators with
    the warps stacked along the rows (16 rows a warp), a [rows, score_cols] score tile, a [rows, head_dim]
    output / gradient tile, and the 16-bit A operand (P or dS from registers) of its product with a
    [score_cols, head_dim] tile."""
    score = ttgl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, score_cols, 16])
    acc = ttgl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, head_dim, 16])
    return score, acc, ttgl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j, n_blocks,
              BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, TILE_BYTES: ttgl.constexpr):
    """Start the TMA loads of key block j into ring slot j % NUM_STAGES (no-op when j >= n_blocks)."""
    slot = j % NUM_STAGES
    pred = j < n_blocks
    kb = k_bars.index(slot)
    vb = v_bars.index(slot)
    mbarrier.expect(kb, TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [j * BLOCK_N, 0], kb, k_smem.index(slot), pred=pred)
    mbarrier.expect(vb, TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [j * BLOCK_N, 0], vb, v_smem.index(slot), pred=pred)


@gluon.jit
def _softmax_pv(s, acc, l_i, m_i, v_tile, offs_m, j, qk_scale, N_CTX_K,
                BLOCK_N: ttgl.constexpr, MASKED: ttgl.constexpr, CAUSAL: ttgl.constexpr,
                s_layout: ttgl.constexpr, o_layout: ttgl.constexpr, p_layout: ttgl.constexpr):
    """Fold one key block's scores s (fp32, unscaled, accumulator layout) into (acc, l_i, m_i)."""
    if MASKED:
        offs_n = j * BLOCK_N + ttgl.arange(0, BLOCK_N, layout=ttgl.SliceLayout(0, s_layout))
        if CAUSAL:
            keep = offs_m[:, None] >= offs_n[None, :]
        else:
            keep = (offs_n < N_CTX_K)[None, :]
        s = ttgl.where(keep, s, float("-inf"))
    # Every row has an unmasked key in its first block, so m_new is finite (see attention.py).
    m_new = ttgl.maximum(m_i, ttgl.max(s, 1) * qk_scale)
    p = ttgl.exp2(s * qk_scale - m_new[:, None])
    alpha = ttgl.exp2(m_i - m_new)
    l_i = l_i * alpha + ttgl.sum(p, 1)
    acc = acc * ttgl.convert_layout(alpha, ttgl.SliceLayout(1, o_layout))[:, None]
    p16 = ttgl.convert_layout(p.to(v_tile.dtype), p_layout)
    acc = warpgroup_mma(p16, v_tile, acc)
    return acc, l_i, m_new


@gluon.jit
def _consume(q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc, v_desc, acc, l_i, m_i, offs_m,
             j_lo, j_hi, n_blocks, qk_scale, N_CTX_K,
             BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
             TILE_BYTES: ttgl.constexpr, MASKED: ttgl.constexpr, CAUSAL: ttgl.constexpr,
             ISSUE_LOADS: ttgl.constexpr, SYNC_WARPS: ttgl.constexpr,
             s_layout: ttgl.constexpr, o_layout: ttgl.constexpr, p_layout: ttgl.constexpr):
    """Key blocks [j_lo, j_hi) of the ring. The QK^T of block j + 1 is issued (async) before block j's
    softmax. ISSUE_LOADS: this partition also refills the ring (single-partition variant); otherwise a
    producer partition does (_producer), and the slot's release is signalled on empty_bars."""
    zero_s = ttgl.zeros([BLOCK_M, BLOCK_N], ttgl.float32, s_layout)
    if j_lo < j_hi:
        slot = j_lo % NUM_STAGES
        mbarrier.wait(k_bars.index(slot), (j_lo // NUM_STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        for j in range(j_lo, j_hi):
            slot = j % NUM_STAGES
            s = warpgroup_mma_wait(0, deps=[s_tok])
            nxt = j + 1
            if nxt < j_hi:
                nslot = nxt % NUM_STAGES
                mbarrier.wait(k_bars.index(nslot), (nxt // NUM_STAGES) & 1)
                s_tok = warpgroup_mma(q_smem, k_smem.index(nslot).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
            mbarrier.wait(v_bars.index(slot), (j // NUM_STAGES) & 1)
            acc, l_i, m_i = _softmax_pv(s, acc, l_i, m_i, v_smem.index(slot), offs_m, j, qk_scale, N_CTX_K,
                                        BLOCK_N, MASKED, CAUSAL, s_layout, o_layout, p_layout)
            # Slot `slot` is free once every warp's PV wgmma on it is done (synchronous wgmma above);
            # the next QK^T (block j + 1) reads another slot (NUM_STAGES >= 2).
            if SYNC_WARPS:
                ttgl.thread_barrier()
            if ISSUE_LOADS:
                _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j + NUM_STAGES, n_blocks,
                          BLOCK_N, NUM_STAGES, TILE_BYTES)
            else:
                mbarrier.arrive(empty_bars.index(slot), count=1)
    return acc, l_i, m_i


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, q_bar, k_desc, v_desc, start_m,
              n_free, n_blocks, qk_scale, N_CTX_K,
              HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
              NUM_STAGES: ttgl.constexpr, TILE_BYTES: ttgl.constexpr, ISSUE_LOADS: ttgl.constexpr,
              SYNC_WARPS: ttgl.constexpr, s_layout: ttgl.constexpr, o_layout: ttgl.constexpr,
              p_layout: ttgl.constexpr):
    """The math warps: wait for Q, then the unmasked key blocks [0, n_free) and the masked ones
    [n_free, n_blocks). Returns (acc, l_i, m_i) for the epilogue."""
    offs_m = start_m * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
    m_i = ttgl.full([BLOCK_M], float("-inf"), ttgl.float32, ttgl.SliceLayout(1, s_layout))
    l_i = ttgl.zeros([BLOCK_M], ttgl.float32, ttgl.SliceLayout(1, s_layout))
    acc = ttgl.zeros([BLOCK_M, HEAD_DIM], ttgl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    acc, l_i, m_i = _consume(q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc, v_desc, acc, l_i, m_i,
                             offs_m, 0, n_free, n_blocks, qk_scale, N_CTX_K, BLOCK_M, BLOCK_N, NUM_STAGES,
                             TILE_BYTES, False, CAUSAL, ISSUE_LOADS, SYNC_WARPS, s_layout, o_layout, p_layout)
    acc, l_i, m_i = _consume(q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc, v_desc, acc, l_i, m_i,
                             offs_m, n_free, n_blocks, n_blocks, qk_scale, N_CTX_K, BLOCK_M, BLOCK_N, NUM_STAGES,
                             TILE_BYTES, True, CAUSAL, ISSUE_LOADS, SYNC_WARPS, s_layout, o_layout, p_layout)
    return acc, l_i, m_i


@gluon.jit
def _producer(k_base, v_base, stride_kt, stride_vt, N_CTX_K, k_smem, v_smem, k_bars, v_bars, empty_bars, n_blocks,
              HEAD_DIM: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
              TILE_BYTES: ttgl.constexpr):
    """The load warp (warp-specialised variant): key block j goes into slot j % NUM_STAGES once the
    consumers released that slot's previous block (j - NUM_STAGES) on empty_bars. It builds the K/V
    descriptors itself, so the warp that issues the TMA loads is the one that wrote (and fenced) them."""
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], k_base.dtype.element_ty)
    k_desc = tma.make_tensor_descriptor(k_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_kt, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=kv_shared)
    v_desc = tma.make_tensor_descriptor(v_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_vt, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM], layout=kv_shared)
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        mbarrier.wait(empty_bars.index(slot), ((j // NUM_STAGES) & 1) ^ 1, pred=j >= NUM_STAGES)
        _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j, n_blocks, BLOCK_N, NUM_STAGES, TILE_BYTES)


@gluon.jit
def _program_ids(H_Q, GROUP, CAUSAL: ttgl.constexpr):
    """(start_m, bh, b, h, hk): this program's query-block index (causal launches the last query blocks, which
    have the most keys, first), its row of the (b, h) grid, and the K/V head its query head reads (GROUP
    query heads share one)."""
    if CAUSAL:
        start_m = ttgl.num_programs(0) - 1 - ttgl.program_id(0)
    else:
        start_m = ttgl.program_id(0)
    bh = ttgl.program_id(1)
    b = bh // H_Q
    h = bh % H_Q
    return start_m, bh, b, h, h // GROUP


@gluon.jit
def _program_bases(Q, K, V, Out, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
                   stride_ob, stride_oh, H_Q, GROUP, CAUSAL: ttgl.constexpr):
    """This program's query-block index and (b, h) row, and the base pointers of its Q / K / V / O heads
    (GROUP query heads share one K/V head). Both forward kernels start here; causal launches the last query
    blocks, which have the most keys, first."""
    start_m, bh, b, h, hk = _program_ids(H_Q, GROUP, CAUSAL)
    q_base = Q + b.to(ttgl.int64) * stride_qb + h.to(ttgl.int64) * stride_qh
    k_base = K + b.to(ttgl.int64) * stride_kb + hk.to(ttgl.int64) * stride_kh
    v_base = V + b.to(ttgl.int64) * stride_vb + hk.to(ttgl.int64) * stride_vh
    o_base = Out + b.to(ttgl.int64) * stride_ob + h.to(ttgl.int64) * stride_oh
    return start_m, bh, q_base, k_base, v_base, o_base


@gluon.jit
def _attn_fwd_gluon_kernel(
    Q, K, V, Out, Lse,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt,
    stride_ob, stride_oh, stride_ot,
    qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr,
    BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, NUM_WARPS: ttgl.constexpr,
    WARP_SPECIALIZE: ttgl.constexpr, PRODUCER_WARPS: ttgl.constexpr, PRODUCER_REGS: ttgl.constexpr,
    STORE_LSE: ttgl.constexpr = True,
):
    dtype: ttgl.constexpr = Q.dtype.element_ty
    TILE_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    Q_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    s_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[0]
    o_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[1]
    p_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[2]
    q_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    start_m, bh, q_base, k_base, v_base, o_base = _program_bases(
        Q, K, V, Out, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
        H_Q, GROUP, CAUSAL)
    q_desc = tma.make_tensor_descriptor(q_base, shape=[N_CTX_Q, HEAD_DIM], strides=[stride_qt, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM], layout=q_shared)
    o_desc = tma.make_tensor_descriptor(o_base, shape=[N_CTX_Q, HEAD_DIM], strides=[stride_ot, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM], layout=q_shared)

    q_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_shared)
    k_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    q_bar = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=1)
    fence_async_shared()

    # Key blocks this query block visits: causal stops at the diagonal block's end.
    if CAUSAL:
        diag_lo = start_m * BLOCK_M
        kv_hi = ttgl.minimum(diag_lo + BLOCK_M, N_CTX_K)
        n_free = diag_lo // BLOCK_N  # blocks wholly below the diagonal: no mask
    else:
        kv_hi = N_CTX_K
        n_free = N_CTX_K // BLOCK_N  # full blocks: no mask; a ragged tail block is masked
    n_blocks = ttgl.cdiv(kv_hi, BLOCK_N)

    mbarrier.expect(q_bar, Q_BYTES)
    tma.async_copy_global_to_shared(q_desc, [start_m * BLOCK_M, 0], q_bar, q_smem)
    SYNC: ttgl.constexpr = True  # a bar.sync before a slot is refilled / released (see _consume)
    if WARP_SPECIALIZE:
        acc, l_i, m_i = ttgl.warp_specialize(
            # (the consumers never touch K/V descriptors: k_base / v_base fill those unused parameters)
            [(_consumer, (q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, q_bar, k_base, v_base, start_m,
                          n_free, n_blocks, qk_scale, N_CTX_K, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES,
                          TILE_BYTES, False, SYNC, s_layout, o_layout, p_layout)),
             (_producer, (k_base, v_base, stride_kt, stride_vt, N_CTX_K, k_smem, v_smem, k_bars, v_bars,
                          empty_bars, n_blocks, HEAD_DIM, BLOCK_N, NUM_STAGES, TILE_BYTES))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
    else:
        k_desc = tma.make_tensor_descriptor(k_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_kt, 1],
                                            block_shape=[BLOCK_N, HEAD_DIM], layout=kv_shared)
        v_desc = tma.make_tensor_descriptor(v_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_vt, 1],
                                            block_shape=[BLOCK_N, HEAD_DIM], layout=kv_shared)
        for i in ttgl.static_range(NUM_STAGES):
            _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, n_blocks, BLOCK_N, NUM_STAGES, TILE_BYTES)
        acc, l_i, m_i = _consumer(q_smem, k_smem, v_smem, k_bars, v_bars, empty_bars, q_bar, k_desc, v_desc,
                                  start_m, n_free, n_blocks, qk_scale, N_CTX_K, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N,
                                  NUM_STAGES, TILE_BYTES, True, SYNC, s_layout, o_layout, p_layout)
    offs_m = start_m * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))

    mbarrier.invalidate(q_bar)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
        mbarrier.invalidate(empty_bars.index(i))

    if STORE_LSE:  # lse in natural-log units, as attention.py's forward writes it (Lse is None otherwise)
        lse = (m_i + ttgl.log2(l_i)) * LN2
        ttgl.store(Lse + bh.to(ttgl.int64) * N_CTX_Q + offs_m, lse, mask=offs_m < N_CTX_Q)
    o = acc / ttgl.convert_layout(l_i, ttgl.SliceLayout(1, o_layout))[:, None]
    q_smem.store(o.to(dtype))  # Q's tile is no longer read: reuse it to stage O for the TMA store
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [start_m * BLOCK_M, 0], q_smem)
    tma.store_wait(0)


# ----------------------------------------------------------------------------------------------
# Ping-pong variant (env HEARTH_ATTN_GLUON_PP=1): two consumer warpgroups on two query tiles
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _pp_tile_blocks(tile, N_CTX_Q, N_CTX_K,
                    CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr):
    """(n_free, n_blocks) of query tile `tile`: key blocks [0, n_free) need no mask, [n_free, n_blocks)
    do. A tile wholly past the queries' end (the CTA's second tile at a ragged T) visits none."""
    lo = tile * BLOCK_M
    if CAUSAL:
        kv_hi = ttgl.minimum(lo + BLOCK_M, N_CTX_K)
        n_free = lo // BLOCK_N
    else:
        kv_hi = N_CTX_K
        n_free = N_CTX_K // BLOCK_N
    n_blocks = ttgl.where(lo < N_CTX_Q, ttgl.cdiv(kv_hi, BLOCK_N), 0)
    return ttgl.minimum(n_free, n_blocks), n_blocks


@gluon.jit
def _pp_scores(s, j, n_free, offs_m, qk_scale, N_CTX_K,
               BLOCK_N: ttgl.constexpr, CAUSAL: ttgl.constexpr, s_layout: ttgl.constexpr):
    """Block j's scores, scaled into log2 units, with the causal / ragged-tail mask where j needs one
    (a runtime branch: the unmasked blocks skip the index arithmetic). Causal takes T_q == T_k (attention and
    attention_varlen refuse anything else), so a stored row i < T_q sees keys j <= i < T_k only: the causal
    mask alone bounds the keys (rows past T_q, which may meet keys past T_k, are not stored). The bound's
    per-column predicates, kept across the persistent forward's tile loop, cost it 4 bytes of stack."""
    if j >= n_free:
        offs_n = j * BLOCK_N + ttgl.arange(0, BLOCK_N, layout=ttgl.SliceLayout(0, s_layout))
        if CAUSAL:
            keep = offs_m[:, None] >= offs_n[None, :]
        else:
            keep = (offs_n < N_CTX_K)[None, :]
        s = ttgl.where(keep, s, float("-inf"))
    return s * qk_scale


@gluon.jit
def _pp_first_block(s_tok, n_free, offs_m, qk_scale, N_CTX_K, dtype: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
                    CAUSAL: ttgl.constexpr, s_layout: ttgl.constexpr, p_layout: ttgl.constexpr):
    """Key block 0 of a ping-pong consumer's tile, once its QK^T (s_tok) was issued: (m_i, l_i, p16). Block 0
    holds key 0, which no row masks, so m_i is finite from here on."""
    s = warpgroup_mma_wait(0, deps=[s_tok])
    s = _pp_scores(s, 0, n_free, offs_m, qk_scale, N_CTX_K, BLOCK_N, CAUSAL, s_layout)
    m_i = ttgl.max(s, 1)
    p = ttgl.exp2(s - m_i[:, None])
    return m_i, ttgl.sum(p, 1), ttgl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _pp_next_block(s_tok, o_tok, p16, m_i, l_i, j, n_free, offs_m, qk_scale, N_CTX_K, empty_bar,
                   dtype: ttgl.constexpr, BLOCK_N: ttgl.constexpr, CAUSAL: ttgl.constexpr, s_layout: ttgl.constexpr,
                   o_layout: ttgl.constexpr, p_layout: ttgl.constexpr):
    """Key block j >= 1 of a ping-pong consumer's tile, once QK^T(j) (s_tok) and PV(j - 1) (o_tok) were issued
    and the turn handed over: the online softmax update; the previous block's slot is released on empty_bar
    once every warp's PV(j - 1) is done. Returns (acc, p16, m_i, l_i)."""
    # wgmma groups retire in issue order: one outstanding = QK^T(j) done, PV(j - 1) maybe not.
    s = warpgroup_mma_wait(1, deps=[s_tok])
    s = _pp_scores(s, j, n_free, offs_m, qk_scale, N_CTX_K, BLOCK_N, CAUSAL, s_layout)
    m_new = ttgl.maximum(m_i, ttgl.max(s, 1))
    p = ttgl.exp2(s - m_new[:, None])
    alpha = ttgl.exp2(m_i - m_new)
    l_i = l_i * alpha + ttgl.sum(p, 1)
    acc, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
    ttgl.thread_barrier()  # every warp's PV(j - 1) is done: this warpgroup is through with its slot
    mbarrier.arrive(empty_bar, count=1)
    acc = acc * ttgl.convert_layout(alpha, ttgl.SliceLayout(1, o_layout))[:, None]
    return acc, ttgl.convert_layout(p.to(dtype), p_layout), m_new, l_i


@gluon.jit
def _pp_last_pv(p16, acc, v_smem, v_bars, empty_bar, r, NUM_STAGES: ttgl.constexpr):
    """The tile's last PV (its ring position r), outside the turns, then its slot released on empty_bar."""
    mbarrier.wait(v_bars.index(r % NUM_STAGES), (r // NUM_STAGES) & 1)
    acc = warpgroup_mma(p16, v_smem.index(r % NUM_STAGES), acc)
    ttgl.thread_barrier()
    mbarrier.arrive(empty_bar, count=1)
    return acc


@gluon.jit
def _pp_epilogue(acc, m_i, l_i, lse_base, offs_m, N_CTX_Q, q_smem, q_box, o_desc, b, h, row,
                 dtype: ttgl.constexpr, STORE_LSE: ttgl.constexpr, o_layout: ttgl.constexpr,
                 q0=0, o_rows=None, stride_ot=0, VARLEN: ttgl.constexpr = False):
    """A ping-pong consumer's tile epilogue: lse (natural-log units, as attention.py's forward writes it) at
    lse_base + offs_m when STORE_LSE, O normalised and staged in q_smem (the tile's Q is no longer read), then
    TMA-stored at [b, h, row, 0] and waited for (q_smem may take the next Q). VARLEN: `row` is the packed row of
    the tile's first query, q0 the sequence's first and N_CTX_Q its length; a tile that runs past the sequence's
    end is stored through pointers instead (o_rows: O at [the sequence's first row, this head], stride_ot its
    token stride), rows past the end masked: the box would write over the next sequence's rows."""
    if STORE_LSE:
        lse = (m_i + ttgl.log2(l_i)) * LN2
        ttgl.store(lse_base + offs_m, lse, mask=offs_m < N_CTX_Q)
    o = acc / ttgl.convert_layout(l_i, ttgl.SliceLayout(1, o_layout))[:, None]
    BLOCK_M: ttgl.constexpr = o.shape[0]
    if VARLEN:
        if row - q0 + BLOCK_M > N_CTX_Q:  # row - q0: the tile's first query within its sequence
            _store_rows(o.to(dtype), o_rows, row - q0, N_CTX_Q, stride_ot, o_layout)
        else:
            _store_o_box(o.to(dtype), q_smem, q_box, o_desc, b, h, row)
    else:
        _store_o_box(o.to(dtype), q_smem, q_box, o_desc, b, h, row)


@gluon.jit
def _store_o_box(o, q_smem, q_box, o_desc, b, h, row):
    """O (16-bit, registers) staged in q_smem and TMA-stored as the box at [b, h, row, 0], waited for (q_smem may
    take the next Q)."""
    q_smem.store(o)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row, 0], q_box)
    tma.store_wait(0)


@gluon.jit
def _store_rows(o, o_rows, first, n_rows, stride_t, layout: ttgl.constexpr):
    """o ([ROWS, D] in `layout`) stored through pointers at o_rows + (first + r) * stride_t for the rows
    first + r < n_rows (a packed sequence's tile that runs past its end, or the zeros of queries without keys)."""
    ROWS: ttgl.constexpr = o.shape[0]
    D: ttgl.constexpr = o.shape[1]
    offs_r = first + ttgl.arange(0, ROWS, layout=ttgl.SliceLayout(1, layout))
    offs_d = ttgl.arange(0, D, layout=ttgl.SliceLayout(0, layout))
    ptrs = o_rows + offs_r[:, None].to(ttgl.int64) * stride_t + offs_d[None, :]
    ttgl.store(ptrs, o, mask=(offs_r < n_rows)[:, None])


@gluon.jit
def _pp_consumer(q_desc, o_desc, lse_base, q_smem, q_bar, k_smem, v_smem, k_bars, v_bars,
                 empty_bars, turn_bars, b, h, start_m, qk_scale, N_CTX_Q, N_CTX_K,
                 WG: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr,
                 BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, STORE_LSE: ttgl.constexpr,
                 s_layout: ttgl.constexpr, o_layout: ttgl.constexpr, p_layout: ttgl.constexpr,
                 q0=0, o_rows=None, stride_ot=0, VARLEN: ttgl.constexpr = False):
    """One consumer warpgroup: query tile 2 * start_m + WG of head (b, h), all of it (Q load, key
    blocks, epilogue). q_desc / o_desc: host-built 4-D TMA descriptors over [B, Hq, T, D] with a
    [1, 1, BLOCK_M, D] box, so a tile past T is zero-filled on load and clipped on store within its own head.
    VARLEN (packed sequences, B = 1): N_CTX_Q / N_CTX_K are the sequence's lengths and q0 its first packed row;
    positions (masks, lse) are the sequence's own, the Q box starts at q0 + the tile's first query (the rows
    past the sequence's end it also reads belong to the next one: their outputs are never stored); a tile whose
    sequence has no keys stores zeros and lse -inf (_pp_epilogue's o_rows / stride_ot).

    Per key block j it takes one turn: wait for its turn (turn_bars[WG]), issue QK^T(j) and PV(j - 1)
    asynchronously, hand the turn over (arrive on the other warpgroup's turn barrier), then run block j's
    softmax while the tensor cores work on the other warpgroup's GEMMs (FlashAttention-3's ping-pong): turn t
    of WG1 waits for WG0's turn t, turn t >= 1 of WG0 for WG1's turn t - 1; a wait whose partner turn does not
    exist (the tiles visit different numbers of blocks under the causal mask) is skipped, so neither can hang
    on the other. The last PV is issued outside the turns."""
    dtype: ttgl.constexpr = q_desc.dtype
    Q_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    tile = 2 * start_m + WG
    n_free, n_blocks = _pp_tile_blocks(tile, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)
    my_turn = turn_bars.index(WG)
    n_other = _pp_tile_blocks(2 * start_m + 1 - WG, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)[1]
    their_turn = turn_bars.index(1 - WG)
    if n_blocks > 0:
        q_box = q_smem._reinterpret(dtype, [1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)  # the same bytes, as the box
        mbarrier.expect(q_bar, Q_BYTES)
        tma.async_copy_global_to_shared(q_desc, [b, h, q0 + tile * BLOCK_M, 0], q_bar, q_box)
        offs_m = tile * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
        zero_s = ttgl.zeros([BLOCK_M, BLOCK_N], ttgl.float32, s_layout)
        acc = ttgl.zeros([BLOCK_M, HEAD_DIM], ttgl.float32, o_layout)
        mbarrier.wait(q_bar, 0)

        # turn 0: QK^T(0) alone (no P yet)
        if WG == 1:
            mbarrier.wait(my_turn, 0, pred=n_other > 0)
        mbarrier.wait(k_bars.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.arrive(their_turn, count=1)
        m_i, l_i, p16 = _pp_first_block(s_tok, n_free, offs_m, qk_scale, N_CTX_K, dtype, BLOCK_N, CAUSAL, s_layout,
                                        p_layout)

        for j in range(1, n_blocks):
            slot = j % NUM_STAGES
            prev = (j - 1) % NUM_STAGES
            if WG == 0:
                mbarrier.wait(my_turn, (j - 1) & 1, pred=j - 1 < n_other)
            else:
                mbarrier.wait(my_turn, j & 1, pred=j < n_other)
            mbarrier.wait(k_bars.index(slot), (j // NUM_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // NUM_STAGES) & 1)
            o_tok = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
            mbarrier.arrive(their_turn, count=1)
            acc, p16, m_i, l_i = _pp_next_block(s_tok, o_tok, p16, m_i, l_i, j, n_free, offs_m, qk_scale, N_CTX_K,
                                                empty_bars.index(WG * NUM_STAGES + prev), dtype, BLOCK_N, CAUSAL,
                                                s_layout, o_layout, p_layout)

        last = n_blocks - 1
        acc = _pp_last_pv(p16, acc, v_smem, v_bars, empty_bars.index(WG * NUM_STAGES + last % NUM_STAGES), last,
                          NUM_STAGES)
        _pp_epilogue(acc, m_i, l_i, lse_base, offs_m, N_CTX_Q, q_smem, q_box, o_desc, b, h, q0 + tile * BLOCK_M,
                     dtype, STORE_LSE, o_layout, q0, o_rows, stride_ot, VARLEN)
    if VARLEN:
        if (n_blocks == 0) & (tile * BLOCK_M < N_CTX_Q):  # queries of a sequence without keys: out 0, lse -inf
            if STORE_LSE:
                offs_z = tile * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
                ttgl.store(lse_base + offs_z, ttgl.full([BLOCK_M], float("-inf"), ttgl.float32,
                                                        ttgl.SliceLayout(1, s_layout)), mask=offs_z < N_CTX_Q)
            _store_rows(ttgl.zeros([BLOCK_M, HEAD_DIM], q_desc.dtype, o_layout), o_rows, tile * BLOCK_M, N_CTX_Q,
                        stride_ot, o_layout)


@gluon.jit
def _issue_kv_box(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, b, hk, j, pred,
                  BLOCK_N: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
                  TILE_BYTES: ttgl.constexpr):
    """Start the TMA loads of key block j of K/V head (b, hk) into ring slot j % NUM_STAGES through host-built
    4-D descriptors (a [1, 1, BLOCK_N, D] box; rows past T are zero-filled), when pred."""
    _load_kv_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, b, hk, j, j % NUM_STAGES, pred, BLOCK_N, HEAD_DIM,
                   TILE_BYTES)


@gluon.jit
def _load_kv_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, b, hk, j, slot, pred,
                   BLOCK_N: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, TILE_BYTES: ttgl.constexpr, k0=0):
    """_issue_kv_box's loads into a given ring slot (the persistent producer's ring position is not the block's
    index), the box at row k0 + j * BLOCK_N (k0: a packed sequence's first key row)."""
    kb = k_bars.index(slot)
    vb = v_bars.index(slot)
    box: ttgl.constexpr = [1, 1, BLOCK_N, HEAD_DIM]
    mbarrier.expect(kb, TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [b, hk, k0 + j * BLOCK_N, 0], kb,
                                    k_smem.index(slot)._reinterpret(k_desc.dtype, box, k_desc.layout), pred=pred)
    mbarrier.expect(vb, TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [b, hk, k0 + j * BLOCK_N, 0], vb,
                                    v_smem.index(slot)._reinterpret(v_desc.dtype, box, v_desc.layout), pred=pred)


@gluon.jit
def _pp_producer(k_desc, v_desc, N_CTX_Q, N_CTX_K, k_smem, v_smem, k_bars, v_bars, empty_bars, b, hk,
                 start_m, HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr,
                 BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, TILE_BYTES: ttgl.constexpr, k0=0):
    """The load warp of the ping-pong variant: key block j goes into slot j % NUM_STAGES once every
    consumer that read the slot's previous block (j - NUM_STAGES) released it; a warpgroup whose tile
    stops short of that block never arrives for it, so its barrier is not waited on. k_desc / v_desc:
    host-built 4-D descriptors over [B, Hk, T, D] with a [1, 1, BLOCK_N, D] box; key block j's box starts at row
    k0 + j * BLOCK_N (k0: a packed sequence's first key row, else 0)."""
    n0 = _pp_tile_blocks(2 * start_m, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)[1]
    n1 = _pp_tile_blocks(2 * start_m + 1, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)[1]
    n_blocks = ttgl.maximum(n0, n1)
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        phase = ((j // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(empty_bars.index(slot), phase, pred=(j >= NUM_STAGES) & (j - NUM_STAGES < n0))
        mbarrier.wait(empty_bars.index(NUM_STAGES + slot), phase, pred=(j >= NUM_STAGES) & (j - NUM_STAGES < n1))
        _load_kv_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, b, hk, j, slot, True, BLOCK_N, HEAD_DIM,
                       TILE_BYTES, k0)


@gluon.jit
def _pps_tile_id(Sched, n, N_PROG):
    """This program's n-th tile id in the persistent schedule (_pps_schedule_tensor: row n of [rows, grid], -1 past
    the program's tiles): addressed from the argument and the program's ids, so the tile loop keeps only n and
    the tile id live, as the round-robin loop did (a per-program start, end and pointer in registers added spills
    at head_dim 128 causal). N_PROG: the grid, passed as an argument: read as num_programs(0), the compiler
    loaded it once at the kernel's start and kept it on the stack across the partitions' register changes."""
    return ttgl.load(Sched + n * N_PROG + ttgl.program_id(0))


@gluon.jit
def _pps_tile(tile_id, N_M, H_Q, GROUP, SECTION, CAUSAL: ttgl.constexpr):
    """(start_m, bh, b, h, hk) of persistent tile tile_id, in the order pps_tile_order spells out on the host:
    sections of SECTION (batch * head) rows one after another (SECTION divides batch * heads); within one,
    heads fastest and query blocks from the last (the most keys under the causal mask: longest first) to the
    first."""
    q = tile_id // SECTION  # = sec * N_M + start_m
    sec = q // N_M
    start_m = q - sec * N_M
    bh = tile_id - q * SECTION + sec * SECTION
    if CAUSAL:
        start_m = N_M - 1 - start_m
    b = bh // H_Q
    h = bh % H_Q
    return start_m, bh, b, h, h // GROUP


@gluon.jit
def _pps_tile_varlen(code, N_M, H_Q, CuSeqQ, CuSeqK):
    """(start_m, h, q0, k0, n_q, n_k) of a packed-rows persistent tile: code = (s * N_M + start_m) * H_Q + h
    (varlen_pps_schedule's), sequence s's first query / key row and its lengths from the offsets."""
    h = code % H_Q
    rest = code // H_Q
    start_m = rest % N_M
    s = rest // N_M
    q0 = ttgl.load(CuSeqQ + s)
    k0 = ttgl.load(CuSeqK + s)
    return start_m, h, q0, k0, ttgl.load(CuSeqQ + s + 1) - q0, ttgl.load(CuSeqK + s + 1) - k0


@gluon.jit
def _pps_tile_turns(start_m, N_CTX_Q, N_CTX_K, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr,
                    BLOCK_N: ttgl.constexpr):
    """Turns (= ring positions) of persistent tile start_m: the larger key-block count of its two query tiles
    (the producer streams that many blocks; both consumers take that many turns)."""
    return ttgl.maximum(_pp_tile_blocks(2 * start_m, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)[1],
                        _pp_tile_blocks(2 * start_m + 1, N_CTX_Q, N_CTX_K, CAUSAL, BLOCK_M, BLOCK_N)[1])


@gluon.jit
def _pps_wait_turn(my_turn, r, WG: ttgl.constexpr):
    """Wait for turn r (both warpgroups take one turn per ring position, so the position is the turn count):
    WG1's turn r waits for WG0's turn r, WG0's turn r >= 1 for WG1's turn r - 1."""
    if WG == 1:
        mbarrier.wait(my_turn, r & 1)
    else:
        mbarrier.wait(my_turn, (r - 1) & 1, pred=r > 0)


@gluon.jit
def _pps_empty_turns(my_turn, their_turn, k_bars, v_bars, empty_bars, r0, j0, n_max, WG: ttgl.constexpr,
                     NUM_STAGES: ttgl.constexpr):
    """Turns j0 .. n_max - 1 of a tile whose blocks this warpgroup does not visit: wait for the turn, pass it on,
    wait for the block to land and release it unread (waiting for it bounds the releases to one phase ahead of
    the producer's wait)."""
    for j in range(j0, n_max):
        r = r0 + j
        _pps_wait_turn(my_turn, r, WG)
        mbarrier.arrive(their_turn, count=1)
        mbarrier.wait(k_bars.index(r % NUM_STAGES), (r // NUM_STAGES) & 1)
        mbarrier.wait(v_bars.index(r % NUM_STAGES), (r // NUM_STAGES) & 1)
        mbarrier.arrive(empty_bars.index(WG * NUM_STAGES + r % NUM_STAGES), count=1)


@gluon.jit
def _pps_consumer(q_desc, o_desc, Lse, q_smem, q_bar, k_smem, v_smem, k_bars, v_bars, empty_bars, turn_bars,
                  qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_M, Sched, SECTION, N_PROG,
                  WG: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr,
                  BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, STORE_LSE: ttgl.constexpr,
                  s_layout: ttgl.constexpr, o_layout: ttgl.constexpr, p_layout: ttgl.constexpr,
                  CuSeqQ, CuSeqK, Out, stride_ot, stride_oh, VARLEN: ttgl.constexpr):
    """Consumer warpgroup WG of the persistent ping-pong forward: for each of this program's tiles, query tile
    2 * start_m + WG of head (b, h), as _pp_consumer does for one tile, with three differences that keep every
    mbarrier's phase exact across tiles:
      - ring position r = (blocks of this program's earlier tiles) + j: slot r % NUM_STAGES, phase
        (r // NUM_STAGES) & 1, for the producer and both consumers alike (each tile streams n_max blocks, the
        larger of its two query tiles' counts);
      - both warpgroups take n_max turns a tile, one per ring position r, strictly alternating (WG1's turn r
        waits for WG0's turn r, WG0's turn r >= 1 for WG1's turn r - 1; no wait is ever skipped, so neither runs
        two turns ahead). The
        warpgroup whose tile stops short (or lies wholly past the end) takes the rest as empty turns: it passes
        the turn on, waits for the block to land and releases it unread, so the producer waits on both
        consumers for every slot;
      - the empty turns come before the epilogue, so one warpgroup's O store overlaps the other's last block,
        and its next tile's Q load and first QK^T overlap the other's epilogue;
      - Q is loaded every tile, also for a query tile wholly past the end (zero-filled, unused), so q_bar's
        phase is the tile count.
    VARLEN (packed sequences, forward_varlen's persistent form): each schedule entry is a tile code
    (_pps_tile_varlen), N_CTX_Q the packed query count (lse's row length), and each tile works in its sequence's
    own positions as _pp_consumer's VARLEN does: the Q box at the sequence's first row q0 + the tile's first
    query, O through pointers (Out, stride_ot, stride_oh) where the tile runs past the sequence's end, and a tile
    of a sequence without keys stores zeros and lse -inf. CuSeqQ / CuSeqK / Out are placeholders otherwise."""
    dtype: ttgl.constexpr = q_desc.dtype
    Q_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    my_turn = turn_bars.index(WG)
    their_turn = turn_bars.index(1 - WG)
    zero_s = ttgl.zeros([BLOCK_M, BLOCK_N], ttgl.float32, s_layout)
    q_box = q_smem._reinterpret(dtype, [1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)  # the same bytes, as the box
    r0 = 0  # ring position of this tile's block 0 (= turns taken so far, by either warpgroup)
    n = 0
    tile_id = _pps_tile_id(Sched, 0, N_PROG)
    while tile_id >= 0:  # the schedule ends each program's column with -1
        if VARLEN:  # the sequence's own lengths; the descriptors' batch index is 0
            start_m, h, q0, k0, n_q, n_k = _pps_tile_varlen(tile_id, N_M, H_Q, CuSeqQ, CuSeqK)
            b = start_m * 0
            o_rows = Out + h.to(ttgl.int64) * stride_oh + q0.to(ttgl.int64) * stride_ot
            lse_row = h.to(ttgl.int64) * N_CTX_Q + q0
        else:
            start_m, bh, b, h, hk = _pps_tile(tile_id, N_M, H_Q, GROUP, SECTION, CAUSAL)
            q0 = 0
            n_q = N_CTX_Q
            n_k = N_CTX_K
            # int32 (forward() launches this kernel only where B * H_Q * T_q < 2^31, always so where q fits a GPU:
            # it holds head_dim >= 64 times as many elements): an int64 product kept N_CTX_Q's sign word live
            # across the partitions, 8 bytes of stack
            lse_row = bh * N_CTX_Q
        tile = 2 * start_m + WG
        n_free, n_blocks = _pp_tile_blocks(tile, n_q, n_k, CAUSAL, BLOCK_M, BLOCK_N)
        n_max = _pps_tile_turns(start_m, n_q, n_k, CAUSAL, BLOCK_M, BLOCK_N)
        # Q is loaded every tile, also one past the end (zero-filled, not used), so q_bar's phase is the tile count
        mbarrier.expect(q_bar, Q_BYTES)
        tma.async_copy_global_to_shared(q_desc, [b, h, q0 + tile * BLOCK_M, 0], q_bar, q_box)
        mbarrier.wait(q_bar, n & 1)
        if n_blocks > 0:
            offs_m = tile * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
            acc = ttgl.zeros([BLOCK_M, HEAD_DIM], ttgl.float32, o_layout)

            # turn 0 of the tile: QK^T(0) alone
            _pps_wait_turn(my_turn, r0, WG)
            mbarrier.wait(k_bars.index(r0 % NUM_STAGES), (r0 // NUM_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(r0 % NUM_STAGES).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            mbarrier.arrive(their_turn, count=1)
            m_i, l_i, p16 = _pp_first_block(s_tok, n_free, offs_m, qk_scale, n_k, dtype, BLOCK_N, CAUSAL,
                                            s_layout, p_layout)

            for j in range(1, n_blocks):
                r = r0 + j
                slot = r % NUM_STAGES
                prev = (r - 1) % NUM_STAGES
                _pps_wait_turn(my_turn, r, WG)
                mbarrier.wait(k_bars.index(slot), (r // NUM_STAGES) & 1)
                s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                mbarrier.wait(v_bars.index(prev), ((r - 1) // NUM_STAGES) & 1)
                o_tok = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
                mbarrier.arrive(their_turn, count=1)
                acc, p16, m_i, l_i = _pp_next_block(s_tok, o_tok, p16, m_i, l_i, j, n_free, offs_m, qk_scale,
                                                    n_k, empty_bars.index(WG * NUM_STAGES + prev), dtype, BLOCK_N,
                                                    CAUSAL, s_layout, o_layout, p_layout)

            r = r0 + n_blocks - 1
            acc = _pp_last_pv(p16, acc, v_smem, v_bars, empty_bars.index(WG * NUM_STAGES + r % NUM_STAGES), r,
                              NUM_STAGES)
            # the empty turns, then this tile's epilogue (overlapping the other warpgroup's last block)
            _pps_empty_turns(my_turn, their_turn, k_bars, v_bars, empty_bars, r0, n_blocks, n_max, WG, NUM_STAGES)
            lse_base = Lse
            if STORE_LSE:
                lse_base = Lse + lse_row
            if VARLEN:
                _pp_epilogue(acc, m_i, l_i, lse_base, offs_m, n_q, q_smem, q_box, o_desc, b, h, q0 + tile * BLOCK_M,
                             dtype, STORE_LSE, o_layout, q0, o_rows, stride_ot, VARLEN)
            else:
                _pp_epilogue(acc, m_i, l_i, lse_base, offs_m, N_CTX_Q, q_smem, q_box, o_desc, b, h, tile * BLOCK_M,
                             dtype, STORE_LSE, o_layout)
        else:  # this warpgroup's query tile lies past the end: empty turns only
            _pps_empty_turns(my_turn, their_turn, k_bars, v_bars, empty_bars, r0, 0, n_max, WG, NUM_STAGES)
            if VARLEN:
                if tile * BLOCK_M < n_q:  # queries of a sequence without keys: out 0, lse -inf
                    if STORE_LSE:
                        offs_z = tile * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
                        ttgl.store(Lse + lse_row + offs_z, ttgl.full([BLOCK_M], float("-inf"), ttgl.float32,
                                                                     ttgl.SliceLayout(1, s_layout)),
                                   mask=offs_z < n_q)
                    _store_rows(ttgl.zeros([BLOCK_M, HEAD_DIM], dtype, o_layout), o_rows, tile * BLOCK_M, n_q,
                                stride_ot, o_layout)
        r0 += n_max
        n += 1
        tile_id = _pps_tile_id(Sched, n, N_PROG)


@gluon.jit
def _pps_producer(k_desc, v_desc, N_CTX_Q, N_CTX_K, k_smem, v_smem, k_bars, v_bars, empty_bars, H_Q, GROUP, N_M,
                  Sched, SECTION, N_PROG, HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr,
                  BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, TILE_BYTES: ttgl.constexpr,
                  CuSeqQ, CuSeqK, VARLEN: ttgl.constexpr):
    """The load warp of the persistent ping-pong forward: the n_max key blocks of each of the program's tiles,
    ring position r (counted across tiles) into slot r % NUM_STAGES once BOTH consumers released position
    r - NUM_STAGES (each releases every position, read or not: _pps_consumer's empty turns). VARLEN: tile codes,
    key block j of a tile at its sequence's first key row k0 + j * BLOCK_N."""
    r = 0
    n = 0
    tile_id = _pps_tile_id(Sched, 0, N_PROG)
    while tile_id >= 0:  # the schedule ends each program's column with -1
        if VARLEN:
            start_m, h, q0, k0, n_q, n_k = _pps_tile_varlen(tile_id, N_M, H_Q, CuSeqQ, CuSeqK)
            b = start_m * 0
            hk = h // GROUP
        else:
            start_m, bh, b, h, hk = _pps_tile(tile_id, N_M, H_Q, GROUP, SECTION, CAUSAL)
            k0 = 0
            n_q = N_CTX_Q
            n_k = N_CTX_K
        n_max = _pps_tile_turns(start_m, n_q, n_k, CAUSAL, BLOCK_M, BLOCK_N)
        for j in range(n_max):
            slot = r % NUM_STAGES
            phase = ((r // NUM_STAGES) & 1) ^ 1
            mbarrier.wait(empty_bars.index(slot), phase, pred=r >= NUM_STAGES)
            mbarrier.wait(empty_bars.index(NUM_STAGES + slot), phase, pred=r >= NUM_STAGES)
            _load_kv_block(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, b, hk, j, slot, True, BLOCK_N, HEAD_DIM,
                           TILE_BYTES, k0)
            r += 1
        n += 1
        tile_id = _pps_tile_id(Sched, n, N_PROG)


@gluon.jit
def _pp_init_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES: ttgl.constexpr):
    """The ping-pong forwards' mbarriers (per tile and persistent), each with count 1: per consumer warpgroup its
    Q barrier, its turn barrier and its NUM_STAGES slot-released barriers (consumer-major); per ring slot its K
    and V barriers. Then the fence that makes them visible to the async proxy (TMA)."""
    for w in ttgl.static_range(2):
        mbarrier.init(q_bars.index(w), count=1)
        mbarrier.init(turn_bars.index(w), count=1)
        for i in ttgl.static_range(NUM_STAGES):
            mbarrier.init(empty_bars.index(w * NUM_STAGES + i), count=1)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()


@gluon.jit
def _pp_invalidate_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES: ttgl.constexpr):
    """_pp_init_barriers' mbarriers, invalidated at the end of the kernel."""
    for w in ttgl.static_range(2):
        mbarrier.invalidate(q_bars.index(w))
        mbarrier.invalidate(turn_bars.index(w))
        for i in ttgl.static_range(NUM_STAGES):
            mbarrier.invalidate(empty_bars.index(w * NUM_STAGES + i))
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))


# N_M is never specialized: a launch with N_M == 1 (one query block: T_q <= 2 * BLOCK_M) would make start_m the
# constant 0, and with T_q == T_k == 1 as well (constants too) Triton 3.6's lowering to LLVM fails an internal
# assertion (SmallVector index out of range; the H200 suite hit it at T = 1). offline_kernels(ones=...) builds
# such launches without a GPU. N_PROG (the grid) neither: one compiled kernel whatever the program count (a
# specialized 1 or multiple of 16 would each build another).
@gluon.jit(do_not_specialize=["N_M", "N_PROG"])
def _attn_fwd_gluon_pps_kernel(
    q_desc, k_desc, v_desc, o_desc, Lse,
    qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_M, Sched, SECTION, N_PROG,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr,
    BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
    CONSUMER_REGS: ttgl.constexpr, PRODUCER_WARPS: ttgl.constexpr, PRODUCER_REGS: ttgl.constexpr,
    STORE_LSE: ttgl.constexpr = True,
    CuSeqQ=None, CuSeqK=None, Out=None, stride_ot=0, stride_oh=0, VARLEN: ttgl.constexpr = False,
):
    """The persistent ping-pong forward: min(tiles, SMs) programs, each walking its tiles of the N_M * B * H_Q
    (N_M = cdiv(T_q, 2 * BLOCK_M) query blocks of two consumer tiles each) as the schedule Sched lists them
    (int32 [rows, grid], a column per program, -1 past its tiles; pps_schedule, _pps_schedule_tensor); barriers
    are set up once per program and their phases carried across tiles (_pps_consumer, _pps_producer). Descriptors
    as _attn_fwd_gluon_pp_kernel's.

    VARLEN (forward_varlen's persistent form): packed sequences, the descriptors over [1, H, total, D] views of
    [total, H, D], N_CTX_Q the packed query count, N_M the longest sequence's query blocks (cdiv(max_q, 2 *
    BLOCK_M)), and Sched's entries tile codes (s * N_M + start_m) * H_Q + h (varlen_pps_schedule: only the tiles
    that start inside their sequence), the offsets in CuSeqQ / CuSeqK and O also addressed through Out /
    stride_ot / stride_oh, as _attn_fwd_gluon_pp_kernel's VARLEN."""
    dtype: ttgl.constexpr = q_desc.dtype
    TILE_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    s_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[0]
    o_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[1]
    p_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[2]
    q_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    q_smem = ttgl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_shared)
    k_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    q_bars = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = ttgl.allocate_shared_memory(ttgl.int64, [2 * NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    _pp_init_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES)
    if VARLEN:
        cu_q = CuSeqQ
        cu_k = CuSeqK
        o_ptr = Out
    else:  # unused placeholders (warp_specialize takes no None)
        cu_q = Sched
        cu_k = Sched
        o_ptr = Sched

    ttgl.warp_specialize(
        [(_pps_consumer, (q_desc, o_desc, Lse, q_smem.index(0), q_bars.index(0), k_smem, v_smem, k_bars, v_bars,
                          empty_bars, turn_bars, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_M, Sched, SECTION,
                          N_PROG, 0, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, STORE_LSE, s_layout, o_layout,
                          p_layout, cu_q, cu_k, o_ptr, stride_ot, stride_oh, VARLEN)),
         (_pps_consumer, (q_desc, o_desc, Lse, q_smem.index(1), q_bars.index(1), k_smem, v_smem, k_bars, v_bars,
                          empty_bars, turn_bars, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_M, Sched, SECTION,
                          N_PROG, 1, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, STORE_LSE, s_layout, o_layout,
                          p_layout, cu_q, cu_k, o_ptr, stride_ot, stride_oh, VARLEN)),
         (_pps_producer, (k_desc, v_desc, N_CTX_Q, N_CTX_K, k_smem, v_smem, k_bars, v_bars, empty_bars, H_Q, GROUP,
                          N_M, Sched, SECTION, N_PROG, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, TILE_BYTES,
                          cu_q, cu_k, VARLEN))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])

    _pp_invalidate_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES)


@gluon.jit
def _attn_fwd_gluon_pp_kernel(
    q_desc, k_desc, v_desc, o_desc, Lse,
    qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr,
    BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
    CONSUMER_REGS: ttgl.constexpr, PRODUCER_WARPS: ttgl.constexpr, PRODUCER_REGS: ttgl.constexpr,
    STORE_LSE: ttgl.constexpr = True,
    CuSeqQ=None, CuSeqK=None, Out=None, stride_ot=0, stride_oh=0, VARLEN: ttgl.constexpr = False,
):
    """One program per 2 * BLOCK_M query rows of one (b, h): consumer warpgroup 0 (the default partition,
    num_warps = 4) takes the first BLOCK_M rows, consumer warpgroup 1 (a 4-warp worker) the next, and a
    1-warp producer streams the K/V blocks both read through one shared ring. The four TMA descriptors are
    built on the host (4-D, over [B, H, T, D]): no device-side descriptor, so no global scratch.

    VARLEN (forward_varlen): packed sequences, the descriptors over [1, H, total, D] views of [total, H, D]; the
    grid's second axis is sequence * head, N_CTX_Q the packed query count (lse's row length: lse is [Hq, total_q]);
    each program reads its sequence's first rows and lengths from CuSeqQ / CuSeqK (int32 offsets) and works in the
    sequence's own positions; Out / stride_ot / stride_oh address O for the tiles that end past the sequence."""
    dtype: ttgl.constexpr = q_desc.dtype
    TILE_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    # Each consumer is one warpgroup: its 4 warps stack along M (a 128-row tile wraps round them twice).
    s_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[0]
    o_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[1]
    p_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_N, HEAD_DIM)[2]
    q_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    start_m, bh, b, h, hk = _program_ids(H_Q, GROUP, CAUSAL)
    if VARLEN:  # b is the sequence; the descriptors' batch index is 0
        q0 = ttgl.load(CuSeqQ + b)
        k0 = ttgl.load(CuSeqK + b)
        n_q = ttgl.load(CuSeqQ + b + 1) - q0
        n_k = ttgl.load(CuSeqK + b + 1) - k0
        o_rows = Out + h.to(ttgl.int64) * stride_oh + q0.to(ttgl.int64) * stride_ot
        lse_row = h.to(ttgl.int64) * N_CTX_Q + q0
        b = b * 0
    else:
        q0 = 0
        k0 = 0
        n_q = N_CTX_Q
        n_k = N_CTX_K
        o_rows = bh  # unused (warp_specialize takes no None)
        lse_row = bh.to(ttgl.int64) * N_CTX_Q
    if STORE_LSE:
        lse_base = Lse + lse_row
    else:  # Lse is None: the consumers take this unused value in its place and store nothing through it
        lse_base = bh

    q_smem = ttgl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_shared)
    k_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    q_bars = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    # one "slot released" barrier per (consumer, slot), consumer-major: a slot is refilled once both consumers that
    # read its block arrived (the producer waits on both); turn_bars[w]: warpgroup w may issue its GEMMs.
    empty_bars = ttgl.allocate_shared_memory(ttgl.int64, [2 * NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    _pp_init_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES)

    ttgl.warp_specialize(
        [(_pp_consumer, (q_desc, o_desc, lse_base, q_smem.index(0), q_bars.index(0), k_smem, v_smem, k_bars,
                         v_bars, empty_bars, turn_bars, b, h, start_m, qk_scale, n_q, n_k, 0,
                         HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, STORE_LSE, s_layout, o_layout, p_layout,
                         q0, o_rows, stride_ot, VARLEN)),
         (_pp_consumer, (q_desc, o_desc, lse_base, q_smem.index(1), q_bars.index(1), k_smem, v_smem, k_bars,
                         v_bars, empty_bars, turn_bars, b, h, start_m, qk_scale, n_q, n_k, 1,
                         HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, STORE_LSE, s_layout, o_layout, p_layout,
                         q0, o_rows, stride_ot, VARLEN)),
         (_pp_producer, (k_desc, v_desc, n_q, n_k, k_smem, v_smem, k_bars, v_bars, empty_bars, b, hk,
                         start_m, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, TILE_BYTES, k0))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])

    _pp_invalidate_barriers(q_bars, turn_bars, empty_bars, k_bars, v_bars, NUM_STAGES)


# ----------------------------------------------------------------------------------------------
# Backward, dK and dV (env HEARTH_ATTN_GLUON_BWD=1; checked by the GPU suite and timed on the H200: within 3% of
# the Triton kernel either way, with bitwise-equal gradients, so it stays opt-in)
# ----------------------------------------------------------------------------------------------
# (BLOCK_N keys a program, BLOCK_M queries a step, NUM_STAGES of the Q / dO ring, num_warps) per head dim
# (offline sm_90 builds: at D128, 64-query steps spill 8 bytes causal, so D128 takes 32; none of these spill)
BWD_CONFIGS = {
    64: (128, 64, 2, 8),
    128: (128, 32, 2, 8),
}
BWD_CANDIDATES = {
    64: [(128, 64, 2, 8), (128, 32, 2, 8), (128, 64, 3, 8)],
    128: [(128, 32, 2, 8), (128, 32, 3, 8)],
}


@gluon.jit
def _fb_step(i, n_m, m_lo, GROUP, STEP_ORDER: ttgl.constexpr):
    """(query head within the group, query block) of a backward program's step i, over its n_m query blocks from
    m_lo and GROUP query heads. STEP_ORDER 0: each head's blocks in turn, from m_lo up (the shipped order); 1: each
    query block's GROUP heads together, blocks from m_lo up; 2: the same, blocks from the last down to m_lo, so that
    under causal masking every program of a (b, K/V head) pair starts at the same block and they stay in step (a
    probe knob, env HEARTH_ATTN_FB_STEP_ORDER)."""
    if STEP_ORDER == 0:
        g = i // n_m
        qb = m_lo + i % n_m
    elif STEP_ORDER == 1:
        g = i % GROUP
        qb = m_lo + i // GROUP
    else:
        g = i % GROUP
        qb = m_lo + n_m - 1 - i // GROUP
    return g, qb


@gluon.jit
def _bwd_issue_qdo(q_desc, do_desc, q_ring, do_ring, bars, i, n_iters, n_m, m_lo, b, hk, GROUP,
                   BLOCK_M: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, NUM_STAGES: ttgl.constexpr,
                   TILE_BYTES: ttgl.constexpr, q0=0, STEP_ORDER: ttgl.constexpr = 0):
    """Start the TMA loads of step i's Q and dO tiles into ring slot i % NUM_STAGES (no-op past the last
    step). Step i is query block qb of query head hk * GROUP + g, (g, qb) = _fb_step(..., STEP_ORDER); its box
    starts at row q0 + the block's first query (q0: a packed sequence's first row, else 0)."""
    slot = i % NUM_STAGES
    pred = i < n_iters
    g, qb = _fb_step(i, n_m, m_lo, GROUP, STEP_ORDER)
    h = hk * GROUP + g
    row = q0 + qb * BLOCK_M
    bar = bars.index(slot)
    box: ttgl.constexpr = [1, 1, BLOCK_M, HEAD_DIM]
    mbarrier.expect(bar, 2 * TILE_BYTES, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [b, h, row, 0], bar,
                                    q_ring.index(slot)._reinterpret(q_desc.dtype, box, q_desc.layout), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [b, h, row, 0], bar,
                                    do_ring.index(slot)._reinterpret(do_desc.dtype, box, do_desc.layout), pred=pred)


@gluon.jit
def _bwd_st_dpt(k_s, v_s, q_s, do_s, zero_st):
    """A backward step's transposed scores: S^T = K Q^T and dP^T = V dO^T issued together (keys x queries, K / V
    and Q / dO tiles in shared memory). Returns (S^T, dP^T's token): S^T retired, dP^T maybe still running."""
    st_tok = warpgroup_mma(k_s, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v_s, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
    return warpgroup_mma_wait(1, deps=[st_tok]), dpt_tok


@gluon.jit
def _store_dkdv(DK, DV, dk, dv, sm_scale, b, hk, row0, stride_dkb, stride_dkh, stride_dkt, N_CTX_K,
                ROWS: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, acc_layout: ttgl.constexpr):
    """The dK / dV epilogue: dk * sm_scale and dv (fp32 [ROWS, D] accumulators in acc_layout) of keys row0 + [0, ROWS)
    of (b, K/V head hk), cast to DK's dtype; keys past T_k are not stored."""
    offs_r = row0 + ttgl.arange(0, ROWS, layout=ttgl.SliceLayout(1, acc_layout))
    offs_c = ttgl.arange(0, HEAD_DIM, layout=ttgl.SliceLayout(0, acc_layout))
    out_off = (b.to(ttgl.int64) * stride_dkb + hk.to(ttgl.int64) * stride_dkh
               + offs_r[:, None].to(ttgl.int64) * stride_dkt + offs_c[None, :])
    keep = (offs_r < N_CTX_K)[:, None]
    ttgl.store(DK + out_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=keep)
    ttgl.store(DV + out_off, dv.to(DV.dtype.element_ty), mask=keep)


@gluon.jit
def _attn_bwd_dkdv_gluon_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV,
    stride_dkb, stride_dkh, stride_dkt,
    sm_scale, qk_scale, H_Q, H_K, GROUP, N_CTX_Q, N_CTX_K,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
    NUM_STAGES: ttgl.constexpr, NUM_WARPS: ttgl.constexpr,
):
    """dK, dV of one key block of BLOCK_N rows of one (b, K/V head), summed over its GROUP query heads: per
    step one [BLOCK_M, D] query block of one head, its Q and dO through a TMA ring, four wgmma on the
    transposed scores (keys x queries, so both accumulators are [BLOCK_N, D]):
        S^T = K Q^T, dP^T = V dO^T (both issued async together), P^T = exp2(S^T * qk_scale - lse),
        dV += P^T dO (async, P^T from registers), dS^T = P^T (dP^T - delta), dK += dS^T Q (async).
    Rows past T are zero-filled by TMA (q = dO = 0) and their lse loads as +inf, so P = dS = 0 there;
    keys past T_k give rows of dK / dV that are not stored. dQ is left to attention.py's dQ kernel; Delta
    (rowsum(O * dO)) comes from its preprocess kernel. The (b, h) rows of Lse / Delta are [B * Hq, Tq]."""
    dtype: ttgl.constexpr = q_desc.dtype
    TILE_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    KV_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    # accumulators: warps stacked along the BLOCK_N key rows (16 rows a warp)
    st_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_M, HEAD_DIM)[0]
    acc_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_M, HEAD_DIM)[1]
    a_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_M, HEAD_DIM)[2]
    qd_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    start_n = ttgl.program_id(0) * BLOCK_N
    bhk = ttgl.program_id(1)
    b = bhk // H_K
    hk = bhk % H_K

    k_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_shared)
    q_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], qd_shared)
    do_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], qd_shared)
    kv_bar = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    kv_box: ttgl.constexpr = [1, 1, BLOCK_N, HEAD_DIM]
    mbarrier.expect(kv_bar, 2 * KV_BYTES)
    tma.async_copy_global_to_shared(k_desc, [b, hk, start_n, 0], kv_bar,
                                    k_smem._reinterpret(dtype, kv_box, k_desc.layout))
    tma.async_copy_global_to_shared(v_desc, [b, hk, start_n, 0], kv_bar,
                                    v_smem._reinterpret(dtype, kv_box, v_desc.layout))

    # Query blocks that see this key block: causal, those from the one holding query start_n on (top-left
    # aligned mask, query i sees key j <= i); the steps run head by head over them.
    if CAUSAL:
        m_lo = start_n // BLOCK_M
    else:
        m_lo = start_n * 0
    n_m = ttgl.maximum(ttgl.cdiv(N_CTX_Q, BLOCK_M) - m_lo, 0)
    n_iters = GROUP * n_m
    n_m = ttgl.maximum(n_m, 1)  # a key block no query sees (causal, Tk > Tq) runs no step: no division by 0
    for i in ttgl.static_range(NUM_STAGES):
        _bwd_issue_qdo(q_desc, do_desc, q_ring, do_ring, bars, i, n_iters, n_m, m_lo, b, hk, GROUP,
                       BLOCK_M, HEAD_DIM, NUM_STAGES, TILE_BYTES)

    offs_n = start_n + ttgl.arange(0, BLOCK_N, layout=ttgl.SliceLayout(1, st_layout))
    zero_st = ttgl.zeros([BLOCK_N, BLOCK_M], ttgl.float32, st_layout)
    dk = ttgl.zeros([BLOCK_N, HEAD_DIM], ttgl.float32, acc_layout)
    dv = ttgl.zeros([BLOCK_N, HEAD_DIM], ttgl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for i in range(n_iters):
        slot = i % NUM_STAGES
        h = hk * GROUP + i // n_m
        start_m = (m_lo + i % n_m) * BLOCK_M
        row_base = (b * H_Q + h).to(ttgl.int64) * N_CTX_Q
        offs_m = start_m + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(0, st_layout))
        row_ok = offs_m < N_CTX_Q
        lse = ttgl.load(Lse + row_base + offs_m, mask=row_ok, other=float("inf"))
        delta = ttgl.load(Delta + row_base + offs_m, mask=row_ok, other=0.0)
        mbarrier.wait(bars.index(slot), (i // NUM_STAGES) & 1)
        q_s = q_ring.index(slot)
        do_s = do_ring.index(slot)
        st, dpt_tok = _bwd_st_dpt(k_smem, v_smem, q_s, do_s, zero_st)
        pt = ttgl.exp2(st * qk_scale - (lse * LOG2E_C)[None, :])
        if CAUSAL:
            if start_m < start_n + BLOCK_N:  # a block that crosses the diagonal
                pt = ttgl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
        pt16 = ttgl.convert_layout(pt.to(dtype), a_layout)
        dv_tok = warpgroup_mma(pt16, do_s, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=[dpt_tok])  # dP^T retired, dV may still run
        dst = pt * (dpt - delta[None, :])
        ds16 = ttgl.convert_layout(dst.to(dtype), a_layout)
        dk_tok = warpgroup_mma(ds16, q_s, dk, is_async=True)
        dv, dk, pt16, ds16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, pt16, ds16])
        # every warp's wgmma on this slot is done: refill it with step i + NUM_STAGES
        ttgl.thread_barrier()
        _bwd_issue_qdo(q_desc, do_desc, q_ring, do_ring, bars, i + NUM_STAGES, n_iters, n_m, m_lo, b, hk, GROUP,
                       BLOCK_M, HEAD_DIM, NUM_STAGES, TILE_BYTES)

    mbarrier.invalidate(kv_bar)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))
    _store_dkdv(DK, DV, dk, dv, sm_scale, b, hk, start_n, stride_dkb, stride_dkh, stride_dkt, N_CTX_K, BLOCK_N, HEAD_DIM,
                acc_layout)


# (BLOCK_M queries a program, BLOCK_N keys a step, NUM_STAGES of the K / V ring, num_warps) per head dim
BWD_DQ_CONFIGS = {
    64: (128, 64, 2, 8),
    128: (128, 64, 2, 8),
}
BWD_DQ_CANDIDATES = {
    64: [(128, 64, 2, 8), (128, 128, 2, 8), (128, 64, 3, 8)],
    128: [(128, 64, 2, 8), (128, 64, 3, 8)],
}


@gluon.jit
def _attn_bwd_dq_gluon_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DQ,
    stride_dqb, stride_dqh, stride_dqt,
    sm_scale, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
    NUM_STAGES: ttgl.constexpr, NUM_WARPS: ttgl.constexpr,
):
    """dQ of one [BLOCK_M, D] query block of one (b, h): Q and dO loaded once, the K / V blocks it sees through
    a TMA ring, three wgmma a step: S = Q K^T and dP = dO V^T (issued async together), P = exp2(S * qk_scale
    - lse), dS = P (dP - delta), dQ += dS K (dS from registers). Keys past T_k are masked (P = 0); rows past T_q
    load lse = +inf (P = 0) and are not stored."""
    dtype: ttgl.constexpr = q_desc.dtype
    Q_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    TILE_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    s_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[0]
    acc_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[1]
    a_layout: ttgl.constexpr = _wgmma_layouts(NUM_WARPS, BLOCK_N, HEAD_DIM)[2]
    q_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    start_m, bh, b, h, hk = _program_ids(H_Q, GROUP, CAUSAL)
    q_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_shared)
    do_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_shared)
    k_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    v_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_shared)
    q_bar = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    q_box: ttgl.constexpr = [1, 1, BLOCK_M, HEAD_DIM]
    mbarrier.expect(q_bar, 2 * Q_BYTES)
    tma.async_copy_global_to_shared(q_desc, [b, h, start_m * BLOCK_M, 0], q_bar,
                                    q_smem._reinterpret(dtype, q_box, q_desc.layout))
    tma.async_copy_global_to_shared(do_desc, [b, h, start_m * BLOCK_M, 0], q_bar,
                                    do_smem._reinterpret(dtype, q_box, do_desc.layout))
    # Key blocks this query block sees: causal stops at the diagonal block's end; [0, n_free) need no mask.
    if CAUSAL:
        kv_hi = ttgl.minimum(start_m * BLOCK_M + BLOCK_M, N_CTX_K)
        n_free = (start_m * BLOCK_M) // BLOCK_N
    else:
        kv_hi = N_CTX_K
        n_free = N_CTX_K // BLOCK_N  # full blocks: no mask; a ragged tail block is masked
    n_blocks = ttgl.cdiv(kv_hi, BLOCK_N)
    for i in ttgl.static_range(NUM_STAGES):
        _issue_kv_box(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, b, hk, i, i < n_blocks, BLOCK_N, HEAD_DIM,
                      NUM_STAGES, TILE_BYTES)

    offs_m = start_m * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, s_layout))
    row_ok = offs_m < N_CTX_Q
    row_base = bh.to(ttgl.int64) * N_CTX_Q
    lse2 = ttgl.load(Lse + row_base + offs_m, mask=row_ok, other=float("inf")) * LOG2E_C
    delta = ttgl.load(Delta + row_base + offs_m, mask=row_ok, other=0.0)
    zero_s = ttgl.zeros([BLOCK_M, BLOCK_N], ttgl.float32, s_layout)
    dq = ttgl.zeros([BLOCK_M, HEAD_DIM], ttgl.float32, acc_layout)
    mbarrier.wait(q_bar, 0)
    for j in range(n_blocks):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        mbarrier.wait(k_bars.index(slot), phase)
        s_tok = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(slot), phase)
        dp_tok = warpgroup_mma(do_smem, v_ring.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        sc = warpgroup_mma_wait(1, deps=[s_tok])  # S retired, dP may still run
        p = ttgl.exp2(sc * qk_scale - lse2[:, None])
        if j >= n_free:  # the diagonal block(s) (query i sees key j <= i) and a ragged tail: keys past T_k are
            # zero rows of K and V, but their dS = -P delta is not zero and could overflow 16 bits (P = e^-lse):
            # masked here, as the Triton dQ kernel does
            offs_n = j * BLOCK_N + ttgl.arange(0, BLOCK_N, layout=ttgl.SliceLayout(0, s_layout))
            keep = (offs_n < N_CTX_K)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = ttgl.where(keep, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        ds16 = ttgl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq = warpgroup_mma(ds16, k_ring.index(slot), dq)
        # every warp's wgmma on this slot is done: refill it with block j + NUM_STAGES
        ttgl.thread_barrier()
        nxt = j + NUM_STAGES
        _issue_kv_box(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, b, hk, nxt, nxt < n_blocks, BLOCK_N, HEAD_DIM,
                      NUM_STAGES, TILE_BYTES)

    mbarrier.invalidate(q_bar)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    dq = dq * sm_scale
    offs_r = start_m * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=ttgl.SliceLayout(1, acc_layout))
    offs_d = ttgl.arange(0, HEAD_DIM, layout=ttgl.SliceLayout(0, acc_layout))
    out_off = (b.to(ttgl.int64) * stride_dqb + h.to(ttgl.int64) * stride_dqh
               + offs_r[:, None].to(ttgl.int64) * stride_dqt + offs_d[None, :])
    ttgl.store(DQ + out_off, dq.to(dtype), mask=(offs_r < N_CTX_Q)[:, None])


# ----------------------------------------------------------------------------------------------
# Fused backward: dK, dV and dQ in one kernel, 5 matmuls a step (env HEARTH_ATTN_GLUON_BWD_FUSED=1; experimental)
# ----------------------------------------------------------------------------------------------
# (BLOCK_M queries a step, NUM_STAGES of the Q / dO ring) per head dim; a program owns FB_BLOCK_N = 128 keys,
# 64 per consumer warpgroup. The shipped forms (FB_DQ_TMA, FB_STATS_SMEM, FB_DQ_SPLIT[D]) were the fastest on the
# H200 (BENCHMARKS.md): at D 128, FlashAttention-3's 64-query steps with dQ^T split over both warpgroups. Offline
# sm_90 builds: every candidate builds without spills in the shipped forms (64-query steps at D 128 spilled 144-400
# bytes with the fp32 atomics, which is why D 128 used to take 32; 80 with the TMA forms until each consumer read
# lse and delta from the ring slot just before its use).
FB_BLOCK_N = 128
# D 64 takes 128-query steps (FlashAttention-3's tile there): 6-9% less fwd+bwd time than 64 on an H100 (BENCHMARKS.md,
# forty-first run) for 8 / 16 bytes of stack (full / causal; 64-query steps spill none)
FB_CONFIGS = {
    64: (128, 2),
    128: (64, 2),
}
# packed rows (backward_fused_varlen) keep 64-query steps at every head dim: the query step is the unit of its dQ^T
# placement (attention_varlen.DQ_TMA_ALIGN), and at D 64 the 128-query build spills 16 / 56 bytes
FB_CONFIGS_VARLEN = {
    64: (64, 2),
    128: (64, 2),
}
FB_CANDIDATES = {
    64: [(128, 2), (64, 2), (32, 2), (64, 3)],
    128: [(64, 2), (32, 2)],
}
FB_DQ_SPLIT = {64: False, 128: True}  # both warpgroups compute half of dQ^T's rows every step
# causal MHA's grid order (fb_pair_group): (b, head) pairs whose key blocks interleave, per head dim
FB_MHA_CAUSAL_PAIRS = {64: 1, 128: 2}
# causal GQA's grid order (fb_pair_group): up to FB_GQA_GROUP_MAX_KB key blocks a pair, groups of the fewest pairs
# (a power of two) whose key blocks make FB_GQA_GROUP_PROGRAMS programs or more; longer sequences, every pair
FB_GQA_GROUP_PROGRAMS = 128
FB_GQA_GROUP_MAX_KB = 32
FB_DQ_TMA = True  # dQ^T added by a TMA reduce-add (False: fp32 atomics)
FB_STATS_SMEM = True  # lse / delta staged in the ring slot by the producer (False: each consumer loads them)
# With the dQ split: the Q / dO slot given back after dQ^T's matmul, at two stages on the mbarrier that also frees
# dS^T's buffer (the consumer's LATE_RELEASE; False: the slot given back after dK's matmul, dS^T's buffer on its own)
FB_LATE_RELEASE = True
# the fp32 dQ buffer's default bound (env HEARTH_ATTN_FB_ACC_MIB overrides; 0: none): (b, K/V head) pairs past it
# run in further launches over the same buffer
FB_ACC_MIB = 256
# Under grouped-query attention the buffer is also held to 1 / FB_ACC_GQA_SPLIT of its whole size (at 2: dQ's own
# 16-bit size), so the pairs run in that many launches or more. On the H200 (2026-12-04, BENCHMARKS.md) halving
# cost GQA 40/8 0-1.5% fwd+bwd at head_dim 64 and 128 and took its activations from 1.65x below cuDNN's (which
# expands dK / dV to the query heads) to 2.45x; for MHA it cost 6.4% (Llama-2-7B T2048 B4), where cuDNN holds
# no more than hearth either way, so MHA keeps the whole buffer up to FB_ACC_MIB.
FB_ACC_GQA_SPLIT = 2
# ... except for causal GQA at up to FB_GQA_GROUP_MAX_KB key blocks a pair (the grouped grid order's sequences, up to
# 4096 keys): the whole buffer up to FB_ACC_SHORT_MIB, in one launch. There each launch of grouped pairs has its own
# tail and the split makes dq_from_acc clear the buffer between launches (60 of its 146 us at the packed Qwen3-14B
# row): one launch ran 3-7% less fwd+bwd on an H100 (2026-12-06, BENCHMARKS.md forty-third run; packed Qwen3-14B
# 8 x 2048 3.136 -> 2.919 ms, +161 MiB, still under FlashAttention-4's extra memory in every case measured), while
# at T8192 (64 key blocks) it ran 2.2% slower, so longer sequences keep the split
FB_ACC_SHORT_MIB = 512


@_builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA reduce-add of the shared-memory tile src into tensor_desc's box at coord (cp.reduce.async.bulk.tensor
    .add; completion tracked like a TMA store: tma.store_wait). Triton 3.6 builds the op (GluonOpBuilder's
    create_async_tma_reduce) but gluon.language does not export it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _fb_row_stats(Lse, Delta, stat_h0, stat_q0, i, n_iters, m_lo, n_m, STAT_T, N_CTX_Q, BLOCK_M: ttgl.constexpr,
                  layout: ttgl.constexpr, GROUP=1, STEP_ORDER: ttgl.constexpr = 0):
    """(lse * log2(e), delta) of step i's BLOCK_M query rows, 1-D in `layout` (lse +inf and delta 0 past T_q or
    past the last step). Lse / Delta rows of STAT_T: step i's query head is row stat_h0 + g, its block qb ((g, qb) =
    _fb_step's; stat_h0: the program's first query head, b * H_Q + hk * GROUP), its queries start at column stat_q0
    (a packed sequence's first row, else 0); N_CTX_Q: the (sequence's) query count."""
    g, qb = _fb_step(i, n_m, m_lo, GROUP, STEP_ORDER)
    base = (stat_h0 + g).to(ttgl.int64) * STAT_T + stat_q0
    offs_m = qb * BLOCK_M + ttgl.arange(0, BLOCK_M, layout=layout)
    ok = (offs_m < N_CTX_Q) & (i < n_iters)
    lse2 = ttgl.load(Lse + base + offs_m, mask=ok, other=float("inf")) * LOG2E_C
    return lse2, ttgl.load(Delta + base + offs_m, mask=ok, other=0.0)


@gluon.jit
def _fb_add_dq(DQacc, dqt, head, offs_d, offs_m, N_PAD_Q, HEAD_DIM: ttgl.constexpr):
    """dqt (rows offs_d of dQ^T, columns offs_m) added into DQacc[head] ([D, N_PAD_Q], queries contiguous) by fp32
    atomics. No mask: DQacc's rows are padded to whole query blocks, and a query past T_q adds 0 (P = 0). The
    offsets within the head are 32-bit (D * N_PAD_Q < 2^31), the head's base 64-bit."""
    base = DQacc + head.to(ttgl.int64) * HEAD_DIM * N_PAD_Q
    ttgl.atomic_add(base + (offs_d[:, None] * N_PAD_Q + offs_m[None, :]), dqt, sem="relaxed")


@gluon.jit
def _fb_reduce_dq(dq_desc, dq_stage, dqt, head, row0, start_m, PENDING: ttgl.constexpr = 0):
    """dqt (rows row0.. of dQ^T for queries start_m..) added into DQacc[head] by one TMA reduce-add from the
    warpgroup's staging buffer: wait until the reduce that last used the buffer has read it (PENDING: how many of
    the warpgroup's later reduces may still be in flight, one per other staging buffer), store, fence, issue."""
    _fb_stage_dq(dq_stage, dqt, PENDING)
    _fb_issue_dq(dq_desc, dq_stage, head, row0, start_m)


@gluon.jit
def _fb_stage_dq(dq_stage, dqt, PENDING: ttgl.constexpr = 0):
    """The first half of _fb_reduce_dq: once the reduce that last used dq_stage has read it, dqt into it."""
    tma.store_wait(PENDING)
    ttgl.thread_barrier()  # the issuing thread's wait covers every thread's store below
    dq_stage.store(dqt)


@gluon.jit
def _fb_issue_dq(dq_desc, dq_stage, head, row0, start_m):
    """The second half of _fb_reduce_dq: fence the staged tile for the async proxy and issue its TMA reduce-add."""
    fence_async_shared()
    ttgl.thread_barrier()  # every thread's part of the tile is in shared memory before the copy reads it
    _tma_reduce_add(dq_desc, [head, row0, start_m], dq_stage._reinterpret(ttgl.float32, dq_desc.block_shape,
                                                                           dq_desc.layout))


@gluon.jit
def _fb_dq_out(dq_desc, dq_smem, DQacc, dqt, head, row0, par, WG, dq_m0, dq_offs_m, offs_d, N_PAD_Q,
               HEAD_DIM: ttgl.constexpr, DQ_TMA: ttgl.constexpr, DQ_BUFS: ttgl.constexpr):
    """A step's dqt (rows row0.. of dQ^T, queries from dq_m0: dq_offs_m) into DQacc[head]: by the TMA reduce-add
    from the warpgroup's staging tile (DQ_TMA; with DQ_BUFS 2 its two tiles in turn by the step's parity `par`, one
    reduce left in flight), else by fp32 atomics."""
    if DQ_TMA:
        if DQ_BUFS == 2:
            _fb_reduce_dq(dq_desc, dq_smem.index(WG * 2 + par), dqt, head, row0, dq_m0, 1)
        else:
            _fb_reduce_dq(dq_desc, dq_smem.index(WG), dqt, head, row0, dq_m0)
    else:
        _fb_add_dq(DQacc, dqt, head, row0 + offs_d, dq_offs_m, N_PAD_Q, HEAD_DIM)


@gluon.constexpr_function
def _fb_one_release(late_release, dq_split, dq_async, num_stages):
    """Whether the fused backward's consumers signal a step's end on one mbarrier: with LATE_RELEASE (the dQ split,
    not DQ_ASYNC) both the Q / dO slot and dS^T's buffer are given back after dQ^T's matmul, by both warpgroups, and
    at two stages the slot (i % 2) and the buffer (parity i % 2) are the same index with the same phases: one arrive
    on empty_bars serves the producer's refill and the consumers' next dS^T store (ds_empty goes unused). Triton 3.6
    puts a warpgroup bar.sync beside every mbarrier arrive, so each arrive a step saved is a sync saved."""
    return bool(late_release and dq_split and not dq_async and num_stages == 2)


@gluon.constexpr_function
def _fb_st_ahead(st_ahead, dq_split, dq_async, dq_early, dq_tma, dq_bufs):
    """Whether the fused backward's consumers compute the next step's S^T during this step's dQ^T staging (ST_AHEAD):
    the form serves the dQ split's TMA reduce with one staging tile, without DQ_ASYNC or DQ_EARLY (their dQ^T
    retires elsewhere in the step)."""
    return bool(st_ahead and dq_split and dq_tma and dq_bufs == 1 and not dq_async and not dq_early)


@gluon.constexpr_function
def _fb_dq_tiles(dq_bufs, dq_split, dq_async):
    """dQ^T staging tiles of the fused backward: two per consumer warpgroup with DQ_BUFS 2 where the form serves (the
    dQ split, not DQ_ASYNC), else one."""
    return 4 if dq_bufs == 2 and dq_split and not dq_async else 2


@gluon.jit
def _fb_pair(PAIR_GROUP: ttgl.constexpr):
    """(key block, pair) of this program in the fused backward's grid order (_attn_bwd_fused_gluon_kernel)."""
    if PAIR_GROUP == 0:
        kb = ttgl.program_id(1)
        pair = ttgl.program_id(0)
    elif PAIR_GROUP == 1:
        kb = ttgl.program_id(0)
        pair = ttgl.program_id(1)
    else:
        kb = ttgl.program_id(0) // PAIR_GROUP
        pair = ttgl.program_id(1) * PAIR_GROUP + ttgl.program_id(0) % PAIR_GROUP
    return kb, pair


@gluon.jit
def _fb_consumer(k_smem, v_smem, kv_bar, q_ring, do_ring, stats_ring, ld_bars, empty_bars, ds_smem, ds_full,
                 ds_empty, dq_smem, dq_desc,
                 Lse, Delta, DK, DV, DQacc, stride_dkb, stride_dkh, stride_dkt, sm_scale, qk_scale,
                 H_Q, GROUP, N_CTX_Q, N_CTX_K, N_PAD_Q, b, hk, acc_h0, start_n, m_lo, n_m, n_iters,
                 WG: ttgl.constexpr, HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr,
                 BLOCK_N: ttgl.constexpr, NUM_STAGES: ttgl.constexpr, PREFETCH: ttgl.constexpr,
                 DQ_SPLIT: ttgl.constexpr, DQ_TMA: ttgl.constexpr, STATS_SMEM: ttgl.constexpr,
                 stat_h0, stat_t, q0, dq0, CuSeqK, BHK0, H_K, PAIR_GROUP: ttgl.constexpr, VARLEN: ttgl.constexpr,
                 SeqOrder, SEQ_ORDER: ttgl.constexpr, DQ_ASYNC: ttgl.constexpr, LATE_RELEASE: ttgl.constexpr,
                 DQ_BUFS: ttgl.constexpr, DQ_EARLY: ttgl.constexpr, STEP_ORDER: ttgl.constexpr,
                 ST_AHEAD: ttgl.constexpr = False):
    """Consumer warpgroup WG of the fused backward: keys start_n + WG * 64 + [0, 64) of K/V head (b, hk), their
    dK / dV accumulated over every step (all GROUP query heads, every query block that sees them), and every
    other step's dQ for all 128 keys of the program (step i's dQ is warpgroup i % 2's). Per step, on the
    transposed scores (keys x queries):
        S^T = K_w Q^T, dP^T = V_w dO^T (async together), P^T = exp2(S^T * qk_scale - lse), dV_w += P^T dO,
        dS^T = P^T (dP^T - delta), dK_w += dS^T Q; dS^T (16-bit) goes to shared memory (rows WG * 64..)
    and, on its turn, dQ^T [D, BLOCK_M] = K^T dS^T over both warpgroups' rows, added in fp32 to DQacc
    ([this launch's query heads, D, N_PAD_Q]: queries contiguous, so four lanes' adds cover 32 bytes of a row).
    Forms (constexprs; the shipped ones are FB_DQ_TMA, FB_STATS_SMEM and FB_DQ_SPLIT, all GPU-timed:
    BENCHMARKS.md): DQ_TMA adds dQ^T by a TMA reduce-add from a shared-memory staging tile (dq_smem[WG],
    dq_desc) instead of fp32 atomics (no per-element addresses in registers); STATS_SMEM reads lse / delta from
    the ring slot, where the producer put them (no global loads here); DQ_SPLIT (D 128) has both warpgroups
    compute half of dQ^T's rows every step; PREFETCH (probe only) loads the next step's lse / delta a step
    ahead (the kernel then passes STATS_SMEM False here and to the producer: nothing is staged); DQ_ASYNC (probe
    only, with DQ_SPLIT) issues the step's dQ^T matmul right behind dK's, asynchronously, and waits for all three
    together (otherwise dQ^T's starts once dK and dV have retired): the tensor cores get it without a gap, at the
    price of its accumulator live beside P^T and dS^T (offline sm_90: 24-40 bytes of spill dense, none packed).
    LATE_RELEASE (shipped, FB_LATE_RELEASE; with DQ_SPLIT and not DQ_ASYNC) gives the Q / dO slot back after the step's dQ^T matmul,
    together with dS^T's buffer, instead of right after dK's and dV's; at two stages one arrive on empty_bars then
    signals both (_fb_one_release), two arrives a step instead of three. Triton 3.6 syncs the warpgroup (bar.sync)
    after every mbarrier arrive before the next shared-memory or mbarrier operation, and before an arrive that
    follows one (offline, a minimal kernel: arrive-arrive, arrive-wait and wait-arrive each get one, wait-wait none),
    so the step's syncs go from 7 to 5 (offline sm_90, d128: 31 BAR.SYNC in the build against 36, no spill); the
    producer refills the slot a matmul later (two stages: the next step's is in). On the H200 it took 0.6-1.8% off
    fwd+bwd at three model shapes (BENCHMARKS.md forty-fifth run), so it ships.
    DQ_BUFS 2 (probe only, with DQ_TMA, DQ_SPLIT and not DQ_ASYNC; _fb_dq_tiles) gives each warpgroup two dQ^T
    staging tiles used in turn, so a step waits for the reduce of two steps back to have read its tile, not the
    last step's (32 KiB more shared memory: 230832 bytes at d128, of 232448).
    DQ_EARLY (probe only, with DQ_SPLIT and not DQ_ASYNC; 0 off) issues dQ^T's matmul (as soon as both warpgroups'
    dS^T rows are in) before dK's, and dQ^T's staging store and reduce run while dK's matmul is still on the tensor
    cores; otherwise dQ^T's matmul starts once dK's and dV's retired and its staging store and reduce follow with
    none of this warpgroup's matmuls in flight. 1: FlashAttention-4's SM90 order, dV's matmul waits until dS^T is
    computed and stored, then dV, dQ^T and dK go out back to back (dV no longer overlaps dS^T's arithmetic, and
    P^T's registers are live until dV retires, beside dQ^T's accumulator); 2: dV's issued before dS^T's arithmetic
    as shipped, retired before dQ^T's matmul goes out (P^T's registers free first).
    ST_AHEAD (probe only, with DQ_SPLIT and DQ_TMA's one staging tile, not DQ_ASYNC nor DQ_EARLY; _fb_st_ahead)
    computes the next step's S^T inside this step: its matmul goes out once dQ^T is in the staging tile, and runs
    while the warpgroup fences the tile and issues the reduce (otherwise none of this warpgroup's matmuls is on
    the tensor cores from dQ^T's end to the next step's start); the next step then issues only dP^T and starts on
    P^T at once. Step 0's is computed before the loop; the one after the last step reads a ring slot no load
    refills (its result unused). S^T is waited for inside the step that issues it: an accumulator in flight
    across the loop's back edge got every wgmma of the kernel serialized by ptxas (C7514, offline sm_90), so the
    finished S^T (32 fp32 registers a thread) is what crosses it (offline sm_90, d128: 28 bytes of spill, three
    64-bit reloads a step).
    (Two more forms
    were timed and removed: P^T / dS^T from shared memory as the A operands, and red.global.add.v2.f32 adds;
    BENCHMARKS.md.) Packed sequences (the kernel's VARLEN): N_CTX_Q / N_CTX_K are the sequence's lengths, q0 its
    first packed query row (0 when dense) and dq0 its first column in DQacc (q0, or the kernel's DQ_PAD placement),
    stat_h0 / stat_t address lse / delta (_fb_row_stats); `b` only places
    dK / dV (b * stride_dkb): there it is the sequence's first key row and stride_dkb the token stride (one scalar
    fewer live across the steps than a separate offset, which spilled at D 128)."""
    dtype: ttgl.constexpr = k_smem.dtype
    EARLY: ttgl.constexpr = DQ_EARLY > 0 and DQ_SPLIT and not DQ_ASYNC
    DV_LATE: ttgl.constexpr = EARLY and DQ_EARLY == 1  # dV's matmul issued once dS^T is in, not before its arithmetic
    AHEAD: ttgl.constexpr = _fb_st_ahead(ST_AHEAD, DQ_SPLIT, DQ_ASYNC, DQ_EARLY, DQ_TMA, DQ_BUFS)
    HALF: ttgl.constexpr = BLOCK_N // 2
    st_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_M, HEAD_DIM)[0]
    acc_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_M, HEAD_DIM)[1]
    a_layout: ttgl.constexpr = _wgmma_layouts(4, BLOCK_M, HEAD_DIM)[2]
    col_layout: ttgl.constexpr = ttgl.SliceLayout(0, st_layout)
    k_w = k_smem.slice(WG * HALF, HALF, dim=0)
    v_w = v_smem.slice(WG * HALF, HALF, dim=0)
    offs_n = start_n + WG * HALF + ttgl.arange(0, HALF, layout=ttgl.SliceLayout(1, st_layout))
    ragged = start_n + BLOCK_N > N_CTX_K
    zero_st = ttgl.zeros([HALF, BLOCK_M], ttgl.float32, st_layout)
    DQ_ROWS: ttgl.constexpr = HEAD_DIM // 2 if DQ_SPLIT else HEAD_DIM  # rows of dQ^T this warpgroup computes a step
    zero_dq = ttgl.zeros([DQ_ROWS, BLOCK_M], ttgl.float32, st_layout)
    dk = ttgl.zeros([HALF, HEAD_DIM], ttgl.float32, acc_layout)
    dv = ttgl.zeros([HALF, HEAD_DIM], ttgl.float32, acc_layout)
    offs_d = ttgl.arange(0, DQ_ROWS, layout=ttgl.SliceLayout(1, st_layout))
    if PREFETCH:  # step 0's lse / delta; each step then loads the next step's before its own matmuls
        lse_n, delta_n = _fb_row_stats(Lse, Delta, stat_h0, q0, 0, n_iters, m_lo, n_m, stat_t, N_CTX_Q, BLOCK_M,
                                       col_layout, GROUP, STEP_ORDER)
    mbarrier.wait(kv_bar, 0)
    if AHEAD:  # step 0's S^T (each step computes the next one's: st_next)
        mbarrier.wait(ld_bars.index(0), 0, pred=n_iters > 0)
        st_next = warpgroup_mma_wait(0, deps=[warpgroup_mma(k_w, q_ring.index(0).permute((1, 0)), zero_st,
                                                            use_acc=False, is_async=True)])
    for i in range(n_iters):
        slot = i % NUM_STAGES
        g, qb = _fb_step(i, n_m, m_lo, GROUP, STEP_ORDER)
        start_m = qb * BLOCK_M
        offs_m = start_m + ttgl.arange(0, BLOCK_M, layout=col_layout)
        if PREFETCH:
            lse2 = lse_n
            delta = delta_n
            lse_n, delta_n = _fb_row_stats(Lse, Delta, stat_h0, q0, i + 1, n_iters, m_lo, n_m, stat_t, N_CTX_Q,
                                           BLOCK_M,
                                           col_layout, GROUP, STEP_ORDER)
        if not AHEAD:  # (AHEAD: waited for before this step's S^T went out, in the step before)
            mbarrier.wait(ld_bars.index(slot), (i // NUM_STAGES) & 1)
        q_s = q_ring.index(slot)
        do_s = do_ring.index(slot)
        if not PREFETCH and not STATS_SMEM:  # loaded once the slot is in: not live across the wait
            lse2, delta = _fb_row_stats(Lse, Delta, stat_h0, q0, i, n_iters, m_lo, n_m, stat_t, N_CTX_Q, BLOCK_M,
                                        col_layout, GROUP, STEP_ORDER)
        if AHEAD:  # S^T is in (the step before computed it); dP^T goes out alone
            dpt_tok = warpgroup_mma(v_w, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            st = st_next
        else:
            st, dpt_tok = _bwd_st_dpt(k_w, v_w, q_s, do_s, zero_st)
        if STATS_SMEM:  # each read from the slot just before its use: not live across the matmuls
            lse2 = stats_ring.index(2 * slot).load(col_layout)
        pt = ttgl.exp2(st * qk_scale - lse2[None, :])
        # keys past T_k (zero rows of K) would give P = e^-lse, and dS = -P delta could overflow 16 bits: masked.
        # Causal (T_q == T_k): a valid query and a key past T_k only meet in a step that crosses the diagonal,
        # whose mask (query >= key) drops that key; other steps need no mask. Packed rows (VARLEN) take the mask at
        # every step (true below the diagonal): behind the diagonal test their D-128 build kept a word of the
        # branch on the stack (8 bytes), without it none.
        if CAUSAL:
            if VARLEN:
                pt = ttgl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
            elif start_m < start_n + (WG + 1) * HALF:
                pt = ttgl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
        else:
            if ragged:
                pt = ttgl.where((offs_n < N_CTX_K)[:, None], pt, 0.0)
        pt16 = ttgl.convert_layout(pt.to(dtype), a_layout)
        if DV_LATE:  # dV's matmul goes out with dQ^T's, once dS^T is in (below)
            dpt = warpgroup_mma_wait(0, deps=[dpt_tok])
        else:
            dv_tok = warpgroup_mma(pt16, do_s, dv, is_async=True)
            dpt = warpgroup_mma_wait(1, deps=[dpt_tok])  # dP^T retired, dV may still run
        if STATS_SMEM:  # read late: not live across the dV issue
            delta = stats_ring.index(2 * slot + 1).load(col_layout)
        ds = (pt * (dpt - delta[None, :])).to(dtype)
        # dS^T rows of this warpgroup into the step's buffer (parity i % 2), once the dQ that read it two steps ago
        # is done
        par = i % 2
        use = i // 2
        if _fb_one_release(LATE_RELEASE, DQ_SPLIT, DQ_ASYNC, NUM_STAGES):  # the slot's release is dS^T's too
            mbarrier.wait(empty_bars.index(par), (use & 1) ^ 1, pred=use > 0)
        else:
            mbarrier.wait(ds_empty.index(par), (use & 1) ^ 1, pred=use > 0)
        ds_smem.index(par).slice(WG * HALF, HALF, dim=0).store(ds)
        fence_async_shared()
        ttgl.thread_barrier()
        mbarrier.arrive(ds_full.index(par), count=1)
        ds16 = ttgl.convert_layout(ds, a_layout)
        head = acc_h0 + g
        if EARLY:  # dQ^T's and dK's matmuls issued back to back; dQ^T's reduce goes out while dK's runs
            if DV_LATE:  # dV, dQ^T, dK back to back
                dv_tok = warpgroup_mma(pt16, do_s, dv, is_async=True)
                mbarrier.wait(ds_full.index(par), use & 1)
                dq_tok = warpgroup_mma(k_smem.slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0)),
                                       ds_smem.index(par), zero_dq, use_acc=False, is_async=True)
                dv, pt16 = warpgroup_mma_wait(1, deps=[dv_tok, pt16])  # dV retired, dQ^T may still run
            else:  # dV, issued before dS^T's arithmetic, retired first: P^T's registers free before dQ^T's acc
                dv, pt16 = warpgroup_mma_wait(0, deps=[dv_tok, pt16])
                mbarrier.wait(ds_full.index(par), use & 1)
                dq_tok = warpgroup_mma(k_smem.slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0)),
                                       ds_smem.index(par), zero_dq, use_acc=False, is_async=True)
            dk_tok = warpgroup_mma(ds16, q_s, dk, is_async=True)
            dqt = warpgroup_mma_wait(1, deps=[dq_tok])  # dQ^T retired (dS^T's buffer read), dK may still run
            if not _fb_one_release(LATE_RELEASE, DQ_SPLIT, DQ_ASYNC, NUM_STAGES):
                ttgl.thread_barrier()
                mbarrier.arrive(ds_empty.index(par), count=1)
            _fb_dq_out(dq_desc, dq_smem, DQacc, dqt, head, WG * DQ_ROWS, par, WG, dq0 + start_m, dq0 + offs_m, offs_d,
                       N_PAD_Q, HEAD_DIM, DQ_TMA, DQ_BUFS)
            dk, ds16 = warpgroup_mma_wait(0, deps=[dk_tok, ds16])
            ttgl.thread_barrier()  # every warp's wgmma on this slot is done (at one release, on dS^T's buffer too)
            mbarrier.arrive(empty_bars.index(slot), count=1)
        else:
            dk_tok = warpgroup_mma(ds16, q_s, dk, is_async=True)
            if DQ_SPLIT and DQ_ASYNC:  # dQ^T's matmul issued behind dK's, the three retired together
                mbarrier.wait(ds_full.index(par), use & 1)
                dq_tok = warpgroup_mma(k_smem.slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0)),
                                       ds_smem.index(par), zero_dq, use_acc=False, is_async=True)
                dv, dk, dqt, pt16, ds16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, pt16, ds16])
                ttgl.thread_barrier()  # every warp's wgmma on this slot and on dS^T is done
                mbarrier.arrive(empty_bars.index(slot), count=1)
                mbarrier.arrive(ds_empty.index(par), count=1)
                _fb_dq_out(dq_desc, dq_smem, DQacc, dqt, head, WG * DQ_ROWS, par, WG, dq0 + start_m, dq0 + offs_m,
                           offs_d, N_PAD_Q, HEAD_DIM, DQ_TMA, 1)
            else:  # dV and dK retired together
                dv, dk, pt16, ds16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, pt16, ds16])
                if not (LATE_RELEASE and DQ_SPLIT):
                    ttgl.thread_barrier()  # every warp's wgmma on this slot is done: the producer may refill it
                    mbarrier.arrive(empty_bars.index(slot), count=1)
            if DQ_SPLIT and not DQ_ASYNC:  # both warpgroups, each its half of D: dQ^T[WG*D/2 ..] = K[:, half]^T dS^T
                mbarrier.wait(ds_full.index(par), use & 1)
                dqt = warpgroup_mma(k_smem.slice(WG * DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0)), ds_smem.index(par),
                                    zero_dq, use_acc=False)
                ttgl.thread_barrier()
                if LATE_RELEASE:  # the slot's last reader (dK's matmul) retired before dQ^T's started
                    mbarrier.arrive(empty_bars.index(slot), count=1)
                if not _fb_one_release(LATE_RELEASE, DQ_SPLIT, DQ_ASYNC, NUM_STAGES):
                    mbarrier.arrive(ds_empty.index(par), count=1)
                if AHEAD:  # dQ^T staged, the next step's S^T out, then the fence and the reduce while it runs
                    dq_stage = dq_smem.index(WG)
                    _fb_stage_dq(dq_stage, dqt)
                    nxt = i + 1
                    nslot = nxt % NUM_STAGES
                    mbarrier.wait(ld_bars.index(nslot), (nxt // NUM_STAGES) & 1, pred=nxt < n_iters)
                    st_tok = warpgroup_mma(k_w, q_ring.index(nslot).permute((1, 0)), zero_st, use_acc=False,
                                           is_async=True)
                    _fb_issue_dq(dq_desc, dq_stage, head, WG * DQ_ROWS, dq0 + start_m)
                    st_next = warpgroup_mma_wait(0, deps=[st_tok])
                else:
                    _fb_dq_out(dq_desc, dq_smem, DQacc, dqt, head, WG * DQ_ROWS, par, WG, dq0 + start_m,
                               dq0 + offs_m, offs_d, N_PAD_Q, HEAD_DIM, DQ_TMA, DQ_BUFS)
            elif not DQ_SPLIT:
                if par == WG:
                    mbarrier.wait(ds_full.index(par), use & 1)
                    dqt = warpgroup_mma(k_smem.permute((1, 0)), ds_smem.index(par), zero_dq, use_acc=False)
                    ttgl.thread_barrier()
                    mbarrier.arrive(ds_empty.index(par), count=1)
                    _fb_dq_out(dq_desc, dq_smem, DQacc, dqt, head, 0, par, WG, dq0 + start_m, dq0 + offs_m, offs_d,
                               N_PAD_Q, HEAD_DIM, DQ_TMA, 1)
    if DQ_TMA:
        tma.store_wait(0)  # the last reduce has read its staging tile before the program's shared memory goes
    if VARLEN:  # the sequence's first key row and the K/V head from the program's ids again: not live across the steps
        _, pair = _fb_pair(PAIR_GROUP)
        h_in = acc_h0 // GROUP  # pair % H_K, from a value live anyway (pair // H_K would be the prologue's, kept)
        seq = (pair - h_in) // H_K
        if SEQ_ORDER:
            seq = ttgl.load(SeqOrder + seq)
        b = ttgl.load(CuSeqK + seq)
        hk = BHK0 + h_in
    _store_dkdv(DK, DV, dk, dv, sm_scale, b, hk, start_n + WG * HALF, stride_dkb, stride_dkh, stride_dkt, N_CTX_K,
                HALF, HEAD_DIM, acc_layout)


@gluon.jit
def _fb_producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, q_ring, do_ring, stats_ring, ld_bars,
                 empty_bars, Lse, Delta, b, hk, start_n, m_lo, n_m, n_iters, H_Q, GROUP, N_CTX_Q,
                 HEAD_DIM: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
                 NUM_STAGES: ttgl.constexpr, STATS_SMEM: ttgl.constexpr, PRODUCER_WARPS: ttgl.constexpr,
                 stat_h0, stat_t, q0, k0, STATS_AHEAD: ttgl.constexpr = False, STEP_ORDER: ttgl.constexpr = 0):
    """The load warp of the fused backward: the program's K and V block once, then each step's Q and dO tiles
    into ring slot i % NUM_STAGES once both consumers released the step that held it before; with STATS_SMEM
    also the step's lse * log2(e) and delta (stats_ring rows 2 * slot and 2 * slot + 1), stored before the slot's
    mbarrier arrive that the consumers wait on. The shipped order loads a step's lse / delta from global memory
    after its slot is free, so the Q / dO copies go out one global-load latency after the release; STATS_AHEAD
    (probe only, with STATS_SMEM) loads them a step ahead, before the wait for the slot, so the copies go out as
    soon as it is free (Nsight Compute, BENCHMARKS.md forty-ninth run: at Qwen3-32B T8192 the consumers waited
    for their Q / dO tiles in 6.3% of the backward's samples, FlashAttention-4's in 0.2%)."""
    dtype: ttgl.constexpr = q_desc.dtype
    TILE_BYTES: ttgl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    KV_BYTES: ttgl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    stat_layout: ttgl.constexpr = ttgl.BlockedLayout([1], [32], [PRODUCER_WARPS], [0])
    kv_box: ttgl.constexpr = [1, 1, BLOCK_N, HEAD_DIM]
    mbarrier.expect(kv_bar, 2 * KV_BYTES)
    tma.async_copy_global_to_shared(k_desc, [b, hk, k0 + start_n, 0], kv_bar,
                                    k_smem._reinterpret(dtype, kv_box, k_desc.layout))
    tma.async_copy_global_to_shared(v_desc, [b, hk, k0 + start_n, 0], kv_bar,
                                    v_smem._reinterpret(dtype, kv_box, v_desc.layout))
    AHEAD: ttgl.constexpr = STATS_SMEM and STATS_AHEAD
    if AHEAD:  # step 0's lse / delta; each step then starts the next one's loads before waiting for its slot
        lse_n, delta_n = _fb_row_stats(Lse, Delta, stat_h0, q0, 0, n_iters, m_lo, n_m, stat_t, N_CTX_Q, BLOCK_M,
                                       stat_layout, GROUP, STEP_ORDER)
    for i in range(n_iters):
        slot = i % NUM_STAGES
        if AHEAD:
            lse2 = lse_n
            delta = delta_n
            lse_n, delta_n = _fb_row_stats(Lse, Delta, stat_h0, q0, i + 1, n_iters, m_lo, n_m, stat_t, N_CTX_Q,
                                           BLOCK_M, stat_layout, GROUP, STEP_ORDER)
        mbarrier.wait(empty_bars.index(slot), ((i // NUM_STAGES) & 1) ^ 1, pred=i >= NUM_STAGES)
        if STATS_SMEM:
            if not AHEAD:
                lse2, delta = _fb_row_stats(Lse, Delta, stat_h0, q0, i, n_iters, m_lo, n_m, stat_t, N_CTX_Q, BLOCK_M,
                                            stat_layout, GROUP, STEP_ORDER)
            stats_ring.index(2 * slot).store(lse2)
            stats_ring.index(2 * slot + 1).store(delta)
            ttgl.thread_barrier()  # every lane's stores come before the arrive (expect) that publishes the slot
        _bwd_issue_qdo(q_desc, do_desc, q_ring, do_ring, ld_bars, i, n_iters, n_m, m_lo, b, hk, GROUP,
                       BLOCK_M, HEAD_DIM, NUM_STAGES, TILE_BYTES, q0, STEP_ORDER)


@gluon.jit
def _attn_bwd_fused_gluon_kernel(
    q_desc, k_desc, v_desc, do_desc, Lse, Delta, DK, DV, DQacc, dq_desc,
    stride_dkb, stride_dkh, stride_dkt,
    sm_scale, qk_scale, H_Q, H_K, GROUP, N_CTX_Q, N_CTX_K, N_PAD_Q, BHK0,
    HEAD_DIM: ttgl.constexpr, CAUSAL: ttgl.constexpr, BLOCK_M: ttgl.constexpr, BLOCK_N: ttgl.constexpr,
    NUM_STAGES: ttgl.constexpr, CONSUMER_REGS: ttgl.constexpr, PRODUCER_WARPS: ttgl.constexpr,
    PRODUCER_REGS: ttgl.constexpr, PREFETCH: ttgl.constexpr = False, DQ_SPLIT: ttgl.constexpr = False,
    DQ_TMA: ttgl.constexpr = False, STATS_SMEM: ttgl.constexpr = False, PAIR_GROUP: ttgl.constexpr = 1,
    CuSeqQ=None, CuSeqK=None, VARLEN: ttgl.constexpr = False, DQ_PAD: ttgl.constexpr = 0,
    SeqOrder=None, SEQ_ORDER: ttgl.constexpr = False, DQ_ASYNC: ttgl.constexpr = False,
    LATE_RELEASE: ttgl.constexpr = False, DQ_BUFS: ttgl.constexpr = 1, DQ_EARLY: ttgl.constexpr = 0,
    STATS_AHEAD: ttgl.constexpr = False, STEP_ORDER: ttgl.constexpr = 0, ST_AHEAD: ttgl.constexpr = False,
):
    """dK, dV of one 128-key block of one (b, K/V head) and its share of dQ (fp32, added into DQacc), in one
    pass over the query blocks that see it: FlashAttention-3's 5-matmul backward with two consumer warpgroups
    (64 keys each: the default partition and a 4-warp worker) and a 1-warp TMA producer (_fb_consumer,
    _fb_producer). Same inputs as _attn_bwd_dkdv_gluon_kernel. The grid order (fb_pair_group): PAIR_GROUP 1,
    program (i, j) serves key block i of (b, K/V head) pair BHK0 + j (a pair's key blocks together,
    FlashAttention-3's order); 0, program (j, i) does (every pair's key block 0 first, the longest programs under
    causal masking); n > 1 (a probe knob), program (i, j) serves key block i // n of pair BHK0 + j * n + i % n
    (groups of n pairs, key blocks interleaved within a group). DQacc holds the query heads of this launch's
    (b, K/V heads) only (its head acc_h0 + g). dq_desc: a TMA descriptor over DQacc ([heads, D, N_PAD_Q], box
    [1, dQ^T rows a warpgroup, BLOCK_M]) with DQ_TMA, else None.

    VARLEN (backward_fused_varlen): packed sequences, the descriptors over [1, H, total, D] views of [total, H, D];
    a "pair" is (sequence, K/V head BHK0 + j) for j < H_K (this launch's K/V heads), sequence-major; N_CTX_Q is the
    packed query count (lse / delta are [Hq, total_q]). DQacc's columns are packed query rows when DQ_PAD is 0
    (the caller knows every sequence starts at a multiple of 64), else sequence b's dQ^T starts at column
    roundup(q0, DQ_PAD) + b * DQ_PAD (dq_pad_start: a multiple of DQ_PAD, so every TMA reduce-add box starts
    aligned, with room for the sequence's last query block before the next one's). Each program reads
    its sequence's first rows and lengths from CuSeqQ / CuSeqK and works in the sequence's own positions: Q / dO
    rows past the sequence's end (the next sequence's) get lse +inf, so P = dS = 0 for them, and keys past it are
    masked as a ragged tail is. SEQ_ORDER (VARLEN): the grid's n-th sequence is SeqOrder[n] (int32, a permutation
    of the sequences: backward_fused_varlen's env HEARTH_ATTN_FB_SEQ_ORDER=1 puts the longest first); every placement
    (rows, dQ^T columns, dK / dV) stays the sequence's own."""
    dtype: ttgl.constexpr = q_desc.dtype
    qd_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    ds_shared: ttgl.constexpr = ttgl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    DQ_ROWS: ttgl.constexpr = HEAD_DIM // 2 if DQ_SPLIT else HEAD_DIM
    STAGED: ttgl.constexpr = STATS_SMEM and not PREFETCH  # PREFETCH loads lse / delta itself: nothing to stage

    kb, pair = _fb_pair(PAIR_GROUP)
    start_n = kb * BLOCK_N
    if VARLEN:
        b = pair // H_K  # the sequence
        if SEQ_ORDER:
            b = ttgl.load(SeqOrder + b)
        hk = BHK0 + pair % H_K
        acc_h0 = (pair % H_K) * GROUP  # this launch's first query head in DQacc
        q0 = ttgl.load(CuSeqQ + b)
        k0 = ttgl.load(CuSeqK + b)
        if DQ_PAD:
            dq0 = (q0 + DQ_PAD - 1) // DQ_PAD * DQ_PAD + b * DQ_PAD  # dq_pad_start
        else:
            dq0 = q0
        stat_h0 = hk * GROUP
        stat_t = N_CTX_Q
        N_CTX_Q = ttgl.load(CuSeqQ + b + 1) - q0
        N_CTX_K = ttgl.load(CuSeqK + b + 1) - k0
        b = b * 0  # the descriptors' batch index
        dk_b = k0  # the consumers' dK / dV "batch" index: stride_dkb is the token stride (backward_fused_varlen)
    else:
        bhk = BHK0 + pair
        acc_h0 = pair * GROUP  # this launch's first query head in DQacc
        b = bhk // H_K
        hk = bhk % H_K
        q0 = 0
        k0 = 0
        dq0 = 0
        stat_h0 = b * H_Q + hk * GROUP
        stat_t = N_CTX_Q
        dk_b = b
    if CAUSAL:
        m_lo = start_n // BLOCK_M
    else:
        m_lo = start_n * 0
    n_m = ttgl.maximum(ttgl.cdiv(N_CTX_Q, BLOCK_M) - m_lo, 0)
    n_m = ttgl.where(start_n < N_CTX_K, n_m, 0)  # a key block past the (packed) sequence's keys: no steps
    n_iters = GROUP * n_m
    n_m = ttgl.maximum(n_m, 1)

    k_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_shared)
    v_smem = ttgl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_shared)
    q_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], qd_shared)
    do_ring = ttgl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], qd_shared)
    ds_smem = ttgl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_shared)
    if STAGED:
        stats_ring = ttgl.allocate_shared_memory(ttgl.float32, [2 * NUM_STAGES, BLOCK_M],
                                                 ttgl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        stats_ring = ds_smem  # a stand-in (warp_specialize takes no None); the form's code is compiled out
    if DQ_TMA:  # one staging tile per consumer warpgroup (two with DQ_BUFS 2), in the swizzle of dq_desc's box
        DQ_TILES: ttgl.constexpr = _fb_dq_tiles(DQ_BUFS, DQ_SPLIT, DQ_ASYNC)
        dq_smem = ttgl.allocate_shared_memory(ttgl.float32, [DQ_TILES, DQ_ROWS, BLOCK_M],
                                              ttgl.NVMMASharedLayout.get_default_for([DQ_ROWS, BLOCK_M], ttgl.float32))
    else:
        dq_smem = ds_smem  # stand-ins, as stats_ring's
        dq_desc = q_desc
    kv_bar = ttgl.allocate_shared_memory(ttgl.int64, [1], mbarrier.MBarrierLayout())
    ld_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = ttgl.allocate_shared_memory(ttgl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_empty = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.init(ld_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # both consumers release a slot
    for i in ttgl.static_range(2):
        mbarrier.init(ds_full.index(i), count=2)  # both consumers' dS^T rows are in
        mbarrier.init(ds_empty.index(i), count=2 if DQ_SPLIT else 1)  # the dQ warpgroup(s) read them
    fence_async_shared()

    cu_k = CuSeqK if VARLEN else Lse  # a stand-in when dense (warp_specialize takes no None)
    seq_order = SeqOrder if SEQ_ORDER else Lse  # likewise
    ttgl.warp_specialize(
        [(_fb_consumer, (k_smem, v_smem, kv_bar, q_ring, do_ring, stats_ring, ld_bars, empty_bars, ds_smem, ds_full,
                         ds_empty, dq_smem, dq_desc, Lse, Delta, DK, DV, DQacc, stride_dkb, stride_dkh, stride_dkt,
                         sm_scale, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_PAD_Q, dk_b, hk, acc_h0, start_n, m_lo, n_m,
                         n_iters, 0, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, PREFETCH, DQ_SPLIT, DQ_TMA,
                         STAGED, stat_h0, stat_t, q0, dq0, cu_k, BHK0, H_K, PAIR_GROUP, VARLEN, seq_order,
                         SEQ_ORDER, DQ_ASYNC, LATE_RELEASE, _fb_dq_tiles(DQ_BUFS, DQ_SPLIT, DQ_ASYNC) // 2,
                         DQ_EARLY, STEP_ORDER, ST_AHEAD)),
         (_fb_consumer, (k_smem, v_smem, kv_bar, q_ring, do_ring, stats_ring, ld_bars, empty_bars, ds_smem, ds_full,
                         ds_empty, dq_smem, dq_desc, Lse, Delta, DK, DV, DQacc, stride_dkb, stride_dkh, stride_dkt,
                         sm_scale, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K, N_PAD_Q, dk_b, hk, acc_h0, start_n, m_lo, n_m,
                         n_iters, 1, HEAD_DIM, CAUSAL, BLOCK_M, BLOCK_N, NUM_STAGES, PREFETCH, DQ_SPLIT, DQ_TMA,
                         STAGED, stat_h0, stat_t, q0, dq0, cu_k, BHK0, H_K, PAIR_GROUP, VARLEN, seq_order,
                         SEQ_ORDER, DQ_ASYNC, LATE_RELEASE, _fb_dq_tiles(DQ_BUFS, DQ_SPLIT, DQ_ASYNC) // 2,
                         DQ_EARLY, STEP_ORDER, ST_AHEAD)),
         (_fb_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, q_ring, do_ring, stats_ring, ld_bars,
                         empty_bars, Lse, Delta, b, hk, start_n, m_lo, n_m, n_iters, H_Q, GROUP, N_CTX_Q, HEAD_DIM,
                         BLOCK_M, BLOCK_N, NUM_STAGES, STAGED, PRODUCER_WARPS, stat_h0, stat_t, q0,
                         k0, STATS_AHEAD, STEP_ORDER))],
        [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])

    mbarrier.invalidate(kv_bar)
    for i in ttgl.static_range(NUM_STAGES):
        mbarrier.invalidate(ld_bars.index(i))
        mbarrier.invalidate(empty_bars.index(i))
    for i in ttgl.static_range(2):
        mbarrier.invalidate(ds_full.index(i))
        mbarrier.invalidate(ds_empty.index(i))


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def supported(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether this kernel serves (GPU compute capability, dtype, head dim) at all."""
    return capability is not None and capability[0] == 9 and dtype in DTYPES and head_dim in HEAD_DIMS


_GL_DTYPES = {torch.bfloat16: ttgl.bfloat16, torch.float16: ttgl.float16}


@functools.lru_cache(maxsize=None)
def _layout(box: tuple[int, ...], dtype) -> ttgl.NVMMASharedLayout:
    """The shared layout of one TMA box of `dtype` (the 2-D tile's swizzle; unit leading dims add nothing). Cached:
    get_default_for is a constexpr_function building a validated dataclass, tens of microseconds of host time on
    the H200's host, and every launch needs four or five of these."""
    return ttgl.NVMMASharedLayout.get_default_for(list(box), dtype)


def _desc(base: torch.Tensor, block_shape: list[int], layout) -> TensorDescriptor:
    """TensorDescriptor(base, shape, strides, block_shape, layout) with the fields set directly: the caller has
    checked what its __post_init__ asserts (tma_addressable: a unit last stride, 16-byte aligned base and outer
    strides; attention's argument checks: no empty dim; the block shapes and layouts here are fixed). The
    dataclass init and those asserts cost more host time than the rest of a launch's argument handling; the tests
    check that the result equals the validating constructor's."""
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = (
        base, list(base.shape), list(base.stride()), block_shape, layout, "zero")
    return d


def _host_desc(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A host-built TMA descriptor over t [B, H, T, D] (t's own strides) that loads / stores one
    [1, 1, rows, D] box: out-of-range rows of a ragged tile are zero-filled / clipped within the head."""
    D = t.shape[-1]
    return _desc(t, [1, 1, rows, D], _layout((1, 1, rows, D), _GL_DTYPES[t.dtype]))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            store_lse: bool = True, ping_pong: bool | None = None, persistent: bool | None = None):
    """(out [B, Hq, Tq, D], lse [B, Hq, Tq] fp32) like attention._attention_forward. The caller checked
    the arguments and ``supported`` / ``tma_addressable``. store_lse=False (no backward will run): lse is
    None, neither allocated nor written (the STORE_LSE constexpr). ping_pong: the ping-pong kernel (True),
    the other (False), or as PING_PONG says (None; attention.forward_kernel passes its choice). persistent:
    the ping-pong kernel's persistent form (True; two-consumer configs only), its per-tile form (False), or as
    PERSISTENT says (None)."""
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    out = empty_heads_like(q, (B, Hq, Tq, D))  # in q's memory order, as attention._attention_forward
    lse = torch.empty((B, Hq, Tq), dtype=torch.float32, device=q.device) if store_lse else None
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2))
    if PING_PONG if ping_pong is None else ping_pong:
        block_m, descs, meta = _pp_launch(q, k, v, out, causal)
        # the persistent kernel's lse row offset is int32 (_pps_consumer): B * Hq * Tq < 2^31 wherever q fits
        if (PERSISTENT if persistent is None else persistent) and B * Hq * Tq < 2**31:
            n_m = cdiv(Tq, 2 * block_m)
            programs = min(n_m * B * Hq, num_sms(q.device))
            section = pps_section(B * Hq, Hq // Hk, Tk, D, q.element_size())
            env = os.environ
            sched = _pps_schedule_tensor(B * Hq, n_m, section, bool(causal), programs, Tq, Tk, block_m,
                                         meta["BLOCK_N"], _env_flag(env, "HEARTH_ATTN_PPS_BALANCE", True),
                                         _pps_tile_cost(env), q.device)
            with on_device(q.device):
                _attn_fwd_gluon_pps_kernel[(programs,)](
                    *descs, lse, scale * LOG2E, Hq, Hq // Hk, Tq, Tk, n_m, sched, section, programs, STORE_LSE=store_lse,
                    **meta,
                )
            return out, lse
        grid = (cdiv(Tq, 2 * block_m), B * Hq)
        with on_device(q.device):
            _attn_fwd_gluon_pp_kernel[grid](
                *descs, lse, scale * LOG2E, Hq, Hq // Hk, Tq, Tk, STORE_LSE=store_lse, **meta,
            )
        return out, lse
    block_m, block_n, warps, stages = CONFIGS[D]
    grid = (cdiv(Tq, block_m), B * Hq)
    # this kernel builds its TMA descriptors on the device, in a global scratch buffer (the allocator is per thread)
    triton.set_allocator(tma_scratch)
    with on_device(q.device):
        _attn_fwd_gluon_kernel[grid](
            q, k, v, out, lse, *strides, scale * LOG2E, Hq, Hq // Hk, Tq, Tk,
            HEAD_DIM=D, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, NUM_WARPS=warps,
            WARP_SPECIALIZE=WARP_SPECIALIZE, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
            STORE_LSE=store_lse, num_warps=warps,
        )
    return out, lse


def backward_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, scale: float) -> None:
    """dK, dV of attention into dk / dv ([B, Hk, Tk, D], one layout, last dim contiguous) with the Gluon kernel
    above; lse and delta are [B, Hq, Tq] fp32 (contiguous), q / do [B, Hq, Tq, D] and k / v TMA-addressable (the
    caller checked ``supported`` and ``tma_addressable``)."""
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    block_n, block_m, stages, warps = BWD_CONFIGS[D]
    grid = (cdiv(Tk, block_n), B * Hk)
    descs = (_host_desc(q, block_m), _host_desc(k, block_n), _host_desc(v, block_n), _host_desc(do, block_m))
    with on_device(q.device):
        _attn_bwd_dkdv_gluon_kernel[grid](
            *descs, lse, delta, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
            scale, scale * LOG2E, Hq, Hk, Hq // Hk, Tq, Tk,
            HEAD_DIM=D, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, NUM_WARPS=warps,
            num_warps=warps,
        )


def backward_dq(q, k, v, do, lse, delta, dq, causal: bool, scale: float) -> None:
    """dQ of attention into dq ([B, Hq, Tq, D], last dim contiguous) with the Gluon kernel above; same contract as
    backward_dkdv."""
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    block_m, block_n, stages, warps = BWD_DQ_CONFIGS[D]
    grid = (cdiv(Tq, block_m), B * Hq)
    descs = (_host_desc(q, block_m), _host_desc(k, block_n), _host_desc(v, block_n), _host_desc(do, block_m))
    with on_device(q.device):
        _attn_bwd_dq_gluon_kernel[grid](
            *descs, lse, delta, dq, dq.stride(0), dq.stride(1), dq.stride(2),
            scale, scale * LOG2E, Hq, Hq // Hk, Tq, Tk,
            HEAD_DIM=D, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, NUM_WARPS=warps,
            num_warps=warps,
        )


@triton.jit
def _dq_from_acc_kernel(Acc, DQ, stride_b, stride_h, stride_t, ROWS, N_CTX_Q, N_PAD_Q, scale, CuSeq, N_BLOCKS,
                        HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, ZERO: tl.constexpr, DQ_PAD: tl.constexpr):
    """dq[b, h, t, :] = scale * Acc[j, :, t] for head j = b * ROWS + h of a fused-backward launch (Acc [heads, D,
    N_PAD_Q] fp32, queries contiguous), cast to dq's dtype; with ZERO the read part of Acc is cleared for the next
    launch. One program: BLOCK_T queries of one head. DQ_PAD (packed sequences placed apart in Acc, the fused
    kernel's DQ_PAD): program axis 0 is (sequence s, block i) = divmod(id, N_BLOCKS); its queries are
    CuSeq[s] + i * BLOCK_T + [0, BLOCK_T), read at the sequence's padded column; blocks past the sequence do
    nothing (the padding past a sequence's end, to its 64-column boundary, only ever receives zeros, and its last
    block clears it)."""
    j = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    if DQ_PAD:
        s = tl.program_id(0) // N_BLOCKS
        r = (tl.program_id(0) % N_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T)  # rows of the sequence
        q0 = tl.load(CuSeq + s)
        n = tl.load(CuSeq + s + 1) - q0
        col = (q0 + DQ_PAD - 1) // DQ_PAD * DQ_PAD + s * DQ_PAD + r
        t = q0 + r
        live = (r < (n + 63) // 64 * 64)[None, :]  # the sequence's 64-column blocks (never the next one's)
        keep = r < n
    else:
        col = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        t = col
        live = (col < N_PAD_Q)[None, :]  # N_PAD_Q is a multiple of 64, not always of BLOCK_T
        keep = t < N_CTX_Q
    src = Acc + j.to(tl.int64) * HEAD_DIM * N_PAD_Q + d[:, None] * N_PAD_Q + col[None, :]
    a = tl.load(src, mask=live, other=0.0)  # DQ_PAD's live blocks stay within their sequence's span
    if ZERO:
        tl.store(src, tl.zeros_like(a), mask=live)
    b = j // ROWS
    h = j - b * ROWS
    dst = DQ + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + t[None, :].to(tl.int64) * stride_t + d[:, None]
    tl.store(dst, (a * scale).to(DQ.dtype.element_ty), mask=keep[None, :])


def _pp_launch(q, k, v, out, causal: bool):
    """The ping-pong forward's (and its persistent form's) launch pieces for [B, H, T, D] views: BLOCK_M, the four
    host descriptors, and the constexprs every launch of it shares (PP_CONFIGS[D], the partitions' registers)."""
    D = q.shape[-1]
    block_m, block_n, stages = PP_CONFIGS[D]
    descs = (_host_desc(q, block_m), _host_desc(k, block_n), _host_desc(v, block_n), _host_desc(out, block_m))
    return block_m, descs, dict(HEAD_DIM=D, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages,
                                CONSUMER_REGS=CONSUMER_REGS, PRODUCER_WARPS=PRODUCER_WARPS,
                                PRODUCER_REGS=PRODUCER_REGS, num_warps=PP_WARPS)


# dq_from_acc's launch: 64 queries a program, 4 warps (not yet swept: the probe knob HEARTH_ATTN_DQ_CONV)
DQ_CONV_BLOCK = 64
DQ_CONV_WARPS = 4


def dq_conv_config(env=None) -> tuple[int, int]:
    """(queries a program, warps) of dq_from_acc's launch: DQ_CONV_BLOCK / DQ_CONV_WARPS, or the probe knob
    HEARTH_ATTN_DQ_CONV="BLOCK_T,WARPS" (BLOCK_T 32-256 and WARPS 1-16, each a power of two)."""
    raw = (os.environ if env is None else env).get("HEARTH_ATTN_DQ_CONV")
    if not raw:
        return DQ_CONV_BLOCK, DQ_CONV_WARPS
    try:
        block, warps = (int(x) for x in raw.split(","))
    except ValueError:
        block = warps = 0
    if block not in (32, 64, 128, 256) or warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"HEARTH_ATTN_DQ_CONV must be 'BLOCK_T,WARPS' with BLOCK_T in 32/64/128/256 and WARPS a "
                         f"power of two up to 16, got {raw!r}")
    return block, warps


def dq_from_acc(acc: torch.Tensor, dq: torch.Tensor, rows: int, n_ctx_q: int, scale: float, zero: bool,
                cu_q: torch.Tensor | None = None, max_q: int = 0, pad: int = 0) -> None:
    """_dq_from_acc_kernel over every head of acc [heads, D, n_pad] (n_pad a multiple of 64) into dq, a [heads //
    rows, rows, T, D] view (last dim contiguous): dq = scale * acc^T per head, and acc cleared when `zero`. pad
    (a multiple of 64; with cu_q, the packed offsets, and max_q, the longest sequence): acc holds the packed
    sequences at dq_pad_starts(cu_q, pad), as the fused kernel's DQ_PAD writes them. Launch: dq_conv_config()."""
    heads, d, n_pad = acc.shape
    if acc.dtype != torch.float32 or not acc.is_contiguous() or n_pad % 64 or heads % rows:
        raise ValueError(f"acc must be a contiguous fp32 [heads, D, n_pad] with n_pad % 64 == 0 and heads % rows == 0, "
                         f"got {acc.dtype} {tuple(acc.shape)}, rows={rows}")
    if dq.dim() != 4 or tuple(dq.shape) != (heads // rows, rows, n_ctx_q, d) or dq.stride(-1) != 1:
        raise ValueError(f"dq must be a [{heads // rows}, {rows}, {n_ctx_q}, {d}] view with a unit last stride, got "
                         f"{tuple(dq.shape)} strides {tuple(dq.stride())}")
    block, warps = dq_conv_config()
    if pad:
        if pad % 64 or cu_q is None or max_q < 1:
            raise ValueError(f"pad must be a multiple of 64 with cu_q and max_q >= 1, got pad={pad}, max_q={max_q}")
        blocks = cdiv(cdiv(max_q, 64) * 64, block)  # a sequence's 64-column blocks, the ones its last clears
        grid = ((cu_q.shape[0] - 1) * blocks, heads)
    else:
        blocks, grid = 1, (cdiv(n_pad, block), heads)
    _dq_from_acc_kernel[grid](acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), rows, n_ctx_q, n_pad, scale, cu_q,
                              blocks, HEAD_DIM=d, BLOCK_T=block, ZERO=zero, DQ_PAD=pad, num_warps=warps)


def dq_pad_starts(cu_q: torch.Tensor, pad: int) -> torch.Tensor:
    """Each packed sequence's first dQ^T column under the fused kernel's DQ_PAD = pad (on the host, for tests and
    sizing): roundup(cu_q[s], pad) + s * pad. Sequence s's roundup(len_s, pad) columns end at or before s + 1's
    start (roundup(a) + roundup(b) <= roundup(a + b) + pad), and the last one by dq_pad_columns(total_q, n, pad)."""
    s = torch.arange(cu_q.shape[0] - 1, device=cu_q.device)
    return (cu_q[:-1] + pad - 1) // pad * pad + s * pad


def dq_pad_columns(total_q: int, n_seqs: int, pad: int) -> int:
    """Columns of the fused backward's dQ^T buffer for n_seqs packed sequences of total_q queries placed by
    DQ_PAD = pad (dq_pad_starts), a multiple of pad."""
    return cdiv(total_q, pad) * pad + n_seqs * pad


def fused_chunk(B: int, Hk: int, group: int, head_dim: int, n_pad: int, budget: int, split: int = 1) -> int:
    """(b, K/V head) pairs per launch of the fused backward: all B * Hk when their fp32 dQ buffer (group * head_dim
    * n_pad * 4 bytes a pair) fits `budget` bytes (0: no bound) and 1 / split of itself (split > 1: a bound of
    whole // split), else the most that fit and either divide Hk (a launch within one batch row) or are whole
    batch rows dividing B, at least 1. acc_budget gives (budget, split)."""
    total = B * Hk
    per = group * head_dim * n_pad * 4
    if split > 1:
        budget = min(budget, total * per // split) if budget > 0 else total * per // split
    if budget <= 0 or total * per <= budget:
        return total
    fit = max(1, budget // per)
    options = [c for c in range(1, Hk + 1) if Hk % c == 0] + [Hk * nb for nb in range(1, B + 1) if B % nb == 0]
    return max(c for c in options if c <= fit)


def _env_flag(env, name: str, default: bool | None) -> bool | None:
    """A probe switch (the fused backward's, the persistent forward's): "1" on, "0" off, unset (or anything else)
    the shipped default."""
    return {"1": True, "0": False}.get(env.get(name, ""), default)


def _fb_split(head_dim: int, forced: bool | None = None) -> bool:
    """Whether the fused backward splits dQ^T's rows over both consumer warpgroups: FB_DQ_SPLIT's choice, or
    `forced`; only head_dim 128 has the split form."""
    return head_dim == 128 and (FB_DQ_SPLIT[head_dim] if forced is None else forced)


def fb_pair_group(causal: bool, group: int, pairs: int, head_dim: int, env=None, *, n_kb: int = 0) -> int:
    """The fused backward's grid order, as the number of (b, K/V head) pairs whose key blocks interleave (1 ..
    `pairs`, the launch's pairs). n_kb: the launch's key blocks a pair (0: not known).
    Causal grouped-query attention: with n_kb <= FB_GQA_GROUP_MAX_KB, groups of the fewest pairs, a power of two,
    whose key blocks make FB_GQA_GROUP_PROGRAMS programs or more (32 pairs at 5-7 key blocks a pair, 16 at 8-15, 8
    at 16-31, 4 at 32); otherwise all of them (every pair's key block 0 first). Causal MHA: FB_MHA_CAUSAL_PAIRS[head_dim].
    Non-causal: 1 (a pair's key blocks together, FlashAttention-3's order).
    Why: with causal masking key block 0 is a pair's longest program, GROUP times longer under GQA, and in the order
    of 1 the last pairs' ones start late. On the H200 (BENCHMARKS.md) every-pair order took causal GQA 40/8 at T8192
    from 479 to 507 TFLOP/s fwd+bwd, but MHA from 462 to 362 and non-causal from 525 to 388 (MHA's short programs
    leave little tail, and the order of 1 keeps the programs that read one head's Q / dO together in L2); for causal
    MHA at head_dim 128 two pairs were 2-3% faster than one at T 2048-16384 and 8 or more up to 13% slower at
    T >= 4096. Every pair is too many where a launch holds many short pairs: the programs running at once then read
    the Q / dO of as many pairs, and L2 holds few of them. On an H100 (2026-12-06, BENCHMARKS.md's forty-second run)
    groups of 4-16 pairs took causal GQA fwd+bwd 5-29% below every pair at T 1024-4096 (Llama-3.2-1B 32 x 1024 d64:
    2.307 -> 1.635 ms dense, 2.378 -> 1.796 packed; Qwen3-14B B4 T4096: 5.569 -> 4.913; the model-shape suite's
    packed Qwen3-14B rows, 8 sequences of 1024-3072: 4.598 -> 3.654), and moved T8192 by under 2% either way.
    Env HEARTH_ATTN_FB_PAIR_GROUP = n forces groups of n pairs, or of the largest power of two <= n that divides
    `pairs` (0 or n >= pairs: all)."""
    env = os.environ if env is None else env
    raw = env.get("HEARTH_ATTN_FB_PAIR_GROUP", "")
    if raw.strip() == "":
        if not causal:
            n = 1
        elif group == 1:
            n = FB_MHA_CAUSAL_PAIRS.get(head_dim, 1)
        elif 0 < n_kb <= FB_GQA_GROUP_MAX_KB:
            n = 1 << (-(-FB_GQA_GROUP_PROGRAMS // n_kb) - 1).bit_length()  # the power of two at or above
        else:
            n = pairs
    else:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"HEARTH_ATTN_FB_PAIR_GROUP must be an integer (0: all pairs), got {raw!r}") from None
        if n < 0:
            raise ValueError(f"HEARTH_ATTN_FB_PAIR_GROUP must be >= 0 (0: all pairs), got {n}")
    if n == 0 or n >= pairs:
        return pairs
    # whole groups of a power of two (each size is its own build): the largest that divides pairs and is <= n
    return 1 << min(n.bit_length(), (pairs & -pairs).bit_length()) - 1


def _dq_acc_desc(acc: torch.Tensor, split: bool, block_m: int) -> TensorDescriptor:
    """The fused backward's TMA descriptor over its fp32 dQ buffer acc [heads, D, n_pad] (DQ_TMA): one box is
    [1, rows, block_m], the dQ^T rows one consumer warpgroup adds a step for block_m queries (all D, or D / 2 with
    the dQ split: the kernel's DQ_ROWS)."""
    box = (1, acc.shape[1] // 2 if split else acc.shape[1], block_m)
    return _desc(acc, list(box), _layout(box, ttgl.float32))


def _fb_dq_early(env) -> int:
    """The fused backward's DQ_EARLY from env HEARTH_ATTN_FB_DQ_EARLY (a probe knob): unset or "0" 0 (the shipped
    order), "1" FlashAttention-4's order (dV's matmul after dS^T), "2" dV's as shipped, retired before dQ^T's."""
    raw = env.get("HEARTH_ATTN_FB_DQ_EARLY", "0")
    if raw not in ("0", "1", "2"):
        raise ValueError(f"HEARTH_ATTN_FB_DQ_EARLY must be 0, 1 or 2, got {raw!r}")
    return int(raw)


# the fused backward's step order (_fb_step): 0, each query head's blocks in turn from the diagonal up
FB_STEP_ORDER = 0
# whether the fused backward issues the next step's S^T before this step's dQ^T staging (_fb_consumer's ST_AHEAD)
FB_ST_AHEAD = False


def _fb_step_order(env) -> int:
    """The fused backward's STEP_ORDER (_fb_step): env HEARTH_ATTN_FB_STEP_ORDER ("0", "1" or "2"; a probe knob),
    else FB_STEP_ORDER."""
    raw = env.get("HEARTH_ATTN_FB_STEP_ORDER", "").strip()
    if raw == "":
        return FB_STEP_ORDER
    if raw not in ("0", "1", "2"):
        raise ValueError(f"HEARTH_ATTN_FB_STEP_ORDER must be 0, 1 or 2, got {raw!r}")
    return int(raw)


def _fb_meta(head_dim: int, config, env, table=None) -> dict:
    """The fused backward's launch constexprs but CAUSAL / PAIR_GROUP (and num_warps): config (BLOCK_M, NUM_STAGES)
    or the probe knob HEARTH_ATTN_FB_CONFIG or table's (FB_CONFIGS; FB_CONFIGS_VARLEN for packed rows), and the
    forms the env switches pick (backward_fused)."""
    env_cfg = env.get("HEARTH_ATTN_FB_CONFIG")  # probe only: "BLOCK_M,NUM_STAGES"
    block_m, stages = config or (tuple(int(x) for x in env_cfg.split(",")) if env_cfg
                                 else (table or FB_CONFIGS)[head_dim])
    return dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=FB_BLOCK_N, NUM_STAGES=stages,
                CONSUMER_REGS=CONSUMER_REGS, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
                PREFETCH=_env_flag(env, "HEARTH_ATTN_FB_PREFETCH", False),
                DQ_SPLIT=_fb_split(head_dim, _env_flag(env, "HEARTH_ATTN_FB_DQ_SPLIT", None)),
                DQ_TMA=_env_flag(env, "HEARTH_ATTN_FB_DQ_TMA", FB_DQ_TMA),
                STATS_SMEM=_env_flag(env, "HEARTH_ATTN_FB_STATS_SMEM", FB_STATS_SMEM),
                DQ_ASYNC=_env_flag(env, "HEARTH_ATTN_FB_DQ_ASYNC", False),
                LATE_RELEASE=_env_flag(env, "HEARTH_ATTN_FB_LATE_RELEASE", FB_LATE_RELEASE),
                DQ_BUFS=2 if _env_flag(env, "HEARTH_ATTN_FB_DQ_BUFS2", False) else 1,
                DQ_EARLY=_fb_dq_early(env), STATS_AHEAD=_env_flag(env, "HEARTH_ATTN_FB_STATS_AHEAD", False),
                STEP_ORDER=_fb_step_order(env), ST_AHEAD=_env_flag(env, "HEARTH_ATTN_FB_ST_AHEAD", FB_ST_AHEAD),
                num_warps=4)


def _fb_acc(meta: dict, heads: int, n_pad: int, device, zero: bool) -> tuple[torch.Tensor,
                                                                            TensorDescriptor | None]:
    """The fused backward's fp32 dQ buffer [heads, D, n_pad] (zeroed here when `zero`, else left to _fb_prepare)
    and, with DQ_TMA, its descriptor."""
    acc = (torch.zeros if zero else torch.empty)((heads, meta["HEAD_DIM"], n_pad), dtype=torch.float32, device=device)
    return acc, (_dq_acc_desc(acc, meta["DQ_SPLIT"], meta["BLOCK_M"]) if meta["DQ_TMA"] else None)


# the preprocess that also clears the dQ buffer: 64 query rows a program, 8 warps (the fastest of five launch configs
# at five shapes on the H200: scripts/gpu/attention_pre_probe.py, BENCHMARKS.md; 3-9% under the fill plus the
# plain preprocess, 68.5 against 75.3 us at B4 H32 T2048 D128)
FB_PRE_BLOCK = 64
FB_PRE_WARPS = 8


def _fb_prepare(out4, do4, delta, acc, acc_heads: int, n_pad: int, block: int = 0, warps: int = 0) -> None:
    """The fused backward's preprocess on [B, Hq, T, D] views of O and dO (a packed [1, Hq, total, D] with
    varlen): delta [B * Hq rows, T] = rowsum(dO * O), and acc's first acc_heads heads cleared over its n_pad columns
    in the same launch (FlashAttention-3's order: no separate fill; `acc` from _fb_acc(zero=False)). block / warps:
    the launch's query rows a program and warps (a probe's; 0: the shipped FB_PRE_BLOCK / FB_PRE_WARPS)."""
    from hearth.kernels.attention import _bwd_preprocess_kernel  # attention imports this module lazily

    B, Hq, T, D = out4.shape
    block = block or FB_PRE_BLOCK
    _bwd_preprocess_kernel[(cdiv(max(T, n_pad), block), B * Hq)](
        out4, do4, delta, *out4.stride(), *do4.stride(), Hq, T, HEAD_DIM=D, BLOCK_M=block,
        DQacc=acc, ACC_HEADS=acc_heads, N_PAD_Q=n_pad, ZERO_ACC=True, num_warps=warps or FB_PRE_WARPS,
    )


def _fb_start(meta: dict, heads: int, n_pad: int, out4, do4, delta, device, env) -> tuple[torch.Tensor,
                                                                                     TensorDescriptor | None]:
    """The fused backward's fp32 dQ buffer and descriptor (_fb_acc) and, given out4 (the forward's output as
    [B, Hq, T, D] views; do4 likewise), delta: in the launch that clears the buffer (_fb_prepare), or with
    HEARTH_ATTN_FB_PRE_ZERO=0 (the two-launch probe form) a zeroed buffer and attention's plain preprocess.
    Without out4, delta is the caller's input and the buffer is zeroed. Called on the tensors' device."""
    pre = out4 is not None and _env_flag(env, "HEARTH_ATTN_FB_PRE_ZERO", True)
    acc, desc = _fb_acc(meta, heads, n_pad, device, zero=not pre)
    if pre:
        _fb_prepare(out4, do4, delta, acc, heads, n_pad)
    elif out4 is not None:
        from hearth.kernels.attention import _bwd_preprocess  # attention imports this module lazily

        _bwd_preprocess(out4, do4, delta)
    return acc, desc


def _fb_grid(causal: bool, group: int, pairs: int, n_kb: int, head_dim: int, env) -> tuple[tuple[int, int], int]:
    """(grid, PAIR_GROUP) of a fused-backward launch over `pairs` (b, K/V head) pairs of n_kb key blocks each."""
    order = fb_pair_group(causal, group, pairs, head_dim, env, n_kb=n_kb)
    order = 0 if order == pairs > 1 else order  # the kernel's PAIR_GROUP (0: all pairs, the grid's axes swapped)
    return ((pairs, n_kb) if order == 0 else (n_kb * order, pairs // order)), order


def acc_budget(acc_bytes: int | None, env, group: int, *, causal: bool = False, n_kb: int = 0) -> tuple[int, int]:
    """The fused backward's bound on its fp32 dQ buffer, as fused_chunk's (budget bytes, split): acc_bytes when
    given, else env HEARTH_ATTN_FB_ACC_MIB (MiB) when set (0: none), each alone (split 1); else, for causal
    grouped-query attention at 1..FB_GQA_GROUP_MAX_KB key blocks a pair (n_kb), FB_ACC_SHORT_MIB alone; else
    FB_ACC_MIB, and under grouped-query attention (group > 1) also 1 / FB_ACC_GQA_SPLIT of the whole buffer."""
    if acc_bytes is not None:
        return acc_bytes, 1
    raw = env.get("HEARTH_ATTN_FB_ACC_MIB")
    if raw is not None:
        return int(float(raw) * 2**20), 1
    if causal and group > 1 and 0 < n_kb <= FB_GQA_GROUP_MAX_KB:
        return FB_ACC_SHORT_MIB * 2**20, 1
    return FB_ACC_MIB * 2**20, FB_ACC_GQA_SPLIT if group > 1 else 1


def backward_fused(q, k, v, do, lse, delta, dq, dk, dv, causal: bool, scale: float, config=None,
                   acc_bytes: int | None = None, out: torch.Tensor | None = None) -> None:
    """dQ, dK, dV of attention with the fused 5-matmul kernel above: dk / dv as backward_dkdv, dq [B, Hq, Tq, D]
    (last dim contiguous). dQ is summed in an fp32 buffer [heads, D, Tq rounded up to whole query blocks], then
    scaled and cast into dq. acc_bytes bounds that buffer (default: acc_budget's, FB_ACC_MIB and half the whole
    buffer under GQA, FB_ACC_SHORT_MIB at short causal GQA; 0: none, B * Hq * Tq * D * 4 bytes): the (b, K/V head) pairs then run in launches of
    fused_chunk pairs, one buffer reused. config: (BLOCK_M, NUM_STAGES), else FB_CONFIGS'. Probe switches (env, "1"
    on, "0" off, unset: the shipped FB_* default): HEARTH_ATTN_FB_DQ_TMA, HEARTH_ATTN_FB_STATS_SMEM,
    HEARTH_ATTN_FB_DQ_SPLIT (D 128), HEARTH_ATTN_FB_PREFETCH (off by default; it loads lse / delta itself, so
    STATS_SMEM is moot with it), HEARTH_ATTN_FB_DQ_ASYNC (off by default; with the dQ split, dQ^T's matmul issued
    behind dK's: the consumer's DQ_ASYNC), HEARTH_ATTN_FB_LATE_RELEASE (on by default, FB_LATE_RELEASE; with the dQ
    split, the Q / dO slot given back after dQ^T's matmul: the consumer's LATE_RELEASE; "0": after dK's), HEARTH_ATTN_FB_DQ_BUFS2 (off by default; two
    dQ^T staging tiles a warpgroup, used in turn: the consumer's DQ_BUFS 2), HEARTH_ATTN_FB_DQ_EARLY (0 by
    default; with the dQ split, "1" or "2": dQ^T's matmul issued before dK's, its reduce while dK's runs, the
    consumer's DQ_EARLY, _fb_dq_early), HEARTH_ATTN_FB_STATS_AHEAD (off by default; with STATS_SMEM, the producer
    loads a step's lse / delta a step ahead, before waiting for its slot: its STATS_AHEAD), HEARTH_ATTN_FB_STEP_ORDER
    (0 by default, FB_STEP_ORDER; "1" / "2": each query block's heads together, 2 from the last block down: _fb_step),
    HEARTH_ATTN_FB_ST_AHEAD (off by default, FB_ST_AHEAD; "1": the next step's S^T computed during this step's dQ^T
    staging, with the dQ split: the consumer's ST_AHEAD); and the probe knobs HEARTH_ATTN_FB_PAIR_GROUP (an integer, the grid order:
    fb_pair_group) and HEARTH_ATTN_FB_CONFIG="BLOCK_M,NUM_STAGES". out: the forward's output [B, Hq, Tq, D]; when
    given, `delta` is only a [B, Hq, Tq] fp32 buffer that this call fills in the launch that clears the dQ buffer
    (_fb_prepare; HEARTH_ATTN_FB_PRE_ZERO=0: a fill and the plain preprocess instead); without it, delta is an
    input."""
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    group = Hq // Hk
    env = os.environ
    meta = _fb_meta(D, config, env)
    # whole query blocks (and 64-query ones, dq_from_acc's): the kernel's adds need no mask, a TMA box no clipping
    step = max(64, meta["BLOCK_M"])
    n_pad = cdiv(Tq, step) * step
    n_kb = cdiv(Tk, FB_BLOCK_N)
    chunk = fused_chunk(B, Hk, group, D, n_pad, *acc_budget(acc_bytes, env, group, causal=causal, n_kb=n_kb))
    grid, order = _fb_grid(causal, group, chunk, n_kb, D, env)
    block_m = meta["BLOCK_M"]
    descs = (_host_desc(q, block_m), _host_desc(k, FB_BLOCK_N), _host_desc(v, FB_BLOCK_N), _host_desc(do, block_m))
    with on_device(q.device):
        dq_acc, dq_desc = _fb_start(meta, chunk * group, n_pad, out, do, delta, q.device, env)
        for r0 in range(0, B * Hk, chunk):  # each launch's dq_from_acc clears the buffer for the next
            _attn_bwd_fused_gluon_kernel[grid](
                *descs, lse, delta, dk, dv, dq_acc, dq_desc, dk.stride(0), dk.stride(1), dk.stride(2),
                scale, scale * LOG2E, Hq, Hk, group, Tq, Tk, n_pad, r0, CAUSAL=causal, PAIR_GROUP=order, **meta,
            )
            # this launch's query heads: `rows` of each of its batch rows, one [rows_b, rows, T, D] view of dq
            b0, hk0 = divmod(r0, Hk)
            rows = min(chunk, Hk) * group
            h0 = hk0 * group if chunk < Hk else 0
            dq_from_acc(dq_acc, dq[b0:b0 + max(1, chunk // Hk), h0:h0 + rows], rows, Tq, scale,
                        zero=r0 + chunk < B * Hk)


def varlen_serves(*tensors: torch.Tensor) -> bool:
    """Whether TMA can describe the packed [total, H, D] tensors as the varlen kernels view them."""
    return tma_addressable(*packed_planes(*tensors))


def forward_varlen(q, k, v, cu_q, cu_k, max_q: int, causal: bool, scale: float, store_lse: bool = True,
                   lengths: tuple | None = None):
    """The ping-pong forward over packed sequences (attention_varlen's contract): q [total_q, Hq, D], k / v
    [total_k, Hk, D], cu_q / cu_k int32 [n + 1] offsets the caller checked (and ``supported``,
    ``varlen_serves``) -> (out [total_q, Hq, D] contiguous, lse [Hq, total_q] fp32; a query whose sequence has no
    keys gets out 0 and lse -inf, as the Triton varlen forward). One program per 2 * BLOCK_M query rows of one
    (sequence, head): the grid covers max_q's query blocks, and a program past its sequence's end exits.
    store_lse=False (no backward will run): lse is None, neither allocated nor written (STORE_LSE), as forward.
    lengths: (each sequence's query counts, key counts) as host ints (the offsets' differences, known to the caller
    after its check): the persistent form instead, one program per SM walking varlen_pps_schedule's tiles."""
    total_q, Hq, D = q.shape
    total_k, Hk = k.shape[0], k.shape[1]
    n_seqs = cu_q.shape[0] - 1
    out = torch.empty((total_q, Hq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, total_q), dtype=torch.float32, device=q.device) if store_lse else None
    block_m, descs, meta = _pp_launch(*packed_planes(q, k, v, out), causal)
    if lengths is not None:
        plan = _varlen_pps_schedule_tensor(tuple(lengths[0]), tuple(lengths[1]), Hq, bool(causal), num_sms(q.device),
                                           block_m, meta["BLOCK_N"], _pps_tile_cost(), q.device)
        if plan is not None:  # else no query anywhere: nothing to write
            sched, n_m, programs = plan
            with on_device(q.device):
                _attn_fwd_gluon_pps_kernel[(programs,)](
                    *descs, lse, scale * LOG2E, Hq, Hq // Hk, total_q, total_k, n_m, sched, 1, programs,
                    STORE_LSE=store_lse, CuSeqQ=cu_q, CuSeqK=cu_k, Out=out, stride_ot=out.stride(0),
                    stride_oh=out.stride(1), VARLEN=True, **meta,
                )
        return out, lse
    with on_device(q.device):
        _attn_fwd_gluon_pp_kernel[(cdiv(max_q, 2 * block_m), n_seqs * Hq)](
            *descs, lse, scale * LOG2E, Hq, Hq // Hk, total_q, total_k, STORE_LSE=store_lse,
            CuSeqQ=cu_q, CuSeqK=cu_k, Out=out, stride_ot=out.stride(0), stride_oh=out.stride(1), VARLEN=True, **meta,
        )
    return out, lse


def fb_seq_order(cu_k: torch.Tensor, env=None) -> torch.Tensor | None:
    """The packed fused backward's sequence order (its kernel's SeqOrder), or None for the packed order. A probe
    switch, env HEARTH_ATTN_FB_SEQ_ORDER: "1" takes the sequences longest first (by keys; ties in packed order), so
    that the launch's last programs are short sequences' (a greedy model of the launch put the tail of the model-shape
    suite's 1:3 packing at 16% of the time in packed order and 8% longest first, with groups of 8 pairs:
    scripts/attention_launch_model.py, BENCHMARKS.md's forty-second run; timed on an H100 in the forty-third: +0.6%
    and -1.7% fwd+bwd at the suite's two 1:3 packings, so it stays off); unset or "0", None. On the device, without
    a host sync (an argsort of cu_k's differences)."""
    env = os.environ if env is None else env
    flag = env.get("HEARTH_ATTN_FB_SEQ_ORDER", "0").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"HEARTH_ATTN_FB_SEQ_ORDER must be 0 or 1, got {flag!r}")
    if flag != "1":
        return None
    lengths = cu_k[1:] - cu_k[:-1]
    return torch.argsort(lengths, descending=True, stable=True).to(torch.int32)


def backward_fused_varlen(q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, max_q: int, max_k: int, causal: bool,
                          scale: float, acc_bytes: int | None = None, aligned: bool = False,
                          out: torch.Tensor | None = None) -> None:
    """The fused backward over packed sequences: q / do / dq [total_q, Hq, D], k / v / dk / dv [total_k, Hk, D]
    (dq / dk / dv written whole), lse / delta [Hq, total_q] fp32, cu_q / cu_k the checked offsets. As
    backward_fused: dQ summed in an fp32 buffer [heads, D, columns] bounded by acc_bytes, the K/V heads then in
    launches of fused_chunk heads over every sequence. Grid: cdiv(max_k, FB_BLOCK_N) key blocks per (sequence, K/V
    head) pair; blocks past a sequence's keys take no steps (a key without queries gets dK = dV = 0). aligned: the
    caller knows every query offset is a multiple of 64 (attention_varlen.DQ_TMA_ALIGN): the buffer's columns are
    the packed query rows (total_q + one block, rounded up: a sequence's last query block may run one block past
    the packed end). Otherwise, in the TMA reduce-add form (FB_DQ_TMA), each sequence's columns start at a multiple
    of the query step (the kernel's DQ_PAD; dq_pad_starts): a reduce-add box at a ragged start raised an illegal
    instruction on the H200, and the fp32-atomics form, which needs no placement, took about twice the time on
    packed rows (Qwen3-14B 40/8, 16381 tokens in 8 sequences: 7.71 against 3.74 ms fwd+bwd; BENCHMARKS.md). The
    padding costs n_seqs * 64 columns. out [total_q, Hq, D]: as backward_fused's (delta then a buffer this call
    fills, in the launch that clears the dQ buffer)."""
    total_q, Hq, D = q.shape
    total_k, Hk = k.shape[0], k.shape[1]
    group = Hq // Hk
    n_seqs = cu_q.shape[0] - 1
    env = os.environ
    meta = _fb_meta(D, None, env, FB_CONFIGS_VARLEN)
    step = max(64, meta["BLOCK_M"])
    pad = step if meta["DQ_TMA"] and not aligned else 0
    n_pad = dq_pad_columns(total_q, n_seqs, pad) if pad else cdiv(total_q, step) * step + step
    n_kb = cdiv(max_k, FB_BLOCK_N)
    # chunk divides Hk
    chunk = fused_chunk(1, Hk, group, D, n_pad, *acc_budget(acc_bytes, env, group, causal=causal, n_kb=n_kb))
    grid, order = _fb_grid(causal, group, n_seqs * chunk, n_kb, D, env)
    seq_order = fb_seq_order(cu_k, env)
    q4, k4, v4, do4, dq4, dk4, dv4 = packed_planes(q, k, v, do, dq, dk, dv)
    block_m = meta["BLOCK_M"]
    descs = (_host_desc(q4, block_m), _host_desc(k4, FB_BLOCK_N), _host_desc(v4, FB_BLOCK_N),
             _host_desc(do4, block_m))
    with on_device(q.device):
        o4 = None if out is None else packed_planes(out)[0]
        dq_acc, dq_desc = _fb_start(meta, chunk * group, n_pad, o4, do4, delta, q.device, env)
        for hk0 in range(0, Hk, chunk):  # each launch's dq_from_acc clears the buffer for the next
            # the kernel places dK / dV at b * stride_dkb with b = the sequence's first key row: the token stride
            _attn_bwd_fused_gluon_kernel[grid](
                *descs, lse, delta, dk4, dv4, dq_acc, dq_desc, dk4.stride(2), dk4.stride(1), dk4.stride(2),
                scale, scale * LOG2E, Hq, chunk, group, total_q, total_k, n_pad, hk0, CAUSAL=causal,
                PAIR_GROUP=order, CuSeqQ=cu_q, CuSeqK=cu_k, VARLEN=True, DQ_PAD=pad, SeqOrder=seq_order,
                SEQ_ORDER=seq_order is not None, **meta,
            )
            dq_from_acc(dq_acc, dq4[:, hk0 * group:(hk0 + chunk) * group], chunk * group, total_q, scale,
                        zero=hk0 + chunk < Hk, cu_q=cu_q, max_q=max_q, pad=pad)


def offline_kernels(arch: int, dtype: torch.dtype, *, head_dims=HEAD_DIMS, causal=(False, True), configs=None,
                    variants=("1part", "ws", "pp", "bwd", "bwd_dq"), pp_configs=None, store_lse=True,
                    bwd_configs=None, bwd_dq_configs=None, fb_configs=None, fb_prefetch=False, fb_dq_split=None,
                    fb_dq_tma=FB_DQ_TMA, fb_stats_smem=FB_STATS_SMEM, fb_pair_group=1, ones=(), varlen=False,
                    fb_dq_pad=0, fb_seq_order=False, fb_dq_async=False, fb_late_release=FB_LATE_RELEASE,
                    fb_dq_bufs=1, fb_dq_early=0, fb_stats_ahead=False, fb_step_order=FB_STEP_ORDER,
                    fb_st_ahead=FB_ST_AHEAD):
    """Compile the forward for compute capability `arch` without a GPU (triton.compile + bundled ptxas):
    [(label, CompiledKernel)] for each (variant, head_dim, causal). variants: "1part" (single partition),
    "ws" (producer warp), "pp" (ping-pong), "pps" (its persistent form; not in the default list), "bwd" (the dK / dV
    backward), "bwd_dq" (the dQ backward); configs / pp_configs / bwd_configs / bwd_dq_configs replace CONFIGS /
    PP_CONFIGS / BWD_CONFIGS / BWD_DQ_CONFIGS; store_lse=False builds the inference forward (Lse a None constexpr, no
    LSE store). ones: integer arguments (e.g. "N_CTX_Q") built as a launch with the value 1 builds them: Triton makes
    such an int the constant 1 unless the kernel names it in do_not_specialize. varlen=True builds the packed-sequence
    (VARLEN) forms of "pp", "pps" and "bwd_fused" (forward_varlen per tile and persistent, backward_fused_varlen); fb_dq_pad, the fused backward's
    DQ_PAD (its ragged-offset placement of dQ^T, with varlen); fb_seq_order, its SEQ_ORDER (with varlen); fb_dq_async,
    its DQ_ASYNC (with the dQ split); fb_late_release, its LATE_RELEASE (likewise); fb_dq_bufs, its DQ_BUFS (likewise, with the
    TMA reduce); fb_dq_early, its DQ_EARLY (0, 1 or 2; with the dQ split, not fb_dq_async); fb_stats_ahead, its
    producer's STATS_AHEAD (with fb_stats_smem, not fb_prefetch); fb_step_order, its STEP_ORDER (_fb_step); fb_st_ahead, its
    consumers' ST_AHEAD (with the dQ split, not fb_dq_async nor fb_dq_early). Needs
    TRITON_INTERPRET unset."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    unknown = set(variants) - {"1part", "ws", "pp", "pps", "bwd", "bwd_dq", "bwd_fused"}
    if unknown:
        raise ValueError("variants must be among '1part', 'ws', 'pp', 'pps', 'bwd', 'bwd_dq', 'bwd_fused', got "
                         f"{sorted(unknown)}")
    kernels = (_attn_fwd_gluon_kernel, _attn_fwd_gluon_pp_kernel, _attn_fwd_gluon_pps_kernel,
               _attn_bwd_dkdv_gluon_kernel, _attn_bwd_dq_gluon_kernel, _attn_bwd_fused_gluon_kernel)
    unknown = set(ones) - {p.name for fn in kernels for p in fn.params}
    if unknown:
        raise ValueError(f"ones must name kernel arguments, got {sorted(unknown)}")
    ptr = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype]
    target = GPUTarget("cuda", arch, 32)
    found = []

    def build(fn, sig, const, warps):
        """triton.compile of fn for `target` with the ones applied as a launch would."""
        const = dict(const)
        for p in fn.params:
            if p.name in ones and sig.get(p.name) == "i32" and not p.do_not_specialize:
                const[p.name] = 1
        sig = {n: "constexpr" if n in const else t for n, t in sig.items()}
        return triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=const), target=target,
                              options={"num_warps": warps})

    def desc_sig(d, q_rows, kv_rows, fourth):
        """The four host-descriptor arguments (q, k, v, and o or do) typed as a launch types them (JIT's
        mangling of a TensorDescriptor): q and the fourth over q_rows-row boxes, k and v over kv_rows."""
        return {n: mangle_type(_host_desc(torch.empty((1, 1, rows, d), dtype=dtype), rows))
                for n, rows in (("q_desc", q_rows), ("k_desc", kv_rows), ("v_desc", kv_rows), (fourth, q_rows))}
    for variant, d, c in itertools.product(variants, head_dims, causal):
        if variant == "bwd":  # dK / dV (store_lse does not apply)
            bn, bm, stages, warps = (bwd_configs or BWD_CONFIGS)[d]
            const = dict(HEAD_DIM=d, CAUSAL=c, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=stages, NUM_WARPS=warps)
            sig = desc_sig(d, bm, bn, "do_desc")
            sig.update(Lse="*fp32", Delta="*fp32", DK=ptr, DV=ptr, stride_dkb="i32", stride_dkh="i32",
                       stride_dkt="i32", sm_scale="fp32", qk_scale="fp32", H_Q="i32", H_K="i32", GROUP="i32",
                       N_CTX_Q="i32", N_CTX_K="i32")
            sig.update({n: "constexpr" for n in const})
            kernel = build(_attn_bwd_dkdv_gluon_kernel, sig, const, warps)
            name = f"bwd[dkdv] d{d} {'causal' if c else 'full'} {bn}x{bm} w{warps} s{stages}"
            found.append((f"attention_gluon {name} sm_{arch}", kernel))
            continue
        if variant == "bwd_fused":
            bm, stages = (fb_configs or (FB_CONFIGS_VARLEN if varlen else FB_CONFIGS))[d]
            split = _fb_split(d, fb_dq_split)
            const = dict(HEAD_DIM=d, CAUSAL=c, BLOCK_M=bm, BLOCK_N=FB_BLOCK_N, NUM_STAGES=stages,
                         CONSUMER_REGS=CONSUMER_REGS, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
                         PREFETCH=fb_prefetch, DQ_SPLIT=split, DQ_TMA=fb_dq_tma, STATS_SMEM=fb_stats_smem,
                         PAIR_GROUP=fb_pair_group, DQ_ASYNC=fb_dq_async, LATE_RELEASE=fb_late_release,
                         DQ_BUFS=fb_dq_bufs, DQ_EARLY=fb_dq_early, STATS_AHEAD=fb_stats_ahead,
                         STEP_ORDER=fb_step_order, ST_AHEAD=fb_st_ahead)
            sig = desc_sig(d, bm, FB_BLOCK_N, "do_desc")
            if fb_dq_tma:
                sig["dq_desc"] = mangle_type(_dq_acc_desc(torch.empty((1, d, 64), dtype=torch.float32), split, bm))
            else:
                const["dq_desc"] = None
                sig["dq_desc"] = "constexpr"
            sig.update(Lse="*fp32", Delta="*fp32", DK=ptr, DV=ptr, DQacc="*fp32", stride_dkb="i32", stride_dkh="i32",
                       stride_dkt="i32", sm_scale="fp32", qk_scale="fp32", H_Q="i32", H_K="i32", GROUP="i32",
                       N_CTX_Q="i32", N_CTX_K="i32", N_PAD_Q="i32", BHK0="i32")
            if varlen:
                const.update(VARLEN=True, DQ_PAD=fb_dq_pad, SEQ_ORDER=fb_seq_order)
                sig.update(CuSeqQ="*i32", CuSeqK="*i32")
                if fb_seq_order:
                    sig["SeqOrder"] = "*i32"
                else:
                    const["SeqOrder"] = None
            sig.update({n: "constexpr" for n in const})
            kernel = build(_attn_bwd_fused_gluon_kernel, sig, const, 4)
            staged = fb_stats_smem and not fb_prefetch  # the kernel's STAGED
            forms = "".join(f" {n}" for n, on in (("pf", fb_prefetch), ("split", split), ("dq-tma", fb_dq_tma),
                                                    ("stats-smem", staged)) if on)
            forms += f" pairs{fb_pair_group}" if fb_pair_group != 1 else ""
            forms += " varlen" if varlen else ""
            forms += f" dq-pad{fb_dq_pad}" if varlen and fb_dq_pad else ""
            forms += " seq-order" if varlen and fb_seq_order else ""
            forms += " dq-async" if fb_dq_async and split else ""
            forms += " late-release" if fb_late_release and split and not fb_dq_async else ""
            forms += " dq-bufs2" if fb_dq_bufs == 2 and fb_dq_tma and split and not fb_dq_async else ""
            forms += f" dq-early{fb_dq_early}" if fb_dq_early and split and not fb_dq_async else ""
            forms += " stats-ahead" if fb_stats_ahead and staged else ""
            forms += f" step-order{fb_step_order}" if fb_step_order else ""
            forms += " st-ahead" if fb_st_ahead and split and fb_dq_tma and fb_dq_bufs == 1 and not fb_dq_async \
                and not fb_dq_early else ""
            name = f"bwd[fused] d{d} {'causal' if c else 'full'} {FB_BLOCK_N}x{bm} w4+4+{PRODUCER_WARPS} s{stages}{forms}"
            found.append((f"attention_gluon {name} sm_{arch}", kernel))
            continue
        if variant == "bwd_dq":
            bm, bn, stages, warps = (bwd_dq_configs or BWD_DQ_CONFIGS)[d]
            const = dict(HEAD_DIM=d, CAUSAL=c, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=stages, NUM_WARPS=warps)
            sig = desc_sig(d, bm, bn, "do_desc")
            sig.update(Lse="*fp32", Delta="*fp32", DQ=ptr, stride_dqb="i32", stride_dqh="i32", stride_dqt="i32",
                       sm_scale="fp32", qk_scale="fp32", H_Q="i32", GROUP="i32", N_CTX_Q="i32", N_CTX_K="i32")
            sig.update({n: "constexpr" for n in const})
            kernel = build(_attn_bwd_dq_gluon_kernel, sig, const, warps)
            name = f"bwd[dq] d{d} {'causal' if c else 'full'} {bm}x{bn} w{warps} s{stages}"
            found.append((f"attention_gluon {name} sm_{arch}", kernel))
            continue
        if variant in ("pp", "pps"):
            bm, bn, stages = (pp_configs or PP_CONFIGS)[d]
            warps = PP_WARPS
            fn = _attn_fwd_gluon_pp_kernel if variant == "pp" else _attn_fwd_gluon_pps_kernel
            const = dict(HEAD_DIM=d, CAUSAL=c, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=stages,
                         CONSUMER_REGS=CONSUMER_REGS, PRODUCER_WARPS=PRODUCER_WARPS,
                         PRODUCER_REGS=PRODUCER_REGS, STORE_LSE=store_lse)
            name = f"fwd[{variant}] d{d} {'causal' if c else 'full'} 2x{bm}x{bn} w{warps}+4+{PRODUCER_WARPS} s{stages}"
            sig = desc_sig(d, bm, bn, "o_desc")
            sig["Lse"] = "*fp32" if store_lse else "constexpr"
            if not store_lse:
                const["Lse"] = None
            sig.update(qk_scale="fp32", H_Q="i32", GROUP="i32", N_CTX_Q="i32", N_CTX_K="i32")
            if variant == "pps":
                sig.update(N_M="i32", Sched="*i32", SECTION="i32", N_PROG="i32")
            if varlen:
                const["VARLEN"] = True
                sig.update(CuSeqQ="*i32", CuSeqK="*i32", Out=ptr, stride_ot="i32", stride_oh="i32")
                name += " varlen"
            sig.update({n: "constexpr" for n in const})
            kernel = build(fn, sig, const, warps)
            found.append((f"attention_gluon {name}{'' if store_lse else ' no-lse'} sm_{arch}", kernel))
            continue
        else:
            ws = variant == "ws"
            bm, bn, warps, stages = (configs or CONFIGS)[d]
            fn = _attn_fwd_gluon_kernel
            const = dict(HEAD_DIM=d, CAUSAL=c, BLOCK_M=bm, BLOCK_N=bn, NUM_STAGES=stages, NUM_WARPS=warps,
                         WARP_SPECIALIZE=ws, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS)
            name = f"fwd{'[ws]' if ws else ''} d{d} {'causal' if c else 'full'} {bm}x{bn} w{warps} s{stages}"
        const["STORE_LSE"] = store_lse
        sig = {n: ptr for n in ("Q", "K", "V", "Out")}
        sig["Lse"] = "*fp32" if store_lse else "constexpr"
        if not store_lse:
            const["Lse"] = None
        for n in ("stride_qb", "stride_qh", "stride_qt", "stride_kb", "stride_kh", "stride_kt",
                  "stride_vb", "stride_vh", "stride_vt", "stride_ob", "stride_oh", "stride_ot"):
            sig[n] = "i32"
        sig.update(qk_scale="fp32", H_Q="i32", GROUP="i32", N_CTX_Q="i32", N_CTX_K="i32")
        sig.update({n: "constexpr" for n in const})
        kernel = build(fn, sig, const, warps)
        found.append((f"attention_gluon {name}{'' if store_lse else ' no-lse'} sm_{arch}", kernel))
    return found
