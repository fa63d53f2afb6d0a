"""Rotary position embedding, rotate-half convention (Llama / Qwen / Hugging Face).

Math, per head vector x of D features split into halves x1 = x[:D/2], x2 = x[D/2:]:
    rotate_half(x) = cat(-x2, x1)            out = x * cos + rotate_half(x) * sin
    out1 = x1 * cos1 - x2 * sin1             out2 = x2 * cos2 + x1 * sin2
The map is linear, out = R x; the backward is R^T dy:
    dx1 = dy1 * cos1 + dy2 * sin2            dx2 = dy2 * cos2 - dy1 * sin1
which is the forward with (sin1, sin2) replaced by (-sin2, -sin1). For the usual tables
(cos/sin = cat(freqs, freqs): both halves equal) that is "rotate by -theta" (LESSON 6), so ONE
kernel serves both directions behind a constexpr flag; swapping the halves keeps the gradient
exact for any cos/sin.

One program per (b, t): it loads that row of cos/sin once and applies it to all Hq heads of q and
all Hk heads of k (GQA) in the same launch. q/k are addressed through their four strides, so the
Hugging Face layout ([B, T, H, D] transposed to [B, H, T, D]) is read in place, without a copy.
Memory traffic (b bytes per element): reads q, k once and writes them once:
    2 * B * (Hq + Hk) * T * D * b   (+ cos/sin, B_cs * T * D * 2 * their bytes)
At q[4,32,4096,128] k[4,8,4096,128] bf16: 320 MiB per direction, ~0.08 ms at 4.27 TB/s.
cos and sin are treated as constants: no gradient flows to them (they are buffers in every model).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hearth.kernels._common import (
    FLOAT_DTYPES, autograd_op, backward_route, check_same_device, check_same_dtype, check_tensor, next_power_of_2, pick_config,
)

# Cap on the [BLOCK_H, BLOCK_HALF] register tile per tensor; heads beyond it are looped over.
MAX_TILE = 4096
# Tuning override for the launcher's num_warps choice (None: 4 for tiles <= 2048 elements, else 8).
NUM_WARPS: int | None = None


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def _rotate_heads(
    x_ptr, o_ptr, HALF,
    sx_h, sx_d, so_h, so_d,
    c1, c2, s1, s2, d,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Rotate all H heads at x_ptr (already offset to (b, t)) into o_ptr, BLOCK_H heads at a time."""
    dmask = d < HALF
    for h0 in range(0, H, BLOCK_H):
        # int64 head index: h * head stride exceeds 2^31 once one (b, t) slab spans > 2^31 elements
        # (e.g. [B, H, T, D] with H*T*D >= 2^31); the batch / position offsets are int64 already
        h = h0 + tl.arange(0, BLOCK_H)[:, None].to(tl.int64)
        mask = (h < H) & dmask[None, :]
        x_off = h * sx_h + d[None, :] * sx_d
        o_off = h * so_h + d[None, :] * so_d
        x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_off + HALF * sx_d, mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * c1[None, :] - x2 * s1[None, :]
        o2 = x2 * c2[None, :] + x1 * s2[None, :]
        tl.store(o_ptr + o_off, o1.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_ptr + o_off + HALF * so_d, o2.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    # pointers
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    # shapes
    T, HALF,
    # strides: q / k / outputs as (b, h, t, d); cos / sin as (b, t, d), b-stride 0 when broadcast
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sqo_d,
    sko_b, sko_h, sko_t, sko_d,
    sc_b, sc_t, sc_d,
    ss_b, ss_t, ss_d,
    # meta-parameters (head counts are model constants: compiled in, so the head loop has a
    # compile-time trip count, which Triton 3.6's interpreter also needs)
    HQ: tl.constexpr,
    HK: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BACKWARD: tl.constexpr,  # apply R^T (rotate by -theta) instead of R
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // T
    t = pid % T
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    c_row = cos_ptr + b * sc_b + t * sc_t
    s_row = sin_ptr + b * ss_b + t * ss_t
    c1 = tl.load(c_row + d * sc_d, mask=dmask, other=0.0).to(tl.float32)
    c2 = tl.load(c_row + (d + HALF) * sc_d, mask=dmask, other=0.0).to(tl.float32)
    if BACKWARD:
        s1 = -tl.load(s_row + (d + HALF) * ss_d, mask=dmask, other=0.0).to(tl.float32)
        s2 = -tl.load(s_row + d * ss_d, mask=dmask, other=0.0).to(tl.float32)
    else:
        s1 = tl.load(s_row + d * ss_d, mask=dmask, other=0.0).to(tl.float32)
        s2 = tl.load(s_row + (d + HALF) * ss_d, mask=dmask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + b * sq_b + t * sq_t, qo_ptr + b * sqo_b + t * sqo_t, HALF,
                  sq_h, sq_d, sqo_h, sqo_d, c1, c2, s1, s2, d, HQ, BLOCK_HQ)
    _rotate_heads(k_ptr + b * sk_b + t * sk_t, ko_ptr + b * sko_b + t * sko_t, HALF,
                  sk_h, sk_d, sko_h, sko_d, c1, c2, s1, s2, d, HK, BLOCK_HK)


# --------------------------------------------------------------------------------------------
# Launcher: one program per (b, t); BLOCK sizes and num_warps chosen here
# --------------------------------------------------------------------------------------------
def _launch(q, k, cos, sin, backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    bsz, hq, t, dim = q.shape
    hk = k.shape[1]
    # empty_like keeps q's strides when q is dense (e.g. the HF transpose), so the output has the
    # same layout as the input and the kernel writes it just as coalesced as it reads.
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)
    if q.numel() == 0 and k.numel() == 0:
        return qo, ko
    half = dim // 2
    block_half = next_power_of_2(half)
    max_heads = max(1, MAX_TILE // block_half)
    block_hq = min(next_power_of_2(hq), max_heads)
    block_hk = min(next_power_of_2(hk), max_heads)
    num_warps = NUM_WARPS or (4 if max(block_hq, block_hk) * block_half <= 2048 else 8)
    cb = 0 if cos.shape[0] == 1 else cos.stride(0)
    sb = 0 if sin.shape[0] == 1 else sin.stride(0)

    def launch(warps):
        _rope_kernel[(bsz * t,)](
            q, k, cos, sin, qo, ko,
            t, half,
            *q.stride(), *k.stride(), *qo.stride(), *ko.stride(),
            cb, cos.stride(1), cos.stride(2), sb, sin.stride(1), sin.stride(2),
            HQ=hq, HK=hk, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half, BACKWARD=backward, num_warps=warps,
        )

    # the kernel only writes qo / ko, so the GPU times the warp counts on the real arguments once per
    # (shape, layout, dtype) and keeps the fastest (_common.pick_config); NUM_WARPS pins it
    cands = [num_warps] if NUM_WARPS else list(dict.fromkeys([num_warps, 8, 4, 2]))
    key = ("rope", hq, hk, dim, q.dtype, q.stride(), k.stride(), cos.dtype, backward)
    launch(pick_config(key, cands, launch, q.device, rows=bsz * t))
    return qo, ko


# --------------------------------------------------------------------------------------------
# torch.library op + autograd: the backward is the same op with backward=True
# --------------------------------------------------------------------------------------------
@torch.library.custom_op("hearth::rope", mutates_args=())
def _rope_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, k, cos, sin, backward)


@_rope_op.register_fake
def _(q, k, cos, sin, backward):
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    _q, _k, cos, sin, backward = inputs
    ctx.save_for_backward(cos, sin)
    ctx.backward_flag = backward


def _autograd_backward(ctx, dq_out, dk_out):
    cos, sin = ctx.saved_tensors
    # the backward is this op again, with the sign of sin flipped (_common.backward_route: which callable)
    rope = backward_route(ctx, _rope_op, _rope, _launch)
    dq, dk = rope(dq_out, dk_out, cos, sin, not ctx.backward_flag)
    return dq, dk, None, None, None


# eager: a torch.autograd.Function over _launch; under torch.compile: the custom op
_rope = autograd_op(_rope_op, _launch, _setup_context, _autograd_backward)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary embeddings (rotate-half convention) to q and k in one launch.

    Args:
        q: [B, Hq, T, D] float32 / bfloat16 / float16, any strides (e.g. k.transpose(1, 2) of a
            [B, T, H, D] tensor is read in place).
        k: [B, Hk, T, D], same dtype/device/B/T/D as q; Hk may differ from Hq (GQA).
        cos, sin: [B or 1, T, D] float tensors (any float dtype, same shape), broadcast over heads
            (and over batch when the leading dim is 1). D must be even.

    Returns:
        (q_rot, k_rot): same shapes, dtypes and (for dense inputs) strides as q and k;
        q_rot = q * cos + rotate_half(q) * sin, computed in fp32.

    Gradients flow to q and k (the backward is this kernel rotating by -theta); none to cos/sin.
    Bytes moved per direction: 2 * B * (Hq + Hk) * T * D * b (+ cos/sin once).

    Raises:
        TypeError: a non-tensor or unsupported dtype, or q and k dtypes differ.
        ValueError: wrong number of dims, D odd, q/k B/T/D mismatch, cos/sin not [1 or B, T, D],
            tensors on different devices, empty q/k.
    """
    check_tensor(q, "q", ndim=4)
    check_tensor(k, "k", ndim=4)
    check_tensor(cos, "cos", ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor(sin, "sin", ndim=3, dtypes=FLOAT_DTYPES)
    check_same_dtype(q=q, k=k)
    check_same_device(q=q, k=k, cos=cos, sin=sin)
    bsz, _hq, t, dim = q.shape
    if k.shape[0] != bsz or k.shape[2] != t or k.shape[3] != dim:
        raise ValueError(f"k must be [B, Hk, T, D] with B, T, D of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if dim % 2:
        raise ValueError(f"q head dim D must be even for rotate-half, got shape {tuple(q.shape)}")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape[0] not in (1, bsz) or table.shape[1] != t or table.shape[2] != dim:
            raise ValueError(f"{name} must have shape [1 or {bsz}, {t}, {dim}], got {tuple(table.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
    return _rope(q, k, cos, sin, False)
