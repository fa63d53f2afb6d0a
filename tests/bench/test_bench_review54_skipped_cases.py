"""A hearth case the run did not measure (time budget spent, a sticky CUDA error, too large to run: status 'skipped')
is reported as such in the per-op GEOMEAN line and its goals, never left out without a word."""

from __future__ import annotations

from hearth.bench import report


def _row(p, ms, label, status="ok"):
    return {"provider": p, "ms": ms, "status": status, "op": "softmax", "size_label": label, "dtype": "bfloat16",
            "mode": "fwd", "p20_ms": ms, "p80_ms": ms}


def test_geomean_line_names_hearth_cases_skipped_by_the_budget():
    rows = [_row("hearth", 1.0, "a"), _row("compile", 1.2, "a"),
            _row("hearth", None, "b", status="skipped"), _row("compile", None, "b", status="skipped")]
    rows[2]["reason"] = "time budget spent: 100 s of this op's 90 s share"
    g = report.op_geomeans(rows)["softmax"]
    assert g["cases"] == 2 and len(g["ratios"]) == 1
    line = report.geomean_lines(rows)[0]
    assert "1 of 2 cases ranked" in line
    # the second case must be accounted for: it was not measured, so the goals cannot read as met over all cases
    assert "1 hearth not run (skipped)" in line
    assert "goals: geomean >= 1.10x met" in line
    assert "1 hearth case(s) not run: goals cover the measured cases only" in line


def test_geomean_line_without_a_ranked_case_names_skipped_hearth_cases():
    rows = [_row("hearth", None, "b", status="skipped"), _row("compile", None, "b", status="skipped")]
    line = report.geomean_lines(rows)[0]
    assert line.startswith("GEOMEAN softmax - worst -") and "1 hearth not run (skipped)" in line
