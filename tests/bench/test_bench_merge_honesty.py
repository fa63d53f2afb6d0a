"""report.merge_rows: which row of a key stands when runs are merged (--merge, scripts/merge_models_run.sh)."""

from __future__ import annotations

from hearth.bench import report

KEY = dict(op="softmax", size_label="3x40", dtype="bfloat16", mode="fwd")


def _row(provider, status="ok", date=None, **kw):
    r = {**KEY, "provider": provider, "status": status, **kw}
    if date:
        r["env"] = {"gpu": "NVIDIA H200", "date": date}
    return r


def test_hearth_unavailable_in_a_newer_run_replaces_its_old_measurement():
    """'unavailable' keeps a peer's earlier measurement (a call that did not carry its wheel), but hearth's own row
    says 'unavailable' when hearth.kernels.<op> does not import: hearth's failure, which op_geomeans counts as a
    hearth case not ok (goal MISSED). The merge kept the older 'ok' row instead, so the report showed a measurement
    the current code could not make and 'hearth cases not measured: none'."""
    old = _row("hearth", ms=0.5, date="2026-12-05T00:00:00Z")
    broken = _row("hearth", "unavailable", date="2026-12-06T00:00:00Z",
                  reason="hearth.kernels.softmax does not import: SyntaxError: ...")
    assert report.merge_rows([old], [broken]) == [broken]
    rows = report.merge_rows([old, _row("compile", ms=0.6, date="2026-12-05T00:00:00Z")], [broken])
    assert report.op_geomeans(rows)["softmax"]["hearth_failed"] == 1
    # a peer's 'unavailable' still leaves its measurement standing, and hearth's 'skipped' (not run) too
    liger = _row("liger", ms=0.4, date="2026-12-05T00:00:00Z")
    assert report.merge_rows([liger], [_row("liger", "unavailable", date="2026-12-06T00:00:00Z")]) == [liger]
    assert report.merge_rows([old], [_row("hearth", "skipped", date="2026-12-06T00:00:00Z")]) == [old]
