"""One Qwen3-14B-shaped layer's LoRA projections, peft against hearth's fused LoRA nodes (issue 16).

For each case -- the MLP (gate/up/down, LoRA on all three), q_proj (H -> Q) and o_proj (Q -> H) -- and each
provider -- "peft" (peft's lora.Linear modules as HF + peft run them: silu(g) * u in torch for the MLP),
"hearth" (kernels.lora: lora_swiglu_mlp via hearth.nn.SwiGLUMLP / lora_linear) and, for the MLP,
"hearth_recompute_up", and "hearth_base" (the same nodes with lora_compute="base": LoRA GEMMs in bf16) -- one forward + backward (x requires grad, LoRA r=16 alpha=32, fp32 adapters on a bf16
base, peft's defaults) is timed with CUDA events (median of --reps after --warmup), with:

    saved_mib   memory the forward leaves allocated for the backward, beyond x (the layer's input, alive anyway)
                and the output: memory_allocated after the forward - before (on the CPU: the distinct non-parameter
                storages autograd saves, counted with saved_tensors_hooks)
    peak_mib    max_memory_allocated over forward + backward, above what was allocated before
    max_diff    max |out_hearth - out_peft| (a sanity column; tests/kernels/test_lora.py checks numerics)

Prints a table and writes one JSON line per (case, provider) to --out.

    PYTHONPATH=src python3 scripts/gpu/lora_layer_probe.py --out benchmarks/lora/probe.jsonl     # H200, < 60 s
    PYTHONPATH=src TRITON_INTERPRET=1 python3 scripts/gpu/lora_layer_probe.py --smoke --out /tmp/p.jsonl  # CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

QWEN3_14B = dict(hidden=5120, inter=17408, q=40 * 128)
SMOKE = dict(hidden=64, inter=96, q=64)
MIB = 2**20


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="JSONL file to write (one row per case and provider)")
    p.add_argument("--tokens", type=int, default=4096, help="rows T of x (batch 1 x seq); default 4096")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton's interpreter): a self-test")
    a = p.parse_args(argv)
    for name in ("tokens", "rank", "reps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    return a


def _peft_wrap(module, targets, rank, alpha):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: B != 0, so hearth and peft are compared on a LoRA term that is not zero
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(module, cfg)


def build(case: str, shape: dict, rank: int, alpha: float, device, dtype):
    """(peft_fn, hearth_fns {provider: fn}, in_features, params) for one case; fn(x) -> out."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from hearth.kernels.lora import lora_linear, lora_parts
    from hearth.nn import SwiGLUMLP

    torch.manual_seed(0)
    h, i, q = shape["hidden"], shape["inter"], shape["q"]
    if case == "mlp":
        mlp = SwiGLUMLP(h, i, device=device, dtype=dtype)
        model = _peft_wrap(mlp, ["gate_proj", "up_proj", "down_proj"], rank, alpha)

        def peft_fn(x):
            return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

        def hearth_fn(x, recompute_up=False, compute="adapter"):
            mlp.recompute_up, mlp.lora_compute = recompute_up, compute
            if mlp._lora_parts(x) is None:
                raise RuntimeError("the fused LoRA MLP did not apply (projections not in a plain state)")
            return mlp(x)

        fns = {"hearth": hearth_fn, "hearth_recompute_up": lambda x: hearth_fn(x, True),
               "hearth_base": lambda x: hearth_fn(x, compute="base")}
        return peft_fn, fns, h, list(model.parameters())
    k, n = (h, q) if case == "q_proj" else (q, h)
    class OneProj(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(k, n, bias=False, device=device, dtype=dtype)

        def forward(self, x):
            return self.proj(x)

    holder = OneProj()
    model = _peft_wrap(holder, ["proj"], rank, alpha)
    layer = holder.proj

    def hearth_fn(x, compute="adapter"):
        parts = lora_parts(layer, x, compute)
        if parts is None:
            raise RuntimeError("lora_linear did not apply (the LoRA layer is not in a plain state)")
        return lora_linear(x, *parts)

    return layer, {"hearth": hearth_fn, "hearth_base": lambda x: hearth_fn(x, "base")}, k, list(model.parameters())


def measure(fn, x, dy, params, warmup: int, reps: int, cuda: bool, count_saved: bool = False) -> dict:
    """count_saved: measure saved bytes with saved_tensors_hooks (exact at toy sizes) instead of memory_allocated."""
    import torch

    def step():
        x.grad = None
        for p in params:
            p.grad = None
        out = fn(x)
        out.backward(dy)
        return out

    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    row = {"ms": round(statistics.median(times), 3), "ms_min": round(min(times), 3)}
    x.grad = None
    for p in params:
        p.grad = None
    if cuda and not count_saved:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(x)
        torch.cuda.synchronize()
        saved = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
        out.backward(dy)
        torch.cuda.synchronize()
        row["saved_mib"] = round(saved / MIB, 1)
        row["peak_mib"] = round((torch.cuda.max_memory_allocated() - before) / MIB, 1)
        del out
    else:  # the bytes autograd saves (distinct storages that are not parameters)
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (seen.append(t), t)[1], lambda t: t):
            out = fn(x)
        skip = {p.untyped_storage().data_ptr() for p in params} | {x.untyped_storage().data_ptr()}
        uniq = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in seen}
        row["saved_mib"] = round(sum(b for ptr, b in uniq.items() if ptr not in skip) / MIB, 4)
        row["peak_mib"] = None
        out.backward(dy)
    return row


def main(argv=None) -> int:
    a = _args(argv)
    import torch

    cuda = torch.cuda.is_available()  # --smoke on a GPU machine: tiny shapes on the GPU (no interpreter there)
    if not cuda and not a.smoke:
        print("lora_layer_probe: no CUDA GPU; use --smoke for the CPU self-test", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16
    shape = QWEN3_14B if not a.smoke else SMOKE
    tokens = a.tokens if not a.smoke else min(a.tokens, 8)
    reps, warmup = (a.reps, a.warmup) if not a.smoke else (1, 0)
    rows = []
    for case in ("mlp", "q_proj", "o_proj"):
        peft_fn, hearth_fns, k, params = build(case, shape, a.rank, a.alpha, device, dtype)
        gen = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(tokens, k, device=device, generator=gen).to(dtype).requires_grad_()
        with torch.no_grad():
            ref = peft_fn(x)
        dy = torch.randn(ref.shape, device=device, generator=gen).to(dtype)
        for provider, fn in [("peft", peft_fn)] + list(hearth_fns.items()):
            with torch.no_grad():
                diff = 0.0 if provider == "peft" else float((fn(x).float() - ref.float()).abs().max())
            row = {"case": case, "provider": provider, "tokens": tokens, "hidden": shape["hidden"],
                   "inter": shape["inter"], "q": shape["q"], "rank": a.rank, "dtype": "bf16",
                   "device": (torch.cuda.get_device_name(device) if cuda else "cpu") + (" (smoke)" if a.smoke else ""), "max_diff": diff}
            row.update(measure(fn, x, dy, params, warmup, reps, cuda, count_saved=a.smoke))
            rows.append(row)
        del peft_fn, hearth_fns, params, x, dy, ref
        if cuda:
            torch.cuda.empty_cache()
    base = {r["case"]: r for r in rows if r["provider"] == "peft"}
    for r in rows:
        b = base[r["case"]]
        r["speedup_vs_peft"] = round(b["ms"] / r["ms"], 3) if r["ms"] else None
        r["saved_vs_peft"] = round(r["saved_mib"] / b["saved_mib"], 3) if b["saved_mib"] else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"LoRA layer probe: T={tokens} H={shape['hidden']} I={shape['inter']} Q={shape['q']} "
                        f"r={a.rank} bf16 base, fp32 LoRA ({rows[0]['device']})")
    for col in ("case", "provider", "fwd+bwd ms", "x peft", "saved MiB", "x peft", "peak MiB", "max diff"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["case"], r["provider"], f"{r['ms']:.3f}", f"{r['speedup_vs_peft']}", f"{r['saved_mib']}",
                      f"{r['saved_vs_peft']}", str(r["peak_mib"]), f"{r['max_diff']:.3g}")
    Console().print(table)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
