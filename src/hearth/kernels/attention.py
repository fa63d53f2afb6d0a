"""Flash attention (forward and backward) in Triton: ``attention(q, k, v, *, causal, scale)``.

Math (per batch b and query head h; the KV head is h // (Hq // Hk), grouped-query attention):

    S = scale * Q K^T          [T, T]  (never stored)
    P = softmax(S (+ causal mask, -inf above the diagonal))
    O = P V                    [T, D]
    lse = logsumexp(S, -1)     [T]     fp32, saved for the backward

Forward: one program per (block of BLOCK_M query rows, b, h) streams over key blocks with an online
softmax in fp32. ``exp`` is computed as ``exp2`` with log2(e) folded into the scale, so each score
costs one FMA and one exp2. Reads Q once and K, V once per query block; writes O and lse once.

Backward (P is recomputed from Q, K and lse, the T x T matrix is never stored):
    delta = rowsum(dO * O)                                  (preprocess kernel)
    dP = dO V^T,  dS = P * (dP - delta),
    dV = P^T dO,  dK = scale * dS^T Q                       (kernel 1: one program per key block and
                                                             KV head, looping over the Hq/Hk query heads
                                                             of its group and over query blocks, so the
                                                             GQA sum happens in registers: no expanded
                                                             K/V, no atomics)
    dQ = scale * dS K                                       (kernel 2: one program per query block and
                                                             query head, looping over key blocks)

Causal: blocks entirely above the diagonal are skipped; only the diagonal blocks apply the mask, in a
separate loop stage, so the bulk of the work runs mask-free. The ragged tail (T not a multiple of the
block) is likewise its own masked stage (except in causal dK/dV, where the off-diagonal stage keeps a
cheap row-bounds mask: a third pipelined loop made ptxas spill registers there).

Hopper: every tl.dot compiles to wgmma and streamed tiles are pipelined with cp.async (checked in the
sm_90a PTX/SASS). USE_TMA (env HEARTH_ATTN_TMA=1) loads streamed tiles through device-side TMA
descriptors instead (needs 16-byte aligned strides; otherwise the pointer path is used). Block sizes
are autotuned per (T, D, causal, dtype) from short lists below; HEARTH_ATTN_AUTOTUNE=0 pins the first.
On Hopper the head_dim-128 forward is attention_gluon.py's ping-pong kernel (measured faster); the env
HEARTH_ATTN_GLUON=0 / 1 turns the Gluon forwards off / on everywhere they serve (all chosen in forward_kernel).
The bf16 / fp16 head_dim 64 / 128 backward on Hopper is attention_gluon.py's fused 5-matmul kernel (measured
faster; HEARTH_ATTN_GLUON_BWD_FUSED=0 or torch's deterministic mode keep the Triton kernels: backward_kernel).
Under TRITON_INTERPRET=1 (CPU tests) fixed small blocks are used and two interpreter limits are worked
around behind the INTERP flag (no effect on GPU code): loops with run-time bounds, bf16 tl.dot.

VARLEN (constexpr, attention_varlen.py): packed sequences. Program (row block, sequence * head) reads
its sequence's start and length from int32 offsets (CuSeqQ / CuSeqK), offsets the T axis by the start
and masks by the length; blocks past the sequence's end return at once. VARLEN=False compiles to the
same sm_90 PTX as the kernels had before the flag (checked offline for all 12 fwd / dK-dV / dQ x D 64 /
128 x causal or not variants).

FLOPs: forward 4*B*Hq*Tq*Tk*D (two matmuls), halved when causal; backward 2.5x the forward (the
default kernels execute 3.5x: the dQ kernel recomputes P and dP). FUSED_DQ (env HEARTH_ATTN_FUSED_DQ=1)
instead adds scale * dS K into an fp32 dQ buffer with atomics from the dK/dV kernel: 2.5x executed,
+4 bytes * B*Hq*T*D of memory, and dQ is no longer bit-reproducible. Off by default until measured.

fp32 inputs: the matmuls run in full fp32 ("ieee"; slow, no tensor cores) so fp32 means fp32, as
in PyTorch's default. bf16/fp16 inputs: tensor-core matmuls with fp32 accumulation; P and dS are
rounded to the input dtype before their matmuls (as FlashAttention does).

Limitations: causal needs Tq == Tk (the mask is the top-left aligned square); non-causal accepts
Tq != Tk. Head dim D: 1..256, equal for q, k and v; the kernels run at a power of two in 16..256, so any
other D (80, 96) is zero-padded to the next one on the host (exact: zero columns add nothing to q k^T,
and the padded output columns are dropped), at the padded size's cost in time and saved memory.
"""

from __future__ import annotations

import inspect
import math
import os

import torch
import triton
import triton.language as tl

from hearth.kernels._common import (
    autograd_op,
    capability,
    cdiv,
    check_same_device,
    check_same_dtype,
    check_tensor,
    compiled_or_eager,
    empty_heads_like,
    interpret_mode,
    on_device,
    records_graph,
    tma_addressable,
    tma_scratch,
)

LOG2E = 1.4426950408889634
# Head dims the kernels are compiled for (a power of two: tl.arange needs one). Any other D up to 256
# (80, 96: Phi, GPT-NeoX-style models) runs zero-padded to the next of these (padded_head_dim).
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_HEAD_DIM = 256


def padded_head_dim(d: int) -> int | None:
    """The head dim the kernels run `d` at (itself when native), or None when d is not supported."""
    if not isinstance(d, int) or d < 1 or d > MAX_HEAD_DIM:
        return None
    return next(n for n in SUPPORTED_HEAD_DIMS if n >= d)


# ----------------------------------------------------------------------------------------------
# Matmul helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _mm(a, b, DOT_PREC: tl.constexpr, INTERP: tl.constexpr):
    """a @ b with fp32 accumulation. The CPU interpreter mis-multiplies bf16 operands, so there
    they are widened first (exact for bf16/fp16, so the result is what the tensor cores give)."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b, input_precision=DOT_PREC)


@triton.jit
def _mma(a, b, acc, DOT_PREC: tl.constexpr, INTERP: tl.constexpr):
    """acc + a @ b (see _mm)."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PREC)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fwd_stage(
    acc, l_i, m_i, q,
    k_base, v_base, k_desc, v_desc,
    stride_kt, stride_kd, stride_vt, stride_vd,
    offs_m, offs_d, lo, hi, qk_scale, N_CTX_K,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr, INTERP: tl.constexpr,
):
    """Fold key blocks [lo, hi) into the running (acc, l_i, m_i). MASKED: apply the causal and
    key-bounds masks (diagonal / ragged-tail stage only)."""
    if INTERP:
        # The CPU interpreter (with numpy >= 2.4) cannot use a run-time bound in range(); on the GPU
        # the for loop is kept because only it is software-pipelined (num_stages).
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step(
                acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
                offs_m, offs_d, start_n, qk_scale, N_CTX_K, BLOCK_N, MASKED, CAUSAL, USE_TMA, DOT_PREC, INTERP,
            )
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_step(
                acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
                offs_m, offs_d, start_n, qk_scale, N_CTX_K, BLOCK_N, MASKED, CAUSAL, USE_TMA, DOT_PREC, INTERP,
            )
    return acc, l_i, m_i


@triton.jit
def _fwd_step(
    acc, l_i, m_i, q,
    k_base, v_base, k_desc, v_desc,
    stride_kt, stride_kd, stride_vt, stride_vd,
    offs_m, offs_d, start_n, qk_scale, N_CTX_K,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr, INTERP: tl.constexpr,
):
    """One key block of the online softmax."""
    start_n = tl.multiple_of(start_n, BLOCK_N)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:
        # TMA zero-fills rows past N_CTX_K: no load masks needed.
        k = k_desc.load([start_n, 0])
    else:
        k_ptrs = k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
        if MASKED:
            k = tl.load(k_ptrs, mask=(offs_n < N_CTX_K)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
    qk = _mm(q, tl.trans(k), DOT_PREC, INTERP)  # fp32, unscaled
    if MASKED:
        keep = (offs_n < N_CTX_K)[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(keep, qk, float("-inf"))
    # The scale (> 0, log2(e) folded in) is applied inside the exponent so that scale-and-subtract
    # is one FMA per score. Every row sees an unmasked key in its first block: m_new is finite.
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if USE_TMA:
        v = v_desc.load([start_n, 0])
    else:
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_n < N_CTX_K)[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
    acc = _mma(p.to(v.dtype), v, acc, DOT_PREC, INTERP)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_kernel(
    # pointers
    Q, K, V, Out, Lse,
    # strides (elements)
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    # shapes / scalars
    qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K,
    # meta-parameters
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
    INTERP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    # variable-length (packed) sequences, attention_varlen.py: int32 [n_seqs + 1] offsets
    CuSeqQ=None, CuSeqK=None, VARLEN: tl.constexpr = False,
    # False: no backward will run (inference, or no input needs a gradient): Lse is None, not written
    STORE_LSE: tl.constexpr = True,
):
    # Causal: the last query blocks have the most keys; launch them first to shorten the tail.
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H_Q
    h = bh % H_Q
    hk = h // GROUP
    if VARLEN:
        # b is the sequence. N_CTX_Q / N_CTX_K arrive only as the autotuner's key (max_seqlen's power-of-two
        # bucket); from here on they are this sequence's lengths, its rows from q_start / k_start on.
        q_start = tl.load(CuSeqQ + b)
        N_CTX_Q = tl.load(CuSeqQ + b + 1) - q_start
        if start_m * BLOCK_M >= N_CTX_Q:  # a block past this sequence's end
            return
        k_start = tl.load(CuSeqK + b)
        N_CTX_K = tl.load(CuSeqK + b + 1) - k_start
        q_base = Q + h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_qt
        k_base = K + hk.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_kt
        v_base = V + hk.to(tl.int64) * stride_vh + k_start.to(tl.int64) * stride_vt
        o_base = Out + h.to(tl.int64) * stride_oh + q_start.to(tl.int64) * stride_ot
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
        o_base = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    if USE_TMA:
        k_desc = tl.make_tensor_descriptor(
            k_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_kt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        v_desc = tl.make_tensor_descriptor(
            v_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_vt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
    else:
        k_desc = k_base
        v_desc = v_base
    q = tl.load(
        q_base + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
        mask=(offs_m < N_CTX_Q)[:, None], other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        # Stage 1: key blocks fully below the diagonal (all keys < start_m*BLOCK_M <= T): no mask.
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _fwd_stage(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc,
            stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d, 0, diag_lo, qk_scale, N_CTX_K,
            BLOCK_N, False, True, USE_TMA, DOT_PREC, INTERP,
        )
        # Stage 2: the diagonal block(s), causal + bounds mask.
        diag_hi = tl.minimum(diag_lo + BLOCK_M, N_CTX_K)
        acc, l_i, m_i = _fwd_stage(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc,
            stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d, diag_lo, diag_hi, qk_scale, N_CTX_K,
            BLOCK_N, True, True, USE_TMA, DOT_PREC, INTERP,
        )
    else:
        full_hi = (N_CTX_K // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _fwd_stage(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc,
            stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d, 0, full_hi, qk_scale, N_CTX_K,
            BLOCK_N, False, False, USE_TMA, DOT_PREC, INTERP,
        )
        acc, l_i, m_i = _fwd_stage(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc,
            stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d, full_hi, N_CTX_K, qk_scale, N_CTX_K,
            BLOCK_N, True, False, USE_TMA, DOT_PREC, INTERP,
        )

    if VARLEN:
        # queries of a sequence with no keys (k length 0, non-causal): no softmax; out 0, lse -inf
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_i[:, None]
    row_ok = offs_m < N_CTX_Q
    if STORE_LSE:
        # lse in natural-log units: (m + log2 l) * ln 2.
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        if VARLEN:  # Lse is [Hq, total_q]; total_q is the last offset
            tl.store(Lse + (h.to(tl.int64) * tl.load(CuSeqQ + tl.num_programs(1) // H_Q) + q_start) + offs_m, lse, mask=row_ok)
        else:
            tl.store(Lse + bh.to(tl.int64) * N_CTX_Q + offs_m, lse, mask=row_ok)
    tl.store(
        o_base + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
        acc.to(Out.dtype.element_ty), mask=row_ok[:, None],
    )


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bwd_preprocess_kernel(
    Out, DO, Delta,
    stride_ob, stride_oh, stride_ot, stride_od,
    stride_dob, stride_doh, stride_dot, stride_dod,
    H_Q, N_CTX_Q,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    DQacc=None, ACC_HEADS=0, N_PAD_Q=0, ZERO_ACC: tl.constexpr = False,
):
    """delta[b, h, t] = sum_d dO * O, in fp32. Reads O and dO once, writes B*H*T floats.
    ZERO_ACC (the fused Gluon backward's preprocess, FlashAttention-3's): also clears that backward's fp32 dQ
    buffer DQacc [heads, HEAD_DIM, N_PAD_Q] (queries contiguous) for its first ACC_HEADS heads (program row bh ->
    head bh), so no separate fill runs; the grid then covers max(N_CTX_Q, N_PAD_Q) columns. In-head offsets are
    32-bit (HEAD_DIM * N_PAD_Q < 2^31, as the fused kernel's)."""
    bh = tl.program_id(1)
    b = bh // H_Q
    h = bh % H_Q
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q
    # int64 rows: with varlen the plane is the WHOLE packed axis ([1, H, total, D]), so row * token stride reaches
    # total * H * D elements (2^31 at 262144 tokens of 64 x 128 heads), past what the public check bounds (one
    # sequence's plane); the dense kernels' in-plane offsets stay int32
    rows = offs_m.to(tl.int64)
    o = tl.load(
        Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        + rows[:, None] * stride_ot + offs_d[None, :] * stride_od,
        mask=row_ok[:, None], other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        + rows[:, None] * stride_dot + offs_d[None, :] * stride_dod,
        mask=row_ok[:, None], other=0.0,
    ).to(tl.float32)
    tl.store(Delta + bh.to(tl.int64) * N_CTX_Q + offs_m, tl.sum(o * do, 1), mask=row_ok)
    if ZERO_ACC:
        if bh < ACC_HEADS:
            acc = DQacc + bh.to(tl.int64) * HEAD_DIM * N_PAD_Q
            tl.store(acc + offs_d[:, None] * N_PAD_Q + offs_m[None, :],
                     tl.zeros([HEAD_DIM, BLOCK_M], dtype=tl.float32), mask=(offs_m < N_PAD_Q)[None, :])


def _bwd_preprocess(out4, do4, delta) -> None:
    """The plain backward preprocess on [B, H, T, D] views of O and dO (a packed [1, H, total, D] with varlen):
    delta [B * H rows, T] = rowsum(dO * O), in fp32; 128-row programs (32 above head_dim 128, 16 in the
    interpreter). The caller is on the tensors' device."""
    B, H, T, D = out4.shape
    block = 16 if interpret_mode() else (128 if D <= 128 else 32)
    _bwd_preprocess_kernel[(cdiv(T, block), B * H)](
        out4, do4, delta, *out4.stride(), *do4.stride(), H, T, HEAD_DIM=D, BLOCK_M=block,
    )


@triton.jit
def _dkdv_stage(
    dk, dv, k, v,
    q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, sm_scale,
    stride_qt, stride_qd, stride_dot, stride_dod,
    offs_n, offs_d, lo, hi, qk_scale, N_CTX_Q,
    BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr, INTERP: tl.constexpr, FUSED_DQ: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Accumulate dK, dV of one key block over query blocks [lo, hi) of one query head."""
    if INTERP:  # see _fwd_stage
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step(
                dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, sm_scale,
                stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, start_m, qk_scale, N_CTX_Q,
                BLOCK_M, CAUSAL_MASK, BOUNDS, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
            )
            start_m += BLOCK_M
    else:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_step(
                dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, sm_scale,
                stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, start_m, qk_scale, N_CTX_Q,
                BLOCK_M, CAUSAL_MASK, BOUNDS, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
            )
    return dk, dv


@triton.jit
def _dkdv_step(
    dk, dv, k, v,
    q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, sm_scale,
    stride_qt, stride_qd, stride_dot, stride_dod,
    offs_n, offs_d, start_m, qk_scale, N_CTX_Q,
    BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr, INTERP: tl.constexpr, FUSED_DQ: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """One query block's contribution to dK, dV. Works on the transposed scores (keys x queries)
    so that both accumulators are [BLOCK_N, D] row-major."""
    start_m = tl.multiple_of(start_m, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    # Rows past T: q = dO = 0 and lse = +inf make P = 0 and dS = 0 there.
    row_ok = offs_m < N_CTX_Q
    if USE_TMA:  # TMA zero-fills rows past T
        q = q_desc.load([start_m, 0])
        do = do_desc.load([start_m, 0])
    else:
        q_ptrs = q_base + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
        do_ptrs = do_base + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod
        if BOUNDS:
            q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
    if BOUNDS:
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    qkT = _mm(k, tl.trans(q), DOT_PREC, INTERP)  # [BLOCK_N, BLOCK_M] fp32
    pT = tl.math.exp2(qkT * qk_scale - (lse * 1.4426950408889634)[None, :])
    if CAUSAL_MASK:
        pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
    dv = _mma(pT.to(do.dtype), do, dv, DOT_PREC, INTERP)
    dpT = _mm(v, tl.trans(do), DOT_PREC, INTERP)
    dsT = pT * (dpT - delta[None, :])
    dk = _mma(dsT.to(q.dtype), q, dk, DOT_PREC, INTERP)
    if FUSED_DQ:
        # dQ[rows] += scale * dS K, summed over key blocks by fp32 atomics (no second kernel
        # recomputing P and dP; not bit-reproducible run to run).
        dq_part = _mm(tl.trans(dsT.to(k.dtype)), k, DOT_PREC, INTERP) * sm_scale
        dq_ptrs = dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        tl.atomic_add(dq_ptrs, dq_part, mask=row_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_head(
    dk, dv, k, v, Q, DO, Lse, Delta, DQacc, sm_scale,
    stride_qb, stride_qh, stride_qt, stride_qd, stride_dob, stride_doh, stride_dot, stride_dod,
    b, hk, g, start_n, offs_n, offs_d, full_hi, qk_scale, H_Q, GROUP, N_CTX_Q, q_start, total_q,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
    INTERP: tl.constexpr, FUSED_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """dK, dV contributions of query head hk*GROUP + g to one key block. VARLEN: b is the sequence,
    whose query rows start at q_start of the packed axis of total_q rows (unused otherwise)."""
    h = hk * GROUP + g
    if VARLEN:
        q_base = Q + h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_qt
        do_base = DO + h.to(tl.int64) * stride_doh + q_start.to(tl.int64) * stride_dot
        row_base = h.to(tl.int64) * total_q + q_start  # Lse / Delta are [Hq, total_q]
    else:
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        row_base = (b * H_Q + h).to(tl.int64) * N_CTX_Q
    dq_base = DQacc + row_base * HEAD_DIM  # fp32 [B, Hq, T, D] contiguous (FUSED_DQ only)
    if USE_TMA:
        q_desc = tl.make_tensor_descriptor(
            q_base, shape=[N_CTX_Q, HEAD_DIM], strides=[stride_qt, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
        do_desc = tl.make_tensor_descriptor(
            do_base, shape=[N_CTX_Q, HEAD_DIM], strides=[stride_dot, 1], block_shape=[BLOCK_M, HEAD_DIM]
        )
    else:
        q_desc = q_base
        do_desc = do_base
    if CAUSAL:
        # Diagonal: query blocks overlapping this key block (mask, and bounds near T).
        diag_hi = tl.minimum(start_n + BLOCK_N, N_CTX_Q)
        dk, dv = _dkdv_stage(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, Lse + row_base, Delta + row_base, dq_base, sm_scale,
            stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, start_n, diag_hi, qk_scale, N_CTX_Q,
            BLOCK_M, True, True, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
        )
        # The rest, bounds-masked: a third (tail) stage here made ptxas spill (three pipelined
        # loops live in one kernel), and the masks cost little next to the four matmuls.
        # Query blocks above the key block never see it: skipped.
        dk, dv = _dkdv_stage(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, Lse + row_base, Delta + row_base, dq_base, sm_scale,
            stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, start_n + BLOCK_N, N_CTX_Q,
            qk_scale, N_CTX_Q, BLOCK_M, False, True, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
        )
    else:
        dk, dv = _dkdv_stage(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, Lse + row_base, Delta + row_base, dq_base, sm_scale,
            stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, 0, full_hi, qk_scale, N_CTX_Q,
            BLOCK_M, False, False, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
        )
        dk, dv = _dkdv_stage(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, Lse + row_base, Delta + row_base, dq_base, sm_scale,
            stride_qt, stride_qd, stride_dot, stride_dod, offs_n, offs_d, full_hi, N_CTX_Q,
            qk_scale, N_CTX_Q, BLOCK_M, False, True, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, HEAD_DIM,
        )
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    # pointers
    Q, K, V, DO, Lse, Delta, DK, DV, DQacc,
    # strides (elements); DK and DV share one layout (both allocated in k's order: empty_heads_like)
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_dob, stride_doh, stride_dot, stride_dod,
    stride_dkb, stride_dkh, stride_dkt, stride_dkd,
    # shapes / scalars
    sm_scale, qk_scale, H_Q, H_K, GROUP, N_CTX_Q, N_CTX_K,
    # meta-parameters
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
    INTERP: tl.constexpr, FUSED_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    # variable-length (packed) sequences, attention_varlen.py: int32 [n_seqs + 1] offsets
    CuSeqQ=None, CuSeqK=None, VARLEN: tl.constexpr = False,
):
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    b = bhk // H_K
    hk = bhk % H_K
    if VARLEN:
        # b is the sequence; N_CTX_Q / N_CTX_K arrive as the autotuner's key: now this sequence's lengths
        k_start = tl.load(CuSeqK + b)
        N_CTX_K = tl.load(CuSeqK + b + 1) - k_start
        if start_n >= N_CTX_K:  # a key block past this sequence's end
            return
        q_start = tl.load(CuSeqQ + b)
        N_CTX_Q = tl.load(CuSeqQ + b + 1) - q_start
        total_q = tl.load(CuSeqQ + tl.num_programs(1) // H_K)
        K = K + k_start.to(tl.int64) * stride_kt
        V = V + k_start.to(tl.int64) * stride_vt
        DK = DK + k_start.to(tl.int64) * stride_dkt
        DV = DV + k_start.to(tl.int64) * stride_dkt
        b = b * 0  # the packed tensors are [1, H, total, D] views: no batch offset (folded to 0)
    else:
        q_start = 0
        total_q = N_CTX_Q
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < N_CTX_K
    k = tl.load(
        K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
        + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
        mask=col_ok[:, None], other=0.0,
    )
    v = tl.load(
        V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
        + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
        mask=col_ok[:, None], other=0.0,
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    full_hi = (N_CTX_Q // BLOCK_M) * BLOCK_M

    # GQA: the query heads hk*GROUP .. hk*GROUP+GROUP-1 all read this KV head; sum them here.
    if INTERP:  # see _fwd_stage
        g = 0
        while g < GROUP:
            dk, dv = _dkdv_head(
                dk, dv, k, v, Q, DO, Lse, Delta, DQacc, sm_scale,
                stride_qb, stride_qh, stride_qt, stride_qd, stride_dob, stride_doh, stride_dot, stride_dod,
                b, hk, g, start_n, offs_n, offs_d, full_hi, qk_scale, H_Q, GROUP, N_CTX_Q, q_start, total_q,
                HEAD_DIM, CAUSAL, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, BLOCK_M, BLOCK_N, VARLEN,
            )
            g += 1
    else:
        for g in range(GROUP):
            dk, dv = _dkdv_head(
                dk, dv, k, v, Q, DO, Lse, Delta, DQacc, sm_scale,
                stride_qb, stride_qh, stride_qt, stride_qd, stride_dob, stride_doh, stride_dot, stride_dod,
                b, hk, g, start_n, offs_n, offs_d, full_hi, qk_scale, H_Q, GROUP, N_CTX_Q, q_start, total_q,
                HEAD_DIM, CAUSAL, USE_TMA, DOT_PREC, INTERP, FUSED_DQ, BLOCK_M, BLOCK_N, VARLEN,
            )

    dk = dk * sm_scale
    out_off = (
        b.to(tl.int64) * stride_dkb + hk.to(tl.int64) * stride_dkh
        + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd
    )
    tl.store(DK + out_off, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + out_off, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_stage(
    dq, q, do, lse2, delta,
    k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
    offs_m, offs_d, lo, hi, qk_scale, N_CTX_K,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr, INTERP: tl.constexpr,
):
    """Accumulate dQ of one query block over key blocks [lo, hi)."""
    if INTERP:  # see _fwd_stage
        start_n = lo
        while start_n < hi:
            dq = _dq_step(
                dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
                offs_m, offs_d, start_n, qk_scale, N_CTX_K, BLOCK_N, MASKED, CAUSAL, USE_TMA, DOT_PREC, INTERP,
            )
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_step(
                dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
                offs_m, offs_d, start_n, qk_scale, N_CTX_K, BLOCK_N, MASKED, CAUSAL, USE_TMA, DOT_PREC, INTERP,
            )
    return dq


@triton.jit
def _dq_step(
    dq, q, do, lse2, delta,
    k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
    offs_m, offs_d, start_n, qk_scale, N_CTX_K,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr, INTERP: tl.constexpr,
):
    """One key block's contribution to dQ."""
    start_n = tl.multiple_of(start_n, BLOCK_N)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:  # TMA zero-fills rows past T
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
    else:
        k_ptrs = k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
        if MASKED:
            k = tl.load(k_ptrs, mask=(offs_n < N_CTX_K)[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(offs_n < N_CTX_K)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    qk = _mm(q, tl.trans(k), DOT_PREC, INTERP)
    p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    if MASKED:
        keep = (offs_n < N_CTX_K)[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, p, 0.0)
    dp = _mm(do, tl.trans(v), DOT_PREC, INTERP)
    ds = p * (dp - delta[:, None])
    dq = _mma(ds.to(k.dtype), k, dq, DOT_PREC, INTERP)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    # pointers
    Q, K, V, DO, Lse, Delta, DQ,
    # strides (elements)
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_dob, stride_doh, stride_dot, stride_dod,
    stride_dqb, stride_dqh, stride_dqt, stride_dqd,
    # shapes / scalars
    sm_scale, qk_scale, H_Q, GROUP, N_CTX_Q, N_CTX_K,
    # meta-parameters
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
    INTERP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    # variable-length (packed) sequences, attention_varlen.py: int32 [n_seqs + 1] offsets
    CuSeqQ=None, CuSeqK=None, VARLEN: tl.constexpr = False,
):
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H_Q
    h = bh % H_Q
    hk = h // GROUP
    if VARLEN:
        # b is the sequence; N_CTX_Q / N_CTX_K arrive as the autotuner's key: now this sequence's lengths
        q_start = tl.load(CuSeqQ + b)
        N_CTX_Q = tl.load(CuSeqQ + b + 1) - q_start
        if start_m * BLOCK_M >= N_CTX_Q:  # a block past this sequence's end
            return
        k_start = tl.load(CuSeqK + b)
        N_CTX_K = tl.load(CuSeqK + b + 1) - k_start
        Q = Q + q_start.to(tl.int64) * stride_qt
        DO = DO + q_start.to(tl.int64) * stride_dot
        DQ = DQ + q_start.to(tl.int64) * stride_dqt
        K = K + k_start.to(tl.int64) * stride_kt
        V = V + k_start.to(tl.int64) * stride_vt
        b = b * 0  # the packed tensors are [1, H, total, D] views: no batch offset (folded to 0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_CTX_Q
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None], other=0.0,
    )
    do = tl.load(
        DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod,
        mask=row_ok[:, None], other=0.0,
    )
    if VARLEN:  # Lse and Delta are [Hq, total_q]; total_q is the last offset
        row_base = h.to(tl.int64) * tl.load(CuSeqQ + tl.num_programs(1) // H_Q) + q_start
    else:
        row_base = bh.to(tl.int64) * N_CTX_Q
    lse2 = tl.load(Lse + row_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(Delta + row_base + offs_m, mask=row_ok, other=0.0)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    if USE_TMA:
        k_desc = tl.make_tensor_descriptor(
            k_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_kt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        v_desc = tl.make_tensor_descriptor(
            v_base, shape=[N_CTX_K, HEAD_DIM], strides=[stride_vt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
    else:
        k_desc = k_base
        v_desc = v_base
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        diag_lo = start_m * BLOCK_M
        dq = _dq_stage(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
            offs_m, offs_d, 0, diag_lo, qk_scale, N_CTX_K, BLOCK_N, False, True, USE_TMA, DOT_PREC, INTERP,
        )
        dq = _dq_stage(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
            offs_m, offs_d, diag_lo, tl.minimum(diag_lo + BLOCK_M, N_CTX_K), qk_scale, N_CTX_K,
            BLOCK_N, True, True, USE_TMA, DOT_PREC, INTERP,
        )
    else:
        full_hi = (N_CTX_K // BLOCK_N) * BLOCK_N
        dq = _dq_stage(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
            offs_m, offs_d, 0, full_hi, qk_scale, N_CTX_K, BLOCK_N, False, False, USE_TMA, DOT_PREC, INTERP,
        )
        dq = _dq_stage(
            dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, stride_kt, stride_kd, stride_vt, stride_vd,
            offs_m, offs_d, full_hi, N_CTX_K, qk_scale, N_CTX_K, BLOCK_N, True, False, USE_TMA, DOT_PREC, INTERP,
        )
    dq = dq * sm_scale
    tl.store(
        DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
        + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty), mask=row_ok[:, None],
    )


# ----------------------------------------------------------------------------------------------
# Launchers: block sizes, warps and pipeline depth chosen here, in one place.
# ----------------------------------------------------------------------------------------------
# Hopper-sensible candidates (BLOCK_M, BLOCK_N, num_warps, num_stages) per tile-width class (head dim
# x element size, see _size_class). Chosen from ptxas reports for sm_90a (`python
# scripts/gpu/attention_probe.py --ptxas D dtype`, no GPU needed): all use wgmma and cp.async; the lists
# drop configs that spilled registers (dK/dV with BLOCK_N 64 or BLOCK_M 64, forward 128x64 with 4 warps
# at D=128). First H200 run (benchmarks/h200/probe-1): fwd 128x128 w8 s3 (causal) / 128x64 w8 s3,
# dK/dV 32x128 w8, dQ 128x64 w8 s3 won at B=4 H=32 T=4096 D=128 bf16. Causal correctness
# needs BLOCK_M % BLOCK_N == 0 (forward, dQ) and BLOCK_N % BLOCK_M == 0 (dK/dV): all satisfy it.
_FWD_CANDIDATES = {
    "d64": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
    "d128": [(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4), (256, 64, 8, 3)],
    "large": [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 2)],
    "fp32": [(32, 16, 4, 2)],
}
_DKDV_CANDIDATES = {
    "d64": [(32, 128, 8, 3), (32, 128, 8, 2), (16, 128, 8, 3)],
    "d128": [(32, 128, 8, 3), (32, 128, 8, 2), (16, 128, 8, 3)],
    "large": [(32, 64, 8, 2), (16, 64, 8, 2)],
    "fp32": [(16, 32, 4, 2)],
}
_DQ_CANDIDATES = {
    # (64, 128, 4, 3) was here: BLOCK_M < BLOCK_N breaks the causal dQ stages (the unmasked stage's last
    # key block reached past the diagonal), and the autotuner picked it at head_dim 16 and 32 on the H200
    # (dq max error 1.28). _check_tables() now refuses such an entry at import.
    "d64": [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3)],
    "d128": [(128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3)],
    "large": [(64, 32, 4, 2), (64, 32, 8, 2), (32, 32, 4, 2)],
    "fp32": [(32, 16, 4, 2)],
}


def _check_tables() -> None:
    """The causal stages split key blocks at multiples of the row block: the forward and dQ kernels
    need BLOCK_M % BLOCK_N == 0, the dK/dV kernel BLOCK_N % BLOCK_M == 0. Checked at import so that a
    config that silently computes wrong gradients can never be added to a list."""
    for name, table in (("forward", _FWD_CANDIDATES), ("dQ", _DQ_CANDIDATES), ("dK/dV", _DKDV_CANDIDATES)):
        for cls, configs in table.items():
            for bm, bn, _, _ in configs:
                ok = bn % bm == 0 if name == "dK/dV" else bm % bn == 0
                if not ok:
                    raise AssertionError(f"attention {name} config ({bm}, {bn}) for {cls}: the causal stages need "
                                         f"{'BLOCK_N % BLOCK_M' if name == 'dK/dV' else 'BLOCK_M % BLOCK_N'} == 0")


_check_tables()

# Under the interpreter: tiny blocks so that small test shapes still cross several blocks, the
# diagonal spans more than one inner block, and ragged tails are exercised.
_INTERPRET = {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}

# Flags the probe script (and users) may flip at run time.
USE_TMA = os.environ.get("HEARTH_ATTN_TMA", "0") == "1"  # streamed tiles through TMA descriptors
FUSED_DQ = os.environ.get("HEARTH_ATTN_FUSED_DQ", "0") == "1"  # dQ by fp32 atomics in the dK/dV kernel
AUTOTUNE = os.environ.get("HEARTH_ATTN_AUTOTUNE", "1") == "1"  # off: first candidate of each list
# VARLEN (attention_varlen.py passes it; N_CTX_* are then max_seqlen_*'s power-of-two bucket) tunes apart
_FWD_KEY = ["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL", "USE_TMA", "DOT_PREC", "VARLEN"]
_BWD_KEY = ["N_CTX_Q", "N_CTX_K", "HEAD_DIM", "CAUSAL", "USE_TMA", "DOT_PREC", "VARLEN"]
_DKDV_KEY = _BWD_KEY + ["FUSED_DQ"]


def _size_class(head_dim: int, element_size: int) -> str:
    """Tile-width class by bytes per row of a Q/K/V tile. fp32 ("ieee" matmuls run on the FMA
    units, not wgmma) gets small tiles: larger ones spilled tens of KB per thread under ptxas."""
    if element_size == 4:
        return "fp32"
    row_bytes = head_dim * element_size
    return "d64" if row_bytes <= 128 else ("d128" if row_bytes <= 256 else "large")


def _configs(table):
    unique = dict.fromkeys(c for cls in table.values() for c in cls)
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for (m, n, w, s) in unique]


def _pruner(table):
    def prune(configs, named_args, **kwargs):
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        wanted = set(table[_size_class(head_dim, named_args["Q"].element_size())])
        kept = [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in wanted]
        return kept or configs[:1]
    return prune


_fwd_tuned = triton.autotune(
    _configs(_FWD_CANDIDATES), key=_FWD_KEY, prune_configs_by={"early_config_prune": _pruner(_FWD_CANDIDATES)}
)(_attn_fwd_kernel)
_dkdv_tuned = triton.autotune(  # DQacc accumulates atomically: zeroed before each timing run
    _configs(_DKDV_CANDIDATES), key=_DKDV_KEY, prune_configs_by={"early_config_prune": _pruner(_DKDV_CANDIDATES)},
    reset_to_zero=["DQacc"],
)(_attn_bwd_dkdv_kernel)
_dq_tuned = triton.autotune(
    _configs(_DQ_CANDIDATES), key=_BWD_KEY, prune_configs_by={"early_config_prune": _pruner(_DQ_CANDIDATES)}
)(_attn_bwd_dq_kernel)


def _launch(raw_kernel, tuned_kernel, which, table, n_rows, bh, args, meta, fixed=None):
    """Launch with the autotuner on CUDA, or with one config: the interpreter's, the table's first (AUTOTUNE off),
    or `fixed` (a rule's pick, forward_config: it replaces the autotuner, not AUTOTUNE=0's first entry)."""
    if interpret_mode() or not AUTOTUNE or fixed is not None:
        if interpret_mode():
            bm, bn, warps, stages = _INTERPRET[which]
        elif not AUTOTUNE:
            bm, bn, warps, stages = table[_size_class(meta["HEAD_DIM"], args[0].element_size())][0]
        else:
            bm, bn, warps, stages = fixed
        rows_block = bn if which == "dkdv" else bm
        raw_kernel[(cdiv(n_rows, rows_block), bh)](
            *args, **meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages
        )
        return
    row_key = "BLOCK_N" if which == "dkdv" else "BLOCK_M"
    tuned_kernel[lambda META: (cdiv(n_rows, META[row_key]), bh)](*args, **meta)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 stays fp32 (as torch's default matmul); 16-bit types use tensor cores either way.
    return "ieee" if dtype == torch.float32 else "tf32"


def _ensure_allocator() -> None:
    # Device-side tensor descriptors live in a global scratch buffer Triton asks us for. Triton keeps
    # the allocator in a ContextVar, i.e. per thread: the backward runs on autograd's own thread, so
    # it is set before every TMA launch (one ContextVar.set), not once per process.
    triton.set_allocator(tma_scratch)


_on_device = on_device  # attention_varlen reaches it through this module


# Where the Gluon ping-pong forward is the default on Hopper (bf16/fp16): the (head_dim, causal) cases where the
# H200 measured it faster than the Triton forward in the same run (2026-12-02, commit 2d5635d,
# scripts/gpu/attention_gluon_probe.py --pp-only, forward TFLOP/s, ping-pong at PP_CONFIGS / Triton / cuDNN):
# causal B4 H32 T4096 D128 496 / 431 / 521, causal B2 Hq40 Hk8 T8192 D128 540 / 470 / 551, non-causal B4 H32
# T4096 D128 559 / 476 / 597; at D64 (causal B4 H32 T4096) 348 / 377 / 418, slower, so D64 stays Triton.
GLUON_PP_DEFAULT = frozenset({(128, True), (128, False)})
# Up to these query lengths (by causal) the ping-pong forward runs persistent: one program per SM walks the
# tiles, in sections of heads whose K/V fit L2 (attention_gluon.pps_section), so no launch, barrier set-up and
# cold loads per tile. Measured on the H200 (torch 2.11.0+cu130, triton 3.6.0, 2026-12-02/03, commit 080b316),
# `python -m hearth.bench attention --sizes goal|headline --mode fwd --providers hearth,sdpa_cudnn` with env
# HEARTH_ATTN_GLUON_PERSIST=1 against =0, forward ms (goal grid B*T = 16384, GQA 40/8, D128; =0 run twice):
#   causal      T1024 0.393 / 0.453, T2048 0.632 / 0.696-0.704, T4096 1.136 / 1.188-1.189
#   non-causal  T1024 0.599 / 0.637-0.643, T2048 1.097 / 1.125-1.128, T4096 2.184 / 2.100-2.101 (slower)
#   B4 H32 T4096 (no GQA): causal 0.950 / 0.960, non-causal 1.759 / 1.684 (slower)
# From T8192 on the first tile order (round robin) tied or lost (T32768 causal 18.50 / 17.69 ms). With the
# balanced schedule (attention_gluon.pps_schedule; 2026-12-04, commit 89eda47, scripts/gpu/attention_knob_probe.py
# --pass fwd, persistent / per tile, forward ms, two rounds each) causal runs persistent faster up to T16384:
#   GQA 40/8 T8192 B2 2.107 / 2.162-2.170, T16384 B1 4.095-4.101 / 4.120-4.126, T32768 B1 16.20 / 16.15-16.16
#   (slower), Qwen3-32B 64/8 T8192 B1 1.683 / 1.741-1.746, MHA 32/32 T8192 B2 1.708-1.713 / 1.751
# Non-causal at T4096 measured slower persistent at both shapes (its tiles are equal, so the schedule does not
# change it; why is not known yet), so non-causal stays per tile from T4096 on.
PERSIST_MAX_T = {True: 16384, False: 2048}  # keyed by causal


def forward_kernel(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int, causal: bool,
                   *, seq_len: int | None = None, env: dict | None = None) -> str:
    """THE place that picks the forward kernel: "gluon_pp" (attention_gluon.py's ping-pong forward: two consumer
    warpgroups and a TMA producer warp, one program per tile), "gluon_pps" (the same, persistent), "gluon" (its
    single-partition / producer-warp forward) or "triton" (the kernel above, which serves every GPU, dtype and
    head dim). The Gluon kernels serve Hopper, bf16/fp16, head_dim 64/128. capability: the GPU's (major, minor),
    None off CUDA / under the interpreter. seq_len: the query length (None: unknown, not persistent).

    env HEARTH_ATTN_GLUON unset: the ping-pong forward where it measured faster (GLUON_PP_DEFAULT), Triton
    elsewhere. "0": Triton everywhere. "1": a Gluon forward wherever it serves, ping-pong when
    attention_gluon.PING_PONG (env HEARTH_ATTN_GLUON_PP=1), else the variant HEARTH_ATTN_GLUON_WS picks.
    A ping-pong pick runs persistent up to PERSIST_MAX_T[causal] query rows; env HEARTH_ATTN_GLUON_PERSIST "1"
    makes it persistent at every length, "0" never."""
    env = os.environ if env is None else env
    choice = env.get("HEARTH_ATTN_GLUON")
    if choice == "0" or capability is None or capability[0] != 9:
        return "triton"
    if choice != "1":
        if (head_dim, bool(causal)) not in GLUON_PP_DEFAULT or dtype not in (torch.bfloat16, torch.float16):
            return "triton"
    from hearth.kernels import attention_gluon  # imports Gluon: only when it may be used

    if not attention_gluon.supported(capability, dtype, head_dim):
        return "triton"
    if choice == "1" and not attention_gluon.PING_PONG:
        return "gluon"
    persist = env.get("HEARTH_ATTN_GLUON_PERSIST")
    if persist == "1" or (persist != "0" and seq_len is not None and seq_len <= PERSIST_MAX_T[bool(causal)]):
        return "gluon_pps"
    return "gluon_pp"


# The Triton forward's launch config on Hopper at head_dim 64 (bf16 / fp16), by causal: a rule in place of the
# autotuner. Timed one by one on the H200 (2026-12-04, commit f23e60e, scripts/gpu/attention_fwd_config_probe.py: 24
# configs at 7 cases, GQA 40/8 T1024-16384 causal and not, and Llama-3.2-1B 32/8 T8192; device sleep and L2 flush
# before each call, as the harness times), the autotuner's pick ran 1.3-9.7% slower than the best config of its own
# list at every case (causal B4 T4096: 0.893 against 0.814 ms); the best was 64x64, 4 warps, 3 stages at all four
# causal cases and 128x64, 8 warps, 3 stages at all three non-causal ones. (The autotuner times its candidates back
# to back, where the clock the power limit allows differs from the one the harness and a short kernel see.)
FWD_RULE_HOPPER_D64 = {True: (64, 64, 4, 3), False: (128, 64, 8, 3)}  # keyed by causal
# The same kernel on packed rows (attention_varlen: its programs read cu_seqlens and mask each sequence's tail):
# 64x64, 4 warps, 3 stages was the fastest of the 24 configs at all four probed cases, causal and not (2026-12-04,
# commit 8a96ceb, the probe above with --varlen: 32 x 1024 tokens 32/8 causal, GQA 40/8 4 x 4096 causal, 16 x 1024
# and 4 x 4096 non-causal), where the autotuner's pick ran 5-12% slower (non-causal 4 x 4096: 1.658 against
# 1.478 ms) and the dense non-causal rule's 128x64 w8 s3 0.5-2.4% slower.
FWD_RULE_HOPPER_D64_VARLEN = (64, 64, 4, 3)


def forward_config(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int,
                   causal: bool, *, varlen: bool = False) -> tuple[int, int, int, int] | None:
    """The Triton forward's (BLOCK_M, BLOCK_N, num_warps, num_stages) where a rule replaces the autotuner
    (Hopper, bf16 / fp16, head_dim 64: FWD_RULE_HOPPER_D64 by causal, FWD_RULE_HOPPER_D64_VARLEN for packed rows),
    else None (the autotuner picks from _FWD_CANDIDATES). HEARTH_ATTN_AUTOTUNE=0 still runs each list's first."""
    if capability is not None and capability[0] == 9 and head_dim == 64 and dtype in (torch.bfloat16, torch.float16):
        return FWD_RULE_HOPPER_D64_VARLEN if varlen else FWD_RULE_HOPPER_D64[bool(causal)]
    return None


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The (major, minor) compute capability forward_kernel / backward_kernel take: a CUDA device's, None off
    CUDA and under the interpreter (where no Gluon kernel runs); cached (_common.capability)."""
    return None if interpret_mode() else capability(device)


def _gluon_serving(choice: str, *tensors: torch.Tensor):
    """attention_gluon when `choice` (forward_kernel's or backward_kernel's) names one of its kernels and TMA can
    address every tensor; None otherwise (odd strides or alignment: the Triton kernel runs)."""
    if choice == "triton":
        return None
    from hearth.kernels import attention_gluon  # imports Gluon: only when one of its kernels was chosen

    return attention_gluon if attention_gluon.tma_addressable(*tensors) else None


_BWD_ENV = {"dkdv": "HEARTH_ATTN_GLUON_BWD", "dq": "HEARTH_ATTN_GLUON_BWD_DQ", "fused": "HEARTH_ATTN_GLUON_BWD_FUSED"}


# Packed (varlen) causal grouped-query attention at head_dim 128 whose longest sequence is at most this many tokens
# takes the Triton backward, not the fused one: on an H100 (2026-12-06, BENCHMARKS.md's thirty-seventh run, fwd+bwd
# through attention_varlen, sequences of equal length) the Triton backward was 6.5-8% faster at 256 and 512 tokens
# (32/8 and 40/8 heads), 2.6-4% at 683 and 768 (40/8), level at 1024 (32/8: 0.6%), and the fused one 18% faster at
# 2048. Short sequences give the fused kernel's two extra passes (the dQ buffer's clearing and its conversion) a
# larger share. MHA (5% the Triton way at 256, 7% the fused way at 512) and non-causal (14% the fused way at 512)
# keep the fused kernel.
FUSED_VARLEN_SHORT_MAX = 768


def backward_kernel(capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int, causal: bool,
                    *, part: str = "dkdv", env: dict | None = None, packed_max_len: int | None = None,
                    group: int = 1) -> str:
    """THE place that picks a backward kernel, per part ("dkdv", "dq" or "fused"): "gluon" (attention_gluon.py's
    wgmma + TMA kernels, Hopper, bf16/fp16, head_dim 64/128) or "triton" (the kernels above, which serve
    everything). "fused": dK, dV and dQ in one warp-specialised kernel (attention_gluon.backward_fused), which
    replaces both other parts. It is the default where it serves: the H200 measured it 14-24% faster than the
    Triton kernels at the issue's cases (BENCHMARKS.md). Env HEARTH_ATTN_GLUON_BWD_FUSED=0 turns it off, and so
    does torch.use_deterministic_algorithms(True): its dQ is summed by fp32 adds in whatever order the programs
    reach them, so two runs may differ in the last bits (the Triton kernels give the same bits every run). The
    split Gluon kernels are opt-in, each by its env var (HEARTH_ATTN_GLUON_BWD=1 for dK / dV,
    HEARTH_ATTN_GLUON_BWD_DQ=1 for dQ): the H200 measured them within 3% of the Triton kernels, either way.
    packed_max_len (attention_varlen: its max_seqlen_k) and group (query heads a K/V head): causal packed rows under
    grouped-query attention at head_dim 128 whose sequences are at most FUSED_VARLEN_SHORT_MAX tokens take the
    Triton backward (faster there); HEARTH_ATTN_GLUON_BWD_FUSED=1 keeps the fused one for them too."""
    if part not in _BWD_ENV:
        raise ValueError(f"part must be 'dkdv', 'dq' or 'fused', got {part!r}")
    env = os.environ if env is None else env
    if capability is None or capability[0] != 9:
        return "triton"
    if part == "fused":
        flag = env.get(_BWD_ENV[part])
        if flag == "0" or torch.are_deterministic_algorithms_enabled():
            return "triton"
        if (flag != "1" and packed_max_len is not None and causal and group > 1 and head_dim == 128
                and packed_max_len <= FUSED_VARLEN_SHORT_MAX):
            return "triton"
    elif env.get(_BWD_ENV[part], "0") != "1":
        return "triton"
    from hearth.kernels import attention_gluon  # imports Gluon: only when asked for

    return "gluon" if attention_gluon.supported(capability, dtype, head_dim) else "triton"


def fused_backward_serves(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether attention on (device, dtype, head_dim) runs the fused Gluon backward (backward_kernel's "fused"
    pick: Hopper, bf16/fp16, head_dim 64 or 128, not deterministic mode): where hearth's attention measured level
    with SDPA in the dense LoRA step on the H200 (1.01x at seq 4096, 0.994x at 16384) and 12x faster than SDPA's
    masked path on packed rows, and so where hearth.patch.apply switches it in by default. Elsewhere the Triton
    backward runs, slower than SDPA's cuDNN / flash kernels."""
    return backward_kernel(device_capability(device), dtype, head_dim, True, part="fused") == "gluon"


def offline_source(fn, consts: dict, dtype: str = "bf16"):
    """A Triton ASTSource of one of the kernels above (forward, dK/dV, dQ) for an offline build (no GPU), typed
    and specialised as a launch sees it: `consts` are the constexprs (including unit head-dim strides), the
    q / k / v / o tensors `dtype` ("bf16", "fp16", "fp32"), lse / delta / the dQ accumulator fp32, the offsets
    int32, and pointers, strides and lengths divisible by 16. Used by scripts/gpu/attention_probe.py --ptxas
    and the tests' sm_90 builds."""
    from triton.compiler import ASTSource

    # constexprs the caller left out take their defaults (e.g. VARLEN=False, STORE_LSE=True), as a launch does
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    consts = {**defaults, **consts}
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in ("Lse", "Delta", "DQacc"):
            sig[n] = "*fp32"
        elif n in ("Q", "K", "V", "Out", "DO", "DK", "DV", "DQ"):
            sig[n] = "*" + dtype
        elif n in ("qk_scale", "sm_scale"):
            sig[n] = "fp32"
        elif n in ("CuSeqQ", "CuSeqK"):
            sig[n] = "*i32"
        else:
            sig[n] = "i32"
        if n not in consts and (sig[n].startswith("*") or n.startswith(("stride_", "N_CTX"))):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, sig, constexprs={(fn.arg_names.index(n),): v for n, v in consts.items()}, attrs=attrs)


def offline_kernels(arch: int, dtype: torch.dtype) -> list[tuple[str, object]]:
    """`hearth inspect attention --arch sm_90` (no GPU): the Gluon kernels built offline for `arch`
    (attention_gluon.offline_kernels): every forward variant (with and without the logsumexp store), the split
    backward kernels and the fused backward (Hopper's default backward), and attention_varlen's packed forms. The Triton kernels above are inspected on a GPU (`hearth inspect attention`) or
    with `scripts/gpu/attention_probe.py --ptxas`."""
    from hearth.kernels import attention_gluon

    if arch // 10 != 9 or dtype not in attention_gluon.DTYPES:
        raise ValueError(f"the offline build is the Gluon kernels: sm_90 and bf16/fp16, got sm_{arch} / {dtype}")
    # every variant, the persistent forward included (forward_kernel's pick up to PERSIST_MAX_T[causal] query rows)
    built = attention_gluon.offline_kernels(arch, dtype,
                                            variants=("1part", "ws", "pp", "pps", "bwd", "bwd_dq", "bwd_fused"))
    # and the other builds hearth routes to: the inference forwards (attention without grad: no logsumexp store)
    # and attention_varlen's packed forms (the fused backward with and without the ragged-offset dQ placement; the
    # packed forward with and without the logsumexp store)
    built += attention_gluon.offline_kernels(arch, dtype, variants=("pp", "pps"), store_lse=False)
    built += attention_gluon.offline_kernels(arch, dtype, variants=("pp", "bwd_fused"), varlen=True)
    built += attention_gluon.offline_kernels(arch, dtype, variants=("pp",), varlen=True, store_lse=False)
    pad = attention_gluon.FB_CONFIGS_VARLEN[max(attention_gluon.HEAD_DIMS)][0]  # the query step: backward_fused_varlen's pad
    built += attention_gluon.offline_kernels(arch, dtype, variants=("bwd_fused",), varlen=True, fb_dq_pad=pad)
    return built


def _checked_scale(scale, head_dim: int) -> float:
    """The softmax scale as a float: 1/sqrt(head_dim) for None; TypeError / ValueError naming `scale` for
    anything that is not a positive, finite number (attention and attention_varlen check it the same way)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"scale must be positive and finite, got {scale}")
    return scale


def _attention_forward(q, k, v, causal: bool, scale: float, store_lse: bool = True):
    """q [B, Hq, Tq, D], k/v [B, Hk, Tk, D] (any strides) -> out [B, Hq, Tq, D] in q's memory order
    (empty_heads_like), lse [B, Hq, Tq] fp32.
    store_lse=False (no backward will run): lse is None, neither allocated nor written."""
    B, Hq, Tq, D = q.shape
    cap = device_capability(q.device)
    kernel = forward_kernel(cap, q.dtype, D, causal, seq_len=Tq)
    gluon = _gluon_serving(kernel, q, k, v)
    if gluon is not None:
        return gluon.forward(q, k, v, causal, scale, store_lse, kernel in ("gluon_pp", "gluon_pps"),
                             persistent=kernel == "gluon_pps")
    Hk, Tk = k.shape[1], k.shape[2]
    out = empty_heads_like(q, (B, Hq, Tq, D))
    lse = torch.empty((B, Hq, Tq), dtype=torch.float32, device=q.device) if store_lse else None
    use_tma = bool(USE_TMA and not interpret_mode() and q.is_cuda and tma_addressable(k, v))
    if use_tma:
        _ensure_allocator()
    args = (
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        scale * LOG2E, Hq, Hq // Hk, Tq, Tk,
    )
    meta = dict(HEAD_DIM=D, CAUSAL=causal, USE_TMA=use_tma, DOT_PREC=_dot_precision(q.dtype), INTERP=interpret_mode(),
                STORE_LSE=store_lse)
    with _on_device(q.device):
        _launch(_attn_fwd_kernel, _fwd_tuned, "fwd", _FWD_CANDIDATES, Tq, B * Hq, args, meta,
                fixed=forward_config(cap, q.dtype, D, causal))
    return out, lse


def _attention_backward(do, q, k, v, out, lse, causal: bool, scale: float):
    """Gradients of attention: dq [B, Hq, Tq, D] in q's memory order, dk / dv [B, Hk, Tk, D] both in k's
    (empty_heads_like; the dK/dV kernels write both through one set of strides), in the input dtype."""
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    delta = torch.empty((B, Hq, Tq), dtype=torch.float32, device=q.device)
    dk = empty_heads_like(k, (B, Hk, Tk, D))
    dv = empty_heads_like(k, (B, Hk, Tk, D), dtype=v.dtype)
    with _on_device(q.device):
        cap = device_capability(q.device)
        gluon = _gluon_serving(backward_kernel(cap, q.dtype, D, causal, part="fused"), q, k, v, do)
        if gluon is not None:  # it computes delta itself, in the launch that clears its dQ buffer
            dq = empty_heads_like(q, (B, Hq, Tq, D))
            gluon.backward_fused(q, k, v, do, lse, delta, dq, dk, dv, causal, scale, out=out)
            return dq, dk, dv
        _bwd_preprocess(out, do, delta)
        # the Triton kernels' TMA loads: checked only here, off the fused path's host time
        prec = _dot_precision(q.dtype)
        use_tma_dkdv = bool(USE_TMA and not interpret_mode() and q.is_cuda and tma_addressable(q, do))
        use_tma_dq = bool(USE_TMA and not interpret_mode() and q.is_cuda and tma_addressable(k, v))
        if use_tma_dkdv or use_tma_dq:
            _ensure_allocator()
        fused = bool(FUSED_DQ)
        # fp32 dQ accumulator (fused) or a 1-element stand-in the kernel never touches
        dq_acc = torch.zeros((B, Hq, Tq, D) if fused else (1,), dtype=torch.float32, device=q.device)
        dkdv_args = (
            q, k, v, do, lse, delta, dk, dv, dq_acc,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
            scale, scale * LOG2E, Hq, Hk, Hq // Hk, Tq, Tk,
        )
        meta = dict(HEAD_DIM=D, CAUSAL=causal, USE_TMA=use_tma_dkdv, DOT_PREC=prec, INTERP=interpret_mode())
        # the fused dQ path is the Triton kernel's own
        gluon = None if fused else _gluon_serving(backward_kernel(cap, q.dtype, D, causal), q, k, v, do)
        if gluon is not None:
            gluon.backward_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale)
        else:
            _launch(_attn_bwd_dkdv_kernel, _dkdv_tuned, "dkdv", _DKDV_CANDIDATES, Tk, B * Hk, dkdv_args,
                    dict(meta, FUSED_DQ=fused))
        dq = empty_heads_like(q, (B, Hq, Tq, D))
        if fused:
            return dq.copy_(dq_acc), dk, dv
        gluon = _gluon_serving(backward_kernel(cap, q.dtype, D, causal, part="dq"), q, k, v, do)
        if gluon is not None:
            gluon.backward_dq(q, k, v, do, lse, delta, dq, causal, scale)
            return dq, dk, dv
        dq_args = (
            q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
            scale, scale * LOG2E, Hq, Hq // Hk, Tq, Tk,
        )
        meta["USE_TMA"] = use_tma_dq
        _launch(_attn_bwd_dq_kernel, _dq_tuned, "dq", _DQ_CANDIDATES, Tq, B * Hq, dq_args, meta)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------
# torch.library op + autograd: opaque to torch.compile (no graph break), fake impls give shapes.
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("hearth::attention_fwd", mutates_args=())
def _attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_forward(q, k, v, causal, scale)


@_attention_fwd_op.register_fake
def _(q, k, v, causal, scale):
    B, Hq, Tq, D = q.shape
    return empty_heads_like(q, (B, Hq, Tq, D)), q.new_empty((B, Hq, Tq), dtype=torch.float32)


def _attention_infer_forward(q, k, v, causal: bool, scale: float) -> torch.Tensor:
    """The forward when no backward will run: no [B, Hq, Tq] fp32 logsumexp is allocated or written (the
    op then holds only its output, as SDPA's kernels do without grad)."""
    return _attention_forward(q, k, v, causal, scale, store_lse=False)[0]


@torch.library.custom_op("hearth::attention_infer", mutates_args=())
def _attention_infer_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    return _attention_infer_forward(q, k, v, causal, scale)


@_attention_infer_op.register_fake
def _(q, k, v, causal, scale):
    return empty_heads_like(q, q.shape)


_attention_infer = compiled_or_eager(_attention_infer_op, _attention_infer_forward)


@torch.library.custom_op("hearth::attention_bwd", mutates_args=())
def _attention_bwd_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _attention_backward(do, q, k, v, out, lse, causal, scale)


@_attention_bwd_op.register_fake
def _(do, q, k, v, out, lse, causal, scale):
    return empty_heads_like(q, q.shape), empty_heads_like(k, k.shape), empty_heads_like(k, v.shape, dtype=v.dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)  # saved for the backward only; no gradient flows through it
    # and no zero [B, Hq, Tq] gradient is made for it on every backward (an allocation + fill launch)
    ctx.set_materialize_grads(False)
    ctx.causal = causal
    ctx.scale = scale


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    elif _plane_extent(dout) >= _INT32_LIMIT:  # see attention(): in-plane offsets are int32
        dout = dout.contiguous()
    dq, dk, dv = (_attention_backward if ctx.eager else _attention_bwd_op)(dout, q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


# eager: a torch.autograd.Function over the launchers; under torch.compile: the custom ops
_attention = autograd_op(_attention_fwd_op, _attention_forward, _setup_context, _backward, once=True)


# ----------------------------------------------------------------------------------------------
# Public function
# ----------------------------------------------------------------------------------------------
# The kernels add 64-bit (batch, head) base offsets to 32-bit offsets inside one [T, D] plane
# (row * stride_t + col * stride_d, kept in int32 for register pressure in the hot loops).
_INT32_LIMIT = 2**31
# CUDA caps a grid's second dimension (the kernels' batch x heads axis) at 65535.
MAX_BATCH_HEADS = 65535


def _plane_extent(t: torch.Tensor) -> int:
    """Largest element offset within one (b, h) [T, D] plane of `t` (the kernels' int32 part)."""
    return (t.shape[2] - 1) * t.stride(2) + (t.shape[3] - 1) * t.stride(3)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Scaled dot-product attention, flash-style: softmax(q k^T * scale (+ causal mask)) v.

    Args:
        q: [B, Hq, Tq, D] queries (any strides, e.g. a transposed [B, T, H, D] view).
        k: [B, Hk, Tk, D] keys; Hk must divide Hq (grouped-query attention when Hk < Hq).
        v: [B, Hk, Tk, D] values.
        causal: mask keys after the query position (top-left aligned; needs Tq == Tk).
        scale: multiplier of q k^T; default 1/sqrt(D).

    Returns:
        [B, Hq, Tq, D] in the input dtype and in q's memory order, as PyTorch's SDPA returns it: for q a
        transposed [B, T, H, D] view, a transposed view of a dense [B, Tq, Hq, D] tensor (so `.transpose(1, 2)`
        is contiguous and the usual reshape to [B, Tq, Hq * D] copies nothing), otherwise dense [B, Hq, Tq, D].
        The gradients follow q's and k's orders the same way. Differentiable in q, k and v.

    dtypes: float16 / bfloat16 (tensor cores, fp32 accumulation and softmax) and float32 (full fp32
    matmuls, slow). D: 1..256; a power of two in 16..256 runs natively, any other D zero-padded to the
    next one (80, 96 -> 128: the padded size's time and saved memory). Cost: 4*B*Hq*Tq*Tk*D FLOPs forward (half when
    causal), 2.5x that backward; memory O(B*H*T*D) (the T x T scores are never stored; when a backward
    will run, the forward keeps a [B, Hq, Tq] fp32 logsumexp for it, and otherwise allocates only the output).

    Raises:
        TypeError: a non-tensor, an unsupported dtype, mixed dtypes, a non-bool causal or a non-number scale.
        ValueError: wrong ndim, empty, different devices, mismatched B / T / D / heads, Hq not a multiple
            of Hk, an unsupported D, causal with Tq != Tk, a scale that is not positive and finite,
            B * Hq > 65535 (CUDA grid limit).

    A strided q / k / v whose [T, D] plane spans >= 2^31 elements (the kernels' in-plane offsets are
    int32) is copied to a dense layout first; the result is the same.
    """
    check_tensor(q, "q", ndim=4)
    check_tensor(k, "k", ndim=4)
    check_tensor(v, "v", ndim=4)
    check_same_device(q=q, k=k, v=v)
    check_same_dtype(q=q, k=k, v=v)
    B, Hq, Tq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k and v must have batch {B} like q, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if padded_head_dim(D) is None:
        raise ValueError(f"q head dim (last dim) must be in 1..{MAX_HEAD_DIM}, got {D}")
    if k.shape[3] != D:
        raise ValueError(f"k head dim must equal q's ({D}), got shape {tuple(k.shape)}")
    if v.shape[3] != D:
        raise ValueError(f"v head dim must equal q's ({D}), got shape {tuple(v.shape)}")
    if v.shape[1:3] != k.shape[1:3]:
        raise ValueError(f"v must have the heads and length of k {tuple(k.shape)}, got {tuple(v.shape)}")
    Hk, Tk = k.shape[1], k.shape[2]
    if Hq % Hk:
        raise ValueError(f"k heads ({Hk}) must divide q heads ({Hq}) for grouped-query attention")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if causal and Tq != Tk:
        raise ValueError(f"causal attention needs q and k of the same length, got q T={Tq} and k T={Tk}")
    scale = _checked_scale(scale, D)
    if B * Hq > MAX_BATCH_HEADS:
        raise ValueError(f"q has batch x heads = {B} x {Hq} = {B * Hq}; at most {MAX_BATCH_HEADS} (CUDA grid limit) are supported")
    tensors = {"q": q, "k": k, "v": v}
    padded = padded_head_dim(D)
    if padded != D:  # e.g. 80 or 96 -> 128: zero columns, scale kept at the real D's (computed above)
        tensors = {n: torch.nn.functional.pad(t, (0, padded - D)) for n, t in tensors.items()}
    # checked on the tensors the kernels read: a padded copy's rows are wider than the caller's
    for name, t in tensors.items():
        if _plane_extent(t) >= _INT32_LIMIT:
            # a strided view whose [T, D] plane spans >= 2^31 elements (e.g. a transposed [B, T, H, D]
            # tensor with T * H * D >= 2^31): the int32 in-plane offsets would overflow; a dense copy fits
            tensors[name] = t = t.contiguous()
            if _plane_extent(t) >= _INT32_LIMIT:
                raise ValueError(f"{name} has T x D = {t.shape[2]} x {t.shape[3]} >= 2^31 elements per head"
                                 f"{'' if padded == D else f' (D {D} runs padded to {padded})'}; not supported")
    if records_graph(q, k, v):
        out, _ = _attention(tensors["q"], tensors["k"], tensors["v"], causal, scale)
    else:  # no graph to record: skip the logsumexp the backward would need
        out = _attention_infer(tensors["q"], tensors["k"], tensors["v"], causal, scale)
    return out if padded == D else out[..., :D]
