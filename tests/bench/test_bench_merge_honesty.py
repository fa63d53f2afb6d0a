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


def test_a_row_from_an_earlier_run_never_replaces_a_later_runs_row():
    """The later *group* won whatever its rows' dates: `--report-only --out DEST --merge OLD` (or
    merge_models_run.sh given an older call's folder after a newer one) put the older measurements back over the
    newer ones. Now the run date (env.date) decides between two measured rows (or two rows not run); rows of one run,
    or without dates, keep the later-group rule, and a measured row still beats a row not run either way."""
    old, new = "2026-12-04T10:00:00Z", "2026-12-06T10:00:00Z"
    newer = _row("hearth", ms=0.4, date=new)
    older = _row("hearth", ms=0.9, date=old)
    assert report.merge_rows([newer], [older]) == [newer]
    assert report.merge_rows([older], [newer]) == [newer]
    older_wrong = _row("hearth", "wrong", date=old, reason="rel err")
    assert report.merge_rows([newer], [older_wrong]) == [newer]
    # same run, or no dates: the later group wins, as before
    again = _row("hearth", ms=0.41, date=new)
    assert report.merge_rows([newer], [again]) == [again]
    assert report.merge_rows([_row("hearth", ms=1.0)], [_row("hearth", ms=2.0)])[0]["ms"] == 2.0
    # a measurement beats a row not run, whichever run is later
    skipped_new = _row("liger", "skipped", date=new, reason="time budget spent")
    liger_old = _row("liger", ms=0.3, date=old)
    assert report.merge_rows([skipped_new], [liger_old]) == [liger_old]
    assert report.merge_rows([liger_old], [skipped_new]) == [liger_old]


def test_rows_of_a_provider_that_never_applies_to_the_op_are_dropped():
    """A run of 2026-12-01 wrote time-budget 'skipped' rows for every provider, Liger and torch.compile on
    attention, cuBLAS on rms_norm included (fixed since for new runs: test_budget_skipped_rows_only_for_providers_that_
    apply). No later run writes such a row again, so the merge kept them for good, and the published summary read
    'attention ... 1 ranked while a fused peer was not ok (compile skipped, liger skipped, quack skipped, cublas
    skipped, torch_lce skipped)': peers that never run attention, named as if they had failed to."""
    case = dict(op="attention", size_label="Qwen3-32B", dtype="bfloat16", mode="full")
    env = {"gpu": "NVIDIA H200", "date": "2026-12-06T20:52:08Z"}
    hearth = {**case, "provider": "hearth", "status": "ok", "ms": 7.0, "env": env}
    fa = {**case, "provider": "flash_attn", "status": "ok", "ms": 6.0, "env": env}
    stale = [{**case, "provider": p, "status": "skipped", "reason": "time budget spent",
              "env": {"gpu": "NVIDIA H200", "date": "2026-12-01T11:23:47Z"}} for p in ("compile", "liger", "cublas")]
    rows = report.merge_rows(stale + [hearth], [fa])
    assert {r["provider"] for r in rows} == {"hearth", "flash_attn"}
    v = report.verdict(rows)
    assert v["text"] == "loss 0.857x vs flash_attn" and v["unranked"] == []
    line = report.geomean_lines(rows)[0]
    assert "not ok" not in line and "compile" not in line
    # a provider that applies keeps its not-run row, named beside the verdict
    sdpa = {**case, "provider": "sdpa_cudnn", "status": "skipped", "reason": "time budget spent", "env": env}
    assert "sdpa_cudnn skipped" in report.verdict(report.merge_rows(rows, [sdpa]))["text"]


def test_a_line_that_is_not_a_row_is_an_error_naming_the_file_and_line(tmp_path):
    """read_rows took any JSON: `--merge benchmarks/gateway` (another results.jsonl, of the gateway's load tests) or a
    row missing its key fields got through, and the merge died in row_key with a bare KeyError: 'op' naming no file."""
    import json

    import pytest

    good = {"op": "softmax", "size_label": "4x64", "dtype": "float32", "mode": "fwd", "provider": "hearth", "status": "ok"}
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({"label": "gateway", "rps": 3.0}) + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl:2: .*op"):
        report.read_rows(p)
    p.write_text(json.dumps(good) + "\n\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"results.jsonl:3: not a bench row"):
        report.read_rows(p)
    p.write_text(json.dumps(good) + "\n")
    assert report.read_rows(p) == [good]
