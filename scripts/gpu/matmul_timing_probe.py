"""H200 probe: why hearth's matmul reads slower under the harness's GPU timing than back to back at some shapes.

    python scripts/gpu/matmul_timing_probe.py --out $OUT/mm_timing.jsonl [--reps 40]

The model-shape suite timed hearth's matmul at Llama-3.1-70B up_proj (4096x8192 @ 8192x28672) at 2.78 ms GPU time
(p20 2.38, p80 2.94) but 2.41 ms a call back to back, where cuBLAS read 2.35 / 2.38; and the headline's 0.996x
cuBLAS at 8192^3 read 0.83x in a later run. This probe times, per shape, hearth's matmul at the autotuner's pick,
at each of its TMA configs forced (the launch plan's cached choice replaced), and cuBLAS (torch.mm), four ways,
every call's CUDA-event time kept:
  iso     the harness's way: the 256 MiB L2-flush buffer rewritten, a device sleep queued, then the call (the host
          queues ahead, no synchronisation between calls)
  noflush the same without the flush
  drained the flush, a synchronize, then the sleep and the call (nothing else queued)
  b2b     the calls back to back, no flush, no sleep
and prints median / p20 / p80 / min / max ms a way, the autotuner's pick and its own timings of every config.
One JSON object per line (shape, provider, config, way, ms list summary).

    python scripts/gpu/matmul_timing_probe.py --out $OUT/mm_sustain.jsonl --sustain 3

instead runs each provider back to back for that many seconds at the first shape while `nvidia-smi` samples the SM
clock and the board power every 100 ms: ms a call and the mean clock / power, per second of load (whether the
back-to-back slowdown is the power limit's clock drop).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import time

import torch

SHAPES = [  # (label, M, K, N)
    ("Llama-3.1-70B up_proj", 4096, 8192, 28672),
    ("8192^3", 8192, 8192, 8192),
    ("Qwen3-32B down_proj", 4096, 25600, 5120),
    ("Llama-3.1-8B down_proj", 16384, 14336, 4096),
]
WAYS = ("iso", "noflush", "drained", "b2b")


def _summary(ms: list[float]) -> dict:
    s = sorted(ms)
    q = lambda p: s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]  # noqa: E731
    return dict(median=statistics.median(s), p20=q(0.2), p80=q(0.8), min=s[0], max=s[-1], n=len(s))


def _time(fn, way: str, reps: int, flush: torch.Tensor, cycles: int) -> list[float]:
    """CUDA-event ms of each of `reps` calls of fn, timed `way` (module docstring)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if way in ("iso", "drained"):
            flush.zero_()
        if way == "drained":
            torch.cuda.synchronize()
        if way != "b2b":
            torch.cuda._sleep(cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _sustain(mm, seconds: float, emit) -> None:
    """--sustain: each provider back to back for `seconds` at SHAPES[0], nvidia-smi sampling alongside."""
    label, M, K, N = SHAPES[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = (torch.randn(K, N, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    mm.matmul(a, b)  # autotune first
    for name, fn in (("cublas", lambda: torch.mm(a, b)), ("hearth", lambda: mm.matmul(a, b)),
                     ("cublas", lambda: torch.mm(a, b)), ("hearth", lambda: mm.matmul(a, b))):
        torch.cuda.synchronize()
        time.sleep(2.0)  # the board back near idle power between providers
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=subprocess.PIPE, text=True)
        t0 = time.perf_counter()
        per_s = []
        while time.perf_counter() - t0 < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            n = 0
            s0 = time.perf_counter()
            while time.perf_counter() - s0 < 1.0:
                fn()
                n += 1
                if n % 50 == 0:
                    end.record()
                    end.synchronize()  # keep the queue short: the host waits, the GPU does not idle long
            end.record()
            torch.cuda.synchronize()
            per_s.append(round(start.elapsed_time(end) / n, 4))
        smi.terminate()
        samples = [line.split(",") for line in smi.communicate()[0].splitlines() if line.count(",") == 1]
        clocks = [float(c) for c, _ in samples]
        power = [float(p) for _, p in samples]
        emit(dict(shape=label, provider=name, way=f"sustained {seconds:g} s", ms_per_call_each_second=per_s,
                  sm_clock_mhz_mean=statistics.mean(clocks) if clocks else None,
                  sm_clock_mhz_min=min(clocks) if clocks else None,
                  power_w_mean=statistics.mean(power) if power else None, samples=len(samples)))


def main() -> None:
    mm = importlib.import_module("hearth.kernels.matmul")  # the package exports the function under that name

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--sustain", type=float, default=0.0, help="seconds of back-to-back load a provider (the mode "
                    "above); 0: the four timing ways")
    args = ap.parse_args()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    cycles = 2_000_000 * 2  # a 2 ms device sleep: longer than any of these calls takes to queue
    with open(args.out, "w") as f:
        def emit(row):
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")

        if args.sustain > 0:
            _sustain(mm, args.sustain, emit)
            return
        for label, M, K, N in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            b = (torch.randn(K, N, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
            out = mm.matmul(a, b)  # the autotuner picks here
            tuner = mm.LAST_TUNER
            pick = str(tuner.best_config) if tuner is not None else None
            timings = {str(c): t for c, t in (getattr(tuner, "configs_timings", None) or {}).items()}
            ref = torch.mm(a, b)
            err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            emit(dict(shape=label, M=M, K=K, N=N, backend=mm.LAST_BACKEND, pick=pick, autotune_ms=timings,
                      rel_err_vs_cublas=err))
            runs = [("cublas", None, lambda: torch.mm(a, b)), ("hearth", "pick", lambda: mm.matmul(a, b))]
            plan = mm._tma_plan(a, b, out)
            key = (False, mm._precision(a.dtype), True)
            orig = plan.fixed.get(key) if plan is not None else None
            for way in WAYS:
                for name, cfg, fn in runs:
                    emit(dict(shape=label, provider=name, config=cfg, way=way,
                              **_summary(_time(fn, way, args.reps, flush, cycles))))
            if orig is None:
                continue
            for cfg in mm._TMA_HOST_CONFIGS:  # each config forced through the plan's cached choice
                meta = dict(A_T=plan.a_t, B_T=plan.b_t, NUM_SMS=plan.sms, PRECISION=key[1], UPCAST=False)
                kw = {**meta, **cfg.all_kwargs()}
                blocks = mm._block_shapes(plan.a_t, plan.b_t, kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"],
                                          kw["EPILOGUE_SPLIT"])
                plan.fixed[key] = (mm._matmul_tma_kernel, plan.grid(kw), kw, blocks, None, None)
                try:
                    forced = mm.matmul(a, b)
                    err = float((forced.float() - ref.float()).abs().max() / ref.float().abs().max())
                    for way in ("iso", "b2b"):
                        emit(dict(shape=label, provider="hearth", config=str(cfg), way=way, rel_err_vs_cublas=err,
                                  **_summary(_time(lambda: mm.matmul(a, b), way, args.reps, flush, cycles))))
                except Exception as e:  # a config this shape cannot take: say so, go on
                    emit(dict(shape=label, provider="hearth", config=str(cfg), status=f"error: {e!r}"[:300]))
            plan.fixed[key] = orig
            a = b = out = ref = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
