"""How the fused MLPs' chunk size sets their speed and memory (swiglu_mlp and lora_swiglu_mlp, fwd+bwd).

    python3 scripts/gpu/mlp_chunk_probe.py --out DIR [--chunks 8,16,32,64,0] [--rules floor,balanced,waves2,waves4] [--reps 10]
    python3 scripts/gpu/mlp_chunk_probe.py --smoke --out /tmp/chunks       # toy dims (CPU: TRITON_INTERPRET=1)

Both nodes never hold h = silu(g) * u whole: the forward forms it one row chunk at a time (then down_proj's GEMM
on that chunk), the backward one column chunk of I at a time (dh, then the chunk's weight-gradient GEMMs), each
chunk about MLP_CHUNK_ELEMS elements of [rows, I]. Smaller chunks hold less and split the GEMMs into more, smaller
ones. Per case this times the forward + backward at each chunk size (--chunks, in Mi elements; 0 = one chunk, h
whole) under each rule for cutting the rows or columns (--rules): floor = the chunk rounded down to a multiple of
256 and the rest in a last, ragged chunk (_chunk's budget rule alone); balanced = the same number of chunks, cut
evenly (each rounded up to a multiple of 256); waves2 / waves4 = chunks large enough that each chunk's projection
GEMM fills at least 2 / 4 waves of 128x256 tiles on the GPU's SMs, cut evenly; shipped = _chunk as it is in the
tree, called with what the kernel passes it (on a GPU, its wave floor on the backward's weight-gradient columns)
(rule_fn). Eager PyTorch (F.linear, silu * u, F.linear, holding h) runs as
the reference for the same GEMMs unchunked. Median of --reps CUDA-event timings after two warm-up calls; extra
peak memory = peak allocated during the call minus allocated before it (weight / LoRA gradients pre-allocated, so
what is left is activations and temporaries). Cases: the issue's headline MLP (8192 x 4096 x 14336, weights
trainable), the model-shape suite's three, and the Qwen3-14B LoRA MLP (frozen bf16 base, rank-16 fp32 adapters,
compute="base", as hearth train runs it) at 4096 and 16384 tokens. Writes DIR/mlp_chunks.jsonl and prints a table.

--profile K: instead, one fwd+bwd of case K with hearth's own chunk rule and one of eager PyTorch under
torch.profiler, after the same warm-up: the GPU kernels of each by total time (DIR/mlp_profile_<K>.txt), to see
where the two differ.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

CASES = (  # name, tokens, hidden, intermediate, kind
    ("headline 8192 x 4096 x 14336", 8192, 4096, 14336, "full"),
    ("Qwen3-0.6B 16384 x 1024 x 3072", 16384, 1024, 3072, "full"),
    ("Qwen3-4B 12289 x 2560 x 9728", 12289, 2560, 9728, "full"),
    ("Qwen3-14B 4096 x 5120 x 17408", 4096, 5120, 17408, "full"),
    ("Qwen3-14B LoRA r16 4096 tokens", 4096, 5120, 17408, "lora"),
    ("Qwen3-14B LoRA r16 16384 tokens", 16384, 5120, 17408, "lora"),
)
SMOKE_CASES = (("smoke full", 37, 16, 40, "full"), ("smoke lora", 37, 16, 40, "lora"))


def rule_fn(rule: str, budget: int, hidden: int | None = None, sms: int = 132):
    """A stand-in for hearth.kernels.swiglu._chunk: (total, other[, hidden, sms]) -> rows (or columns) per chunk, for a
    budget of `budget` elements a chunk (0: everything in one chunk). "floor" is the budget rule alone (_chunk called
    with (total, other) only, run with MLP_CHUNK_ELEMS set to the budget); "balanced" cuts the same number of chunks
    evenly. "waves2" / "waves4": the floor's chunk, raised until each
    chunk's projection GEMM (the forward's down_proj [rows, H], the backward's weight gradients [H, cols]) has at
    least 2 / 4 waves of WAVE_TILE-element tiles on `sms` SMs, then cut evenly, needs `hidden`, the model's H (the
    probe's form: it also cuts evenly where the floor is already large enough; the tile is the kernel's WAVE_TILE).
    "shipped": _chunk itself with every argument the kernel passes (hidden and sms: its wave floor), with
    MLP_CHUNK_ELEMS set to the budget. Call it while the shipped _chunk is
    in place (main swaps the stand-in in afterwards)."""
    sw = importlib.import_module("hearth.kernels.swiglu")  # the package attribute `swiglu` is the function
    shipped = sw._chunk

    def with_budget(*args) -> int:
        saved, sw.MLP_CHUNK_ELEMS = sw.MLP_CHUNK_ELEMS, budget
        try:
            return shipped(*args)
        finally:
            sw.MLP_CHUNK_ELEMS = saved

    def floor(total: int, other: int, *_gpu) -> int:
        return with_budget(total, other)

    def balanced(total: int, other: int, *_gpu) -> int:
        size = floor(total, other)
        return sw.cut_evenly(total, size, size >= 256)

    def waves(total: int, other: int, count: int) -> int:
        if hidden is None:
            raise ValueError(f"rule {rule!r} needs hidden (the model's H)")
        size = max(floor(total, other), -(-count * sms * sw.WAVE_TILE // hidden))
        return max(1, total) if size >= total else sw.cut_evenly(total, size)

    if budget == 0:
        return lambda total, other, *_gpu: max(1, total)
    return {"floor": floor, "balanced": balanced, "waves2": lambda t, o, *_gpu: waves(t, o, 2),
            "waves4": lambda t, o, *_gpu: waves(t, o, 4), "shipped": with_budget}[rule]


def build(case, device, dtype):
    """(run, params_with_grads, x): run() does one forward + backward."""
    from hearth.kernels.lora import lora_swiglu_mlp
    from hearth.kernels.swiglu import swiglu_mlp

    _name, n, h, i, kind = case
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, scale=1.0, dt=dtype, grad=False):
        t = (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)
        return t.requires_grad_(grad)

    x = rnd(n, h, grad=True)
    dout = rnd(n, h)
    ws = [rnd(i, h, scale=h ** -0.5, grad=kind == "full"), rnd(i, h, scale=h ** -0.5, grad=kind == "full"),
          rnd(h, i, scale=i ** -0.5, grad=kind == "full")]
    if kind == "full":
        params = [x, *ws]

        def run():
            swiglu_mlp(x, *ws).backward(dout)

        def eager():
            F.linear(F.silu(F.linear(x, ws[0])) * F.linear(x, ws[1]), ws[2]).backward(dout)
    else:
        r = 4 if n < 256 else 16
        lora = [rnd(r, h, scale=h ** -0.5, dt=torch.float32, grad=True), rnd(i, r, scale=0.01, dt=torch.float32, grad=True),
                rnd(r, h, scale=h ** -0.5, dt=torch.float32, grad=True), rnd(i, r, scale=0.01, dt=torch.float32, grad=True),
                rnd(r, i, scale=i ** -0.5, dt=torch.float32, grad=True), rnd(h, r, scale=0.01, dt=torch.float32, grad=True)]
        params = [x, *lora]

        def run():
            lora_swiglu_mlp(x, *ws, *lora, 2.0, 2.0, 2.0, compute="base").backward(dout)

        def eager():
            ag, bg, au, bu, ad, bd = (t.to(dtype) for t in lora)
            gate = F.linear(x, ws[0]) + 2.0 * F.linear(F.linear(x, ag), bg)
            up = F.linear(x, ws[1]) + 2.0 * F.linear(F.linear(x, au), bu)
            hh = F.silu(gate) * up
            (F.linear(hh, ws[2]) + 2.0 * F.linear(F.linear(hh, ad), bd)).backward(dout)
    return run, eager, params


def measure(fn, params, reps: int, cuda: bool) -> dict:
    for p in params:
        p.grad = torch.zeros_like(p)
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else 0.0
    return {"ms": times[len(times) // 2], "ms_min": times[0], "extra_mib": round(extra, 1)}


def profile(case, device, dtype, cuda: bool, out: Path, k: int) -> int:
    """One profiled fwd+bwd of hearth's node and one of eager PyTorch at `case`; the kernel tables to out."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    run, eager, params = build(case, device, dtype)
    out.mkdir(parents=True, exist_ok=True)
    text = [f"{case[0]} ({case[4]}), {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}"]
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for name, fn in (("hearth", run), ("eager", eager)):
        measure(fn, params, 2, cuda)  # warm-up (compiles, cuBLAS heuristics) and grads allocated
        with torch_profile(activities=acts) as prof:
            fn()
            if cuda:
                torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=90)
        text += [f"\n== {name}", table]
    (out / f"mlp_profile_{k}.txt").write_text("\n".join(text))
    print("\n".join(text))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--chunks", default="8,16,32,64,0", help="Mi elements per chunk, comma list (0: one chunk)")
    p.add_argument("--rules", default="floor,balanced")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--cases", default=None, help="comma list of case indices (default all)")
    p.add_argument("--smoke", action="store_true", help="toy dims, chunks of a few hundred elements (fp32; the CPU or the GPU)")
    p.add_argument("--profile", type=int, default=None, help="K: profile case K (hearth and eager) instead")
    args = p.parse_args(argv)
    sw = importlib.import_module("hearth.kernels.swiglu")  # the package attribute `swiglu` is the function

    cuda = torch.cuda.is_available()  # --smoke on a GPU machine: toy dims on the GPU (no interpreter there)
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda and not args.smoke else torch.float32
    cases = SMOKE_CASES if args.smoke else CASES
    if args.cases:
        cases = [cases[int(k)] for k in args.cases.split(",")]
    if args.profile is not None:
        return profile(cases[args.profile], device, dtype, cuda, Path(args.out), args.profile)
    unit = 1 if args.smoke else 2**20
    chunks = [int(c) for c in args.chunks.split(",")]
    rules = args.rules.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    real = sw._chunk
    meta = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    try:
        for case in cases:
            run, eager, params = build(case, device, dtype)
            res = measure(eager, params, args.reps, cuda)
            rows.append({**meta, "case": case[0], "kind": case[4], "provider": "eager", "chunk_mi": None, "rule": None, **res})
            print(f"{case[0]:36s} eager                 {res['ms']:8.3f} ms  {res['extra_mib']:8.1f} MiB", flush=True)
            sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 132
            for c in chunks:
                for rule in rules if c else ["one"]:
                    sw._chunk = rule_fn(rule if c else "floor", c * unit, hidden=case[2], sms=sms)
                    res = measure(run, params, args.reps, cuda)
                    rows.append({**meta, "case": case[0], "kind": case[4], "provider": "hearth", "chunk_mi": c,
                                 "rule": rule, **res})
                    print(f"{case[0]:36s} {('chunk %d Mi' % c) if c else 'one chunk':12s} {rule:8s} {res['ms']:8.3f} ms  "
                          f"{res['extra_mib']:8.1f} MiB", flush=True)
                    sw._chunk = real
            del run, eager, params
            if cuda:
                torch.cuda.empty_cache()
    finally:
        sw._chunk = real
    with open(out / "mlp_chunks.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
