"""`hearth bench --report-only` with nothing to report: an --out folder without a results.jsonl (a typo, or a
folder whose rows live elsewhere) rebuilt every report from zero rows -- summary.md overwritten with 'no results',
an empty results.jsonl created -- and exited 0. It now exits 2 naming the file and leaves the folder as it was."""

from __future__ import annotations

from hearth.bench import runner


def test_report_only_without_rows_is_an_error_naming_the_file_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "models"
    out.mkdir()
    (out / "summary.md").write_text("# the committed summary\n")
    assert runner.main(out=out, report_only=True, plots=False) == 2
    said = capsys.readouterr().out.replace("\n", "")  # rich wraps long paths
    assert "results.jsonl" in said and str(out / "results.jsonl") in said
    assert (out / "summary.md").read_text() == "# the committed summary\n"
    assert not (out / "results.jsonl").exists()


def test_report_only_of_an_empty_results_file_is_an_error_too(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.jsonl").write_text("")
    assert runner.main(out=out, report_only=True, plots=False) == 2
    assert not (out / "summary.md").exists()
