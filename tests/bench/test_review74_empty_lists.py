"""An ops or --providers list that names nothing (`hearth bench ,`, `--providers ''`, `--providers ' , '`: an empty
shell variable) is refused at start naming the option, exit 2. It planned no case (or ran every case with no
provider), measured nothing, rewrote the reports from the folder's old rows and printed their GEOMEAN lines under
this run's banner, exit 0: a run that measured nothing read as one that did."""

from __future__ import annotations

import pytest

from hearth.bench import report, runner


def _old_rows(out):
    rows = [{"provider": p, "ms": ms, "status": "ok", "op": "softmax", "size_label": "a", "dtype": "float32",
             "mode": "fwd", "p20_ms": ms, "p80_ms": ms, "metric": "GB/s", "value": 1.0, "formula": "f", "limits": {}}
            for p, ms in (("hearth", 1.0), ("compile", 2.0))]
    report.write_rows(out / "results.jsonl", rows)
    return (out / "results.jsonl").read_text()


@pytest.mark.parametrize("kw, option", [(dict(providers=[""]), "--providers"), (dict(providers=[" , "]), "--providers"),
                                        (dict(ops=[","]), "ops")])
def test_a_list_naming_nothing_is_refused(tmp_path, capsys, kw, option):
    before = _old_rows(tmp_path)
    code = runner.main(**{"ops": ["softmax"], **kw}, check=True, out=tmp_path, plots=False)
    out = capsys.readouterr().out
    assert code == 2
    assert option in out and "GEOMEAN" not in out
    assert (tmp_path / "results.jsonl").read_text() == before
    assert not (tmp_path / "summary.md").exists()


def test_selected_ops_still_takes_all_and_none():
    assert runner._selected_ops(None) == list(runner.OP_ORDER)
    assert runner._selected_ops(["all"]) == list(runner.OP_ORDER)
