"""Cross-entropy over a vocabulary, forward and backward in ONE pass over each row of logits.

Per row i with logits x (width V), target t, label smoothing eps, z-loss weight zl, softcap c:
    z    = c * tanh(x / c)                 (z = x when softcap is None)
    lse  = logsumexp(z)                    (online: running max + sum over vocab chunks, fp32)
    loss = lse - (1 - eps) * z[t] - eps * mean(z) + zl * lse**2          (torch's label smoothing)
    dloss/dz = softmax(z) * (1 + 2*zl*lse) - (1 - eps) * onehot(t) - eps / V
    dloss/dx = dloss/dz * (1 - (z / c)**2)           (softcap only)
Rows whose target is ignore_index have loss 0 and gradient 0. reduction="mean" divides by the number of
non-ignored rows, counted on the device (no host sync); an all-ignored batch gives loss 0, grad 0.

Kernel: programs walk rows p, p + P, ... (on the GPU one program per row, P = N, by the rule in
_pick_rows_config; P = CE_PROGRAMS_PER_SM per SM on the CPU interpreter). Per row, loop 1 reads the row
once for the statistics (max, sum, and sum(z) when smoothing); loop 2 (only when a gradient is wanted)
walks the chunks in reverse, so the re-read starts where L2 is warmest, and writes the gradient OVER
THE LOGITS BUFFER: the second [N, V] tensor never exists. Traffic: read N*V*b once (+ the part of the
re-read that misses L2), write N*V*b once. Chunk BLOCK / num_warps come from the table _CE_CONFIGS
up to V = 8192; above it, on the GPU, (programs per SM, BLOCK, num_warps, pipelining depth) is
_CE_WIDE_CONFIG (rules, not run-time timings: see there why).

IN-PLACE: when `input.requires_grad` (and grad mode is on), cross_entropy overwrites `input` with the gradient during the
forward (as Liger-Kernel does). Callers must treat the logits as consumed: do not read them afterwards,
and do not pass a tensor that another autograd node saved for its own backward (e.g. the output of an
op that saves its result: its backward then raises "modified by an inplace operation", the write bumping the
logits' version counter). The logits of an lm_head matmul are fine (matmul saves its inputs, not its output). A non-contiguous `input` (column stride != 1, or rows sharing memory as in an expanded
tensor) is first copied; the copy then holds the gradient and the caller's tensor is untouched.

Where the scale goes (LESSON 7): the stored gradient is g = dloss/dx times a forward scale, and the
backward multiplies by grad_output (times what the forward did not fold in), in fp32, in place.
  * fp32 / bf16: 1/n_valid is folded into the forward store (bf16 has fp32's exponent range, so
    1/(V*n) is representable). The backward kernel reads grad_output on the device and returns at
    once when it is 1.0 (the usual loss.backward()): no second pass over [N, V], no host sync.
  * fp16: g (in [-1, 1] without z_loss) is stored WITHOUT 1/n, times FP16_STORE_SCALE = 2^12 (exact
    power of two: moves small softmax values out of fp16's subnormal range, 16x headroom below 65504);
    the backward always multiplies by grad_output / (n_valid * 2^12) in fp32. Folding 1/n in would
    store ~1/(V*n) values below fp16's smallest subnormal (6e-8) and a GradScaler's large grad_output
    could not bring back the stored zeros. Cost: one extra read+write of [N, V] in the fp16 backward.
    Limit: overflow (inf) if 1 + 2*z_loss*lse > 16, far outside any sane z_loss.
  * reduction="sum": nothing folded; "none": the backward multiplies row i by grad_output[i].

torch.compile: the compiler functionalizes graphs, and a hidden write over an input that requires grad
is exactly what it must not be lied to about. So under compile (torch.compiler.is_compiling())
`cross_entropy` calls the functional op `hearth::cross_entropy_fwd` (fake kernel + autograd registered),
which writes the gradient into ONE extra [N, V] buffer (the logits are left intact), and the backward
scales that buffer in place with the mutating op `hearth::cross_entropy_scale_grad`. Same kernel, same
numbers; +N*V*b of memory under compile only. The target range check runs inside the op at run time.
Backward through the same graph twice (retain_graph=True) raises in eager mode: the in-place gradient
can be consumed once.

`ce_rows_` is the row launcher linear_cross_entropy calls (its docstring is the contract).

On Hopper, the plain loss (no label smoothing, z-loss or softcap) at a wide vocabulary whose rows are 16-byte
aligned (softmax_gluon.serves) runs the cluster kernel in Gluon instead (cross_entropy_gluon.ce_rows_smem_:
the row split over a cluster of CTAs, each part held in shared memory, read from HBM once, the same scale
modes and in-place or separate gradient); everything else runs the Triton row kernel below. H200, bf16,
loss and gradient, the kernel alone: 1.30x the Triton kernel at 8192 x 131072 (1.196 / 1.553 ms), 1.28x at
4096 x 262144, 1.17x at 16384 x 151936; through cross_entropy() and autograd 1.379 ms at 8192 x 131072, and 1.301
ms since the target check gates the kernel on the device instead of holding its launch (_queue_check).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hearth.kernels._common import (
    cdiv, check_same_device, check_tensor, next_power_of_2, num_sms, on_device, once_differentiable, records_graph,
)

try:  # Gluon ships with Triton 3.6; without it every row stays on the Triton row kernel below
    from hearth.kernels import cross_entropy_gluon as cg
    from hearth.kernels import softmax_gluon as sg
except (ImportError, AttributeError):  # pragma: no cover - the pinned Triton has it
    cg = sg = None

REDUCTIONS = ("mean", "sum", "none")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # ignore_index's range: the targets' dtype, an int64 kernel argument
# fp16 only: the forward stores g * FP16_STORE_SCALE (a power of two, so exact) to lift small softmax
# values out of fp16's subnormal range; the backward multiplies by grad_output / (n * scale) in fp32.
# |g| <= 1 + 2*z_loss*lse, so 2^12 leaves 16x headroom below fp16's max (65504).
FP16_STORE_SCALE = 2.0**12
# Backward scaling kernel: tile width (columns) and persistent programs per SM.
SCALE_BLOCK = 4096
SCALE_PROGRAMS_PER_SM = 8
# Host check of target range (one device->host wait per call, for the check alone: the check gates the row
# kernel on the device, and the host waits for it after the launch, _queue_check). False skips it: the kernel stays
# memory-safe (masked loads) and an out-of-range target then yields a nan loss instead of an error.
CHECK_TARGETS = True
# _target_stats: the one program's tile of targets per loop step (16384 targets: 4 steps)
TARGET_STATS_BLOCK = 4096
# Row kernel on the CPU interpreter: programs per SM of the persistent grid (0 = one program per row).
# Kept persistent there so the tests walk several rows per program.
CE_PROGRAMS_PER_SM = 2
# (largest V, chunk BLOCK, num_warps) for the row kernel up to V = 8192 (and everywhere on the CPU). On
# the GPU these run one program per row, unpipelined (one or two chunks per row leave nothing to overlap):
# scripts/gpu/ce_rows_probe.py on the H200 (2026-12-02, V = 2048 / 4096 / 8192, N = 4096 / 16384 / 65536,
# 8 configs) had one program per row with these BLOCK / warps fastest or within 2% at all 9 shapes, and
# 1.6-1.9x faster than the 2-per-SM persistent grid used before (16384 x 8192: 0.182 vs 0.294 ms;
# 65536 x 2048: 0.248 vs 0.479 ms): with one row in flight per program and no pipelining, 2 programs per
# SM left the loads nothing to hide behind. 3 pipeline stages were 25-48% slower at these widths.
# Up to V = 1024, 512-wide chunks with 2 warps: the same probe at V = 512 / 1024, N = 4096 / 65536 had them
# 8-31% faster than 1024 x 4 warps (65536 x 512: 0.064 vs 0.093 ms; 65536 x 1024: 0.106 vs 0.125 ms), 4 warps
# on 512 columns leave half the lanes of each load idle.
_CE_CONFIGS = ((1024, 512, 2), (8192, 4096, 8), (1 << 62, 8192, 16))
# Wide vocabularies (V > 8192) on the GPU: (programs_per_SM, BLOCK, num_warps, num_stages), by rule, not
# timed at run time. Both vocab loops are software-pipelined (tl.range num_stages: cp.async into shared
# memory), so a program keeps num_stages - 1 chunks in flight. programs_per_SM 0 = one program per row
# (grid = N): the hardware keeps as many resident as fit (8 warps and 24 KiB of shared memory each) and
# starts the next row as soon as any program ends. scripts/gpu/ce_rows_probe.py on the H200 (2026-12-02,
# 9 configs x 16 shapes, V = 128256 / 151936, N = 376 to 16384) had this config fastest or within 1% at
# every shape: 9-10% faster than the earlier (2, 8192, 16, 3) at N = 4096 and 16384, 18% at the
# 376-384-row chunks linear_cross_entropy runs (264 persistent programs left the second wave of rows half
# empty there). Timing candidates at run time needed a scratch copy of the logits (the caller's are
# overwritten by the gradient), which made the first call's peak +1.3 GiB at 8192 x 131072 (a
# dict.setdefault evaluated its clone() on every timed launch: two 512 MiB copies live at once, plus the
# timer's 256 MB L2-flush buffer) while the steady state is +O(N).
_CE_WIDE_CONFIG = (0, 4096, 8, 3)

# grad_scale modes of the row kernel
_SCALE_VALUE, _SCALE_SCALAR_PTR, _SCALE_ROW_PTR = 0, 1, 2


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _capped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:
        # softcap * tanh(x / softcap); tanh(u) = 1 - 2 / (exp(2u) + 1) stays finite for any u
        x = softcap * (1.0 - 2.0 / (tl.exp(2.0 * x / softcap) + 1.0))
    return x


@triton.jit
def _ce_rows_kernel(
    # pointers
    logits_ptr, grad_ptr, target_ptr, loss_ptr, scale_ptr, gate_ptr,
    # shapes and strides (elements; vocab has stride 1)
    n_rows, n_cols, stride_logits, stride_grad,
    # scalars
    ignore_index, label_smoothing, z_loss, softcap, scale_value,
    # meta-parameters
    BLOCK: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_ZLOSS: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    NUM_STAGES: tl.constexpr = 1,  # software-pipelining depth of the vocab loops (1: none)
    GATED: tl.constexpr = False,  # *gate_ptr (int32) != 0: the caller's target check failed, touch nothing
):
    offs = tl.arange(0, BLOCK)
    if GATED:  # no rows at all: the caller raises, and the logits (the gradient's buffer in place) stay as they were
        n_rows = tl.where(tl.load(gate_ptr) == 0, n_rows, 0)
    # persistent: program p handles rows p, p + P, ... (P bounds the rows in flight, hence the
    # bytes between loop 1 reading a row and loop 2 re-reading it: keep that under L2)
    # int64 induction variable: row * stride exceeds 2^31 at real shapes (16384 x 151936)
    for r in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        # int64 on the GPU already (a no-op cast); the CPU interpreter hands the loop a Python int,
        # which it would multiply in int32: the cast keeps the CPU test of the int64 path honest
        row = tl.cast(r, tl.int64)
        x_row = logits_ptr + row * stride_logits
        g_row = grad_ptr + row * stride_grad
        target = tl.load(target_ptr + row)
        valid = target != ignore_index

        if valid:
            # ---- loop 1: online logsumexp (and sum of z for label smoothing)
            m = -float("inf")
            d = 0.0
            sum_z = 0.0
            for start in tl.range(0, n_cols, BLOCK, num_stages=NUM_STAGES):
                cols = start + offs
                mask = cols < n_cols
                # evict_last: loop 2 re-reads this row
                x = tl.load(x_row + cols, mask=mask, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
                z = _capped(x, softcap, HAS_SOFTCAP)
                z = tl.where(mask, z, -float("inf"))
                m_new = tl.maximum(m, tl.max(z, axis=0))
                m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # no -inf - -inf
                d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
                m = m_new
                if HAS_SMOOTHING:
                    sum_z += tl.sum(tl.where(mask, z, 0.0), axis=0)
            lse = m + tl.log(d)
            # target logit; an out-of-range target (only reachable when the host check was skipped) gives nan
            in_range = (target >= 0) & (target < n_cols)
            x_t = tl.load(x_row + target, mask=in_range, other=float("nan")).to(tl.float32)
            z_t = _capped(x_t, softcap, HAS_SOFTCAP)
            loss = lse - (1.0 - label_smoothing) * z_t
            if HAS_SMOOTHING:
                loss -= label_smoothing * sum_z / n_cols
            if HAS_ZLOSS:
                loss += z_loss * lse * lse
            tl.store(loss_ptr + row, loss)

            # ---- loop 2: gradient over the buffer, chunks in reverse (warmest in L2 first)
            if WRITE_GRAD:
                if SCALE_MODE == 1:
                    scale = tl.load(scale_ptr).to(tl.float32)
                elif SCALE_MODE == 2:
                    scale = tl.load(scale_ptr + row).to(tl.float32)
                else:
                    scale = scale_value
                coef = 1.0
                if HAS_ZLOSS:
                    coef = 1.0 + 2.0 * z_loss * lse
                uniform = label_smoothing / n_cols
                n_chunks = tl.cdiv(n_cols, BLOCK)
                for i in tl.range(0, n_chunks, num_stages=NUM_STAGES):
                    cols = (n_chunks - 1 - i) * BLOCK + offs
                    mask = cols < n_cols
                    x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                    z = _capped(x, softcap, HAS_SOFTCAP)
                    g = tl.exp(z - lse) * coef - tl.where(cols == target, 1.0 - label_smoothing, 0.0)
                    if HAS_SMOOTHING:
                        g -= uniform
                    if HAS_SOFTCAP:
                        # not `r`: that name is the row loop's int64 induction variable, and rebinding
                        # it to fp32 does not compile on the GPU (the interpreter never type-checks it)
                        zc = z / softcap
                        g = g * (1.0 - zc * zc)
                    tl.store(g_row + cols, (g * scale).to(grad_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(loss_ptr + row, 0.0)
            if WRITE_GRAD:
                zeros = tl.zeros([BLOCK], dtype=grad_ptr.dtype.element_ty)
                for start in range(0, n_cols, BLOCK):
                    cols = start + offs
                    tl.store(g_row + cols, zeros, mask=cols < n_cols)


@triton.jit
def _scale_rows_kernel(
    # pointers
    grad_ptr, scale_ptr,
    # shapes and strides
    n_rows, n_cols, stride_grad,
    # meta-parameters
    ROWWISE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """grad[row, :] *= scale (scalar, or scale[row]) in fp32, in place. Persistent: each program walks
    tiles pid, pid + P, ...; with a scalar scale of exactly 1.0 every program returns after one load,
    so the usual loss.backward() costs one tiny launch and no pass over [N, V]."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    n_col_blocks = tl.cdiv(n_cols, BLOCK)
    n_tiles = n_rows * n_col_blocks
    offs = tl.arange(0, BLOCK)
    if ROWWISE:
        for tile in range(pid, n_tiles, n_progs):
            row = (tile // n_col_blocks).to(tl.int64)
            scale = tl.load(scale_ptr + row).to(tl.float32)
            if scale != 1.0:
                cols = (tile % n_col_blocks) * BLOCK + offs
                ptrs = grad_ptr + row * stride_grad + cols
                g = tl.load(ptrs, mask=cols < n_cols, other=0.0).to(tl.float32)
                tl.store(ptrs, (g * scale).to(grad_ptr.dtype.element_ty), mask=cols < n_cols)
    else:
        scale = tl.load(scale_ptr).to(tl.float32)
        if scale != 1.0:
            for tile in range(pid, n_tiles, n_progs):
                row = (tile // n_col_blocks).to(tl.int64)
                cols = (tile % n_col_blocks) * BLOCK + offs
                ptrs = grad_ptr + row * stride_grad + cols
                g = tl.load(ptrs, mask=cols < n_cols, other=0.0).to(tl.float32)
                tl.store(ptrs, (g * scale).to(grad_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _target_stats_kernel(target_ptr, gate_ptr, inv_n_ptr, n, n_cols, ignore_index, BLOCK: tl.constexpr):
    """One program over the whole target vector: *gate_ptr (int32) = the number of targets that are neither
    ignore_index nor in [0, n_cols); *inv_n_ptr (fp32) = 1 / max(1, the number of targets != ignore_index),
    correctly rounded (the count is exact below 2^24, as an fp32 sum of the mask was)."""
    offs = tl.arange(0, BLOCK)
    n_bad = tl.zeros([BLOCK], dtype=tl.int32)
    n_valid = tl.zeros([BLOCK], dtype=tl.int32)
    for start in tl.range(0, n, BLOCK):
        idx = start + offs
        t = tl.load(target_ptr + idx, mask=idx < n, other=ignore_index)
        valid = t != ignore_index
        n_valid += valid.to(tl.int32)
        n_bad += (valid & ((t < 0) | (t >= n_cols))).to(tl.int32)
    tl.store(gate_ptr, tl.sum(n_bad, axis=0))
    count = tl.maximum(tl.sum(n_valid, axis=0), 1).to(tl.float32)
    tl.store(inv_n_ptr, tl.math.div_rn(tl.full((), 1.0, tl.float32), count))


# ---------------------------------------------------------------------------------------- launchers
def _grid_rows(n_rows: int, device: torch.device, programs_per_sm: float | None = None) -> int:
    """Programs for the persistent row kernel: programs_per_sm (default CE_PROGRAMS_PER_SM) per SM
    (0: one program per row)."""
    per_sm = CE_PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    if per_sm <= 0:
        return n_rows
    return max(1, min(n_rows, int(num_sms(device) * per_sm)))


def _config(n_cols: int) -> tuple[int, int]:
    """(chunk BLOCK, num_warps) for vocab width n_cols."""
    for limit, block, warps in _CE_CONFIGS:
        if n_cols <= limit:
            return min(block, next_power_of_2(n_cols)), warps
    raise AssertionError("unreachable: last limit is unbounded")


def _launch_rows(logits, grad, target, *, ignore_index, label_smoothing, z_loss, softcap, grad_scale, gate=None):
    """Run the row kernel. grad: tensor receiving the gradient (may be `logits` itself) or None. gate: None,
    or an int32 [] device tensor (_queue_check's): non-zero at run time, the kernel writes no gradient."""
    write_grad = grad is not None
    if sg is not None and not (label_smoothing or z_loss or softcap is not None) and sg.serves(logits) and (
            grad is None or grad is logits or sg.smem_aligned(grad)):
        # Hopper, a wide aligned vocabulary, the plain loss: the cluster kernel reads the row from HBM once
        # (softmax_gluon's routing note); first, so that nothing below is allocated or converted for it
        return cg.ce_rows_smem_(logits, target, ignore_index=ignore_index,
                                grad_scale=(1.0 if grad_scale is None else grad_scale) if write_grad else None,
                                grad=grad, gate=gate)
    n_rows, n_cols = logits.shape
    device = logits.device
    loss = torch.empty(n_rows, dtype=torch.float32, device=device)
    if n_rows == 0:
        return loss
    scale_mode, scale_value, scale_ptr = _SCALE_VALUE, 1.0, loss  # loss: a dummy pointer, never read
    if write_grad and isinstance(grad_scale, torch.Tensor):
        scale_ptr = _as_fp32_on(grad_scale, device)
        scale_mode = _SCALE_ROW_PTR if grad_scale.dim() == 1 else _SCALE_SCALAR_PTR
    elif write_grad and grad_scale is not None:
        scale_value = float(grad_scale)
    # the launch made here, without a closure; stride()[0]: 0.07 us of host time against 0.15 for stride(0) (CPU)
    stride_row = logits.stride()[0]
    stride_grad = (stride_row if grad is logits else grad.stride()[0]) if write_grad else 0
    programs_per_sm, block, warps, stages = _pick_rows_config(logits)
    with on_device(device):  # the logits' stream: the gate, the scale and the logits are queued there
        _ce_rows_kernel[(_grid_rows(n_rows, device, programs_per_sm),)](
            logits, grad if write_grad else logits, target, loss, scale_ptr, loss if gate is None else gate,
            n_rows, n_cols, stride_row, stride_grad,
            ignore_index, float(label_smoothing), float(z_loss), float(softcap or 1.0), scale_value,
            BLOCK=block,
            HAS_SOFTCAP=softcap is not None,
            HAS_SMOOTHING=label_smoothing > 0,
            HAS_ZLOSS=z_loss != 0,
            WRITE_GRAD=write_grad,
            SCALE_MODE=scale_mode,
            NUM_STAGES=stages,
            GATED=gate is not None,
            num_warps=warps,
            num_stages=stages,
        )
    return loss


def _pick_rows_config(logits):
    """The row kernel's (programs_per_SM, BLOCK, num_warps, num_stages) for this vocab width: the
    _CE_CONFIGS up to V = 8192 (one program per row on the GPU, the persistent grid on the CPU),
    _CE_WIDE_CONFIG above on the GPU. No run-time timing, so
    no scratch memory and no first-call cost (the in-place kernel cannot be timed on the caller's
    logits)."""
    n_cols = logits.shape[1]
    block, warps = _config(n_cols)
    if not logits.is_cuda:
        return (CE_PROGRAMS_PER_SM, block, warps, 1)
    if n_cols <= 8192:
        return (0, block, warps, 1)
    per_sm, wide_block, wide_warps, stages = _CE_WIDE_CONFIG
    return (per_sm, min(wide_block, next_power_of_2(n_cols)), wide_warps, stages)


def ce_rows_(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, grad_scale=None):
    """Per-row cross-entropy of `logits` [n, V] (contiguous rows; fp32/bf16/fp16) against `target` [n]
    int64 (validated by the caller). Returns fp32 [n] (0.0 for ignored rows), the math of
    cross_entropy(reduction="none").

    If grad_scale is not None (python float, or fp32 tensor [] or [n] on logits' device), writes
    grad_scale * d loss_i / d logits_i IN PLACE over `logits` (logits' dtype) in the same pass; ignored
    rows get 0. No extra [n, V] tensor.
    """
    return _launch_rows(
        logits, logits if grad_scale is not None else None, target,
        ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
        grad_scale=grad_scale,
    )


def _scale_grad_(grad: torch.Tensor, scale: torch.Tensor) -> None:
    """grad [N, V] *= scale ([] or [N], fp32) in place; a no-op pass when scale is 1 (decided on device)."""
    if grad.numel() == 0:
        return
    n_rows, n_cols = grad.shape
    block = min(SCALE_BLOCK, next_power_of_2(n_cols))
    device = grad.device
    scale = _as_fp32_on(scale, device)
    n_tiles = n_rows * cdiv(n_cols, block)
    grid = (min(n_tiles, num_sms(device) * SCALE_PROGRAMS_PER_SM),)
    with on_device(device):
        _scale_rows_kernel[grid](
            grad, scale, n_rows, n_cols, grad.stride()[0], ROWWISE=scale.dim() == 1, BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )


def _as_fp32_on(scale: torch.Tensor, device: torch.device) -> torch.Tensor:
    """scale as a contiguous fp32 tensor on `device` (the kernels read it by pointer). .to() only when it is not
    one already (the usual case: a grad_output or 1 / n_valid): a no-op .to(device=..., dtype=...).contiguous()
    costs 0.46 us of host time against 0.26 us for this (CPU)."""
    if scale.dtype != torch.float32 or scale.device != device:
        scale = scale.to(device=device, dtype=torch.float32)
    return scale.contiguous()


def _target_stats(target: torch.Tensor, n_cols: int, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Device side of the target check and of the mean's count, in ONE launch and no sync: (gate, inv_n) =
    (int32 [] the number of targets that are not ignore_index and lie outside [0, V); fp32 [] 1 / max(1, the
    number of targets != ignore_index): all ignored gives a loss sum 0 -> 0, not nan). cross_entropy hands
    the gate to the row kernel and waits for it after the launch (_queue_check); linear_cross_entropy waits at
    once (_check_targets), before its first GEMM. The torch form this replaces took eight small launches
    (the mask, a clamp, a compare, an and, two sums, a clamp and a reciprocal); on the H200 each costs the
    host about as much as this one Triton launch. target: contiguous int64 [N].
    Scaling: one program (one SM) walks the targets TARGET_STATS_BLOCK at a time, so its GPU time grows with N
    where the torch ops' did not (estimated, not measured: about 1 us a step, so it passes the eight parallel ops'
    few microseconds somewhere past 64K targets; a training batch holds a few thousand to a few tens of
    thousands)."""
    # size=() by keyword: 0.9 us of host time against 1.3 us for torch.empty((), ...) (CPU), the same aten.empty
    device = target.device
    gate = torch.empty(size=(), dtype=torch.int32, device=device)
    inv_n = torch.empty(size=(), dtype=torch.float32, device=device)
    block = min(TARGET_STATS_BLOCK, max(16, next_power_of_2(target.shape[0])))
    with on_device(device):
        _target_stats_kernel[(1,)](target, gate, inv_n, target.shape[0], n_cols, ignore_index, BLOCK=block,
                                   num_warps=8 if block >= 2048 else 4)
    return gate, inv_n


def _raise_bad(target: torch.Tensor, n_cols: int, ignore_index: int) -> None:
    """The error path of the target check (only after the gate said a target is bad): a ValueError naming the
    first non-ignored target outside [0, V), found again with torch on the target's device."""
    bad = ((target < 0) | (target >= n_cols)) & (target != ignore_index)
    first = int(target[bad][0])
    raise ValueError(f"target values must be in [0, {n_cols}) or equal ignore_index={ignore_index}, found {first}")


def _queue_check(gate: torch.Tensor):
    """The target check as a gate on the kernel, so that the GPU is not left idle while the host waits for the
    check and then prepares the launch. gate: _target_stats' count of bad targets (int32 [] on the device),
    which the row kernels read before they write anything (non-zero: no gradient is written, the logits stay as
    they were). Returns `pending`: on CUDA, the count's copy into pinned host memory and an event recorded after
    it, both queued BEFORE the kernel, so that _finish_check waits for the check only while the kernel is
    already queued behind it (None elsewhere: the interpreter runs in order)."""
    if not gate.is_cuda:  # (device.type builds a device and its name: 0.25 us of host time against 0.04)
        return None
    host = torch.empty((), dtype=torch.int32, pin_memory=True)
    host.copy_(gate, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(gate.device))
    return host, done


def _finish_check(target: torch.Tensor, gate: torch.Tensor, pending, n_cols: int, ignore_index: int) -> None:
    """Host side of _queue_check, after the kernel's launch: waits for the count (not for the kernel), and
    raises when it is not 0. The gated kernel wrote nothing, so a bad target loses no data."""
    if pending is None:
        n_bad = int(gate)
    else:
        host, done = pending
        done.synchronize()
        n_bad = int(host)
    if n_bad:
        _raise_bad(target, n_cols, ignore_index)


def _check_targets(target: torch.Tensor, n_cols: int, ignore_index: int) -> torch.Tensor:
    """Host check (ONE device->host sync): every non-ignored target lies in [0, V). Returns inv_n, fp32 [] on
    the device (see _target_stats): one launch and the sync."""
    gate, inv_n = _target_stats(target, n_cols, ignore_index)
    if int(gate):
        _raise_bad(target, n_cols, ignore_index)
    return inv_n


def _plan(input, inv_n, reduction):
    """Device-side (no sync) scalars from inv_n (_target_stats'): the forward grad scale and the backward's
    extra factor. Returns (forward grad_scale, backward factor [] fp32 or None)."""
    if input.dtype == torch.float16:
        # LESSON 7: never fold 1/n into an fp16 store; store g * 2^k (exact) and undo it in fp32 later
        undo = inv_n if reduction == "mean" else torch.ones_like(inv_n)
        return FP16_STORE_SCALE, undo / FP16_STORE_SCALE
    if reduction != "mean":
        return 1.0, None
    return inv_n, None


def _reduce(rows_loss, inv_n, reduction):
    """The loss in fp32 whatever the logits' dtype: a bf16 loss loses the digits a training log shows
    (12.98 -> 13.0), and an fp16 loss overflows once a GradScaler multiplies it by 65536 (mean loss
    ~10 at V=32768 -> 6.8e5 > 65504), which turned the whole gradient into inf."""
    if reduction == "none":
        return rows_loss
    total = rows_loss.sum()
    return total * inv_n if reduction == "mean" else total


def _backward_scale(grad_output, extra):
    # .to() only for another dtype: a no-op .to(torch.float32) still costs 0.8 us of host time (CPU)
    scale = grad_output if grad_output.dtype == torch.float32 else grad_output.to(torch.float32)
    return scale * extra if extra is not None else scale


def _gated_forward(logits, grad, target, *, ignore_index, label_smoothing, reduction, z_loss, softcap, check):
    """The forward both routes run (the eager Function and the custom op): the target statistics, the grad
    scale, the check queued as the row kernel's gate, the launch, then the host's wait for the check (after the
    launch) and the reduction. grad: the buffer the gradient goes to (logits itself in place, a new one, or None
    for no gradient). check False: no gate and no wait (CHECK_TARGETS off). Returns (loss, inv_n, extra), extra
    being _plan's backward factor or None."""
    n_cols = logits.shape[1]
    gate, inv_n = _target_stats(target, n_cols, ignore_index)
    fwd_scale, extra = _plan(logits, inv_n, reduction)
    pending = _queue_check(gate) if check else None
    rows_loss = _launch_rows(
        logits, grad, target, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
        softcap=softcap, grad_scale=fwd_scale, gate=gate if check else None,
    )
    if check:
        _finish_check(target, gate, pending, n_cols, ignore_index)
    return _reduce(rows_loss, inv_n, reduction), inv_n, extra


# -------------------------------------------------------------------------- eager autograd (in place)
class _CrossEntropyInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, target, options):
        # options: (ignore_index, label_smoothing, reduction, z_loss, softcap, write_grad, check) in one tuple, so that
        # apply takes 3 arguments, not 9: Function.apply walks every argument (functorch's unwrap, the C++ side's
        # input bookkeeping) and the backward returns a gradient slot for each; 9 cost 1.7 us of host time more
        # than 3 (CPU, torch 2.x)
        ignore_index, label_smoothing, reduction, z_loss, softcap, write_grad, check = options
        # the target check runs in here (_gated_forward), not before apply: one launch gives it and n_valid, it
        # gates the kernel on the device, and the host waits for it only after the launch
        # rows that share memory (an expanded input, row stride < V) cannot each receive their own
        # in-place gradient: copy them, like a column stride != 1
        n_rows, n_cols = input.shape
        stride_row, stride_col = input.stride()  # one call (x.stride(i) twice: 0.34 us of host time against 0.09)
        overlapping = n_rows > 1 and stride_row < n_cols
        in_place_ok = stride_col == 1 and not (write_grad and overlapping)
        logits = input if in_place_ok else input.contiguous()
        loss, inv_n, extra = _gated_forward(
            logits, logits if write_grad else None, target, ignore_index=ignore_index,
            label_smoothing=label_smoothing, reduction=reduction, z_loss=z_loss, softcap=softcap, check=check,
        )
        if write_grad:
            if logits is input:
                # the gradient now sits in the caller's tensor: bump its version counter, so that a node that saved
                # it for its own backward (tanh, exp, sigmoid save their outputs) raises "modified by an inplace
                # operation" instead of reading the gradient as the logits (a silently wrong gradient)
                torch.autograd.graph.increment_version(input)
            # the backward factor only when there is one (no placeholder tensor and no flag to say it is one)
            if extra is None:
                ctx.save_for_backward(logits)
            else:
                ctx.save_for_backward(logits, extra)
            ctx.consumed = False
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        # once differentiable: under create_graph=True (grad mode on in here) once_differentiable's wrapper makes a
        # second backward through the result raise. A plain backward runs with grad mode off already, and there the
        # wrapper only added a torch.no_grad() block around the same call (1.4 us of host time, CPU): skipped
        if torch.is_grad_enabled():
            return _backward_once(ctx, grad_output)
        return _backward_in_place(ctx, grad_output)


def _backward_in_place(ctx, grad_output):
    """_CrossEntropyInPlace's backward: the gradient buffer scaled in place and handed out."""
    if ctx.consumed:  # the buffer was already scaled and handed out as the gradient
        raise RuntimeError(
            "hearth cross_entropy: backward ran twice through the same graph (retain_graph=True); its "
            "gradient lives in the overwritten logits buffer and can be consumed only once"
        )
    ctx.consumed = True
    saved = ctx.saved_tensors
    grad = saved[0]
    _scale_grad_(grad, _backward_scale(grad_output, saved[1] if len(saved) == 2 else None))
    # detach: a fresh tensor object, so autograd may adopt it as .grad without cloning [N, V]
    return grad.detach(), None, None


_backward_once = once_differentiable(_backward_in_place)  # _common's: raises for a gradient penalty too


# ------------------------------------------------------------------ torch.library ops (torch.compile)
@torch.library.custom_op("hearth::cross_entropy_fwd", mutates_args=())
def _ce_fwd_op(
    input: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float, reduction: str,
    z_loss: float, softcap: float, with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Functional forward: (loss, grad [N, V] or empty [0], backward factor [] fp32). softcap 0 = off."""
    # runs at run time, even under compile (the op is opaque to the compiler)
    logits = input if input.stride(1) == 1 else input.contiguous()
    grad = torch.empty(logits.shape, dtype=input.dtype, device=input.device) if with_grad else None
    loss, _inv_n, extra = _gated_forward(
        logits, grad, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction,
        z_loss=z_loss, softcap=softcap or None, check=CHECK_TARGETS,
    )
    factor = extra if extra is not None else torch.ones((), dtype=torch.float32, device=input.device)
    if grad is None:
        grad = torch.empty(0, dtype=input.dtype, device=input.device)
    return loss, grad, factor


@_ce_fwd_op.register_fake
def _(input, target, ignore_index, label_smoothing, reduction, z_loss, softcap, with_grad):
    loss_shape = (input.shape[0],) if reduction == "none" else ()
    grad_shape = input.shape if with_grad else (0,)
    return (
        input.new_empty(loss_shape, dtype=torch.float32),
        input.new_empty(grad_shape),
        input.new_empty((), dtype=torch.float32),
    )


@torch.library.custom_op("hearth::cross_entropy_scale_grad", mutates_args=("grad",))
def _ce_scale_grad_op(grad: torch.Tensor, grad_output: torch.Tensor, factor: torch.Tensor) -> None:
    _scale_grad_(grad, grad_output.to(torch.float32) * factor)


@_ce_scale_grad_op.register_fake
def _(grad, grad_output, factor):
    return None


def _ce_setup_context(ctx, inputs, output):
    _, grad, factor = output
    ctx.save_for_backward(grad, factor)


def _ce_backward(ctx, grad_loss, _grad_grad, _grad_factor):
    grad, factor = ctx.saved_tensors
    _ce_scale_grad_op(grad, grad_loss, factor)
    return grad, None, None, None, None, None, None, None


_ce_fwd_op.register_autograd(_ce_backward, setup_context=_ce_setup_context)


# ---------------------------------------------------------------------------------------- public fn
def check_loss_options(ignore_index, label_smoothing, reduction, z_loss, softcap) -> None:
    """Raise TypeError/ValueError naming the option: the checks shared by cross_entropy and
    linear_cross_entropy (same options, same meaning)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not INT64_MIN <= ignore_index <= INT64_MAX:  # the kernels take it as an int64 scalar (Triton: OverflowError)
        raise ValueError(f"ignore_index must fit int64 (the targets' dtype), got {ignore_index}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    for name, value in (("label_smoothing", label_smoothing), ("z_loss", z_loss)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if not z_loss >= 0.0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise TypeError(f"softcap must be None or a float, got {type(softcap).__name__}")
        if not softcap > 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")


def cross_entropy(input, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None):
    """Cross-entropy of logits `input` [N, V] against class indices `target` [N], like
    torch.nn.functional.cross_entropy, plus z_loss (adds z_loss * logsumexp**2 per row) and softcap
    (logits -> softcap * tanh(logits / softcap) before the softmax). Differentiable w.r.t. input.

    Args:
        input: [N, V] float32 / bfloat16 / float16 logits (CUDA; CPU under TRITON_INTERPRET=1).
            WHEN input.requires_grad, THE FORWARD OVERWRITES input WITH ITS GRADIENT (see module
            docstring): treat the logits as consumed.
        target: [N] int64 class indices in [0, V), or ignore_index.
        ignore_index: rows with this target contribute 0 loss / 0 gradient and are not counted.
        label_smoothing: in [0, 1], as torch defines it.
        reduction: "mean" (over non-ignored rows; 0 when all are ignored), "sum", or "none" ([N] losses).
        z_loss: >= 0; softcap: None or > 0.

    Returns: a 0-D tensor ("mean", "sum") or [N] ("none"), always float32 (unlike
    torch.nn.functional.cross_entropy, which returns input's dtype): see _reduce.

    Memory traffic: reads N*V*b once and, with a gradient, writes N*V*b once (the reverse re-read is
    meant to hit L2); extra memory O(N) floats. fp16 (any reduction), "none", or a grad_output != 1
    adds one read+write of [N, V] in the backward.

    Raises:
        TypeError: input not float32/bf16/fp16, target not int64, or option of the wrong type.
        ValueError: wrong shapes, devices, empty input, bad option values, or a target outside [0, V)
            that is not ignore_index (ONE device->host wait per call, for the check only; the kernel, queued
            behind the check, writes nothing when it fails, so the logits are left as they were).
    """
    check_tensor(input, "input", ndim=2)
    # The usual call (an int64 [N] target on input's device; an int ignore_index, float options in range, softcap
    # None or a positive float) in one test: it implies every check below, which then runs only to raise its message
    # naming the argument (or to pass an unusual but valid call, e.g. an int z_loss). With input's check: 3.3 us of
    # host time a call for the checks one by one against 1.7 us (CPU, interpreter).
    if not (isinstance(target, torch.Tensor) and target.dtype == torch.int64 and target.dim() == 1
            and target.shape[0] == input.shape[0] and target.device == input.device
            and type(ignore_index) is int and INT64_MIN <= ignore_index <= INT64_MAX and reduction in REDUCTIONS
            and type(label_smoothing) is float and 0.0 <= label_smoothing <= 1.0 and type(z_loss) is float
            and z_loss >= 0.0 and (softcap is None or (type(softcap) is float and softcap > 0))):
        check_tensor(target, "target", dtypes=(torch.int64,), ndim=1, allow_empty=True)
        check_same_device(input=input, target=target)
        if target.shape[0] != input.shape[0]:
            raise ValueError(f"target must have shape [{input.shape[0]}] to match input {tuple(input.shape)}, "
                             f"got {tuple(target.shape)}")
        check_loss_options(ignore_index, label_smoothing, reduction, z_loss, softcap)
    target = target.contiguous()
    # no gradient wanted (eval, no_grad): the logits are only read, never overwritten
    want_grad = records_graph(input)
    if torch.compiler.is_compiling():
        loss, _, _ = _ce_fwd_op(
            input, target, ignore_index, float(label_smoothing), reduction, float(z_loss),
            float(softcap or 0.0), want_grad,
        )
        return loss
    return _CrossEntropyInPlace.apply(input, target, (
        ignore_index, float(label_smoothing), reduction, float(z_loss), None if softcap is None else float(softcap),
        want_grad, CHECK_TARGETS,
    ))
