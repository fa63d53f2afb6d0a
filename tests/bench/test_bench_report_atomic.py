"""report.write_reports wrote every <op>.md and summary.md in place (Path.write_text: truncate, then write), so a run
interrupted mid-write (a kill, a full disk, the device's hard timeout) left a torn or empty summary.md beside a
complete results.jsonl. Each report file (the pages and the PNG plots) is now written under a temporary name in the
same folder, flushed and renamed over the old one: whole or not at all."""

from __future__ import annotations

import pathlib

import pytest

from hearth.bench import report

KEY = dict(op="softmax", size_label="4096x1024", dtype="bfloat16", mode="fwd", metric="GB/s",
           formula="bytes: fwd 2*M*N*b (read x, write y); bwd 3*M*N*b (read y, dy; write dx); full 5*M*N*b",
           size=dict(M=4096, N=1024), work=2 * 4096 * 1024 * 2, limits={}, env={"gpu": "x"})


def _rows(ms):
    return [{**KEY, "provider": p, "status": "ok", "ms": t, "p20_ms": t, "p80_ms": t, "value": 1.0}
            for p, t in (("hearth", ms), ("compile", 0.02))]


def _disk_full(victim, real_open):
    """A Path.open for which files whose name starts with `victim` put half of each write down, then fail."""

    def open_(path, mode="r", *a, **kw):
        fh = real_open(path, mode, *a, **kw)
        if "w" not in mode or not path.name.startswith(victim):
            return fh
        real_write = fh.write

        def write(data):
            real_write(data[: len(data) // 2])
            fh.flush()
            raise OSError(28, "No space left on device")

        fh.write = write
        return fh

    return open_


@pytest.mark.parametrize("victim", ["summary.md", "softmax.md"])
def test_a_write_that_fails_midway_leaves_the_previous_report_whole(tmp_path, monkeypatch, victim):
    report.write_reports(tmp_path, _rows(0.01), plots=False)
    before = {p.name: p.read_text() for p in tmp_path.glob("*.md")}
    assert set(before) == {"summary.md", "softmax.md"} and all(before.values())
    monkeypatch.setattr(pathlib.Path, "open", _disk_full(victim, pathlib.Path.open))
    with pytest.raises(OSError):
        report.write_reports(tmp_path, _rows(0.03), plots=False)  # other numbers: every page would change
    monkeypatch.undo()
    assert (tmp_path / victim).read_text() == before[victim]  # not torn, not empty
    assert sorted(p.name for p in tmp_path.glob("*.md")) == sorted(before)


def test_pages_are_replaced_whole_when_the_write_succeeds(tmp_path):
    report.write_reports(tmp_path, _rows(0.01), plots=False)
    report.write_reports(tmp_path, _rows(0.03), plots=False)
    assert (tmp_path / "summary.md").read_text() == report.summary_markdown(_rows(0.03))
    assert (tmp_path / "softmax.md").read_text() == report.op_markdown("softmax", _rows(0.03))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_plot_whose_save_fails_midway_leaves_the_previous_png_whole(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    paths = report.write_reports(tmp_path, _rows(0.01))
    pngs = {p.name: p.read_bytes() for p in paths if p.suffix == ".png"}
    assert {"softmax_fwd_bfloat16.png", "ratios.png"} <= set(pngs)

    def torn_savefig(self, fname, *a, **kw):
        with open(fname, "wb") as fh:
            fh.write(b"\x89PN")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", torn_savefig)
    with pytest.raises(OSError):
        report.write_reports(tmp_path, _rows(0.03))
    monkeypatch.undo()
    for name, data in pngs.items():
        assert (tmp_path / name).read_bytes() == data, name
