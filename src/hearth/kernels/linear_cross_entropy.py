"""linear_cross_entropy: cross_entropy(input @ W^T + b, target) without ever holding the [N, V] logits.

Memory plan (the fusion is here, not in a new GEMM): tokens are processed in chunks of C rows, C
chosen by `chunk_rows_for`: at most CHUNK_ROWS_MAX (768) rows, and one chunk's logits within
EXTRA_MEMORY_BUDGET (224 MiB). Per chunk, in the forward:
    logits_c = x_c @ W^T (+ b)                      cuBLAS (torch.mm / addmm) into ONE reused buffer
    loss_c   = ce_rows_(logits_c, ...)               hearth's row kernel; it also writes
               g_c = grad_scale * dloss/dlogits_c    IN PLACE over logits_c (same pass)
    grad_x[c]  = g_c @ W                             written straight into the returned [N, H] tensor
    grad_W    += g_c^T @ x_c                         into the ONE [V, H] tensor that becomes .grad
                                                     (skipped when linear_weight is frozen)
    grad_b    += sum_rows g_c                         (fp32)
grad_scale = 1/n_valid with n_valid counted over ALL N rows first, on the device (no host sync).
The gradients are thus computed during the forward (as Liger does); the backward only multiplies
them, in place, by grad_output -- a Triton kernel reads grad_output on the device and returns at once
when it is 1.0, so the usual loss.backward() costs a few launches, no pass and no host sync. autograd
adopts the forward's buffers as .grad without a copy, and the op's four carrier outputs are marked
non-differentiable with set_materialize_grads(False): otherwise autograd passes the backward a zero
[N, H] and a zero [V, H] tensor (the extra 1088 MiB the first H200 probe saw at H=4096 V=131072).

Memory arithmetic (bf16, N=8192; "extra" = peak during the call minus inputs, LESSON 8):
    gradients any implementation returns: [V, H] + [N, H]
        H=4096 V=131072: 1024 + 64 MiB;  H=5120 V=151936: 1484 + 80 MiB
    activation extra = one logits chunk C*V*2 B + O(N + V) bookkeeping (< 2 MiB: losses, target
        checks, fp32 grad_b; 37 KiB at N=8192 without a bias)
    C (chunk_rows_for: min(CHUNK_ROWS_MAX, the rows whose logits fit EXTRA_MEMORY_BUDGET), rounded down
    to a multiple of 256 (128, 64, ... where the cap is small), the rows spread over that many chunks):
        N=8192 V=131072: 768 rows (192 MiB), 11 chunks;  V=151936: 768 rows (222.6 MiB), 11 chunks
        V=262144: 224 MiB / 512 KiB per row = 448 -> 384 rows (192 MiB)
    Why 768 rows: the weight-gradient GEMM of a chunk has K = C (short) and reads+writes grad_W; at K = 512 it
    ran at 0.60-0.73x of the unchunked GEMM's speed (BENCHMARKS.md, thirty-third run). A sweep of 384-1536
    rows (thirty-fourth run, an H100) had multiples of 256 fastest (640, 896 and 1280 slower than the
    multiple of 256 below them) and, trainable, 768 rows 4-12% faster than 512, 1024 rows a little faster
    again; the frozen weight (no grad_W) was flat. 768 is the most rows whose logits stay within 1/10 of
    the logits torch.compile materialises at N=8192 (2048 MiB at V=131072, 2374 MiB at V=151936): 1024
    rows would hold 256 / 297 MiB. (Earlier H200 sweeps of 256-640 rows had 512 fastest there; 768 was
    not in them.) At fewer tokens the ratio is larger: 188 MiB against 1002 MiB at N=4096 V=128256.

Time model (H200, cuBLAS ~750 TFLOP/s, copy ~4.3 TB/s): 2 GEMMs of 2*N*H*V flops (3 when grad_W
is needed) + ce_rows_ over the N*V logits (read, write g in place; ~1.9 TB/s in the first H200
bench: ~3-4 ms) + one read+write of grad_W [V, H] per chunk beyond the first (cuBLAS addmm with
beta=1 does not hide it: 2 GiB = ~0.5 ms at V=131072, 2.97 GiB = ~0.75 ms at V=151936). Predictions:
    H=4096 V=131072 trainable: 35.2 + 15*0.5 + ~3 = ~46 ms  (probe-1: 54.7 at 256 rows, 46.5 at 512)
    H=5120 V=151936 trainable: 51.0 + 15*0.75 + ~3.5 = ~66 ms (probe-1: 88.0 at 216 rows)
    H=5120 V=151936 frozen:    34.0 + ~3.5 + tile waste ~0 = ~38 ms (probe-1: 44.7 at 216 rows)
The trainable targets (38 / 55 ms) are out of reach for this design within the memory target: the
grad_W passes alone cost 9-16 ms (later measured smaller: cuBLAS hides most of the read; what remains is
the short K of each chunk's GEMMs, BENCHMARKS.md). Larger chunks trade memory for time, up to 768 rows.

Numerics
- grad_W accumulates in linear_weight's dtype: the first chunk writes it (beta = 0), later chunks
  add with cuBLAS addmm (fp32 accumulation inside each GEMM). On the H200 a bf16 addmm_ rounds twice a
  chunk: its error against the fp64 sum was 5.5-6.3e-3 against 2.8-3.4e-3 for one rounding (the product
  rounded to bf16, then the sum; BENCHMARKS.md, the grad_W accumulate probe). Each chunk thus adds up to
  two bf16 roundings (relative 2^-9 each) to the running sum, so after k chunks the relative error is
  <= 2k * 2^-9 in the worst case and ~sqrt(2k) * 2^-9 typically. The chunk budget keeps k
  small (k = N / chunk_rows: 11 at N=8192). tests/kernels/test_linear_cross_entropy.py
  measures it at V=4099 with k=32 chunks against an fp32 accumulator of the same chunk gradients:
  5.8e-3 relative (Frobenius), vs 1.7e-3 for a single final bf16 rounding; the bound asserted is
  2 * sqrt(k) * 2^-9 (2.2e-2 at k=32). An fp32 [V, H] accumulator would cost 2.5 GiB at Qwen3-14B
  dims: not used (fp32 inputs accumulate in fp32 anyway).
- fp16: d/dlogits is stored UNSCALED (values ~1/(V*n) would underflow fp16, LESSON 7); 1/n_valid is
  applied to the finished gradients in fp32 in the backward (one extra pass over [V, H] in fp16 only).
- reduction="none": the per-row grad_output is only known in the backward, and grad_W cannot be
  rescaled row-wise afterwards, so the forward computes losses only and the backward recomputes the
  chunks with grad_scale = grad_output (one more forward GEMM).

torch.compile: the work is two torch.library custom ops (hearth::linear_cross_entropy_fwd and
hearth::linear_cross_entropy_bwd_none) with fake implementations and an autograd formula, plus an
in-place scaling op, so torch.compile(fullgraph=True) traces the loss without a graph break.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hearth.kernels._common import FLOAT_DTYPES, autograd_op, cdiv, check_same_device, check_same_dtype, check_tensor, num_sms
from hearth.kernels.cross_entropy import _check_targets, check_loss_options

EXTRA_MEMORY_BUDGET = 224 << 20  # cap on one chunk of logits: the memory the fusion trades against grad_W passes
CHUNK_ROWS_MAX = 768  # rows per chunk: the most whose logits stay within 1/10 of the whole [N, V] at N = 8192 (docstring)
CHUNK_ROW_STEPS = (256, 128, 64, 8, 1)  # row multiples, the largest at most half the cap (chunk_rows_for)
SCALE_BLOCK = 4096


# ----------------------------------------------------------------------------------------- kernels
@triton.jit
def _scale_inplace_kernel(x_ptr, s_ptr, n, BLOCK: tl.constexpr):
    """x[:] *= s (s: one fp32 on the device), grid-stride over BLOCK-element blocks. Returns at once
    when s == 1: no pass, no host sync."""
    s = tl.load(s_ptr)
    if s != 1.0:
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(x_ptr + offs, (x * s).to(x_ptr.dtype.element_ty), mask=mask)


def _scale_inplace(t: torch.Tensor, scale: torch.Tensor) -> None:
    if t.numel() == 0:
        return
    # a bounded grid (8 programs per SM): the usual grad_output == 1 launch then costs ~1k programs
    # that read one float and exit, not V*H/4096 of them (190k for a 151936 x 5120 grad_W)
    grid = (min(cdiv(t.numel(), SCALE_BLOCK), 8 * num_sms(t.device)),)
    _scale_inplace_kernel[grid](t, scale, t.numel(), BLOCK=SCALE_BLOCK, num_warps=8)


# ----------------------------------------------------------------------------------------- launcher
def _ce_rows():
    # Looked up at call time so tests can stand a reference in for the row kernel.
    from hearth.kernels.cross_entropy import ce_rows_

    return ce_rows_


def chunk_rows_for(n_rows: int, vocab: int, elem_bytes: int, budget: int | None = None,
                   max_rows: int = CHUNK_ROWS_MAX) -> int:
    """Rows per chunk for `n_rows` tokens at vocabulary `vocab` (logits of `elem_bytes` each).

    At most `max_rows` rows (CHUNK_ROWS_MAX), and the chunk's logits must fit `budget` bytes (default
    EXTRA_MEMORY_BUDGET): cap = min(max_rows, budget // (vocab * elem_bytes)). Every chunk beyond the
    first costs one read+write pass over grad_W, so the fewest chunks under the cap win. The cap is
    rounded down to a multiple of a row step: the largest of CHUNK_ROW_STEPS (256, 128, 64, 8, 1) that is
    at most half the cap (whole 128x256 GEMM tiles where the cap allows: 640- and 896-row chunks ran
    slower than 512 and 768 on the GPU); the rows are then spread over that many chunks, rounded up to the
    step (never above the cap), so only the last chunk is short. E.g. 8192 x 131072 bf16: cap 768, 11
    chunks (10 of 768, one of 512); 12289 x 151936 bf16: 17 chunks of 768 (the last 1); 8192 x 262144 bf16:
    224 MiB / 512 KiB = 448 -> 384 rows. Raises nothing; returns >= 1."""
    max_rows = max(1, min(max_rows, (budget or EXTRA_MEMORY_BUDGET) // (vocab * elem_bytes)))
    if max_rows >= n_rows:
        return n_rows
    step = next(m for m in CHUNK_ROW_STEPS if 2 * m <= max_rows or m == 1)
    cap = max_rows - max_rows % step
    n_chunks = -(-n_rows // cap)
    rows = -(-n_rows // n_chunks)
    return min(cap, -(-rows // step) * step)


def _run_chunks(x, w, bias, target, *, ignore_index, label_smoothing, z_loss, softcap, scale,
                need_gx, need_gw, need_gb, chunk_rows):
    """The chunk loop. scale: None (losses only), a python float, or fp32 tensor [] / [N] on the device.
    Returns (rows_loss fp32 [N], grad_x [N, H] | None, grad_w [V, H] | None, grad_b fp32 [V] | None)."""
    n, _ = x.shape
    vocab = w.shape[0]
    ce_rows_ = _ce_rows()
    want_grad = scale is not None
    # one chunk (the usual small call): the row kernel's own [N] result IS the losses (no buffer + copy)
    rows_loss = torch.empty(n, dtype=torch.float32, device=x.device) if chunk_rows < n else None
    gx = torch.empty_like(x) if want_grad and need_gx else None
    gw = torch.empty_like(w) if want_grad and need_gw else None
    gb = torch.zeros(vocab, dtype=torch.float32, device=x.device) if want_grad and need_gb else None
    buf = torch.empty((min(chunk_rows, n), vocab), dtype=x.dtype, device=x.device)
    w_t = w.t()
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        x_c = x[start:stop]
        logits = buf[: stop - start]
        if bias is None:
            torch.mm(x_c, w_t, out=logits)
        else:
            torch.addmm(bias, x_c, w_t, out=logits)
        row_scale = scale[start:stop] if isinstance(scale, torch.Tensor) and scale.dim() == 1 else scale
        chunk_loss = ce_rows_(
            logits, target[start:stop], ignore_index=ignore_index, label_smoothing=label_smoothing,
            z_loss=z_loss, softcap=softcap, grad_scale=row_scale,
        )
        if rows_loss is None:
            rows_loss = chunk_loss
        else:
            rows_loss[start:stop] = chunk_loss
        if not want_grad:
            continue
        # `logits` now holds g_c = scale * dloss/dlogits_c.
        if gx is not None:
            torch.mm(logits, w, out=gx[start:stop])
        if gw is not None:
            if start == 0:
                torch.mm(logits.t(), x_c, out=gw)
            else:
                gw.addmm_(logits.t(), x_c)
        if gb is not None:
            gb += logits.sum(dim=0, dtype=torch.float32)
    return rows_loss, gx, gw, gb


def _empty(x):
    return x.new_empty((0,))


# ----------------------------------------------------------------------------------------- torch.library ops
def _lce_forward(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    ignore_index: int, label_smoothing: float, reduction: str, z_loss: float, softcap: float,
    need_gx: bool, need_gw: bool, need_gb: bool, chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, grad_x | [0], grad_w | [0], grad_b fp32 | [0], factor fp32 []): factor is what the
    backward multiplies into the gradients besides grad_output (1/n_valid for fp16 "mean", else 1)."""
    # ONE launch and ONE device->host sync: every non-ignored target in [0, V), and 1 / n_valid from the same
    # pass (all ignored: loss 0 and grads 0, like cross_entropy)
    inv_n = _check_targets(target, w.shape[0], ignore_index)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    want = (need_gx or need_gw or need_gb) and reduction != "none"
    if not want:
        scale, factor = None, one
    elif reduction == "sum":
        scale, factor = 1.0, one
    elif x.dtype == torch.float16:
        scale, factor = 1.0, inv_n  # LESSON 7: store unscaled, apply 1/n in fp32 later
    else:
        scale, factor = inv_n, one
    rows_loss, gx, gw, gb = _run_chunks(
        x, w, bias, target, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
        softcap=softcap or None, scale=scale, need_gx=need_gx, need_gw=need_gw, need_gb=need_gb,
        chunk_rows=chunk_rows,
    )
    # the loss stays fp32 whatever the input dtype (as Hugging Face's loss path returns it): a bf16 loss
    # rounds 12.98 to 13.0, and an fp16 loss times a GradScaler's 65536 overflows to inf
    if reduction == "none":
        loss = rows_loss
    else:
        total = rows_loss.sum()
        loss = total * inv_n if reduction == "mean" else total
    return (loss, gx if gx is not None else _empty(x), gw if gw is not None else _empty(x),
            gb if gb is not None else _empty(rows_loss), factor)


_lce_fwd = torch.library.custom_op("hearth::linear_cross_entropy_fwd", mutates_args=())(_lce_forward)


@_lce_fwd.register_fake
def _(x, w, target, bias, ignore_index, label_smoothing, reduction, z_loss, softcap, need_gx, need_gw, need_gb, chunk_rows):
    eager = reduction != "none"
    loss = x.new_empty((x.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    gx = x.new_empty(x.shape) if eager and need_gx else _empty(x)
    gw = w.new_empty(w.shape) if eager and need_gw else _empty(x)
    gb = x.new_empty((w.shape[0],) if eager and need_gb else (0,), dtype=torch.float32)
    return loss, gx, gw, gb, x.new_empty((), dtype=torch.float32)


def _lce_backward_none(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None, grad_output: torch.Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    need_gx: bool, need_gw: bool, need_gb: bool, chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction="none" backward: recompute the chunks with row scale grad_output [N]."""
    _, gx, gw, gb = _run_chunks(
        x, w, bias, target, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
        softcap=softcap or None, scale=grad_output.to(torch.float32).contiguous(), need_gx=need_gx,
        need_gw=need_gw, need_gb=need_gb, chunk_rows=chunk_rows,
    )
    return (gx if gx is not None else _empty(x), gw if gw is not None else _empty(x),
            gb if gb is not None else x.new_empty((0,), dtype=torch.float32))


_lce_bwd_none = torch.library.custom_op("hearth::linear_cross_entropy_bwd_none", mutates_args=())(_lce_backward_none)


@_lce_bwd_none.register_fake
def _(x, w, target, bias, grad_output, ignore_index, label_smoothing, z_loss, softcap, need_gx, need_gw, need_gb, chunk_rows):
    return (x.new_empty(x.shape) if need_gx else _empty(x), w.new_empty(w.shape) if need_gw else _empty(x),
            x.new_empty((w.shape[0],) if need_gb else (0,), dtype=torch.float32))


def _backward_scale(grad_output: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """grad_output * factor as a 0-d fp32 tensor on the device (one launch, no host sync)."""
    return (grad_output.to(torch.float32) * factor).reshape(()).contiguous()


def _lce_scale_impl(grad: torch.Tensor, grad_output: torch.Tensor, factor: torch.Tensor) -> None:
    """grad *= grad_output * factor in place (fp32 scalar math; a no-op launch when it is 1)."""
    _scale_inplace(grad, _backward_scale(grad_output, factor))


_lce_scale_ = torch.library.custom_op("hearth::linear_cross_entropy_scale_", mutates_args=("grad",))(_lce_scale_impl)


@_lce_scale_.register_fake
def _(grad, grad_output, factor):
    return None


def _setup_context(ctx, inputs, output):
    x, w, target, bias, ignore_index, label_smoothing, reduction, z_loss, softcap, need_gx, need_gw, need_gb, chunk_rows = inputs
    _, gx, gw, gb, factor = output
    # The four extra outputs are carriers, never differentiated: without these two calls autograd
    # hands the backward a zero tensor for each one -- a [V, H] and an [N, H] buffer allocated in
    # every backward (the +1088 MiB "activation" of the first H200 probe at V=131072, H=4096).
    ctx.mark_non_differentiable(gx, gw, gb, factor)
    ctx.set_materialize_grads(False)
    ctx.reduction = reduction
    ctx.opts = (ignore_index, label_smoothing, z_loss, softcap, need_gx, need_gw, need_gb, chunk_rows)
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.used = False
    if reduction == "none":
        ctx.save_for_backward(x, w, target, bias)
    else:
        ctx.save_for_backward(gx, gw, gb, factor)


def _backward(ctx, grad_loss, *_unused):
    if ctx.used:  # the stored gradients are scaled in place: a second backward would scale twice
        raise RuntimeError("linear_cross_entropy: backward through the same graph twice is not supported (retain_graph)")
    ctx.used = True
    if grad_loss is None:  # the loss did not reach the graph's output: nothing flows back
        return (None,) * 13
    ignore_index, label_smoothing, z_loss, softcap, need_gx, need_gw, need_gb, chunk_rows = ctx.opts
    if ctx.reduction == "none":
        x, w, target, bias = ctx.saved_tensors
        gx, gw, gb = (_lce_backward_none if ctx.eager else _lce_bwd_none)(x, w, target, bias, grad_loss, ignore_index, label_smoothing, z_loss,
                                   softcap, need_gx, need_gw, need_gb, chunk_rows)
    else:
        gx, gw, gb, factor = ctx.saved_tensors
        if ctx.eager:  # the scale grad_output * factor made once (one launch) for all the gradients
            scale = _backward_scale(grad_loss, factor)
            for g in (gx, gw, gb):
                _scale_inplace(g, scale)  # returns at once for an empty (not needed) gradient
        else:
            for g in (gx, gw, gb):
                if g.numel():
                    _lce_scale_(g, grad_loss, factor)
    return (gx if need_gx else None, gw if need_gw else None, None,
            gb.to(ctx.bias_dtype) if need_gb else None, None, None, None, None, None, None, None, None, None)


# eager: a torch.autograd.Function over _lce_forward; under torch.compile: the custom ops
_lce = autograd_op(_lce_fwd, _lce_forward, _setup_context, _backward)


# ----------------------------------------------------------------------------------------- public
def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, ignore_index=-100,
                         label_smoothing=0.0, reduction="mean", z_loss=0.0, softcap=None, chunk_rows=None):
    """cross_entropy(input @ linear_weight^T + linear_bias, target) without materialising the logits.

    Args:
        input: [..., H] float32 / bfloat16 / float16 hidden states (leading dims flattened to N).
        linear_weight: [V, H], input's dtype and device (the lm_head). Frozen (requires_grad False):
            its gradient is never computed (no g^T @ x GEMM).
        target: [N] int64 class indices in [0, V) or ignore_index (N = input.numel() // H).
        linear_bias: None or [V], input's dtype.
        ignore_index, label_smoothing, reduction ("mean" over non-ignored rows, 0 when all are
            ignored; "sum"; "none" -> [N]), z_loss (adds z_loss * logsumexp**2 per row), softcap
            (logits -> softcap * tanh(logits / softcap)): as hearth.kernels.cross_entropy.
        chunk_rows: rows per chunk (default: chunk_rows_for: <= 768 rows, logits chunk <= 224 MiB).

    Returns: a 0-D loss ("mean", "sum") or [N] ("none"), always float32 (whatever input's dtype), as
    Hugging Face's loss path returns it.
    Gradients are computed in the forward when any input requires grad; calling backward twice on
    the same graph is refused (RuntimeError).

    Raises TypeError (dtypes, option types) or ValueError (shapes, devices, option values, a target
    outside [0, V) that is not ignore_index -- one host sync per call) naming the argument.
    """
    check_tensor(input, "input")
    check_tensor(linear_weight, "linear_weight", ndim=2)
    check_tensor(target, "target", dtypes=(torch.int64,), ndim=(1,), allow_empty=True)
    check_same_dtype(input=input, linear_weight=linear_weight)
    check_same_device(input=input, linear_weight=linear_weight, target=target)
    hidden = linear_weight.shape[1]
    if input.dim() == 0:  # [..., H] of any rank but 0 (shape[-1] below would raise a bare IndexError)
        raise ValueError(f"input must have at least 1 dimension [..., {hidden}], got a 0-D tensor")
    if input.shape[-1] != hidden:
        raise ValueError(f"input has hidden size {input.shape[-1]} but linear_weight is {tuple(linear_weight.shape)}; input's last dimension must equal linear_weight.shape[1]")
    x = input if input.dim() == 2 else input.reshape(-1, hidden)  # 2-D: no view node in the graph
    if target.shape[0] != x.shape[0]:
        raise ValueError(f"target must have shape [{x.shape[0]}] (one class per input row), got {tuple(target.shape)}")
    if linear_bias is not None:
        check_tensor(linear_bias, "linear_bias", dtypes=FLOAT_DTYPES, ndim=1)
        check_same_dtype(input=input, linear_bias=linear_bias)
        check_same_device(input=input, linear_bias=linear_bias)
        if linear_bias.shape[0] != linear_weight.shape[0]:
            raise ValueError(f"linear_bias must have shape [{linear_weight.shape[0]}] (V), got {tuple(linear_bias.shape)}")
    check_loss_options(ignore_index, label_smoothing, reduction, z_loss, softcap)
    if chunk_rows is None:
        chunk_rows = chunk_rows_for(x.shape[0], linear_weight.shape[0], x.element_size())
    elif isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
    grad_on = torch.is_grad_enabled()
    loss, *_ = _lce(
        x, linear_weight, target.contiguous(), linear_bias, ignore_index, float(label_smoothing), reduction,
        float(z_loss), float(softcap or 0.0),
        grad_on and input.requires_grad, grad_on and linear_weight.requires_grad,
        grad_on and linear_bias is not None and linear_bias.requires_grad, int(chunk_rows),
    )
    return loss


def inspect_kernels(shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[str, object]]:
    """`hearth inspect` convention: the Triton kernels this op launches at `shape` = (N, H, V):
    the row cross-entropy kernel(s) and the gradient scaling kernel (its GEMMs are cuBLAS)."""
    from hearth.kernels._common import capture_launched_kernels

    n, h, v = (tuple(shape) + (8192, 4096, 131072))[:3] if shape else (8192, 4096, 131072)
    dev = torch.device("cuda")
    x = torch.randn(n, h, device=dev, dtype=dtype, requires_grad=True)
    w = (torch.randn(v, h, device=dev, dtype=dtype) / h ** 0.5).requires_grad_()
    t = torch.randint(0, v, (n,), device=dev)

    def run():
        linear_cross_entropy(x, w, t).backward(torch.tensor(2.0, device=dev, dtype=dtype))

    return capture_launched_kernels(run, label="linear_cross_entropy")
