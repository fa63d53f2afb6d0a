"""Command-line lists given twice (ops, dtypes, modes): each case runs once."""

from __future__ import annotations

import torch

from hearth.bench import cases, report, runner
from hearth.bench import providers as P


def _counting_registry(calls):
    def good(op, inputs, spec, size, rg, check):
        calls.append((op, spec.case_label(size), inputs["x"].dtype))
        return P.Bound(lambda: torch.softmax(inputs["x"].float(), -1).to(inputs["x"].dtype), [inputs["x"]])

    return {"hearth": good}


def test_an_op_dtype_or_mode_named_twice_runs_each_case_once(tmp_path):
    """`hearth bench softmax softmax --dtype float32,float32 --mode fwd --mode fwd` ran every case 8 times (the op loop
    took each op's cases from a plan that held them twice, once per repeated name), and the budget shares and the
    progress total counted them so."""
    calls = []
    code = runner.main(ops=["softmax", "softmax"], dtypes=["float32,float32"], modes=["fwd", "fwd"], check=True,
                       out=tmp_path, registry=_counting_registry(calls), plots=False, providers=["hearth"])
    assert code == 0
    n_cases = len(cases.cases_for(cases.SPECS["softmax"], "headline", ["fwd"], True))
    assert n_cases >= 1
    assert len(calls) == n_cases, calls
    rows = report.read_rows(tmp_path / "results.jsonl")
    assert len(rows) == n_cases


def test_selected_lists_drop_repeats_in_order():
    assert runner._selected_ops(["softmax,rms_norm", "softmax"]) == ["softmax", "rms_norm"]
    assert runner._selected_dtypes(["bfloat16", "float32,bfloat16"], False) == ["bfloat16", "float32"]
    pairs = cases.cases_for(cases.SPECS["softmax"], "headline", ["fwd", "fwd"], False)
    assert len(pairs) == len(set((cases.SPECS["softmax"].case_label(s), m) for s, m in pairs))


