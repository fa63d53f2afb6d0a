"""Multi-GPU `hearth train` on a 2-GPU host (nvidia-h200-x2): Qwen3-14B shape, one GPU against DDP and FSDP on
two, and Qwen3-32B shape with FSDP, at seq 4096 -- tok/s per GPU and peak memory per GPU (issue 14, item 3).

    python scripts/gpu/dist_e2e.py --out benchmarks/e2e/dist_e2e.jsonl [--cases 14b-single,14b-ddp,14b-fsdp,32b-fsdp]
           [--seq 4096] [--steps 6] [--micro 2] [--budget-gib 72]
    python scripts/gpu/dist_e2e.py --smoke --out /tmp/dist_smoke.jsonl      (CPU, gloo, toy dims: checks the script)

Each case is its own launch of the real command, so every run starts with empty GPUs:
    single:    python -m hearth.cli train RUN.toml                                  (cuda:0, parallel = none)
    ddp, fsdp: torchrun --nproc-per-node 2 -m hearth.cli train RUN.toml --parallel ddp|fsdp
(`torch.distributed.run` is torchrun's module; the children inherit this script's environment.)

Same global batch everywhere: --micro micro-batches of one seq-long example per optimizer step (single: all
of them on one GPU; two ranks: --micro / 2 each), so tok/s per GPU compares equal work per GPU; DDP's scaling
efficiency = its tok/s per GPU / the single run's (goal >= 90%). Model: random weights from a config JSON
(--random-init; built directly on each rank's GPU in bf16), LoRA r=16 on all projections, hearth's kernels
patched in, --budget-gib 72 (90% of an 80 GiB card, so the planner picks the checkpointing an 80 GB card
would need and the 32B row shows whether FSDP fits 2 x 80 GiB). Corpus: random tokens, every token trained.
tok/s excludes the first (warm-up) step; peak_gib_per_gpu = torch.cuda.max_memory_allocated during training, the
max over the ranks (the model build, where each rank briefly holds the whole bf16 model before FSDP shards it, is not
counted: it is reset after the build). That is what tensors held, not what the card needs: the caching allocator's
reserve, the CUDA context and NCCL's buffers come on top. So each row also carries device_used_gib_max, the most
`nvidia-smi` saw in use on any of the case's GPUs while it ran (sampled every 0.5 s, the build included), and
fits_80gib judges "fits an 80 GB card" on that (None where nvidia-smi is absent), never on the allocated peak: at most
what an H100 80GB reports as its total, 81559 MiB (79.6 GiB; CARD_80GB_GIB), not 80 GiB.
The corpus is written afresh for every invocation (a reused --work held the previous run's seq / rows), and a row
whose steps did not train --micro x --seq tokens each is an error, not a figure.

NVLink multicast stays OFF: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced here for every
child (the device machines must not use it). Every case also runs with the same OMP_NUM_THREADS (yours, else 1):
torchrun sets 1 for its workers when it starts more than one, and a single-process case left at all cores is not the
same host as the ranks it is compared with.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_common import commit_info, env_knobs  # noqa: E402

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

ROOT = Path(__file__).resolve().parents[2]
# what an H100 80GB reports as its total memory (nvidia-smi: 81559 MiB), the most a case may use to "fit an 80 GB card"
CARD_80GB_GIB = 81559 / 1024
COMMON = dict(max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
              vocab_size=151936, head_dim=128, model_type="qwen3")
SHAPES = {
    "14b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                intermediate_size=17408, **COMMON),
    "32b": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                intermediate_size=25600, **COMMON),
}
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=257, max_position_embeddings=512, model_type="qwen3")
CASES = ("14b-single", "14b-ddp", "14b-fsdp", "32b-fsdp")


def write_corpus(path: Path, *, rows: int, seq: int, vocab: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(rows):
            ids = [rng.randrange(vocab) for _ in range(seq)]
            fh.write(json.dumps({"id": f"r{i}", "input_ids": ids, "labels": ids}) + "\n")
    return path


class DeviceMemory:
    """The most memory `nvidia-smi` reports in use on each GPU, sampled every `every` s in a thread while a case runs
    (None per GPU where nvidia-smi is absent or fails): what the card needed, reserve, context and NCCL included."""

    QUERY = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]

    def __init__(self, every: float = 0.5):
        self.every, self.max_mib, self._stop = every, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> bool:
        try:
            out = subprocess.run(self.QUERY, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return False
        if out.returncode != 0:
            return False
        for line in out.stdout.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit():
                try:
                    used = float(parts[1])
                except ValueError:
                    continue
                self.max_mib[int(parts[0])] = max(self.max_mib.get(int(parts[0]), 0.0), used)
        return True

    def _run(self) -> None:
        if not self.sample():
            return
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def gib(self) -> dict[str, float]:
        return {str(i): round(v / 1024, 2) for i, v in sorted(self.max_mib.items())}


def run_case(case: str, args, work: Path) -> dict:
    shape, mode = case.split("-")
    cfg = dict(SMOKE if args.smoke else SHAPES[shape])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    model = work / f"{shape}.json"
    model.write_text(json.dumps(cfg))
    corpus = work / "corpus.jsonl"
    if not args.corpus_written:  # afresh per invocation: a --work reused from another --seq / --steps / --smoke
        write_corpus(corpus, rows=args.steps * args.micro, seq=args.seq, vocab=cfg["vocab_size"])
        args.corpus_written = True
    world = 1 if mode == "single" else args.gpus
    out = work / case
    run = {"corpus": str(corpus), "model": str(model), "out": str(out), "random_init": True, "max_steps": args.steps,
           "seq_len": args.seq, "batch_tokens": args.seq, "grad_accum": args.micro, "rank": 16, "alpha": 32.0,
           "lr": 1e-4, "shuffle": False, "patch": not args.smoke}
    if not args.smoke:
        run["memory_budget_gib"] = args.budget_gib
    toml = work / f"{case}.toml"
    toml.write_text("".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n"
                            for k, v in run.items()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    # one thread count for every case: torchrun gives its workers OMP_NUM_THREADS=1 when it starts > 1
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    if mode == "single":
        cmd = [sys.executable, "-m", "hearth.cli", "train", str(toml)]
        if not args.smoke:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-addr",
               "127.0.0.1", "--master-port", str(args.port), "-m", "hearth.cli", "train", str(toml), "--parallel", mode]
    (out / "metrics.json").unlink(missing_ok=True)  # a failed run must not be read from an earlier one's metrics
    with DeviceMemory() as device_mem:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    row = {"case": f"dist_{case}", "shape": (f"qwen3-{shape}" if not args.smoke else "smoke")
           + (f"-{cfg['num_hidden_layers']}layers" if args.layers else ""), "parallel": mode,
           "gpus": world, "seq": args.seq, "micro_batches_per_step": args.micro, "steps": args.steps,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": " ".join(cmd),
           "nccl_nvls_enable": env["NCCL_NVLS_ENABLE"],
           "torch_symm_mem_disable_multicast": env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
           **commit_info(), "env": env_knobs(env)}
    used = device_mem.gib()
    row.update(device_used_gib=used or None, device_used_gib_max=max(used.values()) if used else None,
               fits_80gib=(max(used.values()) <= CARD_80GB_GIB) if used else None)
    metrics_path = out / "metrics.json"
    if proc.returncode != 0 or not metrics_path.is_file():
        tail = (proc.stdout + proc.stderr)[-2000:]
        row.update(status="oom" if "out of memory" in tail.lower() else "error", rc=proc.returncode, tail=tail)
        return row
    m = json.loads(metrics_path.read_text())
    row.update(status="ok", tok_per_s=m["tokens_per_s"],
               tok_per_s_per_gpu=round(m["tokens_per_s"] / world, 1) if m["tokens_per_s"] else None,
               peak_gib_per_gpu=m["peak_gib"] if m["peak_gib"] is not None else m["peak_rss_gib"],
               peak_api="torch.cuda.max_memory_allocated" if m["peak_gib"] is not None else "ru_maxrss (CPU)",
               median_step_s=m["median_step_s"], loss=m["loss"], checkpointing=m["checkpointing"]["mode"],
               checkpointed_layers=m["checkpointing"]["checkpointed_layers"], device=m["device"],
               versions=m["versions"],
               # modules replaced per kind (the report is kind -> {class: modules}; its len is the classes)
               patched={k: sum(v.values()) for k, v in (m["patch"] or {}).get("replaced", {}).items()})
    # every step trained what the row's seq / micro say (not a corpus of another seq, not a short last step)
    steps_path = out / "metrics.jsonl"
    tokens = [json.loads(ln)["tokens"] for ln in steps_path.read_text().splitlines() if ln.strip()] \
        if steps_path.is_file() else []
    row["tokens_per_step"] = sorted(set(tokens))
    if tokens != [args.seq * args.micro] * args.steps:
        row.update(status="error", error=f"steps trained {tokens} tokens, not {args.steps} x {args.micro} x {args.seq}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSONL to append the rows to")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per case (the first is warm-up)")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches (one seq-long example each) per step, even")
    ap.add_argument("--budget-gib", type=float, default=72.0, help="memory_budget_gib for the planner")
    ap.add_argument("--gpus", type=int, default=2, help="ranks for the ddp / fsdp cases (1: the torchrun + NCCL + "
                    "DDP/FSDP2 path on a one-GPU host, a check of the code path, not a scaling figure)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's own)")
    ap.add_argument("--port", type=int, default=29641)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hearth_dist_e2e"))
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, toy dims, no kernels: checks the script")
    args = ap.parse_args(argv)
    args.corpus_written = False
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--cases: unknown {bad[0]!r} (known: {', '.join(CASES)})")
    if args.gpus < 1 or args.micro < args.gpus or args.micro % args.gpus:
        ap.error("--micro must be a multiple of --gpus (the ranks share each step's micro-batches)")
    if args.smoke and args.seq == 4096:
        args.seq = 128
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        row = run_case(case, args, args.work)
        rows.append(row)
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("case", "status", "tok_per_s", "tok_per_s_per_gpu",
                                                   "peak_gib_per_gpu", "checkpointing")}), flush=True)
    single = {r["shape"]: r for r in rows if r["parallel"] == "none" or r["parallel"] == "single"}
    print("\n| case | GPUs | tok/s | tok/s per GPU | peak GiB per GPU | checkpointing | scaling vs 1 GPU |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        base = single.get(r["shape"])
        eff = (f"{100 * r['tok_per_s_per_gpu'] / base['tok_per_s_per_gpu']:.0f}%"
               if r.get("status") == "ok" and base and base.get("status") == "ok" and r is not base else "")
        print(f"| {r['case']} | {r['gpus']} | {r.get('tok_per_s', r['status'])} | {r.get('tok_per_s_per_gpu', '')} | "
              f"{r.get('peak_gib_per_gpu', '')} | {r.get('checkpointing', '')} | {eff} |")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
