"""Where does the fused SwiGLU MLP's extra peak memory go? (H200, N=8192 H=4096 I=14336 bf16)

Records the CUDA caching allocator's history over one forward+backward (weights' .grad pre-allocated,
as tests/test_nn.py::test_swiglu_mlp_memory_at_target_shape does), replays the alloc/free events to
find the peak, and prints every block alive at the peak with the Python frame that allocated it.

    PYTHONPATH=src python3 scripts/gpu/mlp_memory_probe.py
"""

from __future__ import annotations

import torch

import hearth.nn as hnn


def main() -> None:
    n, h, i = 8192, 4096, 14336
    mlp = hnn.SwiGLUMLP(h, i, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for recompute_up in (False, True):
        mlp.recompute_up = recompute_up
        for p in mlp.parameters():
            p.grad = torch.zeros_like(p)
        x.grad = None
        dout = torch.ones(n, h, device="cuda", dtype=torch.bfloat16)
        mlp(x).backward(dout)  # warm-up: compile, cuBLAS workspace
        x.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        mlp(x).backward(dout)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated() - base
        live, now, best, at_best = {}, 0, 0, {}
        for ev in snap["device_traces"][0]:
            if ev["action"] == "alloc":
                live[ev["addr"]] = ev
                now += ev["size"]
                if now > best:
                    best, at_best = now, dict(live)
            elif ev["action"] in ("free_completed",):
                gone = live.pop(ev["addr"], None)
                if gone is not None:
                    now -= gone["size"]
        print(f"recompute_up={recompute_up}: extra peak {peak / 2**20:.1f} MiB (replayed new blocks at peak "
              f"{best / 2**20:.1f} MiB)")
        for ev in sorted(at_best.values(), key=lambda e: -e["size"])[:14]:
            frames = [f for f in ev.get("frames", []) if "hearth" in f.get("filename", "") or "torch/autograd" in f.get("filename", "")]
            where = "; ".join(f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in frames[:2]) or "?"
            print(f"  {ev['size'] / 2**20:8.1f} MiB  {where}")


if __name__ == "__main__":
    main()
