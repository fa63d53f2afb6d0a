"""What scripts/gpu/lora_e2e.py and scripts/gpu/qlora_e2e.py share: the model shapes, the child process's
environment and row protocol, the run metadata, and the timed training loop.

Imported as a sibling module (`import e2e_common`): a script run as `python scripts/gpu/X.py` has its own folder
first on sys.path. Needs no pydantic and imports torch / transformers only inside the functions that use them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

GIB = 1 << 30
QWEN3_14B = dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                 intermediate_size=17408, vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=False)
# --smoke (CPU, TRITON_INTERPRET=1): the same code path at toy dims, to check a script without a GPU
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=257, max_position_embeddings=256)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SRC = Path(__file__).resolve().parents[2] / "src"


def qwen3_config(smoke: bool, layers: int):
    """The Qwen3-14B shape (or the smoke toy) at `layers` decoder layers, SDPA attention, no KV cache."""
    from transformers import Qwen3Config

    config = Qwen3Config(**{**(SMOKE if smoke else QWEN3_14B), "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    config.use_cache = False
    return config


# ------------------------------------------------------------------------------------------- parent
def versions(names) -> dict:
    """Installed version of each distribution (a module name with '_' is looked up with '-'), None if absent."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:  # not installed
            out[name] = None
    return out


def gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except ImportError:
        return "unknown"


ENV_PREFIXES = ("HEARTH_", "TRITON_", "NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "OMP_")


def env_knobs(environ=None) -> dict:
    """The environment variables that change what a row measures (hearth's kernel switches, Triton's, NCCL's,
    the allocator's, the visible GPUs, the CPU threads), sorted: a row run with HEARTH_ATTN_GLUON=0 says so."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


def commit_info() -> dict:
    """The hearth commit a row measured: `git rev-parse HEAD` of this checkout (dirty: tracked files differ from
    it), else $HEARTH_COMMIT / $COMMIT (a copy of the tree without .git, e.g. the device machine), else None."""
    import subprocess

    root = SRC.parent
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if sha:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30).stdout.strip() != ""
            return {"commit": sha, "dirty": dirty, "commit_source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    given = os.environ.get("HEARTH_COMMIT") or os.environ.get("COMMIT")
    return {"commit": given or None, "dirty": None, "commit_source": "environment" if given else None}


def run_meta(version_names) -> dict:
    """The fields every row of one run carries: gpu, versions, date (UTC), command, commit (+ dirty), env."""
    return {"gpu": gpu_name(), "versions": versions(version_names),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), **commit_info(), "env": env_knobs()}


def child_env(**defaults: str) -> dict:
    """This environment with hearth importable from a plain checkout (src first on PYTHONPATH), plus `defaults`
    for the variables that are not set already."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for key, value in defaults.items():
        env.setdefault(key, value)
    return env


def child_row(stdout: str, mark: str) -> dict | None:
    """The last row a child printed behind `mark`, or None when it printed none."""
    found = [ln for ln in stdout.splitlines() if ln.startswith(mark)]
    return json.loads(found[-1][len(mark):]) if found else None


# ------------------------------------------------------------------------------------------- child
def child_main(mark: str, run, args) -> int:
    """Run `run()` and print its row behind `mark`; an exception becomes an error row (the parent goes on)."""
    try:
        row = run()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        row = {"setup": args.setup, "seq": args.seq, "layers": args.layers, "status": "error",
               "error": f"{type(exc).__name__}: {exc}"}
    row.setdefault("env", env_knobs())  # what the child itself ran under (the parent's defaults included)
    print(mark + json.dumps(row), flush=True)
    return 0


# ------------------------------------------------------------------------------------------- what was patched
def qwen3_patch_expected(layers: int, *, attention: bool, lora_targets: int = len(LORA_TARGETS)) -> dict:
    """What hearth.patch.apply replaces in a whole Qwen3 model of `layers` decoder layers with LoRA on
    `lora_targets` projections: 4 RMSNorms a layer (input, post-attention, q_norm, k_norm) + the final one, rope and
    the MLP once a layer, the loss once, every LoRA projection, and attention once a layer when asked for."""
    return {"norm": 4 * layers + 1, "rope": layers, "mlp": layers, "loss": 1, "lora": lora_targets * layers,
            "attention": layers if attention else 0}


def patch_gaps(report: dict | None, expected: dict) -> list[str]:
    """How a patch report (PatchReport.as_dict()) falls short of `expected` (kind -> modules): a kind that replaced
    another number of modules, or anything left. [] when the row ran what its setup's name says."""
    if report is None:
        return ["no patch report"]
    gaps = []
    for kind, want in expected.items():
        got = sum(report.get("replaced", {}).get(kind, {}).values())
        if got != want:
            gaps.append(f"{kind}: {got} of {want} modules replaced")
    gaps += [f"left {e['kind']} {e['class']} x{e['count']}: {e['reason']}" for e in report.get("left", [])]
    return gaps


def liger_applied(model, layers: int) -> tuple[dict, list[str]]:
    """What apply_liger_kernel_to_qwen3(rope, rms_norm, swiglu, fused_linear_cross_entropy) actually put in place
    in `model` (built after the call), and the gaps: Liger's RMSNorm at every norm (4 a layer + the final one),
    its SwiGLU MLP in every layer, its rope and its fused linear cross-entropy forward in modeling_qwen3."""
    from transformers.models.qwen3 import modeling_qwen3

    def liger(obj) -> bool:
        return (getattr(obj, "__module__", "") or "").startswith("liger_kernel")

    mods = [m for m in model.modules() if liger(type(m))]
    found = {"rms_norm": sum("RMSNorm" in type(m).__name__ for m in mods),
             "swiglu": sum("SwiGLU" in type(m).__name__ for m in mods),
             "rope": liger(modeling_qwen3.apply_rotary_pos_emb),
             "fused_linear_cross_entropy": liger(type(model).forward)}
    want = {"rms_norm": 4 * layers + 1, "swiglu": layers, "rope": True, "fused_linear_cross_entropy": True}
    return found, [f"liger {k}: {found[k]} where {w} expected" for k, w in want.items() if found[k] != w]


def syncer(device):
    """A function that waits for the GPU (a no-op on the CPU)."""
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def peak_reader(device):
    """Resets the CUDA peak; returns peak(): the GiB allocated at most since this call (None on the CPU)."""
    import torch

    if device.type != "cuda":
        return lambda: None
    torch.cuda.reset_peak_memory_stats(device)
    return lambda: round(torch.cuda.max_memory_allocated(device) / GIB, 2)


def packed_batch(ids, lengths: list[int]) -> dict:
    """The model kwargs of one packed row, built by `hearth train --pack`'s own collator
    (hearth.train.batches.collate(pack=True)): ids [1, T] cut into sequences of `lengths` (summing to T), each one
    an example whose labels are its ids; position ids restart at each, and the varlen kwargs come with it."""
    from hearth.train.batches import Example, collate

    if sum(lengths) != ids.shape[1] or min(lengths) < 1:
        raise ValueError(f"lengths must be positive and sum to {ids.shape[1]}, got {lengths}")
    row, examples = ids[0].tolist(), []
    for n in lengths:
        examples.append(Example(ids=row[:n], labels=row[:n], line=len(examples) + 1))
        row = row[n:]
    return collate(examples, pack=True, device=ids.device)


def timed_steps(model, ids, optimizer, n: int, sync) -> tuple[list[float], list[float]]:
    """n training steps on the batch `ids` (labels = ids), or on a dict of model kwargs (packed_batch): each one's
    seconds and loss."""
    batch = ids if isinstance(ids, dict) else {"input_ids": ids, "labels": ids}
    times, losses = [], []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    return times, losses


def step_fields(times: list[float], losses: list[float], seq: int) -> dict:
    """The row's timing: the first step is the warm-up, step_s the median of the others."""
    step_s = statistics.median(times[1:])
    return dict(status="ok", step_s=round(step_s, 4), steps_s=[round(t, 4) for t in times], loss=losses,
                tok_per_s=round(seq / step_s, 1))
