"""The end-to-end figure: one LoRA fine-tune step on a Qwen3-14B-SHAPED model (random weights), one H200.

    python scripts/gpu/lora_e2e.py --out benchmarks/e2e/lora_e2e.jsonl [--seqs 4096,16384]
           [--setups hf,liger,hearth] [--layers 40] [--steps 3] [--plot PNG]
           [--checkpointing none|selective|full|auto|best] [--checkpointed N] [--memory-budget-gib B] [--budget-gib B]
           [--time-budget-s S] [--pack N]
    python scripts/gpu/lora_e2e.py --match-steps 20 --out DIR/match.jsonl [--setups hf,hearth,liger]
    python scripts/gpu/lora_e2e.py --smoke ...          # CPU, toy dims, TRITON_INTERPRET=1: checks the script

Model: hidden 5120, 40 layers, 40 heads / 8 KV heads, head_dim 128, intermediate 17408, vocab 151936, bf16,
built directly on the GPU (torch.device context + from_config: seconds). LoRA r=16, alpha=32 on
q,k,v,o,gate,up,down (peft, fp32 adapters); batch 1; AdamW on the LoRA parameters; SDPA attention; labels =
input_ids (random tokens). One warm-up step, then the median of --steps. tokens/s = seq / median step time;
peak = torch.cuda.max_memory_allocated over warm-up and steps (weights included).

Setups (each (setup, seq, setting) in its own child process: Liger and hearth patch modeling_qwen3
process-wide, and a child returns all of its GPU memory when it exits):
  hf           HF + peft
  liger        + liger_kernel.transformers.apply_liger_kernel_to_qwen3 (rope, rms_norm, swiglu, fused linear CE)
  hearth       + hearth.patch.apply, after get_peft_model (so hearth's LoRA-aware nodes apply where they exist);
               the patch report is printed and stored with the row
  hearth_fast  hearth + patch.apply(lora_compute="base"): the LoRA-aware nodes run the adapters' products in bf16
               on the tensor cores (fp32 accumulation and fp32 gradients; not peft's fp32 numbers bit for bit)
  hearth_attn  hearth + patch.apply(attention=True). The setups without _attn pin SDPA (attention=False), as every
               published row before hearth's attention became patch.apply's default by device did
  hearth_fast_attn  hearth_fast + attention=True: hearth's attention in place of SDPA (on the H200 what
               `hearth train` runs by default)
  unsloth      Unsloth's FastLanguageModel (opt-in): imported first, as Unsloth requires; when it does not
               import the row says `unavailable` and why. The random model is saved to /tmp and loaded by
               FastLanguageModel.from_pretrained (~70 s more build at 40 layers); --checkpointing full is
               Unsloth's own "unsloth" (offloaded) checkpointing, anything else none; the planner estimate uses
               HF's knobs. On the H200 image it needs carried wheels: scripts/gpu/unsloth_wheels.sh
A setup whose package does not import is reported `unavailable` with the reason.

--pack N: the seq tokens are one PACKED row of N sequences (lengths alternately 1/2 and 3/2 of seq / N, the bench's
attention_varlen spread), as `hearth train --pack` builds it: position ids restarting at each sequence and
transformers' varlen kwargs. Without hearth's attention, transformers reads the packing from the position ids and
SDPA attends through a [seq, seq] block-diagonal mask; with it (the _attn setups), hearth's varlen kernel runs on the
offsets and no mask is built. The planner's estimate does not count that mask. Rows carry `pack`.

Activation checkpointing (non-reentrant; selective = the LAST N decoder layers):
  none / full; selective --checkpointed N; auto: hearth.train.finetune.plan_checkpointing picks for
  --memory-budget-gib (default 0.9 x the GPU); best (--budget-gib B): per setup the fastest setting whose
  planner estimate fits B; an OOM at run time is recorded (status oom) and the next lighter setting (half way
  to full, then full) is tried, each in a new child.
Every row records the planner's estimate for the setting it ran, computed for that setup's kernels
(estimate_peak_gib's knobs: hf unpatched, liger, hearth patched and fused_lora when hearth's LoRA nodes
replaced any projection), beside the measured peak: checkpointing.estimate_gib, peak_gib, peak_over_estimate.

--match-steps N: hf, hearth (and liger / unsloth if listed) train N AdamW steps (lr 2e-4) on one FIXED batch at
--layers (default 4), --seqs (default 1024), bf16 base, fp32 LoRA; plus `reference`: HF + peft with an fp32 base.
Each child saves its N fp32 losses and LoRA weights to OUT_DIR/match-<setup>.pt; the parent writes one JSONL row:
max |loss diff| and max |LoRA weight diff| between each setup and hf, each setup's error against the reference,
and whether it is within the rule of tests/kernels/tolerance.py: err(setup) <= 2 x err(hf) + 1e-3 x max(1, |ref|)
(hf: PyTorch's own bf16 run of the same training; factor 4 under Triton's CPU interpreter, which truncates bf16).

Rows (JSONL, appended to --out): case, setup, seq, layers, status (ok / unavailable / oom / error / skipped /
patch_incomplete: timed, but Liger's or hearth's patch put fewer kernels in place than the model has -- patch_gaps
says which -- so the row is not that setup),
checkpointing {mode, checkpointed_layers, estimate_gib, ...}, step_s (median), steps_s, tok_per_s, peak_gib,
peak_over_estimate, weights_gib, build_s, patch (hearth), budget_gib (best), target + meets_target (hearth),
liger_patch (liger), patch_gaps, gpu, versions, date, command, commit + dirty, env (HEARTH_* / TRITON_* / NCCL_* /
allocator / thread variables the child ran under). --time-budget-s S stops starting children once S seconds have passed (rows
`skipped`). Needs no pydantic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from e2e_common import (GIB, LORA_TARGETS, child_env, child_main as _child_main, child_row, liger_applied, packed_batch,
                        patch_gaps, peak_reader, qwen3_config, qwen3_patch_expected, run_meta, step_fields, syncer,
                        timed_steps)

SETUPS = ("hf", "liger", "hearth", "hearth_fast", "hearth_attn", "hearth_fast_attn", "unsloth")
DEFAULT_SETUPS = ("hf", "liger", "hearth")
MODES = ("none", "selective", "full", "auto", "best")
TARGETS = {4096: (4750.0, 31.5), 16384: (4200.0, 41.0)}  # lean mode: tok/s at least, peak GiB at most
SPEED_TARGETS = {4096: (7000.0, 80.0), 16384: (5000.0, 80.0)}  # speed mode (budget 80 GiB)
ROW_MARK = "LORA_E2E_ROW "
MATCH_LR = 2e-4
FACTOR, FLOOR_BF16 = 2.0, 1e-3  # tests/kernels/tolerance.py's rule for bf16


# ------------------------------------------------------------------------------------------- child
def knobs(setup: str, report=None) -> dict:
    """estimate_peak_gib's knobs for a setup (hearth: from its patch report, as `hearth train` plans)."""
    if setup == "liger":
        return {"patched": False, "liger": True}
    if setup.startswith("hearth"):
        from hearth.train.finetune import patch_knobs

        return patch_knobs(report)
    return {"patched": False}  # hf, unsloth (its own kernels: estimated as HF, said so in the row)


def _unsloth_model(config, dtype, seq: int, checkpointed: int, layers: int, tmp: Path):
    """Unsloth's documented path: FastLanguageModel.from_pretrained on a local folder (the random model saved
    there first: it loads nothing else), then its get_peft_model with the same LoRA."""
    import torch
    from transformers import AutoModelForCausalLM
    from unsloth import FastLanguageModel  # imported (first) by run_one already

    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    base.save_pretrained(tmp)
    del base
    torch.cuda.empty_cache()
    model, _ = FastLanguageModel.from_pretrained(str(tmp), max_seq_length=seq, dtype=dtype, load_in_4bit=False,
                                                 local_files_only=True)
    return FastLanguageModel.get_peft_model(
        model, r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0, bias="none",
        use_gradient_checkpointing="unsloth" if checkpointed == layers else False, random_state=0)


def build(setup: str, *, seq: int, layers: int, smoke: bool, dtype_name: str, checkpointed_hint: int = 0,
          same_weights: bool = False):
    """(model, row fields, patch report) for one setup; raises _Unavailable when its package does not import."""
    if setup == "unsloth":
        try:
            import unsloth  # noqa: F401  (before transformers, as Unsloth requires)
        except Exception as exc:  # ImportError, or its own NotImplementedError / RuntimeError on this machine
            raise _Unavailable(f"unsloth: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if setup == "liger":
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_qwen3
        except ImportError as exc:
            raise _Unavailable(f"liger_kernel: {exc}")
        # class-level patch of modeling_qwen3, before the model exists (Liger's documented use)
        apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)
    device = torch.device("cpu" if smoke else "cuda")
    dtype = getattr(torch, dtype_name)
    config = qwen3_config(smoke, layers)
    fields: dict = {}
    torch.manual_seed(0)
    if setup == "unsloth":
        import tempfile

        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            model = _unsloth_model(config, dtype, seq, checkpointed_hint, layers, Path(tmp))
        return model, fields, None
    # same_weights (the match mode): built in fp32 and cast, so that every dtype starts from the same weights
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if same_weights else dtype)
    model.to(dtype)
    if setup == "liger":  # what Liger put in place: a row labelled liger runs Liger's kernels, or says it does not
        fields["liger_patch"], fields["patch_gaps"] = liger_applied(model, layers)
    torch.manual_seed(1)  # the LoRA init: the same for every setup
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0,
                                             bias="none", task_type="CAUSAL_LM"))
    report = None
    if setup.startswith("hearth"):
        from hearth import patch

        fields["lora_compute"] = "base" if setup.startswith("hearth_fast") else "adapter"
        report = patch.apply(model, attention=setup.endswith("_attn"), lora_compute=fields["lora_compute"])
        fields["patch"] = report.as_dict()
        fields["patch_text"] = str(report)
        # fewer modules replaced than the model has (a probe that failed, a kernel left) is not the setup it names
        fields["patch_gaps"] = patch_gaps(fields["patch"], qwen3_patch_expected(layers, attention=setup.endswith("_attn")))
    return model, fields, report


class _Unavailable(Exception):
    pass


def _lora_state(model) -> dict:
    """The trained LoRA weights by name, fp32 on the CPU (peft's names: the same for every setup)."""
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def run_one(setup: str, seq: int, layers: int, steps: int, checkpointing: str, budget_gib: float | None,
            checkpointed: int | None = None, smoke: bool = False, dtype_name: str | None = None,
            match_file: str | None = None, pack: int = 0) -> dict:
    """Build, patch, LoRA-wrap and time one setup at one sequence length; returns the row.
    match_file: train `steps` steps on the fixed batch and save losses + LoRA weights there (no warm-up).
    pack: N > 0 makes the row N packed sequences (--pack)."""
    row: dict = {"setup": setup, "seq": seq, "layers": layers}
    if pack:
        row["pack"] = pack
    dtype_name = dtype_name or ("float32" if smoke else "bfloat16")
    hint = layers if checkpointing == "full" else 0
    start = time.perf_counter()
    try:
        model, fields, report = build(setup, seq=seq, layers=layers, smoke=smoke, dtype_name=dtype_name,
                                      checkpointed_hint=hint, same_weights=match_file is not None)
    except _Unavailable as exc:
        return {**row, "status": "unavailable", "error": str(exc)}
    import torch

    from hearth.train.finetune import GIB as _G, apply_checkpointing, estimate_peak_gib, plan_checkpointing, CheckpointPlan

    row.update(fields)
    if report is not None:
        report.print()
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    sync = syncer(device)
    config = model.config
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    el = torch.finfo(getattr(torch, dtype_name)).bits // 8
    kw = dict(weights_bytes=weights_bytes, trainable_bytes=sum(p.numel() * 4 for p in trainable), bytes_per_el=el,
              **knobs(setup, report))
    if setup == "unsloth" and checkpointing != "full":  # Unsloth checkpoints all layers or none
        plan = CheckpointPlan(0, layers, estimate_peak_gib(config, seq, 0, **kw), budget_gib,
                              "none (Unsloth checkpoints all layers or none; after an OOM best tries full)")
    elif checkpointing in ("auto", "best"):
        budget = budget_gib or (0.9 * torch.cuda.get_device_properties(device).total_memory / _G if cuda else None)
        plan = plan_checkpointing(config, seq, budget_gib=budget, **kw)
    else:
        c = {"none": 0, "full": layers}.get(checkpointing, checkpointed)
        if c is None or not 0 <= c <= layers:
            raise ValueError(f"--checkpointed must be in [0, {layers}] for selective, got {checkpointed!r}")
        plan = CheckpointPlan(c, layers, estimate_peak_gib(config, seq, c, **kw), budget_gib, f"{checkpointing} (asked)")
    if setup != "unsloth":  # Unsloth checkpoints through its own get_peft_model argument (none or full)
        apply_checkpointing(model, plan)
    row["checkpointing"] = {"mode": plan.mode, "checkpointed_layers": plan.checkpointed,
                            "estimate_gib": round(plan.estimate_gib, 2), "reason": plan.reason,
                            "knobs": {k: v for k, v in kw.items() if not k.endswith("bytes")}}
    if setup == "unsloth":
        row["checkpointing"]["note"] = "estimated with HF's knobs (Unsloth's own kernels are not modelled)"
    model.train()
    optimizer = torch.optim.AdamW(trainable, lr=MATCH_LR if match_file else 1e-4, weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device, generator=gen)
    if pack:
        from hearth.bench.cases import varlen_lengths

        ids = packed_batch(ids, varlen_lengths(pack, seq))
    sync()
    row["build_s"] = round(time.perf_counter() - start, 2)
    row["weights_gib"] = round(weights_bytes / GIB, 2)
    peak = peak_reader(device)

    try:  # timing: the first step is the warm-up
        times, losses = timed_steps(model, ids, optimizer, steps if match_file else 1 + steps, sync)
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0], "peak_gib": peak()}
    if match_file:
        state = _lora_state(model)
        torch.save({"losses": losses, "lora": state, "dtype": dtype_name}, match_file)
        digest = hashlib.sha256()
        for name in sorted(state):
            digest.update(name.encode() + state[name].numpy().tobytes())
        row.update(status="ok", loss=losses, match_file=match_file, peak_gib=peak(), lora_sha256=digest.hexdigest(),
                   lora_abs_sum=float(sum(t.abs().sum() for t in state.values())))
        return _gaps_status(row)
    row.update(step_fields(times, losses, seq), peak_gib=peak())
    if row["peak_gib"] is not None:
        row["peak_over_estimate"] = round(row["peak_gib"] / plan.estimate_gib, 3)
    return _gaps_status(row)


def _gaps_status(row: dict) -> dict:
    """An ok row whose setup did not patch what its name says is timed, but not `ok`: it is not that setup."""
    if row.get("status") == "ok" and row.get("patch_gaps"):
        row["status"] = "patch_incomplete"
        row["error"] = "; ".join(row["patch_gaps"])[:500]
    return row


def child_main(args) -> int:
    return _child_main(ROW_MARK, lambda: run_one(
        args.setup, args.seq, args.layers, args.steps, args.checkpointing, args.memory_budget_gib,
        checkpointed=args.checkpointed, smoke=args.smoke, dtype_name=args.dtype, match_file=args.match_file,
        pack=args.pack), args)


# ------------------------------------------------------------------------------------------- parent

def _parse_list(text: str, kind, allowed=None, name="") -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"{name}: {exc}")
    if not values or (allowed and any(v not in allowed for v in values)):
        raise SystemExit(f"{name} must be a comma list of {allowed or kind.__name__}, got {text!r}")
    return values


class Runner:
    """Starts children, one at a time, within an optional wall-clock budget."""

    def __init__(self, args, console):
        self.args, self.console = args, console
        self.t0 = time.monotonic()

    def left_s(self) -> float | None:
        if not self.args.time_budget_s:
            return None
        return self.args.time_budget_s - (time.monotonic() - self.t0)

    def child(self, setup: str, seq: int, mode: str, *, checkpointed=None, budget=None, dtype=None, match_file=None,
              steps=None) -> dict:
        args = self.args
        base = {"setup": setup, "seq": seq, "layers": args.layers, **({"pack": args.pack} if args.pack else {})}
        left = self.left_s()
        if left is not None and left < args.min_child_s:
            return {**base, "status": "skipped", "error": f"time budget: {max(left, 0):.0f} s left of {args.time_budget_s} s"}
        cmd = [sys.executable, __file__, "--child", "--setup", setup, "--seq", str(seq), "--layers", str(args.layers),
               "--steps", str(steps or args.steps), "--checkpointing", mode]
        if args.smoke:
            cmd.append("--smoke")
        if checkpointed is not None:
            cmd += ["--checkpointed", str(checkpointed)]
        if budget:
            cmd += ["--memory-budget-gib", str(budget)]
        if dtype:
            cmd += ["--dtype", dtype]
        if match_file:
            cmd += ["--match-file", str(match_file)]
        if args.pack:
            cmd += ["--pack", str(args.pack)]
        timeout = args.child_timeout_s if left is None else max(1, min(args.child_timeout_s, int(left)))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=child_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
            row = child_row(proc.stdout, ROW_MARK) or {
                **base, "status": "error", "error": f"child exited {proc.returncode}: {proc.stderr[-2000:]}"}
            if row["status"] == "error":
                self.console.print(proc.stderr[-3000:])
            elif row.get("patch_text"):  # hearth's patch report, as the child printed it
                self.console.print(f"[bold]{setup} seq {seq}[/bold] patch: {row['patch_text']}")
        except subprocess.TimeoutExpired:
            row = {**base, "status": "error", "error": f"timed out after {timeout} s"}
        return row


def _ladder(first: int, layers: int) -> list[int]:
    """The settings tried after an OOM at `first` checkpointed layers: half way to full, then full."""
    return sorted({first, (first + layers + 1) // 2, layers})


def sweep_rows(args, runner: Runner, seqs: list[int], setups: list[str], on_row) -> None:
    for seq in seqs:
        for setup in setups:
            if args.checkpointing != "best":
                on_row(runner.child(setup, seq, args.checkpointing, checkpointed=args.checkpointed,
                                    budget=args.memory_budget_gib))
                continue
            row = runner.child(setup, seq, "best", budget=args.budget_gib)
            row["budget_gib"] = args.budget_gib
            on_row(row)
            if row.get("status") != "oom":
                continue
            first = row.get("checkpointing", {}).get("checkpointed_layers", 0)
            for c in ([args.layers] if setup == "unsloth" else _ladder(first, args.layers)[1:]):
                row = runner.child(setup, seq, "selective" if c < args.layers else "full", checkpointed=c)
                row["budget_gib"] = args.budget_gib
                row["after_oom"] = True
                on_row(row)
                if row.get("status") != "oom":
                    break


def _rule(err: float, err_hf: float, scale: float, interpret: bool) -> tuple[bool, float]:
    bound = FACTOR * (2.0 if interpret else 1.0) * err_hf + FLOOR_BF16 * max(1.0, scale)
    return err <= bound, bound


def match_rows(args, runner: Runner, seq: int, setups: list[str], out_dir: Path) -> dict:
    """--match-steps: every setup (bf16 base) and the fp32-base reference train on the same batch."""
    import torch

    files, status = {}, {}
    runs = [("reference", "hf", "float32")] + [(s, s, "bfloat16") for s in ["hf", *[s for s in setups if s != "hf"]]]
    for name, setup, dtype in runs:
        path = out_dir / f"match-{name}.pt"
        row = runner.child(setup, seq, "none", dtype=dtype, match_file=path, steps=args.match_steps)
        status[name] = {k: row.get(k) for k in ("status", "error", "patch", "lora_sha256", "lora_abs_sum")
                        if row.get(k) is not None}
        if row.get("status") == "ok":
            files[name] = torch.load(path)
    result: dict = {"case": "lora_match_steps", "steps": args.match_steps, "seq": seq, "layers": args.layers,
                    "lr": MATCH_LR, "reference": "HF + peft, fp32 base (same weights, batch, LoRA init)",
                    "rule": "err(setup) <= 2 x err(hf bf16) + 1e-3 x max(1, max |ref|) (tests/kernels/tolerance.py; "
                            "factor 4 under the CPU interpreter)", "runs": status}
    if "reference" not in files or "hf" not in files:
        return {**result, "status": "error", "error": "the reference or the hf run failed"}
    ref, hf = files["reference"], files["hf"]
    interpret = args.smoke and os.environ.get("TRITON_INTERPRET") == "1"

    def errs(run) -> dict:
        loss_err = max(abs(a - b) for a, b in zip(run["losses"], ref["losses"]))
        w_err = max(float((run["lora"][n] - ref["lora"][n]).abs().max()) for n in ref["lora"])
        return {"loss": loss_err, "lora": w_err}

    e_hf = errs(hf)
    loss_scale = max(abs(x) for x in ref["losses"])
    w_scale = max(float(t.abs().max()) for t in ref["lora"].values())
    result.update(status="ok", losses={k: v["losses"] for k, v in files.items()}, err_vs_reference={"hf": e_hf},
                  compared={})
    for name, run in files.items():
        if name in ("reference", "hf"):
            continue
        e = errs(run)
        ok_loss, b_loss = _rule(e["loss"], e_hf["loss"], loss_scale, interpret)
        ok_w, b_w = _rule(e["lora"], e_hf["lora"], w_scale, interpret)
        result["err_vs_reference"][name] = e
        result["compared"][name] = {
            "max_loss_diff_vs_hf": max(abs(a - b) for a, b in zip(run["losses"], hf["losses"])),
            "max_lora_diff_vs_hf": max(float((run["lora"][n] - hf["lora"][n]).abs().max()) for n in hf["lora"]),
            "loss_bound": b_loss, "lora_bound": b_w, "losses_within_rule": ok_loss, "lora_within_rule": ok_w}
    return result


def parent_main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    setups = _parse_list(args.setups, str, SETUPS, name="--setups")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = run_meta(("torch", "triton", "transformers", "peft", "liger_kernel", "unsloth"))
    runner = Runner(args, console)
    if args.match_steps:
        seq = _parse_list(args.seqs or ("32" if args.smoke else "1024"), int, name="--seqs")[0]
        row = {**match_rows(args, runner, seq, setups, out.parent), **meta}
        with out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        table = Table(title=f"{args.match_steps} AdamW steps on one batch, seq {seq}, {args.layers} layers")
        for col in ("setup", "err vs fp32 ref: loss / LoRA", "max diff vs hf: loss / LoRA", "within the rule"):
            table.add_column(col, justify="right")
        for name, e in row.get("err_vs_reference", {}).items():
            c = row["compared"].get(name)
            table.add_row(name, f"{e['loss']:.3g} / {e['lora']:.3g}",
                          f"{c['max_loss_diff_vs_hf']:.3g} / {c['max_lora_diff_vs_hf']:.3g}" if c else "-",
                          (f"losses {'yes' if c['losses_within_rule'] else 'NO'}, LoRA {'yes' if c['lora_within_rule'] else 'NO'}") if c else "(the rule's baseline)")
        console.print(table if row["status"] == "ok" else f"[red]{row.get('error')}[/red] {row.get('runs')}")
        console.print(f"row appended to {out}")
        return 0 if row["status"] == "ok" else 1

    seqs = _parse_list(args.seqs or "4096,16384", int, name="--seqs")
    rows = []

    def on_row(row: dict) -> None:
        if row["setup"].startswith("hearth") and row.get("status") == "ok" and args.layers == 40:
            goals = SPEED_TARGETS if (args.budget_gib or 0) > 41 else TARGETS
            if row["seq"] in goals:
                tps, gib = goals[row["seq"]]
                row["target"] = {"tok_per_s": tps, "peak_gib": gib}
                row["meets_target"] = row["tok_per_s"] >= tps and row["peak_gib"] <= gib
        row = {"case": "lora_qwen3_14b_shape", **meta, **row}
        rows.append(row)
        with out.open("a", encoding="utf-8") as fh:  # one row at a time: a later crash keeps earlier rows
            fh.write(json.dumps(row) + "\n")
        ck = row.get("checkpointing", {})
        console.print(f"{row['setup']} seq {row['seq']} {ck.get('mode', '-')}({ck.get('checkpointed_layers', '-')}): "
                      f"{row['status']} {row.get('tok_per_s', '')} tok/s peak {row.get('peak_gib')} GiB, "
                      f"estimate {ck.get('estimate_gib')} GiB {row.get('error', '')[:200]}")

    sweep_rows(args, runner, seqs, setups, on_row)

    title = f"LoRA step, Qwen3-14B shape ({args.layers} layers), {meta['gpu']}" + (f", {args.pack} packed sequences" if args.pack else "")
    if args.checkpointing == "best":
        title += f", best setting within {args.budget_gib} GiB"
    table = Table(title=title)
    for col in ("seq", "setup", "checkpointing", "status", "tok/s", "peak GiB", "estimate GiB", "peak/est", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        ck = row.get("checkpointing", {})
        target = row.get("target")
        table.add_row(str(row["seq"]), row["setup"], f"{ck.get('mode', '-')} {ck.get('checkpointed_layers', '')}",
                      row["status"] if row["status"] == "ok" else f"{row['status']}: {row.get('error', '')[:60]}",
                      f"{row.get('tok_per_s', '-')}", f"{row.get('peak_gib', '-')}", f"{ck.get('estimate_gib', '-')}",
                      f"{row.get('peak_over_estimate', '-')}",
                      ("[green]met[/green]" if row.get("meets_target") else "[red]missed[/red]") + f" ({target['tok_per_s']:.0f}, {target['peak_gib']})" if target else "-")
    console.print(table)
    console.print(f"rows appended to {out}")
    if args.plot:
        _plot(rows, Path(args.plot), meta)
        console.print(f"plot: {args.plot}")
    return 0 if all(r["status"] in ("ok", "unavailable", "oom", "skipped") for r in rows) else 1


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
            # the last ok row of a (setup, seq): after an OOM, the setting that ran
            values = [next((r[key] or 0 for r in reversed(ok) if r["setup"] == setup and r["seq"] == s), 0) for s in seqs]
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
    parser.add_argument("--seqs", default=None, help="comma list (default 4096,16384; --match-steps: 1024)")
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS), help=f"comma list of {', '.join(SETUPS)}")
    parser.add_argument("--layers", type=int, default=None, help="default 40 (--match-steps: 4); targets need 40")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up (median reported)")
    parser.add_argument("--checkpointing", choices=MODES, default="full",
                        help="none, selective (--checkpointed N), full, auto (planner at --memory-budget-gib), "
                             "best (per setup the fastest setting the planner fits in --budget-gib)")
    parser.add_argument("--checkpointed", type=int, default=None, help="layers checkpointed with --checkpointing selective")
    parser.add_argument("--memory-budget-gib", type=float, default=None, help="auto's budget (default 0.9 x the GPU)")
    parser.add_argument("--budget-gib", type=float, default=None, help="best's budget (sets --checkpointing best)")
    parser.add_argument("--match-steps", type=int, default=0, help="N: the same-training check (see above)")
    parser.add_argument("--time-budget-s", type=float, default=None, help="start no child after this many seconds")
    parser.add_argument("--min-child-s", type=float, default=45.0, help="with --time-budget-s: the least time a child needs")
    parser.add_argument("--child-timeout-s", type=int, default=240)
    parser.add_argument("--plot", default=None, help="also write a PNG of tok/s and peak memory")
    parser.add_argument("--smoke", action="store_true", help="toy dims on the CPU (TRITON_INTERPRET=1): checks the script")
    parser.add_argument("--pack", type=int, default=0, help="N: the row is N packed sequences (see above)")
    # internal: one (setup, seq) in this process
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--match-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layers is None:
        args.layers = 4 if args.match_steps else 2 if args.smoke else 40
    if args.budget_gib is not None:
        if not args.budget_gib > 0:
            parser.error(f"--budget-gib must be > 0, got {args.budget_gib}")
        args.checkpointing = "best"
    if args.checkpointing == "best" and args.budget_gib is None and not args.child:  # a child gets --memory-budget-gib
        parser.error("--checkpointing best needs --budget-gib")
    if args.checkpointing == "selective" and (args.checkpointed is None or not 0 <= args.checkpointed <= args.layers):
        parser.error(f"--checkpointing selective needs --checkpointed N with 0 <= N <= --layers ({args.layers})")
    if args.layers < 1 or args.steps < 1 or args.match_steps < 0:
        parser.error("--layers and --steps must be >= 1, --match-steps >= 0")
    if args.pack < 0 or (args.pack and args.match_steps):
        parser.error(f"--pack must be >= 0 and is not used with --match-steps, got {args.pack}")
    if args.memory_budget_gib is not None and not args.memory_budget_gib > 0:
        parser.error(f"--memory-budget-gib must be > 0, got {args.memory_budget_gib}")
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
