"""scripts/merge_models_run.sh: a device call's model-suite rows merged into a committed models folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "merge_models_run.sh"
COMMITTED = REPO / "benchmarks" / "h200" / "models" / "results.jsonl"


def _rows(op: str) -> list[dict]:
    """One case's committed H200 rows (hearth and its peers) of `op`: real rows, so the reports build from them."""
    rows = [json.loads(line) for line in COMMITTED.read_text().splitlines() if line.strip()]
    first = next(r for r in rows if r["op"] == op and r["provider"] == "hearth" and r["status"] == "ok")
    return [r for r in rows if r["op"] == op and r["size_label"] == first["size_label"] and r["mode"] == first["mode"]]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_merge_keeps_measured_rows_rebuilds_reports_and_packs_them(tmp_path):
    """The later call's hearth row replaces the committed one, its 'unavailable' Liger row does not erase Liger's
    measurement; the per-op reports end up in reports.tgz (none loose), summary.md is rebuilt, and the call's
    bench.log is kept under its date and label."""
    old = _rows("rms_norm")
    liger = next(r for r in old if r["provider"] == "liger" and r["status"] == "ok")
    hearth = next(r for r in old if r["provider"] == "hearth")
    dest, new = tmp_path / "models", tmp_path / "call"
    _write(dest / "results.jsonl", old)
    newer = {**hearth, "ms": hearth["ms"] * 0.5, "env": {**hearth["env"], "date": "2026-12-07T01:02:03Z"}}
    gone = {**liger, "status": "unavailable", "reason": "No module named 'liger_kernel'"}
    for k in ("ms", "p20_ms", "p80_ms", "extra_mib", "value"):
        gone.pop(k, None)
    _write(new / "results.jsonl", [newer, gone])
    (new / "bench.log").write_text("GEOMEAN rms_norm ...\n")
    out = subprocess.run(["bash", str(SCRIPT), str(new), "abc1234-rms_norm", str(dest)], cwd=REPO, text=True,
                         capture_output=True, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                   "MPLBACKEND": "Agg", "HOME": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    merged = {(r["provider"]): r for r in map(json.loads, (dest / "results.jsonl").read_text().splitlines())}
    assert merged["hearth"]["ms"] == pytest.approx(hearth["ms"] * 0.5)
    assert merged["liger"]["status"] == "ok" and merged["liger"]["ms"] == liger["ms"]
    with tarfile.open(dest / "reports.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert "rms_norm.md" in names and "summary.md" not in names and "ratios.png" not in names
    assert not list(dest.glob("rms_norm*.md")) and not list(dest.glob("rms_norm*.png"))
    assert "rms_norm" in (dest / "summary.md").read_text()
    assert (dest / "bench-2026-12-07-abc1234-rms_norm.log").read_text() == "GEOMEAN rms_norm ...\n"
    assert (dest / "bench.log").read_text() == "GEOMEAN rms_norm ...\n"


def test_merge_refuses_a_missing_folder_or_a_bad_label(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "nope"), "x", str(tmp_path)], cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 2 and "results.jsonl not found" in out.stderr
    _write(tmp_path / "call" / "results.jsonl", [])
    out = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "call"), "a b", str(tmp_path)], cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 2 and "LABEL" in out.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_merge_refuses_rows_of_another_gpu(tmp_path):
    """A device call asked for without needs_h200 may run on an H100 (or a --check folder may be passed by mistake):
    merged into benchmarks/h200/models, its rows replaced the H200 ones by key, and the op's GEOMEAN line, the
    summary and the folder's name went on saying H200 with nothing but the env list to tell. The script refuses
    such a folder, naming both GPUs, and leaves DEST as it was."""
    old = _rows("rms_norm")
    dest, new = tmp_path / "models", tmp_path / "call"
    _write(dest / "results.jsonl", old)
    before = (dest / "results.jsonl").read_text()
    h100 = [{**r, "ms": (r.get("ms") or 1.0) * 2, "env": {**r["env"], "gpu": "NVIDIA H100 80GB HBM3",
                                                              "date": "2026-12-07T01:02:03Z"}} for r in old]
    _write(new / "results.jsonl", h100)
    out = subprocess.run(["bash", str(SCRIPT), str(new), "abc1234-rms_norm", str(dest)], cwd=REPO, text=True,
                         capture_output=True, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                   "MPLBACKEND": "Agg", "HOME": str(tmp_path)}, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "NVIDIA H100 80GB HBM3" in out.stderr and "NVIDIA H200" in out.stderr
    assert (dest / "results.jsonl").read_text() == before
