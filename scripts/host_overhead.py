"""Host (CPU-side) cost of each hearth kernel op per call, forward and backward, broken down.

What is timed (median of --reps calls, after --warmup, gc off; each call starts with the GPU idle:
torch.cuda.synchronize() before it, outside the timed region, so the figure is host time, not queueing):
  fwd       the public function (hearth.kernels.<op>) with inputs that require grad
  bwd       loss.backward() through the op's graph (the autograd engine's own cost included; the
            inputs' .grad is None before each call, as after zero_grad(set_to_none=True))
  impl      the op's launcher called directly (no checks, no dispatch, no autograd), fwd and bwd
and, inside those, the time spent in (inclusive, attributed to the outermost timed helper):
  checks    check_tensor / check_same_device / check_same_dtype / check_loss_options / the target check
  config    pick_config, _config, candidates, persistent grids (the launch-config lookup)
  device    num_sms (device property queries)
  alloc     torch.empty / empty_like / zeros / zeros_like / ones / Tensor.new_empty / new_zeros
  launch    the Triton launch (JITFunction.run / Autotuner.run); on the CPU it is stubbed, so 0
  dispatch  fwd - checks - impl(fwd), bwd - impl(bwd): the custom-op dispatcher or autograd.Function,
            setup_context / save_for_backward, the autograd engine (bwd), the public function's glue
  other     impl - config - device - alloc - launch: reshape / contiguous / strides / grid math
Helpers are timed by wrapping them; each wrapper's own cost (calibrated on a no-op) is subtracted.

Modes:
  CPU (no CUDA, the default there): TRITON_INTERPRET=1 so that CPU tensors pass the checks, and the
  interpreter's kernel run is REPLACED by a stub that only counts launches: everything the op does on
  the host except the launch itself is timed (tensors are tiny so that the few torch ops on the path,
  e.g. rms_norm's partial-dw sum, cost what they cost on a GPU: a launch each, not a CPU loop).
  The CPU run uses one intra-op thread (torch.set_num_threads(1)).
  CUDA: the real thing, kernels included (tiny shapes: the host is the bottleneck, as in a training
  loop with a short GPU queue); launch = Triton's Python launch path.

    python scripts/host_overhead.py                        # every op, rich table
    python scripts/host_overhead.py --ops rms_norm,rope --reps 300 --jsonl out.jsonl

--stat min takes the least disturbed of the --reps calls instead of the median (everywhere: totals and
breakdown): on a busy shared CPU box, whose load swings the medians by 2x between runs, the minimum is
the figure that before/after comparisons can rest on.

JSONL: one object per (op, direction): op, direction, device, stat, us, and the breakdown in us.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

OPS = ("softmax", "cross_entropy", "linear_cross_entropy", "rms_norm", "layer_norm", "rope", "swiglu",
       "swiglu_mlp", "attention", "matmul", "lora_linear", "lora_swiglu_mlp")
BUCKETS = ("checks", "config", "device", "alloc", "launch")
LEAVES: list = []  # every input that requires grad: .grad is reset to None before each timed backward
STAT = statistics.median  # --stat: the figure taken over the --reps samples


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="all", help="comma-separated ops, or 'all' (default)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda: real launches; cpu: interpreter mode, launches stubbed (default: cuda if available)")
    p.add_argument("--reps", type=int, default=200, help="timed calls per figure (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (compiles, config picks)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="input dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--jsonl", default=None, help="also write one JSON object per (op, direction) here")
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="median of the --reps samples (default), or min: the least disturbed call, for before/after "
                        "comparisons on a busy shared machine whose load swings the median")
    args = p.parse_args(argv)
    ops = OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"--ops: unknown op(s) {bad}; choose from {', '.join(OPS)}")
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    args.ops = ops
    return args


# ------------------------------------------------------------------------------------------ timers
class Timers:
    """Inclusive time of wrapped helpers per bucket; only the outermost wrapped call counts."""

    def __init__(self):
        self.depth = 0
        self.ns = dict.fromkeys(BUCKETS, 0)
        self.calls = dict.fromkeys(BUCKETS, 0)
        self.on = False

    def reset(self):
        self.ns = dict.fromkeys(BUCKETS, 0)
        self.calls = dict.fromkeys(BUCKETS, 0)

    def wrap(self, fn, bucket):
        timers = self

        def wrapped(*args, **kwargs):
            if not timers.on or timers.depth:
                return fn(*args, **kwargs)
            timers.depth += 1
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                timers.ns[bucket] += time.perf_counter_ns() - t0
                timers.calls[bucket] += 1
                timers.depth -= 1

        wrapped.__wrapped__ = fn
        return wrapped


def _install(timers, torch, modules, cuda: bool):
    """Wrap the helpers named in the docstring; returns the launch counter (a one-element list)."""
    import triton

    names = {
        "checks": ("check_tensor", "check_same_device", "check_same_dtype", "check_loss_options", "_check_targets"),
        "config": ("pick_config", "_config", "_pick_rows_config", "persistent_grid", "_bwd_candidates",
                   "_candidates", "_onepass_candidates", "_wide_candidates", "_wide_programs", "_grid_rows", "_chunk"),
        "device": ("num_sms",),
    }
    for mod in modules:
        for bucket, attrs in names.items():
            for attr in attrs:
                fn = getattr(mod, attr, None)
                if callable(fn) and not hasattr(fn, "__wrapped__"):
                    setattr(mod, attr, timers.wrap(fn, bucket))
    for attr in ("empty", "empty_like", "zeros", "zeros_like", "ones"):
        setattr(torch, attr, timers.wrap(getattr(torch, attr), "alloc"))
    for attr in ("new_empty", "new_zeros"):
        setattr(torch.Tensor, attr, timers.wrap(getattr(torch.Tensor, attr), "alloc"))
    launches = [0]
    if cuda:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        for cls in (JITFunction, Autotuner):
            run = cls.run

            def counted(self, *a, _run=run, **k):
                launches[0] += 1
                return _run(self, *a, **k)

            cls.run = timers.wrap(counted, "launch")
    else:
        from triton.runtime.interpreter import InterpretedFunction

        def stub(self, *a, **k):  # the kernel is not run: its outputs stay uninitialised
            launches[0] += 1
            answer_read_outputs(self, a)

        InterpretedFunction.run = timers.wrap(stub, "launch")
    del triton
    return launches


def answer_read_outputs(kernel, args) -> None:
    """For a stubbed interpreter launch (the kernel body not run): the one kernel whose outputs the host reads and
    acts on, cross_entropy's target check, gets its two 0-d outputs set to "no bad target, 1 / n" (the kernel's
    answer for valid targets) without running the interpreter, so that the launch still costs nothing. Every other
    kernel's outputs stay uninitialised. Shared with scripts/host_vs_peers.py."""
    if kernel.fn.__name__ == "_target_stats_kernel":
        gate, inv_n, n = args[1], args[2], args[3]
        gate.fill_(0)
        inv_n.fill_(1.0 / max(1, n))


def _wrapper_cost_ns(timers) -> float:
    """Median extra ns a wrapped call costs over the bare call (subtracted per counted call)."""
    def noop():
        return None

    wrapped = timers.wrap(noop, "checks")
    timers.on = True
    bare, wrap = [], []
    for _ in range(2000):
        t0 = time.perf_counter_ns(); noop(); t1 = time.perf_counter_ns(); wrapped(); t2 = time.perf_counter_ns()
        bare.append(t1 - t0)
        wrap.append(t2 - t1)
    timers.on = False
    timers.reset()
    return max(0.0, statistics.median(wrap) - statistics.median(bare))


# --------------------------------------------------------------------------------------- op specs
def _raw(mod, new_name, op_name):
    """The op's Python body: the plain function (new layout) or the custom op's wrapped function."""
    fn = getattr(mod, new_name, None)
    return fn if fn is not None else getattr(mod, op_name)._init_fn


def _specs(torch, dev, dtype):
    """name -> builder() -> dict(fwd, bwd_setup, impl_fwd, impl_bwd): tiny shapes, inputs on dev."""
    import importlib

    import hearth.kernels as hk

    # importlib: `from hearth.kernels import softmax` would give the function, not the module
    att, ce, ln, lce, mm, rn, rp, sm, sw, lo = (importlib.import_module(f"hearth.kernels.{m}") for m in (
        "attention", "cross_entropy", "layer_norm", "linear_cross_entropy", "matmul", "rms_norm", "rope", "softmax", "swiglu",
        "lora"))

    def leaf(*shape, scale=1.0):
        t = (torch.randn(*shape, device=dev, dtype=dtype) * scale).requires_grad_()
        LEAVES.append(t)
        return t

    def rms_norm():
        x, w = leaf(64, 128), leaf(128)
        xd, wd = x.detach(), w.detach()
        y, rstd = rn._forward(xd, wd, 1e-6)
        dy = torch.randn_like(y)
        return dict(fwd=lambda: hk.rms_norm(x, w), impl_fwd=lambda: rn._forward(xd, wd, 1e-6),
                    impl_bwd=lambda: rn._backward(dy, xd, wd, rstd))

    def layer_norm():
        x, w, b = leaf(64, 128), leaf(128), leaf(128)
        xd, wd, bd = x.detach(), w.detach(), b.detach()
        y, mean, rstd = ln._forward(xd, wd, bd, 1e-5)
        dy = torch.randn_like(y)
        return dict(fwd=lambda: hk.layer_norm(x, w, b), impl_fwd=lambda: ln._forward(xd, wd, bd, 1e-5),
                    impl_bwd=lambda: ln._backward(dy, xd, wd, mean, rstd))

    def softmax():
        x = leaf(64, 128)
        xd = x.detach()
        y = sm._softmax_fwd(xd)
        dy = torch.randn_like(y)
        return dict(fwd=lambda: hk.softmax(x), impl_fwd=lambda: sm._softmax_fwd(xd), impl_bwd=lambda: sm._softmax_bwd(y, dy))

    def rope():
        q, k = leaf(1, 4, 16, 64), leaf(1, 2, 16, 64)
        cos, sin = torch.randn(1, 16, 64, device=dev, dtype=dtype), torch.randn(1, 16, 64, device=dev, dtype=dtype)
        qd, kd = q.detach(), k.detach()
        return dict(fwd=lambda: hk.rope(q, k, cos, sin),
                    impl_fwd=lambda: rp._launch(qd, kd, cos, sin, False), impl_bwd=lambda: rp._launch(qd, kd, cos, sin, True))

    def swiglu():
        g, u = leaf(64, 256), leaf(64, 256)
        gd, ud = g.detach(), u.detach()
        fwd_impl = _raw(sw, "_swiglu_forward", "_swiglu_fwd_op")
        bwd_impl = _raw(sw, "_swiglu_backward_impl", "_swiglu_bwd_op")
        dh = torch.randn_like(gd)
        return dict(fwd=lambda: hk.swiglu(g, u), impl_fwd=lambda: fwd_impl(gd, ud), impl_bwd=lambda: bwd_impl(dh, gd, ud))

    def swiglu_mlp():
        x, wg, wu, wdn = leaf(32, 64), leaf(128, 64, scale=0.1), leaf(128, 64, scale=0.1), leaf(64, 128, scale=0.1)
        ds = [t.detach() for t in (x, wg, wu, wdn)]
        fwd_impl = _raw(sw, "_mlp_forward", "_mlp_fwd_op")
        bwd_impl = _raw(sw, "_mlp_backward_impl", "_mlp_bwd_op")
        out, g, u = fwd_impl(*ds, None, None, None, False)
        dout = torch.randn_like(out)
        return dict(fwd=lambda: sw.swiglu_mlp(x, wg, wu, wdn), impl_fwd=lambda: fwd_impl(*ds, None, None, None, False),
                    impl_bwd=lambda: bwd_impl(dout, ds[0], g, u, ds[1], ds[2], ds[3], None, True, False, False))

    def cross_entropy():
        x = leaf(64, 512)
        t = torch.randint(0, 512, (64,), device=dev)
        xd = x.detach()
        scale = torch.ones((), device=dev, dtype=torch.float32)
        opts = dict(ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, grad_scale=1.0)
        return dict(fwd=lambda: hk.cross_entropy(x, t), impl_fwd=lambda: ce._launch_rows(xd, xd, t, **opts),
                    impl_bwd=lambda: ce._scale_grad_(xd, scale))

    def linear_cross_entropy():
        x, w = leaf(64, 64), leaf(256, 64, scale=0.1)
        t = torch.randint(0, 256, (64,), device=dev)
        xd, wd = x.detach(), w.detach()
        fwd_impl = _raw(lce, "_lce_forward", "_lce_fwd")
        scale_impl = _raw(lce, "_lce_scale_impl", "_lce_scale_")
        args = (xd, wd, t, None, -100, 0.0, "mean", 0.0, 0.0, True, True, False, 64)
        _, gx, gw, _, factor = fwd_impl(*args)
        one = torch.ones((), device=dev, dtype=torch.float32)

        def impl_bwd():  # the usual backward: the two returned gradients scaled by grad_output (1.0)
            if hasattr(lce, "_backward_scale"):  # one scale tensor for both (the eager backward's launchers)
                scale = lce._backward_scale(one, factor)
                lce._scale_inplace(gx, scale)
                lce._scale_inplace(gw, scale)
            else:
                scale_impl(gx, one, factor)
                scale_impl(gw, one, factor)

        return dict(fwd=lambda: hk.linear_cross_entropy(x, w, t), impl_fwd=lambda: fwd_impl(*args), impl_bwd=impl_bwd)

    def attention():
        q, k, v = leaf(1, 2, 32, 64), leaf(1, 2, 32, 64), leaf(1, 2, 32, 64)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        scale = 64 ** -0.5
        out, lse = att._attention_forward(qd, kd, vd, True, scale)
        do = torch.randn_like(out)
        return dict(fwd=lambda: hk.attention(q, k, v, causal=True), impl_fwd=lambda: att._attention_forward(qd, kd, vd, True, scale),
                    impl_bwd=lambda: att._attention_backward(do, qd, kd, vd, out, lse, True, scale))

    def matmul():
        a, b = leaf(64, 64), leaf(64, 64)
        ad, bd = a.detach(), b.detach()
        impl = _raw(mm, "_matmul", "_matmul_op")
        dc = torch.randn(64, 64, device=dev, dtype=dtype)

        def impl_bwd():
            impl(dc, bd.t())
            impl(ad.t(), dc)

        return dict(fwd=lambda: hk.matmul(a, b), impl_fwd=lambda: impl(ad, bd), impl_bwd=impl_bwd)

    def lora_linear():  # a frozen base weight, trainable x and LoRA factors (rank 8)
        x, a, b = leaf(64, 64), leaf(8, 64, scale=0.1), leaf(128, 8, scale=0.1)
        w = torch.randn(128, 64, device=dev, dtype=dtype) * 0.1
        xd, ad, bd = x.detach(), a.detach(), b.detach()
        fwd_impl = _raw(lo, "_linear_forward", "_linear_fwd_op")
        bwd_impl = _raw(lo, "_linear_backward_impl", "_linear_bwd_op")
        _, xa = fwd_impl(xd, w, None, ad, bd, 0.5, False)
        dy = torch.randn(64, 128, device=dev, dtype=dtype)
        return dict(fwd=lambda: lo.lora_linear(x, w, None, a, b, 0.5),
                    impl_fwd=lambda: fwd_impl(xd, w, None, ad, bd, 0.5, False),
                    impl_bwd=lambda: bwd_impl(dy, xd, xa, w, ad, bd, 0.5, True, False, False, False))

    def lora_swiglu_mlp():  # frozen base [I=128, H=64], rank-8 factors on the three projections
        x = leaf(32, 64)
        base = [torch.randn(*s, device=dev, dtype=dtype) * 0.1 for s in ((128, 64), (128, 64), (64, 128))]
        lora = [leaf(*s, scale=0.1) for s in ((8, 64), (128, 8), (8, 64), (128, 8), (8, 128), (64, 8))]
        ld = [t.detach() for t in lora]
        fwd_impl = _raw(lo, "_mlp_forward", "_mlp_fwd_op")
        bwd_impl = _raw(lo, "_mlp_backward_impl", "_mlp_bwd_op")
        fwd_args = (x.detach(), *base, None, None, None, *ld, 0.5, 0.5, 0.5, False, False)
        out, g, u, xa, xa_down = fwd_impl(*fwd_args)
        dout = torch.randn_like(out)
        return dict(fwd=lambda: lo.lora_swiglu_mlp(x, *base, *lora, 0.5, 0.5, 0.5), impl_fwd=lambda: fwd_impl(*fwd_args),
                    impl_bwd=lambda: bwd_impl(dout, x.detach(), g, u, xa, xa_down, *base, None, *ld, 0.5, 0.5, 0.5, False,
                                              False))

    modules = (att, ce, ln, lce, mm, rn, rp, sm, sw, lo)
    return {f.__name__: f for f in (softmax, cross_entropy, linear_cross_entropy, rms_norm, layer_norm, rope,
                                    swiglu, swiglu_mlp, attention, matmul, lora_linear, lora_swiglu_mlp)}, modules


# -------------------------------------------------------------------------------------- measuring
def _stat_us(samples):
    return STAT(samples) / 1000.0


def measure(torch, spec, reps, warmup, sync, timers, wrap_ns):
    """Returns {"fwd": {...}, "bwd": {...}} in microseconds."""
    fwd, impl_fwd, impl_bwd = spec["fwd"], spec["impl_fwd"], spec["impl_bwd"]

    def grads_for(out):
        outs = out if isinstance(out, tuple) else (out,)
        return [o for o in outs if o.requires_grad], [torch.ones_like(o) for o in outs if o.requires_grad]

    def time_fwd():
        sync(); t0 = time.perf_counter_ns(); out = fwd(); t1 = time.perf_counter_ns()
        return t1 - t0, out

    def clear_grads():  # as a training loop's zero_grad(set_to_none=True): no accumulation adds
        for t in LEAVES:
            t.grad = None

    def time_bwd():
        out = fwd()
        outs, gs = grads_for(out)
        clear_grads()
        sync(); t0 = time.perf_counter_ns(); torch.autograd.backward(outs, gs); t1 = time.perf_counter_ns()
        return t1 - t0

    def time_call(fn):
        sync(); t0 = time.perf_counter_ns(); fn(); t1 = time.perf_counter_ns()
        return t1 - t0

    for _ in range(warmup):
        time_fwd(); time_bwd(); time_call(impl_fwd); time_call(impl_bwd)
    res = {}
    gc.collect()
    gc.disable()
    try:
        clean = {
            "fwd": [time_fwd()[0] for _ in range(reps)],
            "bwd": [time_bwd() for _ in range(reps)],
            "impl_fwd": [time_call(impl_fwd) for _ in range(reps)],
            "impl_bwd": [time_call(impl_bwd) for _ in range(reps)],
        }
        # the breakdown: the same calls with the helpers wrapped; per bucket the median over the calls of
        # (time - wrapper cost x wrapped calls), so that one slow call (a page fault, a GC-free spike) does
        # not move it
        parts = {}
        for name in ("fwd", "bwd", "impl_fwd", "impl_bwd"):
            samples = {b: [] for b in BUCKETS}
            launches = []
            for _ in range(reps):
                if name == "bwd":  # only the backward is attributed, not the forward that builds its graph
                    outs, gs = grads_for(fwd())
                    clear_grads()
                    call = lambda: torch.autograd.backward(outs, gs)  # noqa: E731
                else:
                    call = {"fwd": fwd, "impl_fwd": impl_fwd, "impl_bwd": impl_bwd}[name]
                sync()
                timers.reset()
                timers.on = True
                call()
                timers.on = False
                for b in BUCKETS:
                    samples[b].append(max(0.0, timers.ns[b] - timers.calls[b] * wrap_ns))
                launches.append(timers.calls["launch"])
            parts[name] = {b: STAT(v) / 1000.0 for b, v in samples.items()}
            parts[name]["launches"] = statistics.median(launches)
    finally:
        gc.enable()
        timers.on = False
    for d in ("fwd", "bwd"):
        total = _stat_us(clean[d])
        impl = _stat_us(clean[f"impl_{d}"])
        ip = parts[f"impl_{d}"]
        checks = parts[d]["checks"]
        row = {"us": total, "impl": impl, "checks": checks,
               "dispatch": max(0.0, total - checks - impl),
               "config": ip["config"], "device": ip["device"], "alloc": ip["alloc"], "launch": ip["launch"],
               "launches": ip["launches"]}
        row["other"] = max(0.0, impl - ip["config"] - ip["device"] - ip["alloc"] - ip["launch"])
        res[d] = row
    return res


def main(argv=None) -> int:
    global STAT
    args = _parse(argv)
    STAT = min if args.stat == "min" else statistics.median
    want_cuda = args.device == "cuda"
    if args.device == "auto":
        import torch

        want_cuda = torch.cuda.is_available()
    if not want_cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before hearth / triton define the kernels
    import torch

    if want_cuda and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if want_cuda else "cpu")
    if not want_cuda:
        # the few torch ops on an op's path (an LCE / MLP GEMM, a sum) are one async launch on a GPU; on
        # the CPU, an intra-op thread pool's wake-ups stalled them by ~20 ms on a loaded 2-core box
        torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if want_cuda else torch.float32)
    sync = torch.cuda.synchronize if want_cuda else (lambda: None)
    torch.manual_seed(0)
    specs, modules = _specs(torch, dev, dtype)
    timers = Timers()
    wrap_ns = _wrapper_cost_ns(timers)
    _install(timers, torch, modules, want_cuda)
    rows = []
    for op in args.ops:
        spec = specs[op]()
        res = measure(torch, spec, args.reps, args.warmup, sync, timers, wrap_ns)
        for d in ("fwd", "bwd"):
            rows.append({"op": op, "direction": d, "device": "cuda" if want_cuda else "cpu (launch stubbed)", "stat": args.stat,
                         "dtype": str(dtype).replace("torch.", ""), **{k: round(v, 2) for k, v in res[d].items()}})
    _print(rows, want_cuda, args.stat)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


def _print(rows, cuda: bool, stat: str = "median") -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"hearth host cost per call, us ({stat})" + ("" if cuda else " -- CPU, interpreter mode, kernel launches stubbed")
    table = Table(title=title)
    cols = ("op", "direction", "us", "checks", "dispatch", "impl", "config", "device", "alloc", "launch", "other", "launches")
    for c in cols:
        table.add_column(c, justify="left" if c in ("op", "direction") else "right")
    for r in rows:
        table.add_row(*(str(r[c]) for c in cols))
    Console(width=160).print(table)
    tot = {d: sum(r["us"] for r in rows if r["direction"] == d) for d in ("fwd", "bwd")}
    print(f"TOTAL fwd {tot['fwd']:.1f} us, bwd {tot['bwd']:.1f} us over {len(rows) // 2} ops")


if __name__ == "__main__":
    sys.exit(main())
