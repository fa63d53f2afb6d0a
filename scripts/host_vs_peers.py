"""Host cost of one fwd+bwd call through autograd: hearth against Liger-Kernel and eager PyTorch, on the CPU.

What is timed: `y = op(inputs); y.backward(dy)` with the inputs' .grad reset to None first, as a training step
calls a fused op. It runs with TRITON_INTERPRET=1 and every Triton launch STUBBED (hearth's and Liger's alike:
the kernel body does not run), so the figure is what each implementation costs the host around its launches:
argument checks, the autograd.Function, config lookup, allocations, the torch ops it issues, autograd's own work.
Eager PyTorch runs its real CPU kernels on tiny tensors, so its figure is a floor of dispatch and autograd cost,
not a peer's launch path. Tensors are tiny (a few KiB) so that no real compute hides the host work.

The providers interleave in rounds (hearth, liger, torch, hearth, ...) so that a busy machine's drift falls on all
of them alike; per provider the minimum (the least disturbed call: the figure before/after comparisons can rest on)
and the median of all its samples, in microseconds.

    python scripts/host_vs_peers.py                                 # every op, rich table
    python scripts/host_vs_peers.py --ops softmax,swiglu --reps 300 --rounds 3 --jsonl out.jsonl

This is the CPU-side check of issue 17's host goal (hearth's host cost a call <= Liger's); the H200 figure of
record is the harness's wall/call column (`hearth bench ... --sizes models`), whose host varies between processes.
JSONL: one object per (op, provider): op, provider, min_us, median_us, samples.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

OPS = ("softmax", "rms_norm", "layer_norm", "swiglu", "rope", "cross_entropy", "swiglu_mlp", "linear_cross_entropy")
PROVIDERS = ("hearth", "liger", "torch")


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="all", help="comma-separated ops, or 'all' (default)")
    p.add_argument("--reps", type=int, default=200, help="timed calls per provider per round (default 200)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per provider first")
    p.add_argument("--jsonl", default=None, help="also write one JSON object per (op, provider) here")
    args = p.parse_args(argv)
    ops = OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"--ops: unknown op(s) {bad}; choose from {', '.join(OPS)}")
    if args.reps < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--reps and --rounds must be >= 1 and --warmup >= 0")
    args.ops = ops
    return args


def _stub_launches() -> None:
    """Every interpreted Triton launch returns at once, as in host_overhead.py's CPU mode (its answer_read_outputs
    fills the outputs the host reads: cross_entropy's target check)."""
    from triton.runtime.interpreter import InterpretedFunction

    from host_overhead import answer_read_outputs  # this script's folder is on sys.path when it runs

    def stub(self, *a, **k):
        answer_read_outputs(self, a)

    InterpretedFunction.run = stub


def _cases(op: str) -> dict:
    """provider -> (leaves, step) for `op`; step() runs one fwd+bwd. Liger is left out where it does not import."""
    import torch
    import torch.nn.functional as F

    import hearth.kernels as hk
    from hearth.kernels.swiglu import swiglu_mlp  # not exported by the package

    g = torch.Generator().manual_seed(0)

    def rnd(*shape, grad=False):
        t = torch.randn(*shape, generator=g)
        return t.requires_grad_() if grad else t

    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:  # pragma: no cover - pinned in requirements-ci.txt
        lf = None
    out: dict = {}
    if op in ("softmax", "rms_norm", "layer_norm", "swiglu"):
        x, w, b = rnd(64, 256, grad=True), (1 + 0.1 * rnd(256)).requires_grad_(), rnd(256, grad=True)
        u, dy = rnd(64, 256, grad=True), rnd(64, 256)
        fns = {
            "softmax": ([x], lambda: hk.softmax(x), lf and (lambda: lf.liger_softmax(x)), lambda: torch.softmax(x, -1)),
            "rms_norm": ([x, w], lambda: hk.rms_norm(x, w, 1e-6), lf and (lambda: lf.liger_rms_norm(x, w, 1e-6)),
                         lambda: F.rms_norm(x, (256,), w, 1e-6)),
            "layer_norm": ([x, w, b], lambda: hk.layer_norm(x, w, b, 1e-5),
                           lf and (lambda: lf.liger_layer_norm(x, w, b, 1e-5)),
                           lambda: F.layer_norm(x, (256,), w, b, 1e-5)),
            "swiglu": ([x, u], lambda: hk.swiglu(x, u), lf and (lambda: lf.liger_swiglu(x, u)),
                       lambda: F.silu(x) * u),
        }
        leaves, h, li, t = fns[op]
        for name, fn in (("hearth", h), ("liger", li), ("torch", t)):
            if fn is not None:
                out[name] = (leaves, lambda fn=fn: fn().backward(dy))
        return out
    if op == "rope":  # q [B, Hq, T, D], k [B, Hk, T, D], cos / sin [B, T, D] (transformers' layout)
        q, k = rnd(2, 4, 16, 64, grad=True), rnd(2, 2, 16, 64, grad=True)
        cos, sin = rnd(2, 16, 64), rnd(2, 16, 64)
        dq, dk = rnd(2, 4, 16, 64), rnd(2, 2, 16, 64)

        def torch_rope(t):
            half = t.shape[-1] // 2
            rot = torch.cat((-t[..., half:], t[..., :half]), -1)
            return t * cos[:, None] + rot * sin[:, None]

        def backward(pair):
            torch.autograd.backward(pair, (dq, dk))
        out["hearth"] = ([q, k], lambda: backward(hk.rope(q, k, cos, sin)))
        if lf is not None:
            out["liger"] = ([q, k], lambda: backward(lf.liger_rope(q, k, cos, sin)))
        out["torch"] = ([q, k], lambda: backward((torch_rope(q), torch_rope(k))))
        return out
    if op == "swiglu_mlp":  # x [32, 64], nn.Linear weights gate / up [128, 64], down [64, 128]; Liger's MLP module
        # is three F.linear around its liger_swiglu (LigerSwiGLUMLP.forward), written out here without the module
        x, dy = rnd(32, 64, grad=True), rnd(32, 64)
        wg, wu, wd = (0.1 * rnd(128, 64)).requires_grad_(), (0.1 * rnd(128, 64)).requires_grad_(), \
            (0.1 * rnd(64, 128)).requires_grad_()
        leaves = [x, wg, wu, wd]
        out["hearth"] = (leaves, lambda: swiglu_mlp(x, wg, wu, wd).backward(dy))
        if lf is not None:
            out["liger"] = (leaves, lambda: F.linear(lf.liger_swiglu(F.linear(x, wg), F.linear(x, wu)), wd).backward(dy))
        out["torch"] = (leaves, lambda: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd).backward(dy))
        return out
    if op == "linear_cross_entropy":  # hidden [64, 64], lm_head [256, 64] (trainable), mean loss
        x, w = rnd(64, 64, grad=True), (0.1 * rnd(256, 64)).requires_grad_()
        target = torch.randint(0, 256, (64,), generator=g)
        out["hearth"] = ([x, w], lambda: hk.linear_cross_entropy(x, w, target).backward())
        if lf is not None:
            out["liger"] = ([x, w], lambda: lf.liger_fused_linear_cross_entropy(x, w, target).backward())
        out["torch"] = ([x, w], lambda: F.cross_entropy(F.linear(x, w), target).backward())
        return out
    # cross_entropy: hearth writes the gradient over its logits, so every provider gets a fresh copy (the same cost)
    logits, target = rnd(64, 512, grad=True), torch.randint(0, 512, (64,), generator=g)
    out["hearth"] = ([logits], lambda: hk.cross_entropy(logits.clone(), target).backward())
    if lf is not None:
        out["liger"] = ([logits], lambda: lf.liger_cross_entropy(logits.clone(), target).backward())
    out["torch"] = ([logits], lambda: F.cross_entropy(logits.clone(), target).backward())
    return out


def _call(leaves, step):
    for t in leaves:
        t.grad = None
    step()


def measure(op: str, reps: int, rounds: int, warmup: int) -> dict:
    """provider -> list of per-call microseconds, interleaved by round."""
    cases = _cases(op)
    samples: dict = {name: [] for name in cases}
    for name, (leaves, step) in cases.items():
        for _ in range(warmup):
            _call(leaves, step)
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (leaves, step) in cases.items():
                for _ in range(reps):
                    t0 = time.perf_counter()
                    _call(leaves, step)
                    samples[name].append((time.perf_counter() - t0) * 1e6)
    finally:
        gc.enable()
    return samples


def main(argv=None) -> int:
    args = _parse(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    import importlib

    import torch

    importlib.import_module("hearth.kernels")  # patches the interpreter's range before any launch
    _stub_launches()
    torch.set_num_threads(1)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="host us per fwd+bwd call through autograd (CPU, interpreter, launches stubbed)")
    for col in ("op", *(f"{p} min" for p in PROVIDERS), *(f"{p} median" for p in PROVIDERS), "hearth / liger (min)"):
        table.add_column(col)
    rows = []
    for op in args.ops:
        samples = measure(op, args.reps, args.rounds, args.warmup)
        stats = {p: (min(v), statistics.median(v)) for p, v in samples.items()}
        for p, (lo, med) in stats.items():
            rows.append({"op": op, "provider": p, "min_us": round(lo, 2), "median_us": round(med, 2),
                         "samples": len(samples[p])})
        cell = lambda p, i: f"{stats[p][i]:.1f}" if p in stats else "-"  # noqa: E731
        ratio = f"{stats['hearth'][0] / stats['liger'][0]:.2f}" if "liger" in stats else "-"
        table.add_row(op, *(cell(p, 0) for p in PROVIDERS), *(cell(p, 1) for p in PROVIDERS), ratio)
    Console(width=160).print(table)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
