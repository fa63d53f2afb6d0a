"""scripts/gpu/bench_models.sh's last lines: the per-op GEOMEAN lines (and ATTENTION-GOAL) a device call reports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hearth.bench.runner import OP_ORDER
from tests.fakes.commands import fake_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "bench_models.sh"

# stands in for python3 on the device: the benchmark writes nothing, the report prints a line per op
FAKE_PYTHON = """#!/usr/bin/env bash
case " $* " in
  *" --report-only "*)
    for op in {ops}; do echo "GEOMEAN $op 1.000x worst 1.000x (case vs compile) | goals: ..."; done
    echo "ATTENTION-GOAL full: 5 cases | vs cuDNN: ..." ;;
  *" - "*) cat > /dev/null ;;
  *" -c "*) exit 1 ;;
esac
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_every_ops_geomean_line_and_the_attention_goal_are_printed_last(tmp_path):
    """The script ended with `grep ^GEOMEAN bench.log | tail -n 10`: a run of all 12 ops printed 10 lines, and the
    two it dropped were the first in the report's (alphabetical) order, attention and attention_varlen; the
    ATTENTION-GOAL lines were never printed."""
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "python3", FAKE_PYTHON.format(ops=" ".join(sorted(OP_ORDER))))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "HEARTH_SITE": str(tmp_path / "site")}
    out = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, text=True, capture_output=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    tail = out.stdout.split("total ")[-1].splitlines()[1:]
    printed = [line.split()[1] for line in tail if line.startswith("GEOMEAN ")]
    assert printed == sorted(OP_ORDER)
    assert any(line.startswith("ATTENTION-GOAL ") for line in tail)
