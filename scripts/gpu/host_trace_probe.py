"""Where one op's wall time per call goes when calls run back to back (the harness's wall/call column).

    python scripts/gpu/host_trace_probe.py --op swiglu_mlp --shape 16384,1024,3072 [--iters 20] [--out DIR]
    python scripts/gpu/host_trace_probe.py --op layer_norm --shape 12289,5120 --provider liger   # a peer, same trace

Runs --iters fwd+bwd calls back to back (no sync between them, as a training loop would) under
torch.profiler and prints: wall ms per call, the host ms inside the calls, and the CUDA runtime calls that
block the host or allocate (cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy*, cudaMalloc,
cudaFree, cudaEventSynchronize) with their counts and host time, then the top ops by self CPU time. A
host figure close to the wall time with a synchronising call in the list is a sync inside the op, not
launch overhead. Ops: swiglu_mlp (shape N,H,I), matmul (M,K,N), linear_cross_entropy (N,H,V), layer_norm and
rms_norm (M,N: bf16 weight, and a bias for layer_norm, all trainable, as the harness's full mode), attention
(B,Hq,Hk,T,D, causal), attention_varlen (S,L,Hq,Hk,D: S causal sequences of L tokens packed in one row). --provider
hearth (default), liger (Liger-Kernel's function, where installed) or torch (eager PyTorch) for layer_norm and
rms_norm; sdpa_cudnn or sdpa_flash for attention; flash_attn (the bench's flash_attn row: FlashAttention-4's varlen
function where carried, else FlashAttention-3 / 2) for attention_varlen. The trace also lists GPU time per call by
kernel, longest first. --pyprof (attention): also a cProfile of hearth's forward and backward launchers, Python time
by function, and the backward() call through autograd split by timestamps (hand-over to autograd's device thread,
the Python backward there, the return) beside a no-op autograd.Function as the control, with a cProfile taken on the
device thread, then the three back to back (launchers, through autograd, the control) alternated in rounds in one
process. The kernel launch calls (cuLaunchKernel, cudaLaunchKernel) are counted too.
Writes DIR/host_trace_<op>[_<provider>]_<shape>.txt when --out is given.
--op softmax_ab --shape M,N: softmax's fwd+bwd host time route by route in rounds (the cluster forms routed and
not, through autograd and the launchers called directly, Liger beside them), and a cProfile of the routed backward.
--op sum_partials --shape G,N: instead, the norms' dweight / dbias reduction alone, both ways in one process (host
time on that machine varies by up to 2.5x between processes): a torch sum of the [2, G, N] fp32 partials and a
cast per bf16 output (what the backward ran before), against rms_norm.sum_partials (one launch); wall and host
us per call, back to back, and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

import torch

BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMalloc", "cudaFree",
            "cudaEventSynchronize", "cudaHostAlloc", "cuLaunchKernel", "cudaLaunchKernel")


def _norm(op: str, provider: str):
    """layer_norm / rms_norm as (x, weight, bias) -> y for one provider (eps 1e-5 and 1e-6)."""
    import torch.nn.functional as F

    if provider == "hearth":
        import hearth.kernels as hk

        return (lambda x, w, b: hk.layer_norm(x, w, b, 1e-5)) if op == "layer_norm" else (lambda x, w, b: hk.rms_norm(x, w, 1e-6))
    if provider == "liger":
        from liger_kernel.transformers import functional as lf

        return (lambda x, w, b: lf.liger_layer_norm(x, w, b, 1e-5)) if op == "layer_norm" else (lambda x, w, b: lf.liger_rms_norm(x, w, 1e-6))
    if provider == "torch":
        return ((lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)) if op == "layer_norm"
                else (lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)))
    raise SystemExit(f"--provider: one of hearth, liger, torch, got {provider!r}")


def _case(op: str, shape: list[int], provider: str = "hearth", device: str = "cuda"):
    import hearth.kernels as hk

    dev, dt = device, torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, device=dev, generator=g) * scale).to(dt)  # noqa: E731
    if op in ("layer_norm", "rms_norm"):
        m, n = shape
        fn = _norm(op, provider)
        x, w, b = rnd(m, n).requires_grad_(), (1 + rnd(n, scale=0.1)).requires_grad_(), rnd(n, scale=0.1).requires_grad_()
        dy = rnd(m, n)
        leaves = [x, w, b] if op == "layer_norm" else [x, w]
        return leaves, lambda: fn(x, w, b), dy  # y.backward(dy): the harness's full mode
    if op == "attention":  # shape B,Hq,Hk,T,D; causal, [B, H, T, D] contiguous (the harness's layout)
        b, hq, nk, t, d = shape
        q = rnd(b, hq, t, d).requires_grad_()
        k, v = rnd(b, nk, t, d).requires_grad_(), rnd(b, nk, t, d).requires_grad_()
        dy = rnd(b, hq, t, d)
        if provider == "hearth":
            return [q, k, v], lambda: hk.attention(q, k, v, causal=True), dy
        if provider in ("sdpa_cudnn", "sdpa_flash"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = SDPBackend.CUDNN_ATTENTION if provider == "sdpa_cudnn" else SDPBackend.FLASH_ATTENTION

            def sdpa():
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                            enable_gqa=hq != nk)
            return [q, k, v], sdpa, dy
        raise SystemExit(f"--provider {provider}: attention takes hearth, sdpa_cudnn or sdpa_flash")
    if op == "attention_varlen":  # shape S,L,Hq,Hk,D: S causal sequences of L tokens packed in one row
        s, seq, hq, nk, d = shape
        q = rnd(s * seq, hq, d).requires_grad_()
        k, v = rnd(s * seq, nk, d).requires_grad_(), rnd(s * seq, nk, d).requires_grad_()
        dy = rnd(s * seq, hq, d)
        cu = torch.arange(0, s + 1, device=dev, dtype=torch.int32) * seq
        if provider == "hearth":
            return [q, k, v], lambda: hk.attention_varlen(q, k, v, cu, cu, seq, seq, causal=True), dy
        if provider == "flash_attn":  # the bench's flash_attn row: the first of FlashAttention-4 / 3 / 2 that imports
            from hearth.bench.providers import Unavailable, _flash_attn_function

            try:
                _module, varlen = _flash_attn_function({"q": q}, "flash_attn_varlen_func")
            except Unavailable as e:
                raise SystemExit(f"--provider flash_attn: {e}") from e

            def fa():
                out = varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seq, max_seqlen_k=seq,
                             causal=True)
                return out[0] if isinstance(out, tuple) else out  # FlashAttention-3 / 4 also return the lse
            return [q, k, v], fa, dy
        raise SystemExit(f"--provider {provider}: attention_varlen takes hearth or flash_attn")
    peer = _peer_fn(op, provider)  # torch / compile for swiglu_mlp and linear_cross_entropy, else None
    if op == "swiglu_mlp":
        from hearth.kernels.swiglu import swiglu_mlp

        n, h, i = shape
        x = rnd(n, h).requires_grad_()
        ws = [rnd(i, h, scale=0.02).requires_grad_(), rnd(i, h, scale=0.02).requires_grad_(),
              rnd(h, i, scale=0.02).requires_grad_()]
        leaves = [x, *ws]
        fn = peer or swiglu_mlp
        return leaves, lambda: fn(x, *ws), rnd(n, h)  # y.backward(dy): the harness's full mode
    if op == "matmul":
        m, k, n = shape
        a, b = rnd(m, k).requires_grad_(), rnd(k, n, scale=0.02).requires_grad_()
        return [a, b], lambda: hk.matmul(a, b).float().sum(), None
    if op == "linear_cross_entropy":
        n, h, v = shape
        x, w = rnd(n, h).requires_grad_(), rnd(v, h, scale=0.02).requires_grad_()
        t = torch.randint(0, v, (n,), device=dev, generator=g)
        fn = peer or hk.linear_cross_entropy
        return [x, w], lambda: fn(x, w, t), None
    raise SystemExit(f"--op: unknown op {op!r}")


def _peer_fn(op: str, provider: str):
    """The bench's eager PyTorch function for swiglu_mlp / linear_cross_entropy, or that function under
    torch.compile (dynamic=False, as the bench's compile row), for --provider torch / compile; None for hearth."""
    if provider == "hearth":
        return None
    if op not in ("swiglu_mlp", "linear_cross_entropy") or provider not in ("torch", "compile"):
        raise SystemExit(f"--provider {provider}: only layer_norm, rms_norm, attention(_varlen), and torch / compile "
                         "for swiglu_mlp and linear_cross_entropy have peers here")
    from hearth.bench.providers import _eager_table

    fn = _eager_table()[op]
    return torch.compile(fn, dynamic=False) if provider == "compile" else fn


def _kernel_times(avgs, iters: int, top: int = 20) -> list[str]:
    """The profile's device-side entries (kernels, memsets, copies) by self device time per call: which part of a
    fwd+bwd takes the GPU time (e.g. a forward against a peer's, the backward's preprocess, its main kernel)."""
    rows = []
    for e in avgs:
        us = getattr(e, "self_device_time_total", None)
        us = getattr(e, "self_cuda_time_total", 0) if us is None else us
        if us > 0 and e.self_cpu_time_total == 0:  # device-only entries (a launch's CPU side is its own entry)
            rows.append((us / iters, e.count / iters, e.key))
    rows.sort(reverse=True)
    total = f"  {sum(r[0] for r in rows):9.1f}  all {len(rows)} kinds, {sum(r[1] for r in rows):.1f} launches a call"
    return [f"  {us:9.1f}  x{n:4.1f}  {name[:110]}" for us, n, name in rows[:top]] + [total] if rows else ["  none"]


def _back_to_back(fn, iters: int) -> tuple[float, float]:
    """(host, wall) seconds per call of `iters` calls of fn back to back from an idle GPU: host is the time spent
    inside the calls, wall runs to a sync after the last."""
    torch.cuda.synchronize()
    host, t0 = 0.0, time.perf_counter()
    for _ in range(iters):
        h0 = time.perf_counter()
        fn()
        host += time.perf_counter() - h0
    torch.cuda.synchronize()
    return host / iters, (time.perf_counter() - t0) / iters


def _pyprof(shape: list[int], iters: int) -> str:
    """--pyprof with --op attention: cProfile of hearth's forward and backward launchers called directly in this
    thread (autograd runs a CUDA backward on its own thread, which cProfile does not see), top functions by own
    time, microseconds per call."""
    import importlib

    at = importlib.import_module("hearth.kernels.attention")  # the package exports the function under that name

    (q, k, v), _step, dy = _case("attention", shape)
    scale = q.shape[-1] ** -0.5

    def both():
        out, lse = at._attention_forward(q, k, v, True, scale)
        at._attention_backward(dy, q, k, v, out, lse, True, scale)

    for _ in range(3):
        both()
    lines = []
    for name, fn in (("forward", lambda: at._attention_forward(q, k, v, True, scale)), ("forward + backward", both)):
        host, wall = _back_to_back(fn, iters)
        lines.append(f"launchers only, {name}: host {host * 1e6:.1f} us/call, wall {wall * 1e6:.1f} us/call")
    lines.append(f"cProfile of {iters} forward + backward launcher calls (times are totals over the calls):")
    lines.append(_cprofile(both, iters, 30))
    lines.extend(_autograd_split(at, q, k, v, dy, iters))
    lines.extend(_interleaved(at, both, q, k, v, dy, scale, iters))
    return "\n".join(lines)


def _interleaved(at, launchers, q, k, v, dy, scale: float, iters: int, rounds: int = 3) -> list[str]:
    """The same fwd+bwd five ways, back to back (no sync between calls, as in a training loop), alternated in
    rounds in one process (host speed drifts between processes and within one): the launchers called directly
    (`launchers`, _pyprof's call of both); the same with the backward launchers handed to a Python worker thread
    and waited for (autograd's hand-over of a CUDA backward to its device thread); attention's autograd.Function
    (`at._attention`) without attention()'s argument checks; `attention(q, k, v).backward(dy)` through autograd;
    and a no-op autograd.Function (the control). Host microseconds inside the calls and wall per call; through
    autograd minus the launchers is what the autograd path adds when the GPU queue is not drained before each
    backward."""
    import queue
    import threading

    import hearth.kernels as hk

    def autograd():
        for t in (q, k, v):
            t.grad = None
        hk.attention(q, k, v, causal=True).backward(dy)

    def function():  # the autograd.Function without attention()'s argument checks
        for t in (q, k, v):
            t.grad = None
        at._attention(q, k, v, True, scale)[0].backward(dy)

    jobs: queue.Queue = queue.Queue()

    def worker():
        while True:
            job, done = jobs.get()
            if job is None:
                return
            job()
            done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def launchers_thread():  # forward here, backward launchers on another Python thread, waited for (autograd's shape)
        out, lse = at._attention_forward(q, k, v, True, scale)
        done = threading.Event()
        jobs.put((lambda: at._attention_backward(dy, q, k, v, out, lse, True, scale), done))
        done.wait()

    def control():
        for t in (q, k, v):
            t.grad = None
        _Noop.apply(q, k, v).backward(dy)

    lines = [f"interleaved back to back, {iters} fwd+bwd calls a round (host us inside the calls / wall us a call); "
             "'Function only' skips attention()'s checks, 'launchers, backward on a thread' hands the backward "
             "launchers to a Python worker thread and waits, as autograd hands a CUDA backward to its device thread:"]
    try:
        return lines + _rounds((("launchers", launchers), ("launchers, backward on a thread", launchers_thread),
                                ("Function only", function), ("through autograd", autograd),
                                ("no-op control", control)), iters, rounds)
    finally:
        jobs.put((None, None))
        thread.join()


def _rounds(cases, iters: int, rounds: int) -> list[str]:
    """One line a round: each (name, fn) of `cases` warmed 3 calls, then `iters` calls back to back; host us inside
    the calls / wall us a call, the cases alternating within the round (host speed drifts within a process)."""
    lines = []
    for r in range(rounds):
        cells = []
        for name, fn in cases:
            for _ in range(3):
                fn()
            host, wall = _back_to_back(fn, iters)
            cells.append(f"{name} {host * 1e6:.0f} / {wall * 1e6:.0f}")
        lines.append(f"  round {r}: " + "; ".join(cells))
    return lines


def _cprofile(fn, iters: int, top: int) -> str:
    """cProfile of `iters` calls of fn on this thread, the `top` functions by own time (totals over the calls)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


class _Noop(torch.autograd.Function):
    """The control: an autograd.Function with three saved inputs, empty outputs and gradients, no kernels. With
    `marks` set to a list, its backward appends a timestamp on entry and one on return (as the timed backward)."""

    marks: list | None = None

    @staticmethod
    def forward(ctx, a, b, c):
        ctx.save_for_backward(a, b, c)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx, g):
        if _Noop.marks is not None:
            _Noop.marks.append(time.perf_counter())
        a, b, c = ctx.saved_tensors
        out = torch.empty_like(a), torch.empty_like(b), torch.empty_like(c)
        if _Noop.marks is not None:
            _Noop.marks.append(time.perf_counter())
        return out


def _autograd_split(at, q, k, v, dy, iters: int) -> list[str]:
    """Where a fwd+bwd call through autograd spends host time beyond the launchers (--pyprof, attention):
    the forward through `attention()`; then, with the GPU idle before each backward (a sync after the forward), the
    `out.backward(dy)` call split by timestamps taken inside the Python backward on autograd's device thread: the
    hand-over to that thread, the launchers there, and the return; the same for a no-op autograd.Function (empty
    outputs and gradients, no kernels) as the control for autograd's own cost on this host; and a cProfile of the
    backward taken on the device thread itself."""
    import cProfile
    import io
    import pstats

    import hearth.kernels as hk

    lines = []
    real_bwd = at._attention_backward
    marks: list[float] = []
    prof = cProfile.Profile()
    profiling = [False]

    def timed_bwd(*args):
        marks.append(time.perf_counter())
        if profiling[0]:
            prof.enable()
        try:
            return real_bwd(*args)
        finally:
            if profiling[0]:
                prof.disable()
            marks.append(time.perf_counter())


    def split(name, fwd):
        fwd_host, parts = 0.0, []
        for it in range(iters + 3):
            for t in (q, k, v):
                t.grad = None
            h0 = time.perf_counter()
            out = fwd()
            h1 = time.perf_counter()
            torch.cuda.synchronize()
            marks.clear()
            b0 = time.perf_counter()
            out.backward(dy)
            b1 = time.perf_counter()
            torch.cuda.synchronize()
            if it >= 3 and len(marks) == 2:
                fwd_host += h1 - h0
                parts.append((marks[0] - b0, marks[1] - marks[0], b1 - marks[1]))
        n = max(1, len(parts))
        hand, body, tail = (sum(p[i] for p in parts) / n * 1e6 for i in range(3))
        lines.append(f"through autograd, {name}: forward {fwd_host / n * 1e6:.1f} us/call; backward() {hand + body + tail:.1f}"
                     f" us/call = hand-over to the device thread {hand:.1f} + Python backward there {body:.1f} + return"
                     f" {tail:.1f} (GPU idle before each backward; {len(parts)} calls)")

    at._attention_backward = timed_bwd
    try:
        split("hearth attention", lambda: hk.attention(q, k, v, causal=True))
        _Noop.marks = marks
        try:
            split("no-op autograd.Function (control)", lambda: _Noop.apply(q, k, v))
        finally:
            _Noop.marks = None
        profiling[0] = True
        for _ in range(iters):
            out = hk.attention(q, k, v, causal=True)
            out.backward(dy)
        torch.cuda.synchronize()
    finally:
        at._attention_backward = real_bwd
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    lines.append(f"cProfile of the backward on autograd's device thread, {iters} calls back to back (totals):")
    lines.append(buf.getvalue())
    return lines


def _sum_partials_ab(shape: list[int], iters: int) -> str:
    """--op sum_partials (module docstring)."""
    import importlib

    rn = importlib.import_module("hearth.kernels.rms_norm")
    g, n = shape
    partial = torch.randn(2, g, n, device="cuda")
    dw, db = (torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def torch_way():
        sums = partial.sum(1)
        return sums[0].to(torch.bfloat16), sums[1].to(torch.bfloat16)

    def kernel_way():
        rn.sum_partials(partial, dw, db)
        return dw, db

    lines = [f"sum_partials {g}x{n} (2 slices, bf16 outputs), {iters} calls back to back on {torch.cuda.get_device_name()}"
             f" (torch {torch.__version__})"]
    for _round in range(3):  # alternate, three rounds: the host's speed drifts
        for name, fn in (("torch sum + casts", torch_way), ("sum_partials", kernel_way)):
            for _ in range(5):
                fn()
            host, wall = _back_to_back(fn, iters)
            lines.append(f"  round {_round}: {name:18s} wall {wall * 1e6:7.1f} us/call, host {host * 1e6:7.1f}")
    a, b = torch_way(), kernel_way()
    diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
    lines.append(f"  largest difference between the two results: {diff:.3e} (bf16 of the same fp32 sums)")
    return "\n".join(lines)


def _softmax_ab(shape: list[int], iters: int, rounds: int = 3) -> str:
    """--op softmax_ab --shape M,N (bf16): where the host time of softmax's fwd+bwd goes, route by route, in rounds
    in one process, back to back (host us inside the calls / wall us a call): through autograd with the cluster
    forms routed (softmax_gluon.ROUTE on) and off (the one-pass / chunked Triton kernels), Liger's softmax where it
    imports, then each backward launcher called directly on this thread (no autograd), routed and not; then a
    cProfile of the routed backward launcher (Python time by function)."""
    import importlib

    sm = importlib.import_module("hearth.kernels.softmax")
    sg = sm.sg
    m, n = shape
    x = (torch.randn(m, n, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    y = torch.softmax(x.detach().float(), -1).to(torch.bfloat16)

    def routed(flag, fn):
        def call():
            sg.ROUTE = flag
            try:
                fn()
            finally:
                sg.ROUTE = True
        return call

    def autograd():
        x.grad = None
        sm.softmax(x).backward(dy)

    cases = [("autograd, routed", routed(True, autograd)), ("autograd, Triton", routed(False, autograd))]
    try:
        from liger_kernel.transformers.functional import liger_softmax

        def liger():
            x.grad = None
            liger_softmax(x).backward(dy)
        cases.append(("liger", liger))
    except ImportError:
        pass
    cases += [("bwd launcher, routed", routed(True, lambda: sm._softmax_bwd(y, dy))),
              ("bwd launcher, Triton", routed(False, lambda: sm._softmax_bwd(y, dy))),
              ("fwd launcher, routed", routed(True, lambda: sm._softmax_fwd(x.detach())))]
    lines = [f"softmax {m}x{n} bf16, {iters} calls a round back to back (host us inside the calls / wall us a call); "
             f"routes: backward {'smem' if sg is not None and sg.serves(y, inputs=2, min_cols=sg.smem_min_cols(y.dtype, 2)) else 'Triton'}, "
             f"forward {'smem' if sg is not None and sg.serves(y, min_cols=sg.smem_min_cols(y.dtype)) else 'Triton'}"]
    lines += _rounds(cases, iters, rounds)
    lines.append(f"cProfile of {iters} routed backward launcher calls (totals over the calls):")
    lines.append(_cprofile(routed(True, lambda: sm._softmax_bwd(y, dy)), iters, 25))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="swiglu_mlp")
    p.add_argument("--shape", default="16384,1024,3072", help="comma-separated sizes (see the docstring)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--provider", default="hearth",
                   help="hearth, liger or torch (layer_norm and rms_norm); sdpa_cudnn or sdpa_flash (attention); "
                        "flash_attn (attention_varlen); torch or compile (swiglu_mlp, linear_cross_entropy)")
    p.add_argument("--shapes", action="store_true",
                   help="also list GPU time by aten op and input shapes (which GEMM of a fused node takes the time)")
    p.add_argument("--pyprof", action="store_true",
                   help="--op attention: also cProfile hearth's forward and backward launchers (Python time by function)")
    p.add_argument("--mlp-chunk-elems", type=int, default=None,
                   help="--op swiglu_mlp: set hearth.kernels.swiglu.MLP_CHUNK_ELEMS first (e.g. 1099511627776: one chunk)")
    args = p.parse_args()
    if args.mlp_chunk_elems is not None:
        if args.op != "swiglu_mlp" or args.mlp_chunk_elems < 1:
            p.error(f"--mlp-chunk-elems takes a positive count and --op swiglu_mlp, got {args.mlp_chunk_elems} "
                    f"with --op {args.op}")
        importlib.import_module("hearth.kernels.swiglu").MLP_CHUNK_ELEMS = args.mlp_chunk_elems
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    ab = {"softmax_ab": _softmax_ab, "sum_partials": _sum_partials_ab}.get(args.op)
    if ab is not None:  # the A/B modes: their own text, one file
        text = ab([int(s) for s in args.shape.split(",")], args.iters)
        print(text)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"host_trace_{args.op}_{args.shape.replace(',', 'x')}.txt").write_text(text + "\n")
        return
    leaves, step, grad = _case(args.op, [int(s) for s in args.shape.split(",")], args.provider)

    def call():
        for t in leaves:
            t.grad = None
        step().backward(grad)

    for _ in range(3):
        call()
    host, wall = _back_to_back(call, args.iters)
    lines = [f"{args.op} ({args.provider}) {args.shape} bf16 fwd+bwd, {args.iters} calls back to back on {torch.cuda.get_device_name()}"
             f" (torch {torch.__version__}): wall {wall * 1e3:.3f} ms/call, host inside the calls {host * 1e3:.3f} ms/call"]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=args.shapes) as prof:
        for _ in range(args.iters):
            call()
        torch.cuda.synchronize()
    avgs = prof.key_averages()
    lines.append("CUDA runtime calls that block, allocate or launch (count per call, host us per call):")
    found = False
    for e in avgs:
        if e.key.startswith(BLOCKING):
            found = True
            lines.append(f"  {e.key:40s} {e.count / args.iters:6.1f}  {e.self_cpu_time_total / args.iters:9.1f}")
    if not found:
        lines.append("  none")
    lines.append("GPU time per call by kernel (us), longest first:")
    lines += _kernel_times(avgs, args.iters)
    if args.shapes:  # which GEMM (by its operands' shapes) takes the GPU time
        lines.append("GPU time per call by op and input shapes (self device us, count per call), longest first:")
        by_shape = []
        for e in prof.key_averages(group_by_input_shape=True):
            # self time: the kernels an op launched itself (aten::linear's GEMM is its aten::mm's, counted once)
            us = getattr(e, "self_device_time_total", None)
            us = getattr(e, "self_cuda_time_total", 0) if us is None else us
            if e.key.startswith("aten::") and us > 0 and e.input_shapes:
                by_shape.append((us / args.iters, e.count / args.iters, e.key, e.input_shapes))
        by_shape.sort(key=lambda r: -r[0])
        lines += [f"  {us:9.1f}  x{n:4.1f}  {key} {shapes}" for us, n, key, shapes in by_shape[:30]]
    lines.append(avgs.table(sort_by="self_cpu_time_total", row_limit=25))
    text = "\n".join(lines)
    print(text)
    if args.pyprof and args.op == "attention" and args.provider == "hearth":
        try:
            prof_text = _pyprof([int(s) for s in args.shape.split(",")], args.iters)
        except Exception:  # noqa: BLE001 - keep the trace above; say what failed
            import traceback

            prof_text = "--pyprof failed:\n" + traceback.format_exc()
        print(prof_text)
        text += "\n" + prof_text
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = args.op if args.provider == "hearth" else f"{args.op}_{args.provider}"
        (Path(args.out) / f"host_trace_{name}_{args.shape.replace(',', 'x')}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
