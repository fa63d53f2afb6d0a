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

In place (rope(..., inplace=True)): every program loads a block of heads before it stores the same block, and no
two programs touch the same (b, t) row, so q and k can be their own outputs, as long as no element of q, k, cos
or sin shares memory with another element that is written (checked: no internal overlap, q and k apart, cos / sin
apart from both). Nothing of q's or k's size is allocated; the backward rotates the incoming gradients in place
where that is safe (see rope()).

Host path: every check and every launch constant depends only on the arguments' shapes, strides, dtypes and
devices, so it is worked out once per such signature (a _Plan, in a dict of at most _PLAN_CAP) and a repeated
call builds the signature, looks it up and launches. The usual launch (outputs laid out like the inputs: in
place, or empty_like of a dense input, unit d strides) takes 17 runtime arguments instead of 29: each one is
host time in Triton's launcher (its specialisation and cache key).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hearth.kernels import _common
from hearth.kernels._common import (
    FLOAT_DTYPES, autograd_op, backward_route, check_same_device, check_same_dtype, check_tensor, next_power_of_2,
    pick_config, records_graph,
)

# Cap on the [BLOCK_H, BLOCK_HALF] register tile per tensor; heads beyond it are looped over.
MAX_TILE = 4096
# Tuning override for the launcher's num_warps choice (None: 4 for tiles <= 2048 elements, else 8).
NUM_WARPS: int | None = None
# Launch plans kept, one per argument signature; the dict is emptied when it reaches this many, so a run over
# many sequence lengths (each T is a signature) cannot grow it without bound.
_PLAN_CAP = 256


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def _rotate_heads(
    x_ptr, o_ptr,
    sx_h, sx_d, so_h, so_d,
    c1, c2, s1, s2, d,
    HALF: tl.constexpr,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Rotate all H heads at x_ptr (already offset to (b, t)) into o_ptr, BLOCK_H heads at a time. Both halves of
    a block are loaded before either is stored, so o_ptr may be x_ptr (in place) when the heads do not overlap."""
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
def _rope_row(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T,
    # strides: q / k / outputs as (b, h, t, d); cos / sin as (b, t, d), b-stride 0 when broadcast
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sqo_d,
    sko_b, sko_h, sko_t, sko_d,
    sc_b, sc_t, sc_d,
    ss_b, ss_t, ss_d,
    # head counts and the head dim are model constants: compiled in, so the head loop has a compile-time trip
    # count (which Triton 3.6's interpreter also needs)
    HQ: tl.constexpr,
    HK: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BACKWARD: tl.constexpr,  # apply R^T (rotate by -theta) instead of R
):
    """This program's (b, t) row: its cos / sin loaded once (before any store), then every head of q and of k."""
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
    _rotate_heads(q_ptr + b * sq_b + t * sq_t, qo_ptr + b * sqo_b + t * sqo_t,
                  sq_h, sq_d, sqo_h, sqo_d, c1, c2, s1, s2, d, HALF, HQ, BLOCK_HQ)
    _rotate_heads(k_ptr + b * sk_b + t * sk_t, ko_ptr + b * sko_b + t * sko_t,
                  sk_h, sk_d, sko_h, sko_d, c1, c2, s1, s2, d, HALF, HK, BLOCK_HK)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T,
    sq_b, sq_h, sq_t,
    sk_b, sk_h, sk_t,
    sc_b, sc_t,
    ss_b, ss_t,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    """The usual launch: outputs laid out like the inputs (in place, or empty_like of a dense q / k) and every
    tensor's features adjacent (unit d strides). 17 runtime arguments."""
    _rope_row(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T,
              sq_b, sq_h, sq_t, 1, sk_b, sk_h, sk_t, 1,
              sq_b, sq_h, sq_t, 1, sk_b, sk_h, sk_t, 1,
              sc_b, sc_t, 1, ss_b, ss_t, 1,
              HQ, HK, BLOCK_HQ, BLOCK_HK, HALF, BLOCK_HALF, BACKWARD)


@triton.jit
def _rope_kernel_out(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T,
    sq_b, sq_h, sq_t, sq_d,
    sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sqo_d,
    sko_b, sko_h, sko_t, sko_d,
    sc_b, sc_t, sc_d,
    ss_b, ss_t, ss_d,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    """Any strides (29 runtime arguments): new outputs of a q / k that is not dense (a slice of a fused projection,
    an expanded gradient), which empty_like lays out contiguous, or a tensor whose d stride is not 1."""
    _rope_row(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T,
              sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
              sqo_b, sqo_h, sqo_t, sqo_d, sko_b, sko_h, sko_t, sko_d,
              sc_b, sc_t, sc_d, ss_b, ss_t, ss_d,
              HQ, HK, BLOCK_HQ, BLOCK_HK, HALF, BLOCK_HALF, BACKWARD)


# --------------------------------------------------------------------------------------------
# Launch plans: what depends only on shapes / strides / dtypes / devices, worked out once
# --------------------------------------------------------------------------------------------
def _span(shape, stride) -> int:
    """Elements from a tensor's first element to its last, both included (PyTorch strides are >= 0)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def _distinct(shape, stride, extent: int = 0) -> bool:
    """Whether no two elements of a tensor of this shape and these strides share memory, by the nesting rule: the
    dims of size > 1 taken by increasing stride, each stride passes the extent of the ones before it. True for
    every dense, sliced, transposed or reshaped layout; False for an expanded one (a zero stride, e.g. the
    gradient of a .sum()) and for the rare interleaved layouts it cannot prove. `extent`: the elements are
    blocks spanning extent + 1 elements (see _apart)."""
    for s, n in sorted((s, n) for n, s in zip(shape, stride) if n > 1):
        if s <= extent:
            return False
        extent += s * (n - 1)
    return True


def _apart(a: torch.Tensor, b: torch.Tensor, lay: _Layout, plan: _Plan) -> bool:
    """Whether a and b (the [B, H, T, D] pair of `lay`, one dtype, each _distinct) share no element.

    Address ranges apart: the usual case (two allocations). Otherwise the fused projection is proven: q and k as
    head slices of one [B, T, (Hq + 2 Hk) * D] buffer have the same b and t strides; then they are apart when,
    within a (b, t) row, a's heads and b's lie side by side, and the row of both (a block of `width` elements)
    never reaches another row's (_distinct of the (b, t) dims over such blocks). Anything else counts as shared.
    torch._C._overlaps is no help here: it reports any two slices of one buffer (even a[:2] and a[2:]) as
    overlapping."""
    pa, pb, size = a.data_ptr(), b.data_ptr(), plan.itemsize
    if pa + lay.span_q * size <= pb or pb + lay.span_k * size <= pa:
        return True
    delta, rem = divmod(pb - pa, size)
    (sa_b, sa_h, sa_t, sa_d), (sb_b, sb_h, sb_t, sb_d) = lay.q_stride, lay.k_stride
    if rem or (plan.bsz > 1 and sa_b != sb_b) or (plan.t > 1 and sa_t != sb_t):
        return False
    inner_a = (plan.hq - 1) * sa_h + (plan.dim - 1) * sa_d
    inner_b = (plan.hk - 1) * sb_h + (plan.dim - 1) * sb_d
    if not (delta > inner_a or delta + inner_b < 0):  # within a row, a's elements and b's interleave
        return False
    width = max(inner_a, delta + inner_b) - min(0, delta) + 1
    return _distinct((plan.bsz, plan.t), (sa_b, sa_t), width - 1)


class _Layout:
    """The launch constants of one pair of (q, k) strides: the q and k of a forward, or the dq and dk of a
    backward (whose strides are the attention backward's choice)."""

    __slots__ = ("q_stride", "k_stride", "strides", "short", "out_strides", "same", "distinct_q", "distinct_k",
                 "span_q", "span_k", "warps")

    def __init__(self, plan: _Plan, q: torch.Tensor, k: torch.Tensor, q_stride: tuple, k_stride: tuple):
        self.q_stride, self.k_stride = q_stride, k_stride
        self.strides = (*q_stride, *k_stride)
        # _rope_kernel's (b, h, t) strides, None unless both d strides are 1
        self.short = (*q_stride[:3], *k_stride[:3]) if q_stride[3] == k_stride[3] == 1 else None
        # the strides empty_like gives new outputs (a meta tensor: the same rule, no memory): the inputs' own when
        # they are dense (e.g. the HF transpose), so the launch needs no output strides (_rope_kernel)
        self.out_strides = (*torch.empty_like(q, device="meta").stride(), *torch.empty_like(k, device="meta").stride())
        self.same = self.out_strides == self.strides
        self.distinct_q = _distinct(plan.q_shape, q_stride)
        self.distinct_k = _distinct(plan.k_shape, k_stride)
        self.span_q = _span(plan.q_shape, q_stride)
        self.span_k = _span(plan.k_shape, k_stride)
        self.warps = [None, None]  # per direction: (NUM_WARPS when picked, the pick), once the pick is settled


class _Plan:
    """Everything a call needs that depends only on its arguments' shapes, strides, dtypes and devices."""

    __slots__ = ("checked", "cpu", "device", "bsz", "hq", "hk", "t", "dim", "q_shape", "k_shape", "dtype",
                 "cos_dtype", "itemsize", "grid", "meta", "warps", "tables", "short_tables", "span_cos", "span_sin",
                 "layouts", "fwd")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        self.checked = False  # rope()'s checks passed for this signature (_launch builds plans unchecked)
        self.cpu, self.device = not q.is_cuda, q.device
        self.q_shape, self.k_shape = tuple(q.shape), tuple(k.shape)
        self.bsz, self.hq, self.t, self.dim = self.q_shape
        self.hk = self.k_shape[1]
        self.dtype, self.cos_dtype, self.itemsize = q.dtype, cos.dtype, q.element_size()
        half = self.dim // 2
        block_half = next_power_of_2(half)
        max_heads = max(1, MAX_TILE // block_half)
        block_hq = min(next_power_of_2(self.hq), max_heads)
        block_hk = min(next_power_of_2(self.hk), max_heads)
        self.meta = dict(HQ=self.hq, HK=self.hk, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, HALF=half,
                         BLOCK_HALF=block_half)
        self.warps = 4 if max(block_hq, block_hk) * block_half <= 2048 else 8
        self.grid = (self.bsz * self.t,)
        self.tables = (0 if cos.shape[0] == 1 else cos.stride(0), cos.stride(1), cos.stride(2),
                       0 if sin.shape[0] == 1 else sin.stride(0), sin.stride(1), sin.stride(2))
        c, s = self.tables[:3], self.tables[3:]
        self.short_tables = (*c[:2], *s[:2]) if c[2] == s[2] == 1 else None  # as _Layout.short
        self.span_cos = _span(cos.shape, cos.stride()) * cos.element_size()  # bytes
        self.span_sin = _span(sin.shape, sin.stride()) * sin.element_size()
        self.layouts: dict = {}
        self.fwd = _layout(self, q, k)


def _layout(plan: _Plan, q: torch.Tensor, k: torch.Tensor) -> _Layout:
    key = (q.stride(), k.stride())
    lay = plan.layouts.get(key)
    if lay is None:
        if len(plan.layouts) >= 16:  # gradients in ever new layouts: keep the dict small
            plan.layouts.clear()
        lay = plan.layouts[key] = _Layout(plan, q, k, *key)
    return lay


_PLANS: dict = {}


def _signature(q, k, cos, sin):
    """The key of a call's plan; None for arguments that are not all tensors (the checks then name the culprit)."""
    try:
        return (q.shape, k.shape, cos.shape, sin.shape, q.stride(), k.stride(), cos.stride(), sin.stride(),
                q.dtype, k.dtype, cos.dtype, sin.dtype, q.device, k.device, cos.device, sin.device)
    except (AttributeError, TypeError, RuntimeError):
        return None


def _plan(q, k, cos, sin, sig) -> _Plan:
    plan = _PLANS.get(sig) if sig is not None else None
    if plan is None:
        plan = _Plan(q, k, cos, sin)
        if sig is not None:
            if len(_PLANS) >= _PLAN_CAP:
                _PLANS.clear()
            _PLANS[sig] = plan
    return plan


# --------------------------------------------------------------------------------------------
# Launchers: one program per (b, t); BLOCK sizes from the plan, num_warps picked once per layout
# --------------------------------------------------------------------------------------------
def _run(plan: _Plan, lay: _Layout, q, k, cos, sin, qo, ko, backward: bool, same: bool, warps: int) -> None:
    """One launch; same: qo and ko have q's and k's strides (in place, or new outputs when lay.same).
    kernel.run(grid=...) is what kernel[grid](...) calls, without the lambda it makes on every call."""
    if same and lay.short is not None and plan.short_tables is not None:
        _rope_kernel.run(q, k, cos, sin, qo, ko, plan.t, *lay.short, *plan.short_tables,
                         grid=plan.grid, warmup=False, BACKWARD=backward, num_warps=warps, **plan.meta)
    else:
        _rope_kernel_out.run(q, k, cos, sin, qo, ko, plan.t, *lay.strides, *(lay.strides if same else lay.out_strides),
                             *plan.tables, grid=plan.grid, warmup=False, BACKWARD=backward, num_warps=warps,
                             **plan.meta)


def _warps(plan: _Plan, lay: _Layout, q, k, cos, sin, qo, ko, backward: bool, same: bool) -> int:
    """num_warps for this layout and direction: the GPU times the candidates once per (shape, layout, dtype)
    (_common.pick_config) and the layout keeps the pick; NUM_WARPS pins it."""
    settled = lay.warps[backward]
    if settled is not None and settled[0] == NUM_WARPS:
        return settled[1]
    cands = [NUM_WARPS] if NUM_WARPS else list(dict.fromkeys([plan.warps, 8, 4, 2]))
    scratch: list = []

    def timed(warps):
        # pick_config launches each candidate dozens of times: into the new outputs of an out-of-place call, but
        # never over the caller's tensors when rotating in place: then into scratch tensors of the same layout
        # (the same kernel, the same traffic), made here, i.e. once per key, on the pick's miss
        if qo is q:
            if not scratch:
                scratch.extend(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                               for x in (q, k))
            _run(plan, lay, q, k, cos, sin, scratch[0], scratch[1], backward, True, warps)
        else:
            _run(plan, lay, q, k, cos, sin, qo, ko, backward, same, warps)

    key = ("rope", plan.hq, plan.hk, plan.dim, plan.dtype, lay.q_stride, lay.k_stride, plan.cos_dtype, backward)
    warps = pick_config(key, cands, timed, plan.device, rows=plan.grid[0])
    # settled unless pick_config gave its untimed default for a CUDA-graph capture (the next call may time)
    if plan.cpu or _common.interpret_mode() or not torch.cuda.is_current_stream_capturing():
        lay.warps[backward] = (NUM_WARPS, warps)
    return warps


def _new_outputs(plan: _Plan, lay: _Layout, q, k, cos, sin, backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # empty_like keeps q's strides when q is dense (e.g. the HF transpose), so the output has the
    # same layout as the input and the kernel writes it just as coalesced as it reads.
    qo = torch.empty_like(q)
    ko = torch.empty_like(k)
    warps = _warps(plan, lay, q, k, cos, sin, qo, ko, backward, lay.same)
    _run(plan, lay, q, k, cos, sin, qo, ko, backward, lay.same, warps)
    return qo, ko


def _in_place(plan: _Plan, lay: _Layout, q, k, cos, sin, backward: bool) -> None:
    """Rotate q and k over themselves; then bump their version counters, so that a graph that saved them (an
    earlier op's backward needing the old values) fails loudly ("modified by an inplace operation")."""
    _run(plan, lay, q, k, cos, sin, q, k, backward, True, _warps(plan, lay, q, k, cos, sin, q, k, backward, True))
    torch.autograd.graph.increment_version((q, k))


def _launch(q, k, cos, sin, backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """New (q_rot, k_rot), or (dq, dk) with backward=True: the custom op's body (torch.compile) and the recorded
    backward of a double backward. Called on checked arguments: its plan is not marked checked."""
    if q.numel() == 0 and k.numel() == 0:
        return torch.empty_like(q), torch.empty_like(k)
    plan = _plan(q, k, cos, sin, _signature(q, k, cos, sin))
    return _new_outputs(plan, plan.fwd, q, k, cos, sin, backward)


# The reference counts a gradient shows inside a Function's backward when nothing but autograd refers to it, per
# device type: (tensor use count, storage use count). They differ between PyTorch builds and devices (torch 2.13 on
# the CPU: 1; torch 2.11 on an H100: 2, the engine holding one more reference), so they are measured, not assumed
# (_sole_counts). The storage count includes the temporary storage object the check itself makes.
_SOLE_COUNTS: dict[str, tuple[int, int]] = {}


def _counts(t: torch.Tensor) -> tuple[int, int]:
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _Fresh(torch.autograd.Function):
    """Identity whose backward hands on a new gradient (as an attention's or a matmul's backward makes one)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.clone()


class _Seen(torch.autograd.Function):
    """Identity whose backward records the counts of the gradient it receives (_Fresh's, nothing else holds it)."""

    @staticmethod
    def forward(ctx, x, out):
        ctx.out = out
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.out.append(_counts(g))
        return g, None


def _sole_counts(device: torch.device) -> tuple[int, int] | None:
    """_SOLE_COUNTS for device's type, measured on the first call: a one-element backward through _Seen <- _Fresh,
    on the device (the engine's device thread, as rope's own backward runs). None while a CUDA graph is being
    captured (nothing measured then: the gradients go to new tensors)."""
    key = device.type
    if key not in _SOLE_COUNTS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        out: list = []
        with torch.enable_grad():
            x = torch.zeros(1, device=device, requires_grad=True)
            torch.autograd.grad(_Fresh.apply(_Seen.apply(x, out)), x, torch.ones(1, device=device))
        _SOLE_COUNTS[key] = out[0]
    return _SOLE_COUNTS[key]


def _sole(t: torch.Tensor, counts: tuple[int, int] | None) -> bool:
    """Whether nothing but this backward refers to gradient t or its memory: the reference counts of a gradient only
    autograd holds (_sole_counts; autograd hands the SAME gradient object to every input of an add, and a caller's
    dy passed to backward() is held by the caller too: one reference more or two), and not a view."""
    return counts is not None and t._base is None and _counts(t) == counts


def _grads_in_place(plan: _Plan, dq, dk, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of rope(inplace=True): R^T written over the incoming gradients where nothing else can see them
    (_sole: written over a gradient object an add also hands another input, the other input got the rotated
    values, a wrong gradient), unless one has overlapping elements (an expanded gradient, e.g. of a .sum()) or the
    two share memory (e.g. one tensor passed for both): otherwise into new gradients, as the out-of-place op does."""
    lay = _layout(plan, dq, dk)
    counts = _SOLE_COUNTS.get(dq.device.type)
    if _sole(dq, counts) and _sole(dk, counts) and lay.distinct_q and lay.distinct_k and _apart(dq, dk, lay, plan):
        _in_place(plan, lay, dq, dk, cos, sin, True)
        # new tensor objects on the same memory: the incoming gradient is also held elsewhere (the engine's buffer; a
        # caller's dy), and a leaf's AccumulateGrad takes a gradient only if nothing else refers to the object: it
        # copied dq and dk whole (the H200 bench: +576 MiB and ~1.5x the time at Qwen3-32B T 32768)
        return dq.detach(), dk.detach()
    return _new_outputs(plan, lay, dq, dk, cos, sin, True)


# --------------------------------------------------------------------------------------------
# Autograd. Eager: two Functions over a checked plan (no torch.library dispatch). torch.compile: the custom op.
# --------------------------------------------------------------------------------------------
def _grads_new(plan: _Plan, dq, dk, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of rope(inplace=False): R^T into new gradients."""
    return _new_outputs(plan, _layout(plan, dq, dk), dq, dk, cos, sin, True)


def _function_backward(ctx, dq_out, dk_out, grads):
    """The two Functions' backward: `grads` (new gradients, or written over the incoming ones) when no graph is
    recorded; with create_graph=True the backward is recorded (differentiable, for a double backward), out of place."""
    cos, sin = ctx.saved_tensors
    if torch.is_grad_enabled():
        dq, dk = _rope(dq_out, dk_out, cos, sin, True)
    else:
        dq, dk = grads(ctx.plan, dq_out, dk_out, cos, sin)
    return dq, dk, None, None, None


class _RopeEagerFunction(torch.autograd.Function):
    """rope(inplace=False): new outputs; the backward into new gradients."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, plan):
        ctx.save_for_backward(cos, sin)
        ctx.plan = plan
        return _new_outputs(plan, plan.fwd, q, k, cos, sin, False)

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        return _function_backward(ctx, dq_out, dk_out, _grads_new)


class _RopeInPlaceFunction(torch.autograd.Function):
    """rope(inplace=True) when a graph is recorded: q and k rotated over themselves, no ctx.mark_dirty.

    mark_dirty would rebase q's history: on the HF transpose (a view) that adds a CopySlices node whose backward
    copies the whole gradient, and PyTorch refuses it outright for a Function with two outputs that are views.
    Instead q and k keep their histories (this node's edges were taken before the kernel ran) and their version
    counters are bumped, so a graph that saved their old values fails loudly. The outputs are detach() aliases:
    new tensor objects on q's and k's storage and version counters, with this node as grad_fn. Returning q and k
    themselves would make autograd wrap them as views created inside a custom Function, which refuse any later
    in-place op (q_rot.mul_(...)) and take a new grad_fn from their base whenever the shared version moves."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, plan):
        _in_place(plan, plan.fwd, q, k, cos, sin, False)
        ctx.save_for_backward(cos, sin)
        ctx.plan = plan
        return q.detach(), k.detach()

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        return _function_backward(ctx, dq_out, dk_out, _grads_in_place)


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


# the op with its autograd formula: under torch.compile the custom op, else a torch.autograd.Function over
# _launch (the recorded backward of a double backward)
_rope = autograd_op(_rope_op, _launch, _setup_context, _autograd_backward)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------
def _check(q, k, cos, sin) -> None:
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


def _check_in_place(plan: _Plan, q, k, cos, sin) -> None:
    """ValueError naming the argument that rope(inplace=True) cannot write over (or read while writing)."""
    lay = plan.fwd
    for name, t, ok in (("q", q, lay.distinct_q), ("k", k, lay.distinct_k)):
        if not ok:
            raise ValueError(
                f"{name} has elements that share memory (strides {t.stride()} for shape {tuple(t.shape)}, e.g. an "
                f"expanded view), or a layout whose elements cannot be shown distinct: rope(inplace=True) cannot "
                f"write over it; pass inplace=False")
    if not _apart(q, k, lay, plan):
        raise ValueError("k shares memory with q: rope(inplace=True) would rotate the shared elements twice or read "
                         "them rotated; pass inplace=False (or q and k that do not overlap)")
    pq, pk = q.data_ptr(), k.data_ptr()
    eq, ek = pq + lay.span_q * plan.itemsize, pk + lay.span_k * plan.itemsize
    for name, table, span in (("cos", cos, plan.span_cos), ("sin", sin, plan.span_sin)):
        p = table.data_ptr()
        if p < eq and pq < p + span or p < ek and pk < p + span:
            raise ValueError(f"{name} shares memory with q or k: rope(inplace=True) would overwrite the table it "
                             f"reads; pass inplace=False")


def _check_writable(t: torch.Tensor, name: str) -> None:
    """PyTorch's rule for an in-place op while grad mode is on: not over a leaf that requires grad (a parameter:
    its value would change under the optimizer's feet), nor over a view of one."""
    if not t.requires_grad:
        return
    if t.is_leaf:
        raise ValueError(f"{name} is a leaf tensor that requires grad: rope(inplace=True) cannot write over it "
                         f"(PyTorch refuses in-place ops on such leaves); pass inplace=False, or a non-leaf")
    base = t._base
    if base is not None and base.is_leaf:
        raise ValueError(f"{name} is a view of a leaf tensor that requires grad: rope(inplace=True) cannot write "
                         f"over it (PyTorch refuses in-place ops on such views); pass inplace=False, or a non-leaf")


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inplace: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary embeddings (rotate-half convention) to q and k in one launch.

    Args:
        q: [B, Hq, T, D] float32 / bfloat16 / float16, any strides (e.g. k.transpose(1, 2) of a
            [B, T, H, D] tensor is read in place).
        k: [B, Hk, T, D], same dtype/device/B/T/D as q; Hk may differ from Hq (GQA).
        cos, sin: [B or 1, T, D] float tensors (any float dtype, same shape), broadcast over heads
            (and over batch when the leading dim is 1). D must be even.
        inplace: write the rotated values over q and k (their own storage and strides) instead of new
            tensors, as Liger-Kernel does: nothing of q's or k's size is allocated, forward or backward (q and k
            of Qwen3-32B at T 32768 in bf16 are 576 MiB a direction). Use the returned tensors afterwards: with
            no graph recorded they are q and k themselves; when one is, new tensor objects on q's and k's
            storage (autograd needs an output carrying this op as its history, while q and k keep theirs).
            q's and k's version counters are bumped, so a graph that saved their old values (an op before
            rope that needs q for its backward) raises "modified by an inplace operation" instead of computing
            a wrong gradient. The backward writes dq / dk over the gradients flowing into q_rot / k_rot when only
            autograd refers to them (what the next op's backward, e.g. the attention's, made); a gradient that
            is a view, that a caller passed to backward() and holds, or that an add hands to another input as
            well, is never written over: dq / dk then go to new tensors, as out of place (also for an expanded
            gradient, or two that share memory). Under torch.compile the call is out of place (q and k keep their values): the graph
            holds the out-of-place op, a mutating custom op having no autograd formula in torch.library.

    Returns:
        (q_rot, k_rot): same shapes, dtypes and (for dense inputs, and always in place) strides as q and k;
        q_rot = q * cos + rotate_half(q) * sin, computed in fp32.

    Gradients flow to q and k (the backward is this kernel rotating by -theta); none to cos/sin.
    Bytes moved per direction: 2 * B * (Hq + Hk) * T * D * b (+ cos/sin once).

    Raises:
        TypeError: a non-tensor or unsupported dtype, q and k dtypes differ, inplace not a bool.
        ValueError: wrong number of dims, D odd, q/k B/T/D mismatch, cos/sin not [1 or B, T, D],
            tensors on different devices, empty q/k. With inplace=True also: q or k with elements that share
            memory (an expanded view), q and k sharing memory, cos or sin sharing memory with q or k, and
            (grad mode on) q or k a leaf that requires grad or a view of one.
    """
    if inplace is not False and inplace is not True:
        raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
    if torch.compiler.is_compiling():
        # traced once per compile: the checks on the fake tensors, then the out-of-place custom op (see inplace)
        _check(q, k, cos, sin)
        return _rope(q, k, cos, sin, False)
    sig = _signature(q, k, cos, sin)
    plan = _PLANS.get(sig) if sig is not None else None
    # every check depends on the signature alone, except CPU tensors' on TRITON_INTERPRET, read again (through
    # _common, as check_tensor reads it)
    if plan is None or not plan.checked or (plan.cpu and not _common.interpret_mode()):
        _check(q, k, cos, sin)
        plan = _plan(q, k, cos, sin, sig)
        plan.checked = True
    graph = records_graph(q, k)
    if not inplace:
        if graph:
            return _RopeEagerFunction.apply(q, k, cos, sin, plan)
        return _new_outputs(plan, plan.fwd, q, k, cos, sin, False)  # nothing to record: no Function's glue
    _check_in_place(plan, q, k, cos, sin)
    if graph:
        _check_writable(q, "q")
        _check_writable(k, "k")
        _sole_counts(q.device)  # measured before the graph exists: its backward only reads _SOLE_COUNTS
        return _RopeInPlaceFunction.apply(q, k, cos, sin, plan)
    _in_place(plan, plan.fwd, q, k, cos, sin, False)
    return q, k
