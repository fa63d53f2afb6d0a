"""Review 76: `hearth bench --report-only` (or --merge) over a results.jsonl it cannot read is refused naming the
file. A file that is not UTF-8 gave a decode error naming no file ("'utf-8' codec can't decode byte 0xff ..."),
and one without read permission a PermissionError traceback, exit 1. Now each is exit 2 with the path."""

from __future__ import annotations

import os

import pytest

from hearth.bench import runner


def _report_only(out, **kw):
    return runner.main(ops=["softmax"], check=True, out=out, report_only=True, plots=False, providers=["hearth"], **kw)


def test_a_results_file_that_is_not_utf8_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_bytes(b'{"op": "softmax"}\n\xff\xfe garbage\n')
    assert _report_only(tmp_path) == 2
    out = capsys.readouterr().out.replace("\n", "")  # rich wraps long lines
    assert "results.jsonl" in out and "UTF-8" in out and "codec" not in out


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_results_file_without_read_permission_is_refused_naming_it(tmp_path, capsys):
    f = tmp_path / "results.jsonl"
    f.write_text("")
    f.chmod(0)
    try:
        assert _report_only(tmp_path) == 2
    finally:
        f.chmod(0o600)
    assert "results.jsonl" in capsys.readouterr().out


def test_a_merge_folder_whose_results_file_is_not_utf8_is_refused_naming_it(tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.jsonl").write_bytes(b"\xff\n")
    assert _report_only(tmp_path / "out", merge=[other]) == 2
    assert str(other / "results.jsonl") in capsys.readouterr().out.replace("\n", "")  # rich wraps long lines
