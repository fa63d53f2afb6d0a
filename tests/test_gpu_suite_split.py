"""scripts/gpu/test.sh's two passes: `--gpu-big` (tests/conftest.py) splits the collected tests by the
xdist_group("gpu_big") mark, so the workers' pass and the one-process pass together run each test once."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_nn.py", "tests/kernels/test_rope.py"]


def _collect(choice: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", f"--gpu-big={choice}", *FILES],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_gpu_big_split_partitions_the_suite():
    every, without, only = _collect("with"), _collect("skip"), _collect("only")
    assert only and without  # both files hold marked and unmarked tests
    assert only | without == every and not only & without
    # the marked ones are the big-reference GPU tests, by their source
    for node in only:
        path, name = node.split("::", 1)
        src = (ROOT / path).read_text()
        func = name.split("[", 1)[0]
        before = src[: src.index(f"def {func}(")]
        assert 'xdist_group("gpu_big")' in before.rsplit("\n\n\n", 1)[-1], node


def test_gpu_big_refuses_an_unknown_choice():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "--gpu-big=some", FILES[0]],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "--gpu-big" in out.stderr


def test_suite_script_names_a_half_run_and_writes_its_header(tmp_path):
    """scripts/gpu/test.sh end to end on the CPU (its GPU tests skip): GPU_BIG=only names the log -gpu_big.log and
    writes the header (commit, the machine lines asked once, wall, result) above pytest's output."""
    env = dict(os.environ, OUT=str(tmp_path), COMMIT="abc1234", GPU_BIG="only", PYTEST_ARGS="tests/kernels/test_rope.py",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "test.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    logs = list(tmp_path.glob("*.log"))
    assert [p.name.endswith("-abc1234-gpu_big.log") for p in logs] == [True], logs
    text = logs[0].read_text()
    for line in ("commit:   abc1234", "gpu:      ", "versions: torch ", "wall:     ", "result:   "):
        assert line in text, line
    assert "GPU_BIG=only" in text and "deselected" in text
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("pytest-raw*"))
