"""`hearth train` on two processes for the torchrun tests (test_distributed.py and the review files beside it): the
tiny run's files under a run.toml, one launch of 2 gloo ranks on the loopback, and a failed launch's story. One
copy, so every such test starts its ranks the same way (environment, port, timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fakes.openai_server import PORT_TRIES, free_port, port_taken
from tests.train.tiny import save_tiny_model, tiny_tokenizer, write_corpus

ROOT = Path(__file__).resolve().parents[2]
# the 3-step run these tests launch, one-process and on 2 ranks (each test adds its grad_accum: how the micro-batches
# are dealt to the ranks is what they vary)
RUN = dict(rank=4, alpha=8.0, lr=1e-2, seq_len=512, patch=False, max_steps=3, batch_tokens=512, eval_fraction=0.25,
           eval_every=2, save_every=2, warmup_steps=1)


def tiny_run(d: Path, run: dict) -> tuple[Path, Path, Path]:
    """(corpus, base model, run.toml) under ``d``: the tiny 12-example corpus, the tiny random Qwen3 of its
    tokenizer's vocabulary, and a run file naming both with ``run``'s keys (TOML booleans for bools)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer(d / "tok")), local_files_only=True)
    corpus = write_corpus(d / "train.jsonl", tok, range(12))
    base = save_tiny_model(d / "model", len(tok))
    run_toml = d / "run.toml"
    run_toml.write_text(f'corpus = "{corpus}"\nmodel = "{base}"\n'
                        + "".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n"
                                  for k, v in run.items()))
    return corpus, base, run_toml


def failure(proc: subprocess.CompletedProcess) -> str:
    """A failed torchrun's story: the tails of stdout and stderr, and, from anywhere in stderr, the lines a rank's
    own crash leaves (a C++ `what():` or `terminate called` above torchrun's summary can fall outside the tail)."""
    marks = ("terminate called", "what():", "Error", "Signal", "Traceback")
    crash = [line for line in proc.stderr.splitlines() if any(m in line for m in marks)]
    return proc.stdout[-3000:] + proc.stderr[-3000:] + "\n--- crash lines ---\n" + "\n".join(crash[:60])


def torchrun(run_toml: Path, out: Path, parallel: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT / "src") + os.pathsep + str(ROOT), OMP_NUM_THREADS="1")
    for _ in range(PORT_TRIES):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), "-m", "hearth.cli", "train", str(run_toml), "--out", str(out),
               "--parallel", parallel, *extra]
        # generous: two ranks share 2 cores with whatever else runs; a hang still ends here, not at CI's limit
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=out.parent)
        # free when picked, not when torchrun binds it seconds later (importing torch): only that clash runs again
        if proc.returncode == 0 or not port_taken(proc.stdout + proc.stderr):
            return proc
    return proc
