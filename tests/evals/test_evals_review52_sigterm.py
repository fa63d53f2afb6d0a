"""A run stopped with SIGTERM (a CI job's time limit, `timeout`, a container stop) writes its report like Ctrl-C:
the replies measured so far, `interrupted: true`, `ok: false`, exit 143 (the shell's code for SIGTERM). Was: the
default SIGTERM handler killed the process at once and the report was never written."""

from __future__ import annotations

import json
import signal

from tests.evals.test_evals_review51d_interrupted import ANSWERED, stop_a_run


def test_sigterm_writes_the_report_of_what_was_measured(tmp_path):
    code, out, report = stop_a_run(tmp_path, signal.SIGTERM)
    assert code == 143, (code, out)
    assert report.exists(), out
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["ok"] is False
    assert doc["overall"]["total"] == ANSWERED and len(doc["cases"]) == ANSWERED
    assert "INTERRUPTED" in out
