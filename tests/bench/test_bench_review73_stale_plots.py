"""Review 73: a report rebuilt from rows that no longer support a plot does not leave the old plot in place.

write_reports overwrites each PNG it draws but never removes one it no longer draws. ratios.png is drawn only when some
case is ranked (hearth and a fused peer both correct) and <op>_<mode>_<dtype>.png only when the group has an ok row;
so after a rerun in which hearth became wrong at every case (a broken kernel: its 'wrong' rows replace its measured
ones in results.jsonl), the folder kept the previous ratios.png, hearth's old speedups per op, beside a summary.md
and GEOMEAN lines saying no case is ranked -- and a group whose every row failed kept its old curves.
"""

from __future__ import annotations

from hearth.bench import report

KEY = dict(op="softmax", size_label="4096x1024", dtype="bfloat16", mode="fwd", metric="GB/s",
           formula="bytes: fwd 2*M*N*b (read x, write y); bwd 3*M*N*b (read y, dy; write dx); full 5*M*N*b",
           size=dict(M=4096, N=1024), work=2 * 4096 * 1024 * 2, limits={}, env={"gpu": "x"})


def _row(provider, status="ok", ms=0.01):
    r = {**KEY, "provider": provider, "status": status}
    if status == "ok":
        r.update(ms=ms, p20_ms=ms, p80_ms=ms, value=1.0)
    else:
        r["reason"] = "output0 rel err 0.5 > 0.02"
    return r


def test_ratio_plot_of_an_earlier_report_goes_when_no_case_is_ranked_any_more(tmp_path):
    written = report.write_reports(tmp_path, [_row("hearth"), _row("compile", ms=0.02)])
    assert tmp_path / "ratios.png" in written and (tmp_path / "ratios.png").exists()
    rows = [_row("hearth", "wrong"), _row("compile", ms=0.02)]
    written = report.write_reports(tmp_path, rows)
    assert "no case with hearth and a fused peer both correct" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "ratios.png").exists()  # not hearth's old 2x beside a summary with no ranked case
    assert tmp_path / "ratios.png" not in written


def test_a_group_whose_rows_all_failed_loses_its_old_plot(tmp_path):
    report.write_reports(tmp_path, [_row("hearth"), _row("compile", ms=0.02)])
    png = tmp_path / "softmax_fwd_bfloat16.png"
    assert png.exists()
    report.write_reports(tmp_path, [_row("hearth", "error"), _row("compile", "oom")])
    assert not png.exists()


def test_plots_of_other_groups_are_left_alone(tmp_path):
    """A PNG of a group without rows in this report (another op's, a file of the user's) is not the report's to drop."""
    other = tmp_path / "rms_norm_full_bfloat16.png"
    other.write_bytes(b"not ours")
    report.write_reports(tmp_path, [_row("hearth"), _row("compile", ms=0.02)])
    assert other.read_bytes() == b"not ours"

