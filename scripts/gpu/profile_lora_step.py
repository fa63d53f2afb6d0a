"""Where a LoRA step's GPU time goes: torch.profiler over one step of a Qwen3-14B-SHAPED model (random weights).

    python scripts/gpu/profile_lora_step.py --out DIR [--setups hf,liger,hearth] [--layers 8] [--seq 4096]
           [--checkpointing none|full]
    python scripts/gpu/profile_lora_step.py --smoke --out /tmp/prof     # CPU, toy dims, TRITON_INTERPRET=1

Same model, LoRA and patching as scripts/gpu/lora_e2e.py (its build()); fewer layers by default so
one setup profiles in well under a minute. One warm-up step, then one profiled step. Each setup runs in its own
process (patching is process-wide). Writes DIR/<setup>.txt (the profiler's table of GPU kernels by total GPU time,
top 40) and DIR/profile.jsonl (per setup: total GPU time, and the time in each category: GEMM, attention,
hearth's Triton kernels, elementwise/copies, other, with the host's step time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CATEGORIES = (  # first match wins; names are the CUDA kernel names the profiler reports
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul", "_mm_")),
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa")),
    ("hearth", ("_rms_norm", "_rope", "_swiglu", "_ce_", "_lce", "_softmax", "_layer_norm", "_attn")),
    ("elementwise", ("elementwise", "vectorized", "copy", "fill", "reduce", "cat", "index", "unrolled")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def child(args) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import lora_e2e
    from e2e_common import run_meta, syncer, timed_steps

    # the same model, LoRA and patching as lora_e2e.py's rows (hearth: patch.apply after get_peft_model)
    model, _fields, _report = lora_e2e.build(args.setup, seq=args.seq, layers=args.layers, smoke=args.smoke,
                                             dtype_name="float32" if args.smoke else "bfloat16")
    if args.checkpointing == "full":
        from hearth.train.finetune import enable_checkpointing

        enable_checkpointing(model)
    model.train()
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    cuda = device.type == "cuda"
    sync = syncer(device)

    def step():
        timed_steps(model, ids, optimizer, 1, sync)

    step()  # the warm-up (compiles, config picks, cuBLAS heuristics)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        step()
    host_s = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == cuda]
    key = "device_time_total" if cuda else "self_cpu_time_total"
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{'us total':>12} {'calls':>7}  kernel"]
    totals: dict[str, float] = {}
    for e in events:
        cat = category(e.key)
        totals[cat] = totals.get(cat, 0.0) + getattr(e, key)
    for e in events[:40]:
        lines.append(f"{getattr(e, key):>12.0f} {e.count:>7}  {e.key[:140]}")
    (out / f"{args.setup}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    row = {"setup": args.setup, "seq": args.seq, "layers": args.layers, "checkpointing": args.checkpointing,
           "patch_gaps": _fields.get("patch_gaps", []),  # non-empty: the profile is not of the setup its name says
           "host_step_s": round(host_s, 4), "gpu_ms_total": round(sum(totals.values()) / 1e3, 2),
           "gpu_ms_by_category": {k: round(v / 1e3, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
           **run_meta(("torch", "triton", "transformers", "peft", "liger_kernel"))}
    with (out / "profile.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--setups", default="hf,liger,hearth")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--checkpointing", choices=("none", "full"), default="none")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--setup", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from e2e_common import child_env

    env = child_env()
    rc = 0
    for setup in args.setups.split(","):
        cmd = [sys.executable, __file__, "--child", "--setup", setup, "--out", args.out, "--layers", str(args.layers),
               "--seq", str(args.seq), "--checkpointing", args.checkpointing] + (["--smoke"] if args.smoke else [])
        rc |= subprocess.run(cmd, env=env).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
