"""Shared argument checks and launch helpers for hearth's Triton kernels.

Every public op checks its preconditions once, at the public edge, and raises
TypeError (wrong type / dtype) or ValueError (wrong shape, device, value) naming
the argument. The hot path (the launcher and the kernels) carries no checks.

Kernels run on CUDA tensors; under TRITON_INTERPRET=1 (CI, no GPU) they also run
on CPU tensors through Triton's interpreter, at small shapes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def _patch_interpreter_scalar_index() -> None:
    """Let Triton 3.6's CPU interpreter run loops whose bound is a runtime argument under numpy >= 2.3.

    The interpreter holds every scalar as a shape-(1,) array and implements `range(0, n, B)` with
    `int(array)`, which numpy 2.3+ refuses ("only 0-dimensional arrays can be converted"). We wrap
    its per-launch patch so `__index__` reads the single element. Interpreter only; idempotent.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_hearth_index_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._hearth_index_fix = True
    interpreter._patch_lang_tensor = patched


if interpret_mode():  # every kernel module imports this one, so the fix is in place before any launch
    _patch_interpreter_scalar_index()


def check_tensor(
    t,
    name: str,
    *,
    dtypes=FLOAT_DTYPES,
    ndim: int | tuple[int, ...] | None = None,
    allow_empty: bool = False,
) -> None:
    """Raise TypeError/ValueError naming `name` if `t` is not a usable kernel input."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None:
        allowed_ndim = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed_ndim:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed_ndim))} dimensions, got shape {tuple(t.shape)}")
    # is_cuda first: one attribute read on the hot path (t.device builds a device object)
    if not t.is_cuda and not (t.device.type == "cpu" and interpret_mode()):
        raise ValueError(
            f"{name} must be a CUDA tensor (CPU tensors run only under TRITON_INTERPRET=1), got device {t.device}"
        )
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the first tensor that is not on the first tensor's device."""
    first_name = first = device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first, device = name, t, t.device
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; they must share a device")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """Raise TypeError naming the first tensor whose dtype differs from the first tensor's."""
    first_name = first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first = name, t
        elif t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; they must match")


def on_device(device: torch.device):
    """Make `device` current for Triton launches (Triton launches on the current device's stream, torch ops on
    their tensors' device), switching only when it is not already (a device context costs two device exchanges of
    host time a call)."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints: triton.cdiv is a constexpr_function, ~6 us a call on the host."""
    return -(-a // b)


def empty_heads_like(ref: torch.Tensor, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.empty of `shape` [B, H, T, D] in the memory order of `ref` (a [B, H', T', D'] tensor), as PyTorch's
    SDPA allocates its output and gradients: when ref is a transposed view of a dense [B, T, H, D] tensor
    (its heads step faster than its positions), a transposed view of a new dense [B, T, H, D] buffer, so
    that the caller's `.transpose(1, 2)` back to [B, T, H, D] is contiguous and a following reshape to
    [B, T, H * D] copies nothing; otherwise a dense [B, H, T, D] tensor.

    Only a ref whose heads do not overlap (stride(1) >= D' and stride(2) >= H' * stride(1), e.g. not an
    expanded view with stride(1) == 0) takes the [B, T, H, D] order: then the new tensor's [T, D] plane spans no
    more than ref's, which the caller checked against the kernels' int32 in-plane offsets. An expanded
    multi-query k of 300000 positions would otherwise give dK a plane of 2.46e9 elements."""
    B, H, T, D = shape
    dtype = ref.dtype if dtype is None else dtype
    h, t, d = ref.shape[1], ref.shape[2], ref.shape[3]
    s_h, s_t = ref.stride(1), ref.stride(2)
    if h > 1 and t > 1 and s_h < s_t and s_h >= d and s_t >= h * s_h:
        return torch.empty((B, T, H, D), dtype=dtype, device=ref.device).transpose(1, 2)
    return torch.empty((B, H, T, D), dtype=dtype, device=ref.device)


def packed_planes(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Packed-sequence attention's [total, H, D] tensors as [1, H, total, D] views (no copy): the layout the
    dense kernels (and their TMA descriptors) address, a batch of one whose rows are every sequence's tokens."""
    return [t.unsqueeze(0).transpose(1, 2) for t in tensors]


def tma_addressable(*tensors: torch.Tensor) -> bool:
    """Whether TMA can describe each tensor from its own shape and strides: a contiguous last dim, a 16-byte
    aligned base and 16-byte aligned, non-zero outer strides (a dO expanded from a sum() has zero strides)."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        es = t.element_size()
        if any(s <= 0 or (s * es) % 16 for s in t.stride()[:-1]):
            return False
    return True


def tma_scratch(size: int, alignment: int, stream):
    """The allocator of kernels that build their TMA descriptors on the device (triton.set_allocator): `size`
    bytes of global scratch on the current device (the caching allocator's blocks are more aligned than asked).
    Triton keeps the allocator per thread (a ContextVar) and autograd runs a backward on its own thread, so a
    launcher sets it before every such launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0, like triton.next_power_of_2), in plain int math:
    triton.next_power_of_2 costs ~6 us a call on the host (its constexpr_function wrapper)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def device_index(device: torch.device) -> int:
    """A CUDA device's index; the current device's for a bare "cuda"."""
    return device.index if device.index is not None else torch.cuda.current_device()


# Both cached per device index: a properties query costs microseconds and these sit on launch paths.
@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on `device` (a small constant under the interpreter); cached per device."""
    if device.type == "cuda":
        return _sm_count(device_index(device))
    return 4


def capability(device: torch.device) -> tuple[int, int] | None:
    """The (major, minor) compute capability of a CUDA device, None for any other; cached per device. The one
    query the kernels' Hopper-only paths ask."""
    return _capability(device_index(device)) if device.type == "cuda" else None


# --------------------------------------------------------------------------------------------
# Eager calls skip the dispatcher; torch.compile sees the custom op
# --------------------------------------------------------------------------------------------
def records_graph(*tensors: torch.Tensor) -> bool:
    """True when autograd will record a call on `tensors`: grad mode is on and one of them needs a gradient.
    Without a graph no backward runs, so an op may skip what only its backward reads (attention's logsumexp)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # a plain loop: any() over a generator costs host time on every call
        if t.requires_grad:
            return True
    return False


def compiled_or_eager(op, forward):
    """`call(*args)`: the custom op `op` (whose body is `forward`) while torch.compile traces, an opaque node
    in its graph; `forward` itself otherwise, skipping the torch.library dispatch's host time."""

    def call(*args):
        if torch.compiler.is_compiling():
            return op(*args)
        return forward(*args)

    call.op, call.forward = op, forward
    return call


def once_differentiable(backward):
    """A Function's backward that is not differentiable (it calls launchers: its results have no history) as one
    that says so: under create_graph=True (grad mode on in a backward) it runs without grad and hands out
    gradients whose own backward raises. torch.autograd.function.once_differentiable does that only when an
    incoming gradient requires grad; the usual second-order case (a gradient penalty: the loss's incoming
    gradient is a constant, the dependence is through the saved inputs) then got gradients with no history and
    its second-order term was silently dropped. A plain backward (grad mode off) calls `backward` as is."""

    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():
            return backward(ctx, *grads)
        # what the true second-order term flows through: the saved inputs that require grad (unpacked before the
        # backward, which may overwrite saved buffers) and any incoming gradient that does
        links = [t for t in (*ctx.saved_tensors, *grads) if isinstance(t, torch.Tensor) and t.requires_grad]
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not links:
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        aliases = []
        for t in outs:
            if isinstance(t, torch.Tensor):
                t = t.detach()
                t.requires_grad_(True)
            aliases.append(t)
        # the error node takes the links as inputs too (their outputs dropped): it lies on every path from the
        # gradients to the inputs, so differentiating them raises instead of skipping the node
        err_fn = torch._C._functions.DelayedError(
            b"hearth: this op's backward is once_differentiable: its gradient cannot be differentiated again "
            b"(create_graph=True gives the first-order gradient only)", len(aliases) + len(links))
        wrapped = err_fn(*aliases, *links)[: len(aliases)]
        return wrapped[0] if single else tuple(wrapped)

    return wrapper


def autograd_op(op, forward, setup_context, backward, *, once: bool = False):
    """One differentiable hearth op, two routes to the same launchers. Returns `call(*args)`.

    op: the torch.library custom op (with its fake registered) whose body is `forward`. The formula
    (`setup_context`, `backward`) is registered as op's autograd AND becomes a torch.autograd.Function
    whose forward is `forward` itself. `call` runs op while torch.compile traces (an opaque node, no graph
    break), and the Function otherwise: an eager call then skips the torch.library dispatch (schema
    parsing, the Autograd / ADInplaceOrView / CPU-or-CUDA kernels: tens of microseconds of host time a
    call, more than a small kernel's GPU time).
    `backward` launches its kernels through `ctx.eager`: True on the Function route (call the launcher
    directly), False on the op route (call the backward custom op, so the compiled graph holds it too).
    once=True: `backward` is not differentiable (it calls the launchers, whose results have no history), so
    under create_graph=True the Function's backward runs once_differentiable: differentiating its gradients
    again raises, where it silently dropped the second-order term (a gradient penalty beside the loss).
    """

    def op_setup(ctx, inputs, output):
        ctx.eager = False
        setup_context(ctx, inputs, output)

    def eager_forward(ctx, *inputs):
        # forward(ctx, ...) style: Function.apply with a separate setup_context staticmethod took 46 us
        # a call on the CI box against 14 us for this style (the functorch-compatible path)
        output = forward(*inputs)
        ctx.eager = True
        setup_context(ctx, inputs, output)
        return output

    op.register_autograd(backward, setup_context=op_setup)
    eager_backward = once_differentiable(backward) if once else backward
    name = "".join(part.title() for part in op._name.split("::")[-1].split("_")) + "Function"
    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(eager_forward),
        "backward": staticmethod(eager_backward),
    })
    call = compiled_or_eager(op, function.apply)
    call.function, call.forward = function, forward
    return call


def backward_route(ctx, op, differentiable, launcher):
    """What an op's backward calls when it is the op again (rope: rotate back; matmul: two more products):
    the custom `op` on the compile route (ctx.eager False), so the compiled graph holds it; on the eager
    route the `differentiable` Function when a double backward records it (create_graph=True: grad mode is
    on in here), else the `launcher` itself, without Function.apply's glue (a ctx, setup_context, saved
    tensors: microseconds of host time a call) for a graph nobody will use."""
    if not ctx.eager:
        return op
    return differentiable if torch.is_grad_enabled() else launcher


class _CudaClock:
    """Marks on the current CUDA stream (timing events: no device memory) and the ms between two of them; the host's
    clock; and hold(ms), a kernel that keeps the GPU busy for about ms, so the launches queued behind it run back to
    back whatever the host's launch overhead (torch.cuda._sleep: a spin on the SM's cycle counter, no memory)."""

    cycles_per_ms: float | None = None  # measured on the first hold (_sleep counts SM cycles, not time)

    @staticmethod
    def mark():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def sync():
        torch.cuda.synchronize()

    @staticmethod
    def ms(start, end) -> float:
        return start.elapsed_time(end)

    @staticmethod
    def host_ms() -> float:
        return time.perf_counter() * 1e3

    @classmethod
    def hold(cls, ms: float) -> None:
        if cls.cycles_per_ms is None:
            cycles = 1_000_000
            start = cls.mark()
            torch.cuda._sleep(cycles)
            end = cls.mark()
            cls.sync()
            # measured at whatever clock the GPU runs now; if it later runs faster a hold is shorter than asked:
            # hence the margin in _hold_ms
            cls.cycles_per_ms = cycles / max(cls.ms(start, end), 1e-3)
        torch.cuda._sleep(max(1, int(ms * cls.cycles_per_ms)))


# How pick_config times its candidates: PICK_ROUNDS interleaved rounds; in each, every candidate runs a block of
# back-to-back launches lasting about PICK_BLOCK_MS (at most PICK_MAX_REPS launches); a candidate's time is the
# median over the rounds of its block's ms per launch. Before each block the GPU is held busy (clock.hold) for
# longer than the host takes to queue the block, so the block measures the GPU's time, not the host's.
PICK_ROUNDS = 5
PICK_BLOCK_MS = 0.25
PICK_MAX_REPS = 64
PICK_HOLD_MAX_MS = 5.0  # a block's hold at most (a host slower than this per block is measured as it is)


def _hold_ms(reps: int, host_ms: float) -> float:
    """The hold before a block of `reps` launches whose host side took host_ms each: twice the queueing time, plus
    0.05 ms (the marks), capped at PICK_HOLD_MAX_MS."""
    return min(PICK_HOLD_MAX_MS, 2.0 * reps * host_ms + 0.05)


def _time_candidates(candidates, launch, clock=_CudaClock) -> list:
    """ms per launch of each candidate (the exception's type name for one that does not launch), in order.

    One launch each first (compile, warm-up), then one timed launch each to size its block (and the host's time
    to queue one launch), then PICK_ROUNDS rounds over all candidates, the order rotated by one every round, each
    block behind a hold (clock.hold) that outlasts its queueing. Interleaving gives every candidate the same share
    of the GPU's clock ramp after the compiles and of any drift, which timing the candidates one after the other
    did not (the first ones timed ran at lower clocks); a block of launches instead of one keeps a 50 us kernel's
    time well above the events' resolution and launch jitter (seven single launches let the same six rms_norm
    candidates measure 0.056-0.083 ms in one run and 0.080-0.096 ms in another, with different winners). The hold:
    without it a block whose launches cost the host more than the GPU (rms_norm's "rowpair" backward: a zeroed
    buffer, two launches) measured the host, and differently in each process: at Qwen3-1.7B's 2048 x 16384 on the
    H200 rowpair timed 0.056 ms in one process and 0.080-0.134 in another, where the whole op ranked it fastest, so
    one process ran the op 13% slower. No allocation (the timing buffers of triton.testing.do_bench showed up as
    the op's first-call memory)."""
    out: list = [None] * len(candidates)
    live = []
    for i, cfg in enumerate(candidates):
        try:
            launch(cfg)
            clock.hold(0.25)  # the estimate below times the GPU, not the host's queueing of the launch
            host0 = clock.host_ms()
            start = clock.mark()
            launch(cfg)
            end = clock.mark()
            host = clock.host_ms() - host0
        except Exception as e:  # a config that does not fit this GPU (registers / shared memory): skip it
            out[i] = type(e).__name__
            continue
        live.append((i, cfg, start, end, host))
    clock.sync()
    # launches per block: enough for about PICK_BLOCK_MS at the estimated time of one
    live = [(i, cfg, min(PICK_MAX_REPS, max(1, math.ceil(PICK_BLOCK_MS / max(clock.ms(start, end), 1e-4)))), host)
            for i, cfg, start, end, host in live]
    marks = []
    for r in range(PICK_ROUNDS):
        for j in range(len(live)):
            i, cfg, reps, host = live[(j + r) % len(live)]
            clock.hold(_hold_ms(reps, host))
            start = clock.mark()
            for _ in range(reps):
                launch(cfg)
            marks.append((i, reps, start, clock.mark()))
    clock.sync()
    samples: dict[int, list[float]] = {i: [] for i, _, _, _ in live}
    for i, reps, start, end in marks:
        samples[i].append(clock.ms(start, end) / reps)
    for i, times in samples.items():
        times.sort()
        out[i] = times[len(times) // 2]
    return out


# Chosen configs, keyed by (kernel family, row width, dtype, ...): filled once per key on the GPU.
_PICKED: dict = {}


ROWS_BUCKET_CAP = 1 << 14  # past this many rows the persistent grids are full: one pick serves all


def rows_bucket(rows: int) -> int:
    """The row count's bucket in a pick's key: the next power of two, capped at ROWS_BUCKET_CAP."""
    return min(1 << max(rows - 1, 0).bit_length(), ROWS_BUCKET_CAP)


# A pick's memory tie-break (pick_config's `memory`): candidates timed within this fraction of the fastest count as
# level, and the one that allocates least among them is kept. Not only the rounds' run-to-run spread (about 0.5% a
# candidate between two picks on one H100): a policy too, that up to 3% of a norm's backward buys the half-size
# fp32 partial buffer. At Qwen3-14B's 5120 features x 12289 rows on an H100 the "rowpair" backward (129 partial rows,
# 2.5 MiB) timed 1.9% and 2.2% over the 257-row plain one (5.0 MiB) in two picks: at 2% the second pick kept the
# plain one and the op held 2.4 MiB more than quack's (which keeps one row an SM).
PICK_MEMORY_TIE = 0.03


def pick_among(candidates, timed, memory=None):
    """The pick from candidates' timings (ms, or an exception's name for one that did not launch): the fastest;
    with `memory` (config -> bytes the launch allocates) the least-allocating of those within PICK_MEMORY_TIE of the
    fastest (ties in bytes: the faster). candidates[0] when none launched."""
    ok = [(ms, i) for i, ms in enumerate(timed) if isinstance(ms, float)]
    if not ok:
        return candidates[0]
    best_ms, best = min(ok)
    if memory is None:
        return candidates[best]
    level = [(memory(candidates[i]), ms, i) for ms, i in ok if ms <= best_ms * (1 + PICK_MEMORY_TIE)]
    return candidates[min(level)[2]]


def pick_config(key, candidates, launch, device: torch.device, rows: int | None = None, memory=None):
    """The fastest of `candidates` for `key`, timed once on the GPU (later calls hit a cache).

    candidates: a non-empty list of launch configs; candidates[0] is the default, used without timing
    under the interpreter, on CPU, during CUDA-graph capture or torch.compile tracing, or when only
    one candidate is given. launch(config) must run the kernel on scratch or idempotent arguments
    (each candidate runs a few dozen times). Timing: _time_candidates (CUDA events, interleaved rounds of
    launch blocks, median per candidate; no allocation: triton.testing.do_bench allocated a 256 MB L2-flush
    buffer, which showed up as extra peak memory of the op's first call).
    rows: the call's row count; its bucket (rows_bucket) joins the key, so a pick made on a few rows (a
    check on a slice, a short first batch) is not reused for many: hearth's softmax picked on 64 rows of
    width 262144 ran 4096 rows at 3.06 ms against 1.59 ms with the pick made at 4096 (H200).
    memory: config -> bytes its launch allocates (e.g. a partial-sum buffer sized by the grid): among the
    candidates within PICK_MEMORY_TIE of the fastest, the least-allocating is kept (pick_among).
    Shared by hearth's row kernels (softmax, cross_entropy, rms_norm, rope, swiglu). With the
    environment variable HEARTH_PICK_LOG set, each pick is printed to stderr (key, ms per candidate).
    """
    # the candidate list is part of the key: a cached pick is always one of the candidates passed now
    # (the same width can meet different lists, e.g. when tests lower ONEPASS_MAX_COLS / WIDE_CHUNK)
    key = (key, tuple(candidates)) if rows is None else (key, tuple(candidates), rows_bucket(rows))
    if key in _PICKED:
        return _PICKED[key]
    if (len(candidates) == 1 or device.type != "cuda" or interpret_mode()
            or torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling()):
        return candidates[0]
    timed = _time_candidates(candidates, launch)
    timings = [(cfg, round(ms, 4) if isinstance(ms, float) else ms) for cfg, ms in zip(candidates, timed)]
    best = pick_among(candidates, timed, memory)
    _PICKED[key] = best
    if os.environ.get("HEARTH_PICK_LOG"):
        print(f"hearth pick_config {key}: {best} of {timings}", file=sys.stderr, flush=True)
    return best


# ---------------------------------------------------------------------------------------- inspection
# `hearth inspect` (a layer above the kernels) reads the kernels an op launches with this; an op's own
# inspect_kernels (hearth.kernels.linear_cross_entropy) uses it too, so it lives here, below both.
def capture_launched_kernels(run, *, label: str) -> list[tuple[str, object]]:
    """Call `run()` and return [(label, CompiledKernel)] for every distinct Triton kernel it launched
    (autotuned kernels: each benchmarked config appears once)."""
    from triton.runtime.jit import JITFunction

    seen: dict[int, tuple[str, object]] = {}
    original = JITFunction.run

    def recording(self, *args, **kwargs):
        kernel = original(self, *args, **kwargs)
        if kernel is not None and hasattr(kernel, "asm"):
            seen.setdefault(id(kernel), (f"{label}: {kernel.metadata.name}", kernel))
        return kernel

    JITFunction.run = recording
    try:
        run()
    finally:
        JITFunction.run = original
    return list(seen.values())
