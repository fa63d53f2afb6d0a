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

Setups: qlora_hf (plain transformers + peft on the 4-bit base), qlora_hearth (+ hearth.patch.apply as
`hearth train --qlora` applies it: norm, rope, loss, and the MLP, whose 4-bit projections run as modules with the
silu(g) * u fused), lora_hearth (bf16
base + hearth, the `hearth train` run it is compared with).

Rows (JSONL, appended to --out; one per setup): setup, seq, layers, status (ok / oom / error), step_s, steps_s,
tok_per_s, peak_gib, weights_gib, meets_goal (peak <= 16 GiB, QLoRA setups), checkpointing, patch, loss, build_s,
gpu, versions, date, command. Needs bitsandbytes (pinned in requirements-ci.txt).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30
SETUPS = ("lora_hearth", "qlora_hf", "qlora_hearth")
QWEN3_14B = dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                 intermediate_size=17408, vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=False)
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=257, max_position_embeddings=256)
GOAL_GIB = 16.0
ROW_MARK = "QLORA_E2E_ROW "


def run_one(setup: str, seq: int, layers: int, steps: int, budget_gib: float, smoke: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from hearth.train import finetune, qlora

    row: dict = {"setup": setup, "seq": seq, "layers": layers}
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    start = time.perf_counter()
    config = Qwen3Config(**{**(SMOKE if smoke else QWEN3_14B), "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    config.use_cache = False
    if setup.startswith("qlora"):
        model = qlora.prepare(qlora.random_4bit(config, dtype=dtype, device=device))
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    row["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / GIB, 3)
    if setup.endswith("hearth"):
        from hearth import patch

        row["patch"] = patch.apply(model).as_dict()
    model = finetune.add_lora(model, rank=16, alpha=32.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not setup.startswith("qlora"):  # the bf16 comparison runs as `hearth train` would: 90% of the GPU
        budget_gib = 0.9 * torch.cuda.get_device_properties(device).total_memory / GIB if cuda else None
    plan = finetune.plan_checkpointing(
        model.config, seq, weights_bytes=int(row["weights_gib"] * GIB), trainable_bytes=sum(p.numel() * 4 for p in trainable),
        bytes_per_el=dtype.itemsize, budget_gib=budget_gib, patched=setup.endswith("hearth"),
        qlora=setup.startswith("qlora"))
    finetune.apply_checkpointing(model, plan)
    row["checkpointing"] = {"mode": plan.mode, "checkpointed_layers": plan.checkpointed,
                            "estimate_gib": round(plan.estimate_gib, 2), "reason": plan.reason}
    model.train()
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device, generator=torch.Generator(device=device).manual_seed(1))
    sync()
    row["build_s"] = round(time.perf_counter() - start, 2)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    peak = (lambda: round(torch.cuda.max_memory_allocated(device) / GIB, 2)) if cuda else (lambda: None)
    times, losses = [], []
    try:
        for _ in range(1 + steps):  # the first warms up (Triton JIT, cuBLAS heuristics, allocator)
            sync()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0], "peak_gib": peak()}
    step_s = statistics.median(times[1:])
    row.update(status="ok", step_s=round(step_s, 4), steps_s=[round(t, 4) for t in times], loss=losses,
               tok_per_s=round(seq / step_s, 1), peak_gib=peak())
    if setup.startswith("qlora") and row["peak_gib"] is not None:
        row["meets_goal"] = row["peak_gib"] <= GOAL_GIB
    return row


def child_main(args) -> int:
    try:
        row = run_one(args.setup, args.seq, args.layers, args.steps, args.memory_budget_gib, args.smoke)
    except Exception as exc:  # reported as a row: the parent goes on with the other setups
        import traceback

        traceback.print_exc()
        row = {"setup": args.setup, "seq": args.seq, "layers": args.layers, "status": "error",
               "error": f"{type(exc).__name__}: {exc}"}
    print(ROW_MARK + json.dumps(row), flush=True)
    return 0


def _versions() -> dict:
    out = {}
    for name in ("torch", "transformers", "peft", "triton", "bitsandbytes"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


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
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if args.smoke:
        env.setdefault("TRITON_INTERPRET", "1")
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except ImportError:
        gpu = "unknown"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    common = {"gpu": gpu, "versions": _versions(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    for setup in setups:
        cmd = [sys.executable, __file__, "--child", "--setup", setup, "--seq", str(args.seq), "--layers", str(args.layers),
               "--steps", str(args.steps), "--memory-budget-gib", str(args.memory_budget_gib), "--out", str(args.out)]
        proc = subprocess.run(cmd + (["--smoke"] if args.smoke else []), env=env, capture_output=True, text=True)
        rows = [json.loads(line[len(ROW_MARK):]) for line in proc.stdout.splitlines() if line.startswith(ROW_MARK)]
        row = rows[-1] if rows else {"setup": setup, "seq": args.seq, "status": "error",
                                     "error": (proc.stderr or proc.stdout)[-800:]}
        row.update(common)
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("setup", "status", "tok_per_s", "peak_gib", "weights_gib", "meets_goal")}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
