"""scripts/gpu/final.sh (the publishing call) with python3 faked by a stub on PATH: a failed benchmark op is not
a run that finished. bench_all.sh's exit code was lost in its pipe (| tee | tail) and final.sh ended on an echo, so
the call exited 0 with an op's benchmark failed; the op's 'exit N' line could also fall outside the tail -n 70 that
the reply shows, behind the summary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.fakes.commands import fake_command, path_with

ROOT = Path(__file__).resolve().parents[1]

STUB = r"""#!/usr/bin/env bash
# a fake python3: `-m hearth.bench OP ...` fails for $STUB_FAIL_OP, the report and inspect succeed
if [ "${1:-}" = -m ] && [ "${2:-}" = hearth.bench ]; then
  [ "${3:-}" = "$STUB_FAIL_OP" ] && { echo "Traceback: boom"; exit 1; }
  [ "${3:-}" = --report-only ] && { for i in $(seq 200); do echo "summary line $i"; done > "$5/summary.md"; }
  exit 0
fi
if [ "${1:-}" = -m ] && [ "${2:-}" = hearth.cli ]; then echo "ok"; exit "${STUB_INSPECT_RC:-0}"; fi
exit 0
"""


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "python3", STUB)
    out = tmp_path / "out"
    out.mkdir()
    full = dict(os.environ, OUT=str(out), TOTAL_S="0", BENCH_S="60", HEARTH_SITE=str(tmp_path / "site"),
                PATH=path_with(bin_dir), **env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "final.sh")], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=120)


def test_a_failed_bench_op_makes_the_call_fail_and_says_so_last(tmp_path):
    res = _run(tmp_path, STUB_FAIL_OP="rope")
    assert res.returncode != 0, res.stdout[-3000:]
    tail = res.stdout.splitlines()[-3:]
    assert any("bench_all" in line and "rc=1" in line for line in tail), tail


def test_a_clean_run_exits_0(tmp_path):
    res = _run(tmp_path, STUB_FAIL_OP="none")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_an_inspect_that_finds_no_tensor_cores_fails_the_call(tmp_path):
    res = _run(tmp_path, STUB_FAIL_OP="none", STUB_INSPECT_RC="1")
    assert res.returncode != 0, res.stdout[-3000:]
