"""Time, peak memory and speed-of-light limits, all measured in the run that reports them.

Timing (CUDA): CUDA events around each call, after a warm-up of at least 3 calls and 25 ms;
between timed calls the 256 MiB L2-flush buffer is rewritten and gradients are reset to None
(both outside the events). Before each timed call a device-side sleep (torch.cuda._sleep) is queued
ahead of the start event, so the host has queued the whole call (autograd included) before the GPU
reaches it: the events then time the GPU work, not Python launch gaps. Without it, a 0.3 ms fwd+bwd
measured ~0.5 ms on an H200 for every provider alike (host-bound). The sleep is sized per case from
the host time of the warm-up calls (sleep_ms: 1.5x their median after the first, plus 0.2 ms; at least
1 ms, at most 50): a fixed 1 ms was shorter than some calls take to queue (hearth's swiglu_mlp at the
Qwen3-14B shape: 1.9 ms of host time a call on the H200), whose GPU time could then include waits for
the host. Since 2026-12-04 the sleep is also at least one call's own time (the warm-up calls' median, host and GPU,
to the synchronize): under a short sleep a compute-bound call ran at a varying duty cycle, so the board's power limit
moved the SM clock between calls and providers (hearth's matmul at Llama-3.1-70B up_proj: p20 2.38 / p80 2.94 ms
with a 1 ms sleep; 2.40 / 2.41 with 2 ms, as cuBLAS; both 2.89 ms a call under seconds of back-to-back load at
~1470 MHz, BENCHMARKS.md). At a duty cycle of at most one half the calls run at the full clock: GPU time is the
kernel's at full clock, the same condition for every provider; wall time is the sustained figure. Rows carry it
as sleep_ms. The bwd mode runs its forward there too, outside the events, and
times the backward alone (no retain_graph: fused losses need not support a second backward).
Reported: median, p20 and p80 in ms over >= 10 calls (about 100 ms of calls, at most 500). On the CPU (--check, the
interpreter: a test of the harness's paths, not a measurement) a host clock times one call.

Memory (CUDA): gradients reset to None, then allocated-before = torch.cuda.memory_allocated(),
torch.cuda.reset_peak_memory_stats(), one call, synchronize; extra = max_memory_allocated() -
allocated-before. Inputs and earlier gradients are thus excluded; whatever the call allocates and
keeps (outputs, new gradients) or frees (activations, workspaces) counts at its peak.
grad_bytes = the gradients the call left on the leaves; activation = extra - grad_bytes.

Wall time per call (time_wall, every fwd / full case): the same call back to back, no device
sleep and no L2 flush, gradients reset to None between calls as a training loop's zero_grad
does: synchronize, n calls, synchronize; wall = elapsed / n, the median of 5 such blocks (one before
2026-12-04). This is what a training step with
a short GPU queue sees: a call whose host work (Python, autograd, the torch.library dispatch,
argument checks, config lookup, launches) outlasts its GPU work costs its host time, not its GPU
time. host = the time the host spent inside the calls themselves (launch cost while the queue
does not block). Both in ms.

Limits: device copy bandwidth from a ~4 GiB device-to-device copy (read + write counted) and
cuBLAS bf16 TFLOP/s at 8192^3 (smaller stand-ins on the CPU, marked as such).
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass


# The timing procedure rows are measured with, written into every row's env ("timing"): a peer row is ranked against
# hearth's only when both name the same one (report.timing_method; rows from before it was written are placed by date).
# Change it whenever a change here can move a row's GPU or wall time.
TIMING_METHOD = "sleep >= one call, wall median of 5 blocks"

# device-sleep cycles per ms at the H200's ~1.98 GHz SM clock (a slower clock sleeps longer: still enough)
_SLEEP_CYCLES_PER_MS = 2_000_000
SLEEP_MIN_MS, SLEEP_MAX_MS = 1.0, 50.0


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    sleep_ms: float = 0.0  # the device sleep queued ahead of each timed call (0 on the CPU)


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of `xs` (q in [0, 1]); ValueError if empty."""
    if not xs:
        raise ValueError("xs must not be empty")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def sleep_ms(host_ms: list[float], call_ms: list[float] | None = None) -> float:
    """The device sleep ahead of each timed call, from the warm-up calls (the first, which pays compiles and config
    picks, left out): 1.5x the median host time (ms) plus 0.2 ms, so the host has queued the call before the GPU
    reaches it; and at least the median whole call (call_ms: host and GPU, to a synchronize), so the GPU idles at
    least as long as it works (its power limit then leaves the clock alone); within [SLEEP_MIN_MS, SLEEP_MAX_MS]."""
    warm = host_ms[1:] or host_ms
    need = 1.5 * statistics.median(warm) + 0.2 if warm else 0.0
    whole = (call_ms or [])[1:] or (call_ms or [])
    if whole:
        need = max(need, statistics.median(whole))
    return min(SLEEP_MAX_MS, max(SLEEP_MIN_MS, need))


def reset_grads(leaves) -> None:
    for t in leaves:
        if getattr(t, "grad", None) is not None:
            t.grad = None


def _prepare(leaves, setup):
    reset_grads(leaves)
    return (setup(),) if setup is not None else ()


def time_call(fn, leaves, device, *, setup=None, warmup_ms=25.0, rep_ms=100.0, min_reps=10, max_reps=500) -> Timing:
    """Median / p20 / p80 of `fn()` in ms; gradients on `leaves` reset before every call.

    setup: optional untimed callable run before every call; its result is passed to fn
    (the bwd mode runs the forward there and times fn(out) = the backward alone)."""
    import torch

    if device.type != "cuda":
        return _time_cpu(fn, leaves, setup)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    # warm-up, and a first estimate of one call
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n_warm, host, whole = 0, [], []
    while n_warm < 3 or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        args = _prepare(leaves, setup)
        h0 = time.perf_counter()
        fn(*args)
        host.append((time.perf_counter() - h0) * 1e3)  # the host's time to queue the call (GPU idle before it)
        del args
        torch.cuda.synchronize()
        whole.append((time.perf_counter() - h0) * 1e3)  # the call to its end on the GPU
        n_warm += 1
    est = (time.perf_counter() - t0) * 1e3 / n_warm
    sleep = sleep_ms(host, whole)
    cycles = int(_SLEEP_CYCLES_PER_MS * sleep)
    reps = int(min(max_reps, max(min_reps, rep_ms / max(est, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        args = _prepare(leaves, setup)
        flush.zero_()  # evict the inputs from L2 so every call reads them from memory
        torch.cuda._sleep(cycles)  # keep the GPU busy while the host queues the call
        starts[i].record()
        fn(*args)
        ends[i].record()
        del args
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    del flush
    return Timing(statistics.median(ms), quantile(ms, 0.2), quantile(ms, 0.8), reps, round(sleep, 3))


def time_wall(fn, leaves, device, *, setup=None, est_ms=None, target_ms=30.0, min_calls=5, max_calls=200,
              blocks=5) -> dict:
    """{"wall_ms", "host_ms", "wall_calls", "wall_blocks"} of `fn()` called back to back (module docstring).

    est_ms: an estimate of one call (the GPU median) to size the run to about target_ms in all;
    setup: as in time_call (run between the calls, inside the measured wall time).
    blocks: the run is split into this many blocks (each synchronize, n calls, synchronize) and the block of
    median wall time gives wall_ms and host_ms. One block, as before 2026-12-04, let a single host stall
    (another process, a page fault, a GC pass) raise a case's mean: the same rms_norm host path measured
    0.28 and 0.46 ms a call at two shapes of one run, where its GPU time is 0.06-0.2 ms."""
    import torch

    cuda = device.type == "cuda"
    blocks = max(1, int(blocks))
    est = est_ms if est_ms and est_ms > 0 else 1.0
    n = int(min(max_calls, max(min_calls, target_ms / blocks / est)))
    samples = []
    for _ in range(blocks):
        if cuda:
            torch.cuda.synchronize()
        host = 0.0
        t0 = time.perf_counter()
        for _ in range(n):
            args = _prepare(leaves, setup)
            h0 = time.perf_counter()
            fn(*args)
            host += time.perf_counter() - h0
            del args
        if cuda:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0, host))
    wall, host = sorted(samples)[len(samples) // 2]
    return {"wall_ms": wall * 1e3 / n, "host_ms": host * 1e3 / n, "wall_calls": n * blocks, "wall_blocks": blocks}


def _time_cpu(fn, leaves, setup=None, reps=1) -> Timing:
    # the correctness call before timing already paid the JIT, so no separate warm-up here
    ms = []
    for _ in range(reps):
        args = _prepare(leaves, setup)
        t0 = time.perf_counter()
        fn(*args)
        ms.append((time.perf_counter() - t0) * 1e3)
    return Timing(statistics.median(ms), quantile(ms, 0.2), quantile(ms, 0.8), reps)


def measure_memory(fn, leaves, device, setup=None) -> dict:
    """Peak extra memory of one call (see the module docstring); setup as in time_call, its
    result (the bwd mode's forward output) is allocated before and so not counted. CPU: None."""
    import torch

    if device.type != "cuda":
        return {"extra_mib": None, "grad_mib": None, "activation_mib": None}
    args = _prepare(leaves, setup)
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(*args)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated(device) - before
    grads = sum(t.grad.nbytes for t in leaves if getattr(t, "grad", None) is not None)
    del out, args
    reset_grads(leaves)
    mib = 2.0**20
    return {"extra_mib": extra / mib, "grad_mib": grads / mib, "activation_mib": max(0, extra - grads) / mib}


def measure_limits(device) -> dict:
    """Copy bandwidth (GB/s, read + write counted) and bf16 matmul TFLOP/s measured now."""
    import torch

    cuda = device.type == "cuda"
    copy_bytes = 4 * 2**30 if cuda else 64 * 2**20
    src = torch.randn(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), [], device)
    copy_gbps = 2 * copy_bytes / (t.median_ms * 1e-3) / 1e9
    del src, dst
    n = 8192 if cuda else 256
    mm_dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=mm_dtype)
    b = torch.randn(n, n, device=device, dtype=mm_dtype)
    t2 = time_call(lambda: a @ b, [], device)
    tflops = 2 * n**3 / (t2.median_ms * 1e-3) / 1e12
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    lib = "cuBLAS bf16" if cuda else "CPU fp32 (stand-in)"
    return {
        "copy_GBps": copy_gbps,
        "copy_what": f"device copy of {copy_bytes / 2**30:.2f} GiB, read+write counted",
        "matmul_TFLOPs": tflops,
        "matmul_what": f"{lib} matmul {n}^3",
    }


def throughput(work: float, ms: float, metric: str) -> float:
    """GB/s (work in bytes) or TFLOP/s (work in FLOPs) for one call of `ms` milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms must be > 0, got {ms}")
    scale = 1e9 if metric == "GB/s" else 1e12
    if metric not in ("GB/s", "TFLOP/s"):
        raise ValueError(f"metric must be GB/s or TFLOP/s, got {metric!r}")
    return work / (ms * 1e-3) / scale


def sol_percent(value: float, metric: str, limits: dict) -> float | None:
    """Percent of the speed-of-light limit measured in this run for `metric`."""
    limit = limits.get("copy_GBps") if metric == "GB/s" else limits.get("matmul_TFLOPs")
    return 100.0 * value / limit if limit else None
