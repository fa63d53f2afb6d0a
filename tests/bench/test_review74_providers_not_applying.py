"""--providers naming only peers that never apply to some op (`hearth bench all --providers vendor`: no vendor
library runs softmax) ran those ops' cases with no provider and died on the first one with an IndexError in
runner._line (no rows to print), before any other op ran. Now such a case has no rows and the run goes on to the ops
the providers do apply to; a selection where no provider applies to any op is refused at start naming --providers."""

from __future__ import annotations

from hearth.bench import report, runner
from hearth.bench import providers as P


def test_ops_without_an_applicable_provider_are_passed_over(tmp_path, monkeypatch):
    calls = []

    def fake_cublas(op, inputs, spec, size, rg, check):
        calls.append(op)
        a, b = inputs["a"], inputs["b"]
        return P.Bound(lambda: a @ b, [a, b])

    monkeypatch.setitem(P.BINDERS, "cublas", fake_cublas)
    code = runner.main(ops=["softmax", "matmul"], providers=["cublas"], modes=["fwd"], check=True, out=tmp_path,
                       plots=False)
    assert code == 0
    rows = report.read_rows(tmp_path / "results.jsonl")
    assert calls and set(calls) == {"matmul"}
    assert {r["op"] for r in rows} == {"matmul"} and all(r["provider"] == "cublas" for r in rows)


def test_no_provider_applying_to_any_op_is_refused(tmp_path, capsys):
    code = runner.main(ops=["softmax"], providers=["cublas"], check=True, out=tmp_path, plots=False)
    assert code == 2
    assert "--providers" in capsys.readouterr().out
    assert not (tmp_path / "results.jsonl").exists()


def test_budget_rows_of_an_op_without_an_applicable_provider(tmp_path):
    # the time-budget path (total budget 0) writes no row for a provider that never applies, and does not crash
    code = runner.main(ops=["softmax", "matmul"], providers=["cublas"], check=True, out=tmp_path, plots=False,
                       total_budget_s=0.0)
    assert code == 0
    rows = report.read_rows(tmp_path / "results.jsonl")
    assert rows and all(r["op"] == "matmul" and r["status"] == "skipped" for r in rows)
