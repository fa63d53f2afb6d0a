"""The end-to-end figure: one LoRA fine-tune step on a Qwen3-14B-SHAPED model (random weights), one H200.

    python scripts/gpu/lora_e2e.py --out benchmarks/e2e/lora_e2e.jsonl [--seqs 4096,16384]
           [--setups hf,liger,hearth] [--layers 40] [--checkpointing full|auto] [--plot PNG]

Model: hidden 5120, 40 layers, 40 heads / 8 KV heads, head_dim 128, intermediate 17408, vocab 151936, bf16,
built directly on the GPU (torch.device context + from_config: seconds). LoRA r=16, alpha=32 on
q,k,v,o,gate,up,down (peft); gradient checkpointing on every layer (non-reentrant); batch 1; AdamW on the
LoRA parameters; SDPA attention; labels = input_ids (random tokens). One warm-up step, then the median of 3.
tokens/s = seq / median step time; peak = torch.cuda.max_memory_allocated over warm-up and steps (weights
included, as in the published targets).

Setups: hf (HF + peft), liger (+ liger_kernel.transformers.apply_liger_kernel_to_qwen3: rope, rms_norm,
swiglu, fused linear CE; reported as unavailable when it does not import), hearth (+ hearth.patch.apply),
and, only when asked for, hearth_attn (hearth + patch.apply(attention=True): hearth's attention kernel in
place of SDPA; not the published-target setup, which fixes SDPA attention).
Every (setup, seq) runs in its own child process: Liger and hearth patch modeling_qwen3 process-wide, so
isolation keeps the setups honest, and each child returns all of its GPU memory when it exits.
--checkpointing auto (hearth setups only) lets hearth.train.finetune.plan_checkpointing pick none / selective /
full for --memory-budget-gib (default 0.9 x the GPU) and records its choice.

Rows (JSONL, appended to --out): case, setup, seq, layers, status (ok / unavailable / oom / error),
step_s (median), steps_s, tok_per_s, peak_gib, weights_gib, build_s, target + meets_target for hearth,
gpu, versions, date, command. Targets: seq 4096 >= 4750 tok/s at <= 31.5 GiB,
seq 16384 >= 4200 tok/s at <= 41 GiB. Needs no pydantic. Total runtime < 8 minutes on an H200.
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
SETUPS = ("hf", "liger", "hearth", "hearth_attn")
DEFAULT_SETUPS = ("hf", "liger", "hearth")
QWEN3_14B = dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                 intermediate_size=17408, vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=False)
TARGETS = {4096: (4750.0, 31.5), 16384: (4200.0, 41.0)}  # tok/s at least, peak GiB at most
PEERS = {("hf", 4096): (3508.0, 38.05), ("hf", 16384): (3175.0, 67.32),  # the H200 anchors, for the table
         ("liger", 4096): (4115.0, 31.51), ("liger", 16384): (3641.0, 41.13)}
# --smoke (CPU, TRITON_INTERPRET=1): the same code path at toy dims, to check the script without a GPU
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=257, max_position_embeddings=256)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROW_MARK = "LORA_E2E_ROW "


# ------------------------------------------------------------------------------------------- child
def _versions() -> dict:
    import peft
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    for name in ("triton", "liger_kernel"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", None)
        except ImportError:
            out[name] = None
    if out.get("liger_kernel") is None:
        try:
            from importlib.metadata import version

            out["liger_kernel"] = version("liger-kernel")
        except Exception:  # not installed
            pass
    return out


def run_one(setup: str, seq: int, layers: int, steps: int, checkpointing: str, budget_gib: float | None,
            smoke: bool = False) -> dict:
    """Build, patch, LoRA-wrap and time one setup at one sequence length; returns the row (no I/O)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    row: dict = {"setup": setup, "seq": seq, "layers": layers}
    if setup == "liger":
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_qwen3
        except ImportError as exc:
            return {**row, "status": "unavailable", "error": f"liger_kernel: {exc}"}
        # class-level patch of modeling_qwen3, before the model exists (Liger's documented use)
        apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)

    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    start = time.perf_counter()
    config = Qwen3Config(**{**(SMOKE if smoke else QWEN3_14B), "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    config.use_cache = False
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / GIB
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0,
                                             bias="none", task_type="CAUSAL_LM"))
    if setup in ("hearth", "hearth_attn"):  # after peft, as `hearth train` applies it
        from hearth import patch

        report = patch.apply(model, attention=setup == "hearth_attn")
        row["patch"] = report.as_dict()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if checkpointing == "auto" and setup.startswith("hearth"):
        from hearth.train.finetune import apply_checkpointing, plan_checkpointing

        budget = budget_gib or (0.9 * torch.cuda.get_device_properties(device).total_memory / GIB if cuda else None)
        plan = plan_checkpointing(model.config, seq, weights_bytes=int(weights_gib * GIB),
                                  trainable_bytes=sum(p.numel() * 4 for p in trainable), bytes_per_el=dtype.itemsize,
                                  budget_gib=budget, patched=True)
        apply_checkpointing(model, plan)
        row["checkpointing"] = {"mode": plan.mode, "checkpointed_layers": plan.checkpointed,
                                "estimate_gib": round(plan.estimate_gib, 2), "reason": plan.reason}
    else:
        from hearth.train.finetune import enable_checkpointing

        enable_checkpointing(model)  # every layer, non-reentrant
        row["checkpointing"] = {"mode": "full", "checkpointed_layers": layers}
    model.train()
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device, generator=gen)
    sync()
    row["build_s"] = round(time.perf_counter() - start, 2)
    row["weights_gib"] = round(weights_gib, 2)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    peak = (lambda: round(torch.cuda.max_memory_allocated(device) / GIB, 2)) if cuda else (lambda: None)

    times, losses = [], []
    try:
        for _ in range(1 + steps):  # the first is the warm-up (Triton JIT, cuBLAS heuristics, allocator)
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
        return {**row, "status": "oom", "error": str(exc).splitlines()[0],
                "peak_gib": peak()}
    step_s = statistics.median(times[1:])
    row.update(status="ok", step_s=round(step_s, 4), steps_s=[round(t, 4) for t in times], loss=losses,
               tok_per_s=round(seq / step_s, 1), peak_gib=peak())
    return row


def child_main(args) -> int:
    try:
        row = run_one(args.setup, args.seq, args.layers, args.steps, args.checkpointing, args.memory_budget_gib,
                      smoke=args.smoke)
    except Exception as exc:  # reported as a row: the parent goes on with the other setups
        import traceback

        traceback.print_exc()
        row = {"setup": args.setup, "seq": args.seq, "layers": args.layers, "status": "error",
               "error": f"{type(exc).__name__}: {exc}"}
    print(ROW_MARK + json.dumps(row), flush=True)
    return 0


# ------------------------------------------------------------------------------------------- parent
def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except ImportError:
        return "unknown"


def _parse_list(text: str, kind, allowed=None, name="") -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"{name}: {exc}")
    if not values or (allowed and any(v not in allowed for v in values)):
        raise SystemExit(f"{name} must be a comma list of {allowed or kind.__name__}, got {text!r}")
    return values


def _child_env() -> dict:
    env = dict(os.environ)
    # hearth importable from a plain checkout (not installed) too
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def parent_main(args) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console()
    seqs = _parse_list(args.seqs, int, name="--seqs")
    setups = _parse_list(args.setups, str, SETUPS, name="--setups")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"case": "lora_qwen3_14b_shape", "gpu": _gpu_name(), "versions": _versions(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv])}
    rows = []
    with Progress(console=console) as progress:
        task = progress.add_task("lora e2e", total=len(seqs) * len(setups))
        for seq in seqs:
            for setup in setups:
                progress.update(task, description=f"{setup} seq {seq}")
                cmd = [sys.executable, __file__, "--child", "--setup", setup, "--seq", str(seq), "--layers",
                       str(args.layers), "--steps", str(args.steps), "--checkpointing", args.checkpointing]
                if args.smoke:
                    cmd.append("--smoke")
                if args.memory_budget_gib:
                    cmd += ["--memory-budget-gib", str(args.memory_budget_gib)]
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout_s,
                                          env=_child_env())
                    found = [ln for ln in proc.stdout.splitlines() if ln.startswith(ROW_MARK)]
                    row = json.loads(found[-1][len(ROW_MARK):]) if found else {
                        "setup": setup, "seq": seq, "layers": args.layers, "status": "error",
                        "error": f"child exited {proc.returncode}: {proc.stderr[-2000:]}"}
                    if row["status"] == "error":
                        console.print(proc.stderr[-3000:])
                except subprocess.TimeoutExpired:
                    row = {"setup": setup, "seq": seq, "layers": args.layers, "status": "error",
                           "error": f"timed out after {args.child_timeout_s} s"}
                if setup.startswith("hearth") and seq in TARGETS and row.get("status") == "ok" and args.layers == 40:
                    tps, gib = TARGETS[seq]
                    row["target"] = {"tok_per_s": tps, "peak_gib": gib}
                    row["meets_target"] = row["tok_per_s"] >= tps and row["peak_gib"] <= gib
                row = {**meta, **row}
                rows.append(row)
                with out.open("a", encoding="utf-8") as fh:  # one row at a time: a later crash keeps earlier rows
                    fh.write(json.dumps(row) + "\n")
                progress.advance(task)

    table = Table(title=f"LoRA step, Qwen3-14B shape ({args.layers} layers), {meta['gpu']}")
    for col in ("seq", "setup", "status", "tok/s", "peak GiB", "H200 anchor", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        anchor = PEERS.get((row["setup"], row["seq"]))
        target = row.get("target")
        table.add_row(str(row["seq"]), row["setup"], row["status"] if row["status"] == "ok" else f"{row['status']}: {row.get('error', '')[:60]}",
                      f"{row.get('tok_per_s', '-')}", f"{row.get('peak_gib', '-')}",
                      f"{anchor[0]:.0f} tok/s, {anchor[1]} GiB" if anchor else "-",
                      ("[green]met[/green]" if row.get("meets_target") else "[red]missed[/red]") + f" ({target['tok_per_s']:.0f}, {target['peak_gib']})" if target else "-")
    console.print(table)
    console.print(f"rows appended to {out}")
    if args.plot:
        _plot(rows, Path(args.plot), meta)
        console.print(f"plot: {args.plot}")
    return 0 if all(r["status"] in ("ok", "unavailable") for r in rows) else 1


def _plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    seqs = sorted({r["seq"] for r in ok})
    setups = [s for s in SETUPS if any(r["setup"] == s for r in ok)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(len(setups), 1)
    for i, setup in enumerate(setups):
        for ax, key in zip(axes, ("tok_per_s", "peak_gib")):
            values = [next((r[key] or 0 for r in ok if r["setup"] == setup and r["seq"] == s), 0) for s in seqs]
            ax.bar([j + i * width for j in range(len(seqs))], values, width, label=setup)
    for ax, label in zip(axes, ("tokens/s (higher is better)", "peak GiB (lower is better)")):
        ax.set_xticks([j + width * (len(setups) - 1) / 2 for j in range(len(seqs))], [f"seq {s}" for s in seqs])
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"LoRA step, Qwen3-14B shape, {meta['gpu']} ({meta['date'][:10]})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/e2e/lora_e2e.jsonl", help="JSONL file rows are appended to")
    parser.add_argument("--seqs", default="4096,16384")
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                        help="comma list of hf, liger, hearth, hearth_attn (hearth + its attention kernel, opt-in)")
    parser.add_argument("--layers", type=int, default=40, help="fewer layers for a quick check (targets need 40)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up (median reported)")
    parser.add_argument("--checkpointing", choices=("full", "auto"), default="full",
                        help="full (the published-target setup) or auto (hearth picks for the memory budget)")
    parser.add_argument("--memory-budget-gib", type=float, default=None)
    parser.add_argument("--child-timeout-s", type=int, default=240)
    parser.add_argument("--plot", default=None, help="also write a PNG of tok/s and peak memory")
    parser.add_argument("--smoke", action="store_true", help="toy dims on the CPU (TRITON_INTERPRET=1): checks the script")
    # internal: one (setup, seq) in this process
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layers < 1 or args.steps < 1:
        parser.error("--layers and --steps must be >= 1")
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
