"""A run stopped with SIGTERM (a CI job's time limit, `timeout`, a container stop) writes its report like Ctrl-C:
the replies measured so far, `interrupted: true`, `ok: false`, exit 143 (the shell's code for SIGTERM). Was: the
default SIGTERM handler killed the process at once and the report was never written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.evals.test_eval_runner import valid_reply
from tests.fakes.openai_server import Behavior, FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
ANSWERED = 2

CHILD = """
import sys
from pathlib import Path
from hearth.evals.runner import main
sys.exit(main(suite="companion", base_url=sys.argv[1], model="m", report=Path(sys.argv[2]), concurrency=1,
              threshold=0.0, timeout_s=60.0))
"""


def test_sigterm_writes_the_report_of_what_was_measured(tmp_path):
    held = threading.Event()
    calls = []

    def answer(body):
        calls.append(body)
        if len(calls) > ANSWERED:
            held.set()
            return Behavior.hang()
        return Behavior.reply(valid_reply("chat"))

    report = tmp_path / "eval.json"
    server = FakeOpenAI(answer).start_in_thread()
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1", "COLUMNS": "200"}
        child = subprocess.Popen([sys.executable, "-c", CHILD, server.base_url, str(report)], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert held.wait(30), "the eval never reached the held call"
            child.send_signal(signal.SIGTERM)
            out, _ = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    finally:
        server.stop()

    assert child.returncode == 143, (child.returncode, out)
    assert report.exists(), out
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["ok"] is False
    assert doc["overall"]["total"] == ANSWERED and len(doc["cases"]) == ANSWERED
    assert "INTERRUPTED" in out
