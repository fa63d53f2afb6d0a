"""Wide-row cross-entropy, loss and gradient in one pass, for Hopper (sm_90) in Gluon: one row held on chip by a
thread-block cluster (softmax_gluon's design and exchange; see its docstring).

Two forms. ce_rows_smem_ (the shared-memory form, end of this file) is what cross_entropy() routes to on Hopper
for the plain loss at wide aligned vocabularies (cross_entropy.py says when). Measured on the H200 (bf16, loss
and gradient in place, scripts/gpu/softmax_cluster_probe.py, 2026-12-03) against the Triton row kernel
(cross_entropy's, which reads each row twice: online logsumexp, then the gradient pass), at 4 warps a CTA:
1.196 / 1.553 ms at 8192 x 131072 (1.30x; 3591 GB/s against a device copy of 4226), 1.246 / 1.601 at
4096 x 262144 (1.28x), 3.089 / 3.613 at 16384 x 151936 (1.17x; at 16 CTAs: the 8 that softmax_gluon.smem_config
now takes there measured 2.872 against 3.072 ms in a later run). (Its first run, before it took the device
scale, the separate gradient buffer and the ignored-row branch: 1.152, 1.222 and 3.052 ms.) ce_rows_ (the register form, one part of the
row in registers a CTA) is not routed: 1.711 / 1.553 at 8192 x 131072 (0.91x), 1.905 / 1.600 at 4096 x 262144,
7.051 / 3.610 at 16384 x 151936 (0.51x, the padded width: softmax_gluon's docstring).

Per row (one row per cluster of CTAS CTAs, each holding P columns in registers): the CTAs exchange their
(max, sum of exp) pairs once (softmax_gluon.exchange_ptx), every CTA forms lse = m + log(s), CTA 0 writes
loss = lse - x[target] (every thread reads x[target] from memory before the exchange), and every CTA writes
its part of grad_scale * (softmax - onehot) over the logits in place. Ignored rows (target == ignore_index) get
loss 0 and a zero gradient. No label smoothing, z-loss or softcap here (cross_entropy keeps its Triton
kernel for those).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from hearth.kernels import softmax_gluon as sg
from hearth.kernels._common import on_device


@gluon.jit
def _ce_rows_cluster_kernel(
    Logits, Target, Loss, stride, n_cols, ignore_index, grad_scale,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, SLOTS: ttgl.constexpr, layout: ttgl.constexpr,
    slot_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
):
    """One row per cluster (program_id = the cluster's index), seen as [CTAS, P]: CTA i holds row i of it,
    columns [i * P, i * P + P) (softmax_gluon's kernel, with the loss and the in-place gradient)."""
    slots = ttgl.allocate_shared_memory(ttgl.float32, [SLOTS], slot_shared)  # at global_smem + 0
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    part = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    cols = part[:, None] * P + ttgl.arange(0, P, layout=ttgl.SliceLayout(0, layout))[None, :]
    mask = cols < n_cols
    # the row's load is issued first: the target's logit depends on the target's load, and in-order issue
    # would hold the row's loads behind that chain
    x = ttgl.load(Logits + row * stride + cols, mask=mask, other=float("-inf")).to(ttgl.float32)
    t = ttgl.load(Target + row)
    valid = t != ignore_index
    # the target's logit, read by every thread before the exchange (its barrier orders this read before the
    # owner CTA's gradient store over it): no reduction over the row for it, which held the CTA at 94-106
    # registers a thread (1 CTA an SM) against softmax's 64 (2 an SM). A target outside [0, n_cols) (the caller's
    # check skipped) reads nothing and gives a nan loss, as the shared-memory form and the Triton kernel do
    in_range = (t >= 0) & (t < n_cols)
    x_t = ttgl.load(Logits + row * stride + ttgl.where(in_range, t, 0), mask=in_range,
                    other=float("nan")).to(ttgl.float32)
    mx = ttgl.max(x, 1)  # [CTAS]: this CTA's element is its part's max
    m_part = ttgl.where(mx == float("-inf"), sg.LOWEST, mx)
    s_part = ttgl.sum(ttgl.exp2((x - m_part[:, None]) * 1.4426950408889634), 1)
    m, s = ttgl.inline_asm_elementwise(EXCHANGE_ASM, "=f,=f,f,f", [m_part, s_part],
                                       dtype=(ttgl.float32, ttgl.float32), is_pure=False, pack=1)
    lse = m + ttgl.log(s)  # [CTAS], the same value in every CTA
    # one writer a row: CTA 0 (loss 0 for an ignored row)
    ttgl.store(Loss + row + part * 0, ttgl.where(valid, lse - x_t, 0.0), mask=part == 0)
    scale = ttgl.where(valid, grad_scale, 0.0)
    g = ttgl.exp2((x - lse[:, None]) * 1.4426950408889634) * scale
    g = ttgl.where(cols == t, g - scale, g)
    ttgl.store(Logits + row * stride + cols, g.to(Logits.dtype.element_ty), mask=mask)
    slots._keep_alive()  # live to here: the compiler's scratch may not take its bytes


def supported(capability: tuple[int, int] | None, dtype: torch.dtype, n_cols: int) -> bool:
    """As softmax_gluon.supported: Hopper, a served dtype, a row wide enough for a cluster."""
    return sg.supported(capability, dtype, n_cols)


def _check(logits: torch.Tensor, target: torch.Tensor, smem: bool = False) -> None:
    """The argument checks shared by both forms (the shared-memory form serves the same widths, on aligned
    rows)."""
    if target.shape != logits.shape[:1] or target.dtype != torch.int64 or target.device != logits.device:
        raise ValueError(f"target must be int64 of shape [{logits.shape[0]}] on {logits.device}, got "
                         f"{target.dtype} {tuple(target.shape)} on {target.device}")
    (sg.check_smem_rows if smem else sg.check_rows)(logits, "logits", "the cluster cross-entropy", "V")


def ce_rows_(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100, grad_scale: float = 1.0,
             ctas: int | None = None) -> torch.Tensor:
    """Per-row cross-entropy of `logits` [n, V] (unit column stride, Hopper, V within `supported`) against
    `target` [n] int64; returns fp32 [n] (0 for ignored rows) and writes grad_scale * d loss_i / d logits_i
    over `logits` in place (0 for ignored rows). Targets other than ignore_index must lie in [0, V) (the
    caller validates them, as cross_entropy does; one outside reads nothing and gives a nan loss). ctas: the
    cluster size (softmax_gluon.config's pick when None)."""
    _check(logits, target)
    n, v = logits.shape
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss
    ctas, p, warps = sg.config(v, ctas)
    with on_device(logits.device):
        _ce_rows_cluster_kernel[(n,)](logits, target.contiguous(), loss, logits.stride(0), v, ignore_index,
                                      float(grad_scale), **sg.constexprs(ctas, p, warps, logits.element_size()),
                                      num_warps=warps, num_ctas=ctas)
    return loss


@gluon.jit
def _ce_rows_cluster_smem_kernel(
    Logits, Grad, Target, Loss, Scale, Gate, stride, stride_g, n_cols, ignore_index, scale_value,
    CTAS: ttgl.constexpr, P: ttgl.constexpr, CHUNK: ttgl.constexpr, CHUNKS: ttgl.constexpr,
    layout: ttgl.constexpr, buf_shared: ttgl.constexpr, START_ASM: ttgl.constexpr, EXCHANGE_ASM: ttgl.constexpr,
    WRITE_GRAD: ttgl.constexpr, SCALE_MODE: ttgl.constexpr, GATED: ttgl.constexpr,
):
    """softmax_gluon's shared-memory form with the loss and the gradient: chunk 0 in registers (its bytes at
    global_smem + 0 are the slots), chunks 1.. copied into shared memory by cp.async; the gradient
    (WRITE_GRAD) is written from those copies into Grad (the logits themselves for the in-place form), times
    the scale: scale_value (SCALE_MODE 0), *Scale (1) or Scale[row] (2), as cross_entropy's row kernel takes
    it. Masks and the target's column are compared against per-CTA offsets ([CTAS] vectors): full column
    indices per chunk held live took the CTA to 76-94 registers. GATED: *Gate (int32) != 0 means the caller's
    target check failed, and no gradient is written (the logits stay as they were; the caller raises)."""
    buf = ttgl.allocate_shared_memory(Logits.dtype.element_ty, [CHUNKS, CTAS, CHUNK], buf_shared)
    ttgl.inline_asm_elementwise(START_ASM, "=r", [], dtype=ttgl.int32, is_pure=False, pack=1)
    row = ttgl.program_id(0).to(ttgl.int64)
    part = ttgl.arange(0, CTAS, layout=ttgl.SliceLayout(1, layout))
    c0 = ttgl.arange(0, CHUNK, layout=ttgl.SliceLayout(0, layout))[None, :]
    left = n_cols - part * P  # [CTAS]: the row's columns from this CTA's first one
    base = Logits + row * stride + part[:, None] * P + c0
    # chunk 0 and the target first (the compiler puts a CTA barrier between the copies' issues); the
    # target's logit after the copies are issued (its load waits on the target's)
    x0 = ttgl.load(base, mask=c0 < left[:, None], other=float("-inf")).to(ttgl.float32)
    t = ttgl.load(Target + row)
    for c in ttgl.static_range(1, CHUNKS):
        async_copy.async_copy_global_to_shared(buf.index(c), base + c * CHUNK, mask=c0 < (left - c * CHUNK)[:, None])
        async_copy.commit_group()
    valid = t != ignore_index
    # read by every thread before the exchange (its barrier orders this read before the owner CTA's
    # in-place gradient store over it); a target outside [0, n_cols) (reachable only when the caller's
    # check is off) reads nothing and gives a nan loss, as the Triton kernel does
    in_range = (t >= 0) & (t < n_cols)
    x_t = ttgl.load(Logits + row * stride + ttgl.where(in_range, t, 0), mask=in_range,
                    other=float("nan")).to(ttgl.float32)
    m, s = sg._smem_row_stats(x0, buf, c0, left, CHUNK, CHUNKS, layout, EXCHANGE_ASM)
    lse = m + ttgl.log(s)
    ttgl.store(Loss + row + part * 0, ttgl.where(valid, lse - x_t, 0.0), mask=part == 0)
    if GATED:
        open_grad = ttgl.load(Gate) == 0
    else:
        open_grad = True
    if WRITE_GRAD and open_grad:
        if SCALE_MODE == 1:
            scale = ttgl.load(Scale).to(ttgl.float32)
        elif SCALE_MODE == 2:
            scale = ttgl.load(Scale + row).to(ttgl.float32)
        else:
            scale = scale_value
        # [CTAS]: the target's column from this CTA's first one; -1 (no column) for a target outside [0, n_cols),
        # which int32 would otherwise wrap onto a column (2^32 + 5 -> 5)
        t_off = ttgl.where(in_range, t, -1).to(ttgl.int32) - part * P
        gbase = Grad + row * stride_g + part[:, None] * P + c0
        if valid:
            g0 = ttgl.exp2((x0 - lse[:, None]) * 1.4426950408889634) * scale
            g0 = ttgl.where(c0 == t_off[:, None], g0 - scale, g0)
            ttgl.store(gbase, g0.to(Grad.dtype.element_ty), mask=c0 < left[:, None])
            for c in ttgl.static_range(1, CHUNKS):
                x = buf.index(c).load(layout).to(ttgl.float32)
                g = ttgl.exp2((x - lse[:, None]) * 1.4426950408889634) * scale
                g = ttgl.where(c0 == (t_off - c * CHUNK)[:, None], g - scale, g)
                ttgl.store(gbase + c * CHUNK, g.to(Grad.dtype.element_ty), mask=c0 < (left - c * CHUNK)[:, None])
        else:  # an ignored row: zeros, whatever its logits (inf, nan)
            zero = ttgl.zeros([CTAS, CHUNK], Grad.dtype.element_ty, layout)
            for c in ttgl.static_range(0, CHUNKS):
                ttgl.store(gbase + c * CHUNK, zero, mask=c0 < (left - c * CHUNK)[:, None])
    buf._keep_alive()


def ce_rows_smem_(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  grad_scale: float | torch.Tensor | None = 1.0, grad: torch.Tensor | None = None,
                  ctas: int | None = None, warps: int = sg.SMEM_WARPS, gate: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row cross-entropy of `logits` [n, V] (unit column stride, rows softmax_gluon.smem_aligned, Hopper,
    V within `supported`) against `target` [n] int64, through the shared-memory form; returns fp32 [n] (0
    for ignored rows). grad_scale (a float, or an fp32 tensor [] or [n] on the logits' device; None: no
    gradient) times d loss_i / d logits_i is written into `grad` ([n, V] of the logits' dtype, unit column
    stride), or over `logits` in place when grad is None; ignored rows get zeros. Targets other than
    ignore_index must lie in [0, V) (an out-of-range one gives a nan loss, reading nothing). ctas: the
    cluster size (softmax_gluon.smem_config's pick when None). gate: an int32 [] tensor on the device, or None;
    when it holds a non-zero value at run time no gradient is written (cross_entropy queues its target check
    into it, launches, and only then waits for the check: see _queue_check there)."""
    _check(logits, target, smem=True)
    n, v = logits.shape
    grad = logits if grad is None else sg._out_like(logits, grad, "grad")
    ctas, chunk, chunks = sg.smem_config(v, logits.element_size(), ctas)
    loss = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss
    scale_mode, scale_value, scale_ptr = 0, 1.0, loss  # loss: a placeholder pointer, never read in mode 0
    if isinstance(grad_scale, torch.Tensor):
        if grad_scale.shape not in ((), (n,)) or grad_scale.device != logits.device:
            raise ValueError(f"grad_scale must be a float or an fp32 tensor [] or [{n}] on {logits.device}, got "
                             f"{tuple(grad_scale.shape)} on {grad_scale.device}")
        scale_ptr = grad_scale.to(torch.float32).contiguous()
        scale_mode = 1 if grad_scale.dim() == 0 else 2
    elif grad_scale is not None:
        scale_value = float(grad_scale)
    with on_device(logits.device):
        _ce_rows_cluster_smem_kernel[(n,)](
            logits, grad, target.contiguous(), loss, scale_ptr, loss if gate is None else gate, logits.stride(0),
            grad.stride(0), v, ignore_index, scale_value,
            **sg.smem_constexprs(ctas, chunk, chunks, logits.element_size(), warps),
            WRITE_GRAD=grad_scale is not None, SCALE_MODE=scale_mode, GATED=gate is not None, num_warps=warps,
            num_ctas=ctas)
    return loss
