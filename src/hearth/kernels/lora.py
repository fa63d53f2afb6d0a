"""LoRA-aware fused nodes: a frozen base projection and its low-rank adapter in ONE autograd node.

    lora_linear(x, weight, bias, lora_a, lora_b, scale, compute="adapter")
        y = x W^T (+ b) + scale * (x A^T) B^T
    lora_swiglu_mlp(x, w_gate, w_up, w_down, a_gate, b_gate, a_up, b_up, a_down, b_down, s_gate, s_up, s_down)
        down(silu(gate(x)) * up(x)) where each projection is a frozen base Linear plus its LoRA factors
    lora_parts(module, x, compute="adapter")
        (weight, bias, lora_a, lora_b, scale, compute) of a peft LoRA Linear in a plain state, else None;
        compute="base" makes the node cast the factors to the base dtype inside itself (the LoRA GEMMs on tensor
        cores: faster, rounded once more)

Why (issue 16): peft keeps LoRA weights in fp32 on a bf16 base (autocast_adapter_dtype=True); each peft
lora.Linear casts its bf16 input to fp32 and lora_A's autograd saves that fp32 copy (4 bytes per element of
every projection input), and the unfused branch adds ~5 memory passes over the [T, out] result (lora_B's
output, the scale, the add, the casts). Here:

  * what is SAVED for the backward: the base-dtype input x itself (half the bytes of peft's fp32 copy; one
    tensor shared by q/k/v; o_proj's input is the attention output, which attention saves anyway) and the
    rank-r products x A^T (in the LoRA dtype, [T, r]: tiny). The MLP node saves x, g and u (u not with recompute_up) and the rank-r products, never
    h = silu(g) * u (recomputed in the backward by hearth's swiglu kernel, as kernels.swiglu.swiglu_mlp does).
  * DTYPES: the LoRA math runs in the LoRA weights' dtype ("ldt": fp32 under peft's default): x A^T is formed
    from x upcast to ldt (bf16 -> fp32 is exact, so this is bit-for-bit peft's fp32 input copy), and
    dA = dxa^T x, dB = scale * dy^T xa, dxa = scale * dy B all take their [T, *] operands upcast to ldt,
    transiently (freed inside the forward / backward, never saved; the MLP upcasts one column chunk at a time).
    The base GEMMs (x W^T, dy W) run in the base dtype as nn.Linear does. The low-rank product is folded into
    the base result by ONE addmm per projection (cuBLAS beta=1: C += alpha * P Q, accumulated in fp32 and
    rounded once); its rank-r operands (xa and B in the forward, dxa and A for dx) are rounded to the base
    dtype for that GEMM, since cuBLAS takes one dtype. peft instead rounds the base result to bf16, adds the
    fp32 LoRA term and rounds again; both are within the kernel tolerance rule of the fp32 reference
    (tests/kernels/test_lora.py). With an fp32 base every step is fp32.
  * no gradient for the frozen base: lora_linear computes dW / db only if weight / bias require grad (they
    normally do not); lora_swiglu_mlp refuses base weights that require grad (ValueError naming them).
  * a bitsandbytes 4-bit base (QLoRA: a Linear4bit's packed Params4bit weight with its .quant_state, NF4 or
    FP4, double-quantised absmax included) is taken in place of a weight: the forward dequantises it to x's
    dtype (bitsandbytes.functional.dequantize_4bit) into a temporary, runs the same GEMMs as for a 16-bit
    base and lets the temporary go; the backward dequantises again for dx. Only the packed weight (a
    parameter, no new memory) is kept for the backward, never the dequantised one (that would cost the
    whole 16-bit weight per projection, which QLoRA exists to avoid). The MLP node dequantises one
    projection at a time (two at once only with recompute_up, whose re-formed u needs W_up beside W_down).
    These nodes run eagerly (a torch.compile graph break: the quant state is no tensor a custom op takes).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from hearth.kernels._common import autograd_op, check_same_device, check_same_dtype, check_tensor
from hearth.kernels.swiglu import _backward_by_column_chunks, _down_by_row_chunks, _linear_into

__all__ = ["lora_linear", "lora_swiglu_mlp", "lora_parts", "LORA_COMPUTE", "is_4bit", "dequantize", "base_compute_dtype",
           "is_bnb_4bit_linear"]


def _fold(out: torch.Tensor, p: torch.Tensor, q: torch.Tensor, alpha: float) -> None:
    """out += alpha * p @ q, one GEMM with beta=1 in out's dtype (p, q rounded to it when wider)."""
    out.addmm_(p.to(out.dtype), q.to(out.dtype), alpha=alpha)


# --------------------------------------------------------------------------------------------
# bitsandbytes 4-bit base weights
# --------------------------------------------------------------------------------------------
def is_4bit(weight) -> bool:
    """True for a bitsandbytes 4-bit weight: a tensor (Params4bit) carrying a `quant_state`. Attribute reads
    only (bitsandbytes is not imported)."""
    return isinstance(weight, torch.Tensor) and getattr(weight, "quant_state", None) is not None


def _shape(weight: torch.Tensor) -> tuple:
    """The logical [out, in] shape: the quant state's for a 4-bit weight (the packed tensor is [N*K/2, 1])."""
    return tuple(weight.quant_state.shape) if is_4bit(weight) else tuple(weight.shape)


def dequantize(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 4-bit weight dequantised to `dtype` [out, in] (a new tensor; nested / double-quantised absmax is
    handled by bitsandbytes.functional.dequantize_4bit); a plain weight is returned as it is."""
    if not is_4bit(weight):
        return weight
    from bitsandbytes.functional import dequantize_4bit

    w = dequantize_4bit(weight.data, weight.quant_state)
    return w if w.dtype == dtype else w.to(dtype)


def _check_4bit(weight: torch.Tensor, name: str, x: torch.Tensor) -> None:
    """ValueError / TypeError naming `name` for a 4-bit weight the nodes cannot dequantise here."""
    qs = weight.quant_state
    shape = getattr(qs, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a 4-bit weight of a 2-D [out, in] matrix, got quant_state.shape {shape}")
    if getattr(qs, "quant_type", None) not in ("nf4", "fp4"):
        raise ValueError(f"{name} must be an nf4 / fp4 4-bit weight, got quant_type {getattr(qs, 'quant_type', None)!r}")
    if getattr(qs, "packing_format_for_cpu", False):
        raise ValueError(f"{name} is in bitsandbytes' CPU inference packing (converted by an eval-mode no-grad CPU "
                         f"forward); dequantize_4bit does not read it: run the module's own forward")
    if weight.device != x.device:
        raise ValueError(f"{name} must be on x's device {x.device}, got {weight.device}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor to dequantise {name} into, got {x.dtype}")


# --------------------------------------------------------------------------------------------
# lora_linear: ops + autograd
# --------------------------------------------------------------------------------------------
def _cast(cast: bool, dtype: torch.dtype, *factors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The LoRA factors in `dtype` when cast (compute="base": copies made inside the node, not autograd
    nodes of their own), else as they are."""
    return tuple(t.to(dtype) for t in factors) if cast else factors


def _linear_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], lora_a: torch.Tensor,
    lora_b: torch.Tensor, scale: float, cast: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (y [..., N] in x.dtype, xa = x A^T [M, r] in the LoRA compute dtype; M = x's rows).
    cast: compute="base", the factors cast to x's dtype in here (the compute dtype is then x's, else lora_a's).

    The leading dims are flattened in here, not around the autograd node: no view nodes in the graph
    (each one an autograd node of host time, forward and backward). y is allocated in its final shape
    (an autograd.Function may not return a view: the caller could not modify it in place)."""
    lora_a, lora_b = _cast(cast, x.dtype, lora_a, lora_b)
    return _linear_forward_with(lambda: weight, x, bias, lora_a, lora_b, scale, lora_b.shape[0])


def _linear_forward_with(weight, x, bias, lora_a, lora_b, scale, n):
    """_linear_forward with the base weight from weight() at its one use (a 4-bit base: the dequantised
    temporary dies with that GEMM, before the LoRA upcast of x)."""
    x2 = x.reshape(-1, x.shape[-1])
    out = x.new_empty((*x.shape[:-1], n))
    out2 = out.view(-1, n)
    _linear_into(out2, x2, weight(), bias)  # F.linear's GEMM (mm, or addmm with the bias), into out
    xa = torch.mm(x2.to(lora_a.dtype), lora_a.t())  # the fp32 copy of x dies here
    _fold(out2, xa, lora_b.t(), scale)
    return out, xa


_linear_fwd_op = torch.library.custom_op("hearth::lora_linear_fwd", mutates_args=())(_linear_forward)


@_linear_fwd_op.register_fake
def _(x, weight, bias, lora_a, lora_b, scale, cast):
    rows = math.prod(x.shape[:-1])
    return (x.new_empty((*x.shape[:-1], weight.shape[0])),
            x.new_empty((rows, lora_a.shape[0]), dtype=x.dtype if cast else lora_a.dtype))


def _linear_backward_impl(
    dy: torch.Tensor, x: torch.Tensor, xa: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor,
    lora_b: torch.Tensor, scale: float, need_dx: bool, need_dw: bool, need_db: bool, cast: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [x's shape], dA, dB, dW, db); dx / dW / db are empty [0] tensors when not needed. cast: as in the
    forward (the factors cast to x's dtype again here; dA and dB returned in the factors' own dtype)."""
    return _linear_backward_with(lambda: weight, dy, x, xa, lora_a, lora_b, scale, need_dx, need_dw, need_db, cast)


def _linear_backward_with(weight, dy, x, xa, lora_a, lora_b, scale, need_dx, need_dw, need_db, cast=False):
    """_linear_backward_impl with the base weight from weight() at its one use, dx = dy W, after the transient
    upcast of dy has gone (a 4-bit base: the dequantised temporary is not alive beside it)."""
    factor_dtype = lora_a.dtype
    lora_a, lora_b = _cast(cast, x.dtype, lora_a, lora_b)
    x_shape = x.shape
    x = x.reshape(-1, x.shape[-1])
    dy = dy.reshape(-1, dy.shape[-1]).contiguous()
    dyl = dy.to(lora_a.dtype)  # transient upcast
    db_lora = torch.mm(dyl.t(), xa).mul_(scale)
    dxa = torch.mm(dyl, lora_b).mul_(scale)
    dw = torch.mm(dy.t(), x) if need_dw else x.new_empty(0)
    db = dyl.sum(0).to(dy.dtype) if need_db else x.new_empty(0)
    dyl = None
    da = torch.mm(dxa.t(), x.to(lora_a.dtype))
    if need_dx:
        dx = torch.mm(dy, weight())
        _fold(dx, dxa, lora_a, 1.0)
        dx = dx.view(x_shape)
    else:
        dx = x.new_empty(0)
    if cast:  # the gradients of the factors in their own dtype (what a cast node's backward did before)
        da, db_lora = da.to(factor_dtype), db_lora.to(factor_dtype)
    return dx, da, db_lora, dw, db


_linear_bwd_op = torch.library.custom_op("hearth::lora_linear_bwd", mutates_args=())(_linear_backward_impl)


@_linear_bwd_op.register_fake
def _(dy, x, xa, weight, lora_a, lora_b, scale, need_dx, need_dw, need_db, cast):
    dx = x.new_empty(x.shape) if need_dx else x.new_empty(0)
    dw = weight.new_empty(weight.shape) if need_dw else x.new_empty(0)
    db = x.new_empty((weight.shape[0],)) if need_db else x.new_empty(0)
    return dx, lora_a.new_empty(lora_a.shape), lora_b.new_empty(lora_b.shape), dw, db


def _linear_setup(ctx, inputs, output):
    x, weight, bias, lora_a, lora_b, scale, cast = inputs
    _out, xa = output
    ctx.mark_non_differentiable(xa)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, xa, weight, lora_a, lora_b)
    ctx.scale, ctx.cast = scale, cast


def _linear_backward(ctx, dy, _dxa):
    if dy is None:
        return (None,) * 7
    x, xa, weight, lora_a, lora_b = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, da, db_lora, dw, db = (_linear_backward_impl if ctx.eager else torch.ops.hearth.lora_linear_bwd)(
        dy, x, xa, weight, lora_a, lora_b, ctx.scale, need[0], need[1], need[2], ctx.cast)
    return (dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
            da if need[3] else None, db_lora if need[4] else None, None, None)


# eager: a torch.autograd.Function over _linear_forward / _linear_backward_impl (no torch.library dispatch:
# tens of microseconds of host time a call, per projection); under torch.compile: the custom ops
_lora_linear = autograd_op(_linear_fwd_op, _linear_forward, _linear_setup, _linear_backward)


class _LoraLinear4bit(torch.autograd.Function):
    """lora_linear on a bitsandbytes 4-bit base: the base weight dequantised to x's dtype into a temporary in the
    forward and again in the backward (for dx only); the packed weight is saved, never the dequantised one."""

    @staticmethod
    def forward(ctx, x, packed, bias, lora_a, lora_b, scale, cast):
        a, b = _cast(cast, x.dtype, lora_a, lora_b)
        out, xa = _linear_forward_with(lambda: dequantize(packed, x.dtype), x, bias, a, b, scale, b.shape[0])
        ctx.mark_non_differentiable(xa)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, xa, packed, lora_a, lora_b)
        ctx.scale, ctx.cast = scale, cast
        return out, xa

    @staticmethod
    def backward(ctx, dy, _dxa):
        if dy is None:
            return (None,) * 7
        x, xa, packed, lora_a, lora_b = ctx.saved_tensors
        need = ctx.needs_input_grad
        # dx = dy W is the only use of W here: dequantised just for it (not at all when x needs no gradient)
        dx, da, db_lora, _dw, db = _linear_backward_with(lambda: dequantize(packed, x.dtype), dy, x, xa, lora_a,
                                                         lora_b, ctx.scale, need[0], False, need[2], ctx.cast)
        return (dx if need[0] else None, None, db if need[2] else None, da if need[3] else None,
                db_lora if need[4] else None, None, None)


@torch.compiler.disable  # the quant state is no custom-op argument: eager, a graph break under torch.compile
def _lora_linear_4bit(x, packed, bias, lora_a, lora_b, scale, cast):
    return _LoraLinear4bit.apply(x, packed, bias, lora_a, lora_b, scale, cast)


# --------------------------------------------------------------------------------------------
# lora_swiglu_mlp: ops + autograd
# --------------------------------------------------------------------------------------------
def _mlp_forward(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    bias_gate: Optional[torch.Tensor], bias_up: Optional[torch.Tensor], bias_down: Optional[torch.Tensor],
    a_gate: torch.Tensor, b_gate: torch.Tensor, a_up: torch.Tensor, b_up: torch.Tensor,
    a_down: torch.Tensor, b_down: torch.Tensor, s_gate: float, s_up: float, s_down: float, recompute_up: bool,
    cast: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., H] -> (out [..., H], g [M, I], u [M, I] or [0] when recompute_up, xa [M, r_g + r_u], xa_down [M, r_d]).

    h is formed one row chunk at a time (as in swiglu_mlp) and never held whole; its LoRA A product
    xa_down is taken per chunk from the chunk upcast to the LoRA dtype. x's leading dims are flattened in
    here (no view nodes around the autograd node); out is allocated in its final shape. cast: compute="base",
    the six factors cast to x's dtype in here (see _linear_forward)."""
    lora = _cast(cast, x.dtype, a_gate, b_gate, a_up, b_up, a_down, b_down)
    return _mlp_forward_with((w_gate, w_up, w_down).__getitem__, x, bias_gate, bias_up, bias_down, *lora,
                             s_gate, s_up, s_down, recompute_up)


def _mlp_forward_with(weight, x, bias_gate, bias_up, bias_down, a_gate, b_gate, a_up, b_up, a_down, b_down,
                      s_gate, s_up, s_down, recompute_up):
    """_mlp_forward with the base weights taken from weight(i) (0 gate, 1 up, 2 down) where they are used: the
    weights themselves for a 16-bit base, a fresh dequantised temporary each call for a 4-bit one (one alive at a
    time; W_up beside W_down only with recompute_up)."""
    out_nd = x.new_empty((*x.shape[:-1], b_down.shape[0]))
    x = x.reshape(-1, x.shape[-1])
    dt, ldt = x.dtype, a_gate.dtype
    rg = a_gate.shape[0]
    xa = torch.mm(x.to(ldt), torch.cat((a_gate, a_up)).t())  # one GEMM for both A's; the upcast x dies here
    g = F.linear(x, weight(0), bias_gate)
    _fold(g, xa[:, :rg], b_gate.t(), s_gate)
    b_up_t = b_up.t().to(dt)
    if recompute_up:
        u = x.new_empty(0)
    else:
        u = F.linear(x, weight(1), bias_up)
        _fold(u, xa[:, rg:], b_up_t, s_up)
    xa_down = xa.new_empty((g.shape[0], a_down.shape[0]))
    out = _down_by_row_chunks(
        x, g, u, weight(1) if recompute_up else None, bias_up, weight(2), bias_down, recompute_up,
        fix_up=lambda uc, r0, r1: _fold(uc, xa[r0:r1, rg:], b_up_t, s_up),
        on_h=lambda hc, r0, r1: torch.mm(hc.to(ldt), a_down.t(), out=xa_down[r0:r1]),
        out=out_nd.view(-1, b_down.shape[0]))
    _fold(out, xa_down, b_down.t(), s_down)
    return out_nd, g, u, xa, xa_down


_mlp_fwd_op = torch.library.custom_op("hearth::lora_swiglu_mlp_fwd", mutates_args=())(_mlp_forward)


@_mlp_fwd_op.register_fake
def _(x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, a_gate, b_gate, a_up, b_up, a_down, b_down,
      s_gate, s_up, s_down, recompute_up, cast):
    m, inter = math.prod(x.shape[:-1]), w_gate.shape[0]
    u = x.new_empty(0) if recompute_up else x.new_empty((m, inter))
    ldt = x.dtype if cast else a_gate.dtype
    return (x.new_empty((*x.shape[:-1], w_down.shape[0])), x.new_empty((m, inter)), u,
            x.new_empty((m, a_gate.shape[0] + a_up.shape[0]), dtype=ldt), x.new_empty((m, a_down.shape[0]), dtype=ldt))


def _mlp_backward_impl(
    dout: torch.Tensor, x: torch.Tensor, g: torch.Tensor, u: torch.Tensor, xa: torch.Tensor, xa_down: torch.Tensor,
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, bias_up: Optional[torch.Tensor],
    a_gate: torch.Tensor, b_gate: torch.Tensor, a_up: torch.Tensor, b_up: torch.Tensor,
    a_down: torch.Tensor, b_down: torch.Tensor, s_gate: float, s_up: float, s_down: float, recompute_up: bool,
    cast: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dA_gate, dB_gate, dA_up, dB_up, dA_down, dB_down). Overwrites g with dg and u with du (they are dead
    after); h is recomputed per column chunk of I by the swiglu backward kernel into the dh chunk buffer.
    x and dout may have leading dims ([..., H]); dx has x's shape. cast: as in the forward (the factors cast
    again here, their gradients returned in the factors' own dtype)."""
    return _mlp_backward_cast((w_gate, w_up, w_down).__getitem__, dout, x, g, u, xa, xa_down, bias_up,
                              (a_gate, b_gate, a_up, b_up, a_down, b_down), (s_gate, s_up, s_down), recompute_up, cast)


def _mlp_backward_cast(weight, dout, x, g, u, xa, xa_down, bias_up, lora, scales, recompute_up, cast):
    """_mlp_backward_with on the six factors cast to x's dtype when cast, their gradients cast back."""
    grads = _mlp_backward_with(weight, dout, x, g, u, xa, xa_down, bias_up, *_cast(cast, x.dtype, *lora), *scales,
                               recompute_up)
    if not cast:
        return grads
    return (grads[0],) + tuple(d.to(t.dtype) for d, t in zip(grads[1:], lora))


def _mlp_backward_with(weight, dout, x, g, u, xa, xa_down, bias_up, a_gate, b_gate, a_up, b_up, a_down, b_down,
                       s_gate, s_up, s_down, recompute_up):
    """_mlp_backward_impl with the base weights from weight(i) where they are used (see _mlp_forward_with): W_down
    (and W_up with recompute_up) for the column-chunk loop, then W_gate and W_up for dx, one after the other."""
    x_shape = x.shape
    x = x.reshape(-1, x.shape[-1])
    dout = dout.reshape(-1, dout.shape[-1]).contiguous()
    dt, ldt = x.dtype, a_gate.dtype
    m, inter = g.shape
    rg = a_gate.shape[0]
    xa_g, xa_u = xa[:, :rg], xa[:, rg:]
    # down_proj's LoRA: out += s_d * xa_down B_d^T
    doutl = dout.to(ldt)
    db_down = torch.mm(doutl.t(), xa_down).mul_(s_down)
    dxa_down = torch.mm(doutl, b_down).mul_(s_down)
    doutl = None
    dxa_down_dt = dxa_down.to(dt)
    a_down_dt = a_down.to(dt)
    b_up_dt = b_up.to(dt)
    da_down = a_down.new_empty(a_down.shape)
    db_gate = b_gate.new_empty(b_gate.shape)
    db_up = b_up.new_empty(b_up.shape)
    dxa_g = xa.new_zeros((m, rg))
    dxa_u = xa.new_zeros((m, a_up.shape[0]))
    dx = torch.zeros_like(x) if recompute_up else None
    chunks = _backward_by_column_chunks(
        dout, x, g, u, weight(1) if recompute_up else None, bias_up, weight(2), recompute_up, dx,
        fix_dh=lambda dhc, c0, c1: _fold(dhc, dxa_down_dt, a_down_dt[:, c0:c1], 1.0),  # the LoRA path into h
        fix_u=lambda uc, c0, c1: _fold(uc, xa_u, b_up_dt[c0:c1].t(), s_up))
    for c0, c1, hc, gc, uc in chunks:
        torch.mm(dxa_down.t(), hc.to(ldt), out=da_down[:, c0:c1])  # in place, as swiglu_mlp's dW_down chunks
        dgl = gc.to(ldt)
        torch.mm(dgl.t(), xa_g, out=db_gate[c0:c1])
        dxa_g.addmm_(dgl, b_gate[c0:c1])
        dgl = None
        dul = uc.to(ldt)
        torch.mm(dul.t(), xa_u, out=db_up[c0:c1])
        dxa_u.addmm_(dul, b_up[c0:c1])
        dul = None
    hc = gc = uc = chunks = None  # the finished loop has let go of its weights
    db_gate.mul_(s_gate)
    db_up.mul_(s_up)
    dxa_g.mul_(s_gate)
    dxa_u.mul_(s_up)
    if recompute_up:
        dx.addmm_(g, weight(0))
    else:
        dx = torch.mm(g, weight(0))
        dx.addmm_(u, weight(1))
    _fold(dx, torch.cat((dxa_g, dxa_u), 1), torch.cat((a_gate, a_up)), 1.0)
    xl = x.to(ldt)
    da_gate = torch.mm(dxa_g.t(), xl)
    da_up = torch.mm(dxa_u.t(), xl)
    return dx.view(x_shape), da_gate, db_gate, da_up, db_up, da_down, db_down


_mlp_bwd_op = torch.library.custom_op("hearth::lora_swiglu_mlp_bwd", mutates_args=("g", "u"))(_mlp_backward_impl)


def _mlp_backward_eager(dout, x, g, u, *args):
    """The eager route: the launcher called directly. g and u are overwritten in place (by Triton, which
    autograd does not see), so their version counters are bumped here as the custom op's mutates_args does:
    a second backward through the same graph then fails autograd's saved-tensor check."""
    grads = _mlp_backward_impl(dout, x, g, u, *args)
    torch.autograd.graph.increment_version([g, u])
    return grads


@_mlp_bwd_op.register_fake
def _(dout, x, g, u, xa, xa_down, w_gate, w_up, w_down, bias_up, a_gate, b_gate, a_up, b_up, a_down, b_down,
      s_gate, s_up, s_down, recompute_up, cast):
    return (x.new_empty(x.shape),) + tuple(t.new_empty(t.shape) for t in (a_gate, b_gate, a_up, b_up, a_down, b_down))


def _mlp_setup(ctx, inputs, output):
    (x, w_gate, w_up, w_down, _bg, bias_up, _bd, a_gate, b_gate, a_up, b_up, a_down, b_down,
     s_gate, s_up, s_down, recompute_up, cast) = inputs
    _out, g, u, xa, xa_down = output
    ctx.mark_non_differentiable(g, u, xa, xa_down)
    ctx.set_materialize_grads(False)  # no zero [rows, I] grads for g and u (see swiglu_mlp)
    ctx.save_for_backward(x, g, u, xa, xa_down, w_gate, w_up, w_down, bias_up, a_gate, b_gate, a_up, b_up, a_down, b_down)
    ctx.scales = (s_gate, s_up, s_down)
    ctx.recompute_up, ctx.cast = recompute_up, cast


def _mlp_backward(ctx, dout, _dg, _du, _dxa, _dxad):
    if dout is None:
        return (None,) * 18
    saved = ctx.saved_tensors
    grads = (_mlp_backward_eager if ctx.eager else torch.ops.hearth.lora_swiglu_mlp_bwd)(
        dout, *saved, *ctx.scales, ctx.recompute_up, ctx.cast)
    need = ctx.needs_input_grad
    dx, lora = grads[0], grads[1:]
    return ((dx if need[0] else None,) + (None,) * 6
            + tuple(t if need[7 + i] else None for i, t in enumerate(lora)) + (None,) * 5)


# eager: a torch.autograd.Function over _mlp_forward / _mlp_backward_impl; under torch.compile: the custom ops
_lora_mlp = autograd_op(_mlp_fwd_op, _mlp_forward, _mlp_setup, _mlp_backward)


class _MlpBase:
    """The frozen base of a lora_swiglu_mlp call with at least one 4-bit projection: weight(i) (0 gate, 1 up,
    2 down) is the 16-bit weight itself or a fresh dequantised temporary in the compute dtype."""

    def __init__(self, weights, dtype):
        self.weights, self.dtype = weights, dtype

    def weight(self, i: int) -> torch.Tensor:
        return dequantize(self.weights[i], self.dtype)


class _LoraMlp4bit(torch.autograd.Function):
    """lora_swiglu_mlp with a 4-bit base: _mlp_forward_with / _mlp_backward_with dequantising each projection
    where it is used. Saved: x, g, u (not with recompute_up), the rank-r products and the LoRA factors, as for a
    16-bit base; the packed base weights are held by reference (frozen parameters), never dequantised."""

    @staticmethod
    def forward(ctx, x, a_gate, b_gate, a_up, b_up, a_down, b_down, base, biases, scales, recompute_up, cast):
        lora = (a_gate, b_gate, a_up, b_up, a_down, b_down)
        out, g, u, xa, xa_down = _mlp_forward_with(base.weight, x, *biases, *_cast(cast, x.dtype, *lora), *scales,
                                                   recompute_up)
        ctx.mark_non_differentiable(g, u, xa, xa_down)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, g, u, xa, xa_down, *lora)
        ctx.base, ctx.bias_up, ctx.scales, ctx.recompute_up, ctx.cast = base, biases[1], scales, recompute_up, cast
        return out, g, u, xa, xa_down

    @staticmethod
    def backward(ctx, dout, _dg, _du, _dxa, _dxad):
        if dout is None:
            return (None,) * 12
        x, g, u, xa, xa_down, *lora = ctx.saved_tensors
        grads = _mlp_backward_cast(ctx.base.weight, dout, x, g, u, xa, xa_down, ctx.bias_up, lora, ctx.scales,
                                   ctx.recompute_up, ctx.cast)
        torch.autograd.graph.increment_version([g, u])  # g and u now hold dg and du (see _mlp_backward_eager)
        need = ctx.needs_input_grad
        return tuple(t if need[i] else None for i, t in enumerate(grads)) + (None,) * 5


@torch.compiler.disable  # the quant states are no custom-op arguments: eager, a graph break under torch.compile
def _lora_mlp_4bit(x, weights, biases, lora, scales, recompute_up, cast):
    return _LoraMlp4bit.apply(x, *lora, _MlpBase(weights, x.dtype), biases, scales, recompute_up, cast)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------
def _check_lora(x: torch.Tensor, names: dict) -> None:
    lora = {n: t for n, t in names.items() if t is not None}
    for name, t in lora.items():
        check_tensor(t, name, ndim=2)
    check_same_dtype(**lora)
    check_same_device(x=x, **lora)
    ldt = next(iter(lora.values())).dtype
    if ldt != x.dtype and ldt != torch.float32:
        first = next(iter(lora))
        raise TypeError(f"{first} must be float32 or x's dtype {x.dtype}, got {ldt}")


def _check_scale(scale, name: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(scale).__name__}")
    return float(scale)


def check_compute(compute, name: str = "compute") -> None:
    """ValueError naming `name` unless compute is one of LORA_COMPUTE (the nodes, lora_parts and patch.apply)."""
    if compute not in LORA_COMPUTE:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, LORA_COMPUTE))}, got {compute!r}")


def _check_compute(compute, x: torch.Tensor, factor: torch.Tensor) -> bool:
    """Whether the node casts the factors (compute "base" with factors not already in x's dtype)."""
    check_compute(compute)
    return compute == "base" and factor.dtype != x.dtype


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scale: float, compute: str = "adapter") -> torch.Tensor:
    """x W^T (+ b) + scale * (x A^T) B^T as ONE autograd node (peft's lora.Linear with one adapter, no dropout).

    Args:
        x: [..., K] in the base dtype; weight [N, K] and bias [N] (or None) in x's dtype: the frozen base.
            weight may instead be a bitsandbytes 4-bit weight (a Linear4bit's Params4bit, its quant_state.shape
            [N, K]): it is dequantised to x's dtype for the forward GEMM and again for dx's, each time into a
            temporary that is freed at once (the node saves the packed weight only); it gets no gradient.
        lora_a [r, K], lora_b [N, r]: float32 (peft's default on a 16-bit base) or x's dtype.
        scale: lora_alpha / r (peft's `scaling[adapter]`).
        compute: "adapter" (the LoRA math in the factors' dtype) or "base": fp32 factors are cast to x's dtype
            inside the node, so the LoRA GEMMs run on the tensor cores and dA / dB come back in fp32 (rounded to
            x's dtype once each); the casts are part of this one node, not two autograd nodes more per call.

    Returns:
        [..., N] in x.dtype.

    Dtypes: x A^T, dA, dB and the rank-r dxa are computed in lora_a's dtype from transient upcasts of x and
    dy (never saved); x W^T and dy W in x's dtype; the rank-r term is added to them by one addmm in x's
    dtype (beta=1, fp32 accumulation, rounded once). Saved for backward: x and x A^T [.., r] only.
    Gradients: x, lora_a, lora_b; weight / bias get dW = dy^T x / db = sum(dy) only if they require grad
    (a frozen base, the normal case, costs nothing).

    Raises:
        TypeError / ValueError naming the argument (dtype, shape, device).
    """
    check_tensor(x, "x", allow_empty=True)
    quantised = is_4bit(weight)
    if quantised:
        _check_4bit(weight, "weight", x)
    else:
        check_tensor(weight, "weight", ndim=2)
    if bias is not None:
        check_tensor(bias, "bias", ndim=1)
    check_same_dtype(x=x, weight=None if quantised else weight, bias=bias)
    check_same_device(x=x, weight=weight, bias=bias)
    _check_lora(x, {"lora_a": lora_a, "lora_b": lora_b})
    scale = _check_scale(scale, "scale")
    cast = _check_compute(compute, x, lora_a)
    n, k = _shape(weight)
    r = lora_a.shape[0]
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"x must be [..., {k}] (weight is {(n, k)}), got {tuple(x.shape)}")
    if bias is not None and bias.shape[0] != n:
        raise ValueError(f"bias must have length {n}, got {tuple(bias.shape)}")
    if tuple(lora_a.shape) != (r, k):
        raise ValueError(f"lora_a must be [r, {k}], got {tuple(lora_a.shape)}")
    if tuple(lora_b.shape) != (n, r):
        raise ValueError(f"lora_b must be [{n}, {r}], got {tuple(lora_b.shape)}")
    if quantised:
        return _lora_linear_4bit(x, weight, bias, lora_a, lora_b, scale, cast)[0]
    out, _xa = _lora_linear(x, weight, bias, lora_a, lora_b, scale, cast)  # [..., N]: flattened inside the node
    return out


def lora_swiglu_mlp(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    a_gate: torch.Tensor, b_gate: torch.Tensor, a_up: torch.Tensor, b_up: torch.Tensor,
    a_down: torch.Tensor, b_down: torch.Tensor, scale_gate: float, scale_up: float, scale_down: float,
    bias_gate: torch.Tensor | None = None, bias_up: torch.Tensor | None = None, bias_down: torch.Tensor | None = None,
    *, recompute_up: bool = False, compute: str = "adapter",
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) with each projection a frozen base Linear + LoRA, as ONE autograd node.

    Args:
        x: [..., H]; base weights w_gate, w_up [I, H], w_down [H, I] (and optional biases) in x's dtype,
            frozen (requires_grad=False; else ValueError naming the weight: use the unfused path). Any of the
            three may be a bitsandbytes 4-bit weight (Params4bit with its quant_state): dequantised to x's dtype
            where it is used, one projection at a time (W_up beside W_down with recompute_up), forward and
            backward, never kept (see lora_linear).
        a_gate, a_up [r, H], b_gate, b_up [I, r], a_down [r_d, I], b_down [H, r_d]: float32 or x's dtype, all
            the same. scale_*: each adapter's lora_alpha / r. compute: "adapter" or "base", as lora_linear's.

    Returns:
        [..., H] in x.dtype.

    Saved for backward: x, g, u (u not when recompute_up: recomputed per column chunk) and the rank-r products
    x [A_gate; A_up]^T and h A_down^T in the LoRA dtype; h is never held whole (one row chunk in the forward,
    recomputed by hearth's swiglu kernel per column chunk of I in the backward). Dtypes as lora_linear's: the
    LoRA factors' products and gradients in the LoRA dtype (x and each dg / du / h column chunk upcast
    transiently), the base GEMMs in x's dtype, each rank-r term folded in by one addmm. Gradients flow to x
    and the six LoRA factors. The backward may run once per forward (g and u become dg and du in place).
    """
    check_tensor(x, "x", allow_empty=True)
    base = {"w_gate": w_gate, "w_up": w_up, "w_down": w_down, "bias_gate": bias_gate, "bias_up": bias_up,
            "bias_down": bias_down}
    quantised = {name for name in ("w_gate", "w_up", "w_down") if is_4bit(base[name])}
    for name, t in base.items():
        if t is not None:
            if name in quantised:
                _check_4bit(t, name, x)
            else:
                check_tensor(t, name, ndim=2 if name.startswith("w") else 1)
            if t.requires_grad:
                raise ValueError(f"{name} requires grad: lora_swiglu_mlp is for a frozen base (no gradient is "
                                 f"computed for it); use the unfused modules to train the base")
    check_same_dtype(x=x, **{n: t for n, t in base.items() if n not in quantised})
    check_same_device(x=x, **base)
    lora = {"a_gate": a_gate, "b_gate": b_gate, "a_up": a_up, "b_up": b_up, "a_down": a_down, "b_down": b_down}
    _check_lora(x, lora)
    scales = [_check_scale(s, n) for s, n in ((scale_gate, "scale_gate"), (scale_up, "scale_up"), (scale_down, "scale_down"))]
    cast = _check_compute(compute, x, a_gate)
    if x.dim() == 0:  # [..., H] of any rank but 0
        raise ValueError("x must have at least 1 dimension [..., H], got a 0-D tensor")
    hidden, inter = x.shape[-1], _shape(w_gate)[0]
    want = {"w_gate": (inter, hidden), "w_up": (inter, hidden), "w_down": (hidden, inter)}
    for name, shape in want.items():
        if _shape(base[name]) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {_shape(base[name])}")
    for name, t, size in (("bias_gate", bias_gate, inter), ("bias_up", bias_up, inter), ("bias_down", bias_down, hidden)):
        if t is not None and t.shape[0] != size:
            raise ValueError(f"{name} must have length {size}, got {tuple(t.shape)}")
    for a_name, b_name, k, n in (("a_gate", "b_gate", hidden, inter), ("a_up", "b_up", hidden, inter),
                                 ("a_down", "b_down", inter, hidden)):
        a, b = lora[a_name], lora[b_name]
        if a.shape[1] != k:
            raise ValueError(f"{a_name} must be [r, {k}], got {tuple(a.shape)}")
        if tuple(b.shape) != (n, a.shape[0]):
            raise ValueError(f"{b_name} must be [{n}, {a.shape[0]}], got {tuple(b.shape)}")
    if quantised:
        return _lora_mlp_4bit(x, (w_gate, w_up, w_down), (bias_gate, bias_up, bias_down),
                              (a_gate, b_gate, a_up, b_up, a_down, b_down), tuple(scales), bool(recompute_up), cast)[0]
    return _lora_mlp(  # [..., H]: flattened inside the node
        x, w_gate, w_up, w_down, bias_gate, bias_up, bias_down, a_gate, b_gate, a_up, b_up, a_down, b_down,
        *scales, bool(recompute_up), cast)[0]


# --------------------------------------------------------------------------------------------
# peft adapters: when is a lora.Linear plain enough for the fused nodes
# --------------------------------------------------------------------------------------------
LORA_COMPUTE = ("adapter", "base")


def lora_parts(module, x: torch.Tensor | None = None, compute: str = "adapter"):
    """(weight, bias, lora_a, lora_b, scale, compute) of a peft LoRA Linear in a plain state, else None (the caller
    falls back to the module's own forward). Plain: exactly one active adapter that the module holds, not
    merged, adapters not disabled, no variant (DoRA, ...), no LoRA bias, dropout Identity / p=0 / eval mode,
    base layer a plain nn.Linear or a bitsandbytes 4-bit Linear (base_compute_dtype) whose weight and bias do
    not take gradients, not fan_in_fan_out, LoRA weights on the base's device in fp32 or the base's compute
    dtype; with x: x has the base's compute dtype and device and autocast is off. For a 4-bit base the weight
    returned is the packed Params4bit (with its quant_state), which lora_linear / lora_swiglu_mlp dequantise
    where they use it. Attribute reads only (cheap enough to run at every call); peft is never imported.

    compute: "adapter" (the LoRA math in the factors' dtype, fp32 under peft's defaults: peft's own numbers) or
    "base" (the node casts the factors to the base dtype inside itself, their gradients still arrive in fp32),
    so every LoRA GEMM runs on the tensor cores in the base dtype with fp32 accumulation instead of fp32 FMA on
    upcast copies -- the faster choice, whose LoRA products and gradients are rounded to the base dtype once
    each. The factors are returned as they are either way and `compute` is passed through, so that
    lora_linear(x, *parts) runs the chosen math (the casts are not two autograd nodes more per call)."""
    base = getattr(module, "base_layer", None)
    lora_a_dict = getattr(module, "lora_A", None)
    if lora_a_dict is None or base is None:
        return None
    dtype = base_compute_dtype(base, x)
    if dtype is None:
        return None
    try:
        if module.disable_adapters or module.merged or getattr(module, "fan_in_fan_out", False):
            return None
        active = module.active_adapters
        if len(active) != 1:
            return None
        name = active[0]
        if name not in lora_a_dict or name in getattr(module, "lora_variant", {}) or module.use_dora.get(name, False):
            return None
        if getattr(module, "lora_bias", {}).get(name, False) or getattr(module, "_caches", None):
            return None
        lin_a, lin_b = lora_a_dict[name], module.lora_B[name]
        if type(lin_a) is not torch.nn.Linear or type(lin_b) is not torch.nn.Linear or lin_b.bias is not None \
                or lin_a.bias is not None:
            return None
        drop = module.lora_dropout[name]
        if not (isinstance(drop, torch.nn.Identity) or (isinstance(drop, torch.nn.Dropout)
                                                        and (drop.p == 0 or not drop.training))):
            return None
        scale = module.scaling[name]
    except (AttributeError, KeyError, TypeError):
        return None
    w, b, a, bb = base.weight, base.bias, lin_a.weight, lin_b.weight
    if w.requires_grad or (b is not None and (b.requires_grad or b.dtype != dtype)):
        return None
    if a.device != w.device or bb.device != w.device or a.dtype != bb.dtype:
        return None
    if a.dtype != dtype and a.dtype != torch.float32:
        return None
    if x is not None:
        if x.dtype != dtype or x.device != w.device or torch.is_autocast_enabled(x.device.type):
            return None
        if a.dtype != x.dtype and not getattr(module, "cast_input_dtype_enabled", True):
            return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        return None
    check_compute(compute)
    return w, b, a, bb, float(scale), compute


# bitsandbytes' 4-bit Linear classes (same forward: x cast to compute_dtype, dequantise, GEMM, cast back)
_BNB_4BIT = ("Linear4bit", "LinearNF4", "LinearFP4")


def is_bnb_4bit_linear(module) -> bool:
    """A bitsandbytes 4-bit Linear (by class: bitsandbytes is not imported)."""
    cls = type(module)
    return cls.__name__ in _BNB_4BIT and cls.__module__.startswith("bitsandbytes.")


def base_compute_dtype(base, x: torch.Tensor | None = None) -> torch.dtype | None:
    """The dtype the fused nodes compute a LoRA layer's frozen base in, or None when they cannot take it:
    a plain nn.Linear -> its weight's dtype; a bitsandbytes 4-bit Linear whose weight's quant state
    dequantize_4bit reads (nf4 / fp4, 2-D, nested absmax or not, not bitsandbytes' CPU inference packing) -> its
    compute_dtype (unset: x's dtype, as bitsandbytes adopts it, or the quantised weight's own dtype without x).
    Anything else (8-bit Linear8bitLt, other quantisers, subclasses) -> None."""
    if type(base) is torch.nn.Linear:
        return base.weight.dtype
    if not is_bnb_4bit_linear(base):
        return None
    qs = getattr(getattr(base, "weight", None), "quant_state", None)
    shape = getattr(qs, "shape", None)
    if (qs is None or shape is None or len(shape) != 2 or getattr(qs, "quant_type", None) not in ("nf4", "fp4")
            or getattr(qs, "packing_format_for_cpu", False) or (getattr(qs, "nested", False) and getattr(qs, "state2", None) is None)
            or shape[0] != base.out_features or shape[1] != base.in_features):
        return None
    dtype = getattr(base, "compute_dtype", None)
    if dtype is None:
        dtype = x.dtype if x is not None else getattr(qs, "dtype", None)
    return dtype if dtype in (torch.float32, torch.bfloat16, torch.float16) else None
