"""scripts/gpu/test.sh's log and exit code with pytest faked by a stub on PATH (no GPU, no pytest run): what the
log says while the gpu_big pass of a split run is still running (the state a call cut by the device's limit leaves
behind), and the exit code when no pass ran a single test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.fakes.commands import fake_command, path_with

ROOT = Path(__file__).resolve().parents[1]

STUB = r"""#!/usr/bin/env bash
# a fake python3: xdist absent, the machine lines, and pytest whose output and exit code depend on the pass
if [ "${1:-}" = -c ]; then exit 1; fi
if [ "${1:-}" = - ]; then cat >/dev/null; echo "gpu:      FAKE"; echo "versions: fake"; exit 0; fi
big=""
for a in "$@"; do case "$a" in --gpu-big=*) big=${a#--gpu-big=} ;; esac; done
if [ "$big" = only ]; then
  # the log as it stands while this pass runs: what a call cut now would bring back
  for f in "$OUT"/*.log; do cp "$f" "$OUT/during-gpu-big.txt"; done
  echo "$STUB_ONLY_LINE"; exit "$STUB_ONLY_RC"
fi
echo "$STUB_FIRST_LINE"; exit "$STUB_FIRST_RC"
"""


def _run(tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "python3", STUB)
    out = tmp_path / "out"
    out.mkdir()
    full = dict(os.environ, OUT=str(out), COMMIT="abc1234", PATH=path_with(bin_dir), **env)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "test.sh")], cwd=ROOT, env=full, capture_output=True,
                         text=True, timeout=120)
    return res, out


def _result(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("result:"))


def test_split_log_says_the_gpu_big_pass_has_not_finished_while_it_runs(tmp_path):
    """GPU_BIG=split: the log written after the workers' pass is what comes back when the call's limit cuts the gpu_big
    pass. Its result line read '1466 passed in 222.81s (pytest rc=0)' with the command saying GPU_BIG=split, as a
    whole suite that passed; it must say that the gpu_big pass did not finish."""
    res, out = _run(tmp_path, STUB_FIRST_LINE="1466 passed in 222.81s", STUB_FIRST_RC="0",
                    STUB_ONLY_LINE="82 passed in 116.33s", STUB_ONLY_RC="0")
    assert res.returncode == 0, res.stdout + res.stderr
    during = _result((out / "during-gpu-big.txt").read_text())
    assert "1466 passed" in during and "gpu_big" in during and "not finished" in during, during
    final = _result(next(out.glob("*-abc1234.log")).read_text())
    assert "not finished" not in final and "gpu_big alone: 82 passed" in final, final


def test_a_run_that_ran_no_test_does_not_exit_0(tmp_path):
    """Both passes selected nothing (pytest exit 5 each): the script exited 0, the mark of a suite that passed."""
    res, out = _run(tmp_path, STUB_FIRST_LINE="no tests ran in 0.01s", STUB_FIRST_RC="5",
                    STUB_ONLY_LINE="no tests ran in 0.01s", STUB_ONLY_RC="5")
    assert res.returncode != 0, res.stdout + res.stderr


def test_one_empty_pass_beside_a_passing_one_still_exits_0(tmp_path):
    """The rule stays as it was for a half that holds no test: exit 5 of one pass is not a failure when the other
    ran tests."""
    res, _ = _run(tmp_path, STUB_FIRST_LINE="10 passed in 1.00s", STUB_FIRST_RC="0",
                  STUB_ONLY_LINE="no tests ran in 0.01s", STUB_ONLY_RC="5")
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "skip").mkdir()
    res, _ = _run(tmp_path / "skip", STUB_FIRST_LINE="10 passed in 1.00s", STUB_FIRST_RC="0",
                  STUB_ONLY_LINE="no tests ran in 0.01s", STUB_ONLY_RC="5", GPU_BIG="skip")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_single_pass_that_ran_no_test_does_not_exit_0(tmp_path):
    """GPU_BIG=skip / only / with: one pass, and it selected nothing (a wrong PYTEST_ARGS, a -k that matches all)."""
    for big in ("skip", "only", "with"):
        (tmp_path / big).mkdir()
        res, _ = _run(tmp_path / big, STUB_FIRST_LINE="no tests ran in 0.01s", STUB_FIRST_RC="5",
                      STUB_ONLY_LINE="no tests ran in 0.01s", STUB_ONLY_RC="5", GPU_BIG=big)
        assert res.returncode != 0, (big, res.stdout + res.stderr)
