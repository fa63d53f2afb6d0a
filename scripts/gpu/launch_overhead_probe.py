"""H200 probe: what one Triton launch costs the host, by path, and what hearth's ops cost a call.

    python scripts/gpu/launch_overhead_probe.py --out $OUT/launch.jsonl

1. A small elementwise kernel with the argument count of hearth's row kernels (4 tensors, 6 ints, 1 float, 2
   constexprs), launched N times back to back without a sync: host microseconds a launch through
   (a) `kernel[grid](...)`, Triton's JIT path (argument specialisation, cache lookup, launch);
   (b) the CompiledKernel that (a) returned, called through its own `[grid]` runner with the launch's runtime
       arguments (no specialisation, no cache lookup), checked to write the same output as (a);
   (c) torch's own `torch.add(x, y, out=z)` (one ATen launch), for scale.
2. hearth's rms_norm fwd+bwd and softmax fwd+bwd at a small shape through autograd: host microseconds a call
   (time to return without a sync, over N calls), beside Liger's.
The GPU queue is drained before each timed block, and the blocks are short enough that the queue never fills (the
kernels run in a few microseconds), so the figures are host time. One JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _probe_kernel(X, Y, Z, W, n, stride_x, stride_y, stride_z, rows, extra, scale,
                  BLOCK: tl.constexpr, FLAG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    z = x * scale + y
    if FLAG:
        z += tl.load(W + offs, mask=mask)
    tl.store(Z + offs, z, mask=mask)


def _host_us(fn, n: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    rows = []
    n = 4096
    x, y, w = (torch.randn(n, device="cuda") for _ in range(3))
    z = torch.empty_like(x)
    grid = (triton.cdiv(n, 1024),)
    grid3 = (grid[0], 1, 1)
    runtime = (x, y, z, w, n, 1, 1, 1, 1, 7, 0.5)
    jit = lambda: _probe_kernel[grid](*runtime, BLOCK=1024, FLAG=True)  # noqa: E731
    compiled = _probe_kernel[grid](*runtime, BLOCK=1024, FLAG=True)
    want = z.clone()
    z.zero_()
    form = None
    for label, call_args in (("runtime args", runtime),
                             ("all args", runtime + (1024, True))):
        try:
            compiled[grid3](*call_args)  # the CompiledKernel's runner indexes grid[0..2]
            torch.cuda.synchronize()
            if torch.equal(z, want):
                form = (label, call_args)
                break
            rows.append(dict(probe="compiled_form", form=label, status="wrong output"))
        except Exception as e:
            rows.append(dict(probe="compiled_form", form=label, status=f"{type(e).__name__}: {str(e)[:200]}"))
        z.zero_()
    for _ in range(3):  # rounds, interleaved
        rows.append(dict(probe="launch", path="jit", host_us=_host_us(jit, args.n)))
        if form is not None:
            runner_args = form[1]
            rows.append(dict(probe="launch", path=f"compiled ({form[0]})",
                             host_us=_host_us(lambda: compiled[grid3](*runner_args), args.n)))
        rows.append(dict(probe="launch", path="torch.add", host_us=_host_us(lambda: torch.add(x, y, out=z), args.n)))

    import importlib

    hk = importlib.import_module("hearth.kernels")
    try:
        from liger_kernel.transformers import functional as lf
    except Exception:
        lf = None
    a = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wt = torch.ones(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)

    def step(fn, leaves):
        def go():
            for t in leaves:
                t.grad = None
            fn().backward(dy)
        return go

    ops = {
        ("rms_norm", "hearth"): step(lambda: hk.rms_norm(a, wt, 1e-6), [a, wt]),
        ("softmax", "hearth"): step(lambda: hk.softmax(a), [a]),
    }
    if lf is not None:
        ops[("rms_norm", "liger")] = step(lambda: lf.liger_rms_norm(a, wt, 1e-6), [a, wt])
        ops[("softmax", "liger")] = step(lambda: lf.liger_softmax(a), [a])
    for fn in ops.values():
        for _ in range(20):
            fn()
    for _ in range(3):
        for (op, who), fn in ops.items():
            rows.append(dict(probe="op", op=op, provider=who, shape="64x1024 bf16 fwd+bwd",
                             host_us=_host_us(fn, args.n // 4)))
    with open(args.out, "w") as f:
        for r in rows:
            print(json.dumps(r))
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
