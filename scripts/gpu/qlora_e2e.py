"""QLoRA on one GPU: a Qwen3-14B-SHAPED model (random weights) with a 4-bit NF4 base, one LoRA step timed.

    python scripts/gpu/qlora_e2e.py --out benchmarks/e2e/qlora_e2e.jsonl [--seq 2048] [--layers 40]
           [--setups lora_hearth,qlora_hf,qlora_hearth] [--memory-budget-gib 16] [--steps 3]
    python scripts/gpu/qlora_e2e.py --smoke --out /tmp/q.jsonl     # CPU, toy dims, TRITON_INTERPRET=1

Model: hidden 5120, 40 layers, 40 / 8 heads, head_dim 128, intermediate 17408, vocab 151936. QLoRA setups build
it on the meta device and materialise each decoder Linear straight into NF4 (hearth.train.qlora.random_4bit;
no download, never the whole model in 16 bits); lora_hearth is the bf16 base for comparison. LoRA r=16,
alpha=32 on q,k,v,o,gate,up,down (peft); activation checkpointing chosen by
hearth.train.finetune.plan_checkpointing for --memory-budget-gib on the QLoRA setups (default 16: the goal is a
peak <= 16 GiB, what a 24 GB card needs with room to spare) and for 90% of the GPU on lora_hearth; AdamW on the LoRA parameters; batch 1 of random tokens. One
warm-up step, then the median of --steps. Each setup runs in its own child process (patching is process-wide).

Setups: qlora_hf (plain transformers + peft on the 4-bit base), qlora_hearth (+ hearth.patch.apply after peft, as
`hearth train --qlora` applies it: norm, rope, loss, and hearth's LoRA-aware nodes on the 4-bit projections --
lora_linear for q/k/v/o, lora_swiglu_mlp for the MLP -- each weight dequantised where it is used, never kept for
the backward; until 2026-12-01 the patch ran before peft and the 4-bit projections ran as peft / bitsandbytes
modules with only silu(g) * u fused), lora_hearth (bf16 base + hearth, the `hearth train` run it is compared with).

Rows (JSONL, appended to --out; one per setup): setup, seq, layers, status (ok / oom / error / patch_incomplete:
hearth's patch replaced fewer modules than the model has, patch_gaps says which), step_s, steps_s,
tok_per_s, peak_gib, weights_gib, meets_goal (peak <= 16 GiB, QLoRA setups), checkpointing, patch, loss, build_s,
gpu, versions, date, command, commit + dirty, env. Needs bitsandbytes (pinned in requirements-ci.txt).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from e2e_common import (GIB, QWEN3_14B, SMOKE, child_env, child_main as _child_main, child_row, patch_gaps,
                        peak_reader, qwen3_config, qwen3_patch_expected, run_meta, step_fields, syncer, timed_steps)

SETUPS = ("lora_hearth", "qlora_hf", "qlora_hearth")
GOAL_GIB = 16.0
ROW_MARK = "QLORA_E2E_ROW "


def run_one(setup: str, seq: int, layers: int, steps: int, budget_gib: float, smoke: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hearth.train import finetune, qlora

    row: dict = {"setup": setup, "seq": seq, "layers": layers}
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    cuda = device.type == "cuda"
    sync = syncer(device)
    torch.manual_seed(0)
    start = time.perf_counter()
    config = qwen3_config(smoke, layers)
    if setup.startswith("qlora"):
        model = qlora.prepare(qlora.random_4bit(config, dtype=dtype, device=device))
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    row["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / GIB, 3)
    model = finetune.add_lora(model, rank=16, alpha=32.0)
    report = None
    if setup.endswith("hearth"):
        from hearth import patch

        # after peft, as `hearth train` does: the "lora" kind routes q/k/v/o (4-bit bases included) to the fused
        # LoRA node and the MLP probe checks its LoRA node on the 4-bit projections
        # SDPA attention, as in the published rows (attention=None would patch hearth's in on Hopper)
        report = patch.apply(model, attention=False)
        row["patch"] = report.as_dict()
        # a probe that failed leaves its kind on peft / PyTorch (the 2026-12-01 rows: rope left on every layer)
        row["patch_gaps"] = patch_gaps(row["patch"], qwen3_patch_expected(layers, attention=False))
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not setup.startswith("qlora"):  # the bf16 comparison runs as `hearth train` would: 90% of the GPU
        budget_gib = 0.9 * torch.cuda.get_device_properties(device).total_memory / GIB if cuda else None
    plan = finetune.plan_checkpointing(
        model.config, seq, weights_bytes=int(row["weights_gib"] * GIB), trainable_bytes=sum(p.numel() * 4 for p in trainable),
        bytes_per_el=dtype.itemsize, budget_gib=budget_gib,
        qlora=setup.startswith("qlora"), **finetune.patch_knobs(report))  # as `hearth train` plans
    finetune.apply_checkpointing(model, plan)
    row["checkpointing"] = {"mode": plan.mode, "checkpointed_layers": plan.checkpointed,
                            "estimate_gib": round(plan.estimate_gib, 2), "reason": plan.reason}
    model.train()
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device, generator=torch.Generator(device=device).manual_seed(1))
    sync()
    row["build_s"] = round(time.perf_counter() - start, 2)
    peak = peak_reader(device)
    try:  # the first step warms up (Triton JIT, cuBLAS heuristics, allocator)
        times, losses = timed_steps(model, ids, optimizer, 1 + steps, sync)
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0], "peak_gib": peak()}
    row.update(step_fields(times, losses, seq), peak_gib=peak())
    if setup.startswith("qlora") and row["peak_gib"] is not None:
        row["meets_goal"] = row["peak_gib"] <= GOAL_GIB
    if row.get("patch_gaps"):  # timed, but not the setup its name says
        row.update(status="patch_incomplete", error="; ".join(row["patch_gaps"])[:500])
    return row


def child_main(args) -> int:
    return _child_main(ROW_MARK, lambda: run_one(args.setup, args.seq, args.layers, args.steps,
                                                  args.memory_budget_gib, args.smoke), args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--memory-budget-gib", type=float, default=GOAL_GIB)
    parser.add_argument("--smoke", action="store_true", help="CPU, toy dims, TRITON_INTERPRET=1")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.layers is None:
        args.layers = SMOKE["num_hidden_layers"] if args.smoke else QWEN3_14B["num_hidden_layers"]
    if args.child:
        return child_main(args)
    setups = [s for s in args.setups.split(",") if s]
    if not setups or any(s not in SETUPS for s in setups):
        raise SystemExit(f"--setups must be a comma list of {SETUPS}, got {args.setups!r}")
    env = child_env(**({"TRITON_INTERPRET": "1"} if args.smoke else {}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    common = run_meta(("torch", "transformers", "peft", "triton", "bitsandbytes"))
    for setup in setups:
        cmd = [sys.executable, __file__, "--child", "--setup", setup, "--seq", str(args.seq), "--layers", str(args.layers),
               "--steps", str(args.steps), "--memory-budget-gib", str(args.memory_budget_gib), "--out", str(args.out)]
        proc = subprocess.run(cmd + (["--smoke"] if args.smoke else []), env=env, capture_output=True, text=True)
        row = child_row(proc.stdout, ROW_MARK) or {"setup": setup, "seq": args.seq, "status": "error",
                                                    "error": (proc.stderr or proc.stdout)[-800:]}
        row.update(common)
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("setup", "status", "tok_per_s", "peak_gib", "weights_gib", "meets_goal")}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
