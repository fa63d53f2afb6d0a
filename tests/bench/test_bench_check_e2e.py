"""End to end: `hearth bench --check` in a fresh process, without pydantic (the H200 has none),
over every op (missing kernels show as unavailable), writing JSONL, Markdown and PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hearth.bench.runner import OP_ORDER

ALLOWED = {"ok", "wrong", "error", "oom", "refuses", "unavailable", "skipped"}


def test_check_run_end_to_end(tmp_path):
    """The H200 path: `python -m hearth.bench` (argparse), with pydantic made unimportable."""
    out = tmp_path / "bench"
    code = (
        "import runpy, sys; sys.modules['pydantic'] = None\n"  # any import of pydantic now fails
        f"sys.argv = ['hearth.bench', '--check', '--mode', 'full', '--providers', 'hearth,eager', '--out', {str(out)!r}]\n"
        "runpy.run_module('hearth.bench', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # --check must set it itself
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["op"] for r in rows} == set(OP_ORDER)
    for r in rows:
        assert r["status"] in ALLOWED, r
        assert r["env"]["torch"] and r["env"]["date"] and "bench" in r["env"]["command"]
        assert isinstance(r["env"]["hearth_env"], dict)
        if r["provider"] == "hearth" and r["op"] == "attention" and r["status"] == "ok":
            assert r["kernel"] == "triton", r  # no Hopper here: the Triton forward
        if r["provider"] == "eager" and r["op"] != "matmul":
            assert r["status"] == "ok", r
            assert r["value"] > 0 and r["rel_err"] < 1e-3
        if r["provider"] == "hearth":
            # under the interpreter CPU tensors are accepted: a CUDA-only complaint means
            # TRITON_INTERPRET was set too late
            assert "must be a CUDA tensor" not in r["reason"], r
    for op in OP_ORDER:
        assert (out / f"{op}.md").exists()
    assert (out / "summary.md").read_text().startswith("# hearth bench summary")
    assert any(p.suffix == ".png" for p in out.iterdir())


def test_typer_cli_reaches_the_runner(tmp_path, monkeypatch):
    """`hearth bench` parses its options and hands them to runner.main (pydantic present here)."""
    from typer.testing import CliRunner

    from hearth import cli
    from hearth.bench import runner

    seen = {}
    monkeypatch.setattr(runner, "main", lambda **kw: seen.update(kw) or 0)
    res = CliRunner().invoke(cli.app, ["bench", "softmax", "--dtype", "float16", "--mode", "fwd", "--sizes", "1024,2048",
                                       "--report-only", "--merge", str(tmp_path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert seen["ops"] == ["softmax"] and seen["dtypes"] == ["float16"] and seen["modes"] == ["fwd"]
    assert seen["sizes"] == "1024,2048" and seen["report_only"] and seen["merge"] == [tmp_path]


def test_argparse_entry_matches():
    from hearth.bench.__main__ import parse

    kw = parse(["rope", "--mode", "full", "--providers", "hearth,eager", "--check", "--total-budget-s", "60"])
    assert kw["ops"] == ["rope"] and kw["modes"] == ["full"] and kw["providers"] == ["hearth,eager"]
    assert kw["check"] and kw["total_budget_s"] == 60.0 and kw["sizes"] is None


def test_models_check_run_end_to_end(tmp_path):
    """`python -m hearth.bench softmax --check --sizes models`: the real kernels under the
    interpreter at the scaled model cases; rows named by model, wall time beside GPU time, and
    the GEOMEAN line last on stdout (scripts/gpu/bench_models.sh greps it)."""
    out = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "hearth.bench", "softmax", "--check", "--sizes", "models", "--mode", "full",
                           "--providers", "hearth,eager,liger", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["size_label"] for r in rows} == {"Llama-2-7B vocab 32000 x 16384 tokens (check-scaled)",
                                               "Llama-3.1-8B vocab 128256 x 4096 tokens (check-scaled)"}
    hearth = [r for r in rows if r["provider"] == "hearth"]
    assert hearth and all(r["status"] == "ok" and r["wall_ms"] > 0 and r["host_ms"] > 0 for r in hearth), hearth
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("GEOMEAN softmax "), proc.stdout[-2000:]
    if any(r["provider"] == "liger" and r["status"] == "ok" for r in rows):
        assert "2 of 2 cases ranked" in last and "wall/call" in last
    assert "## Every case" in (out / "summary.md").read_text()
