"""review51d: a run stopped with Ctrl-C still writes its report, with the replies it measured.

Was: SIGINT cancelled the run inside asyncio.run, the KeyboardInterrupt went out of runner.main, and --report was
never written: an hour of replies lost to one keystroke. Now the replies scored so far are summarized, printed
and written, the report says `interrupted: true` and how many replies the run had planned, `ok` is false (a part
of a run is not a verdict), and the exit code is 130 (the shell's for SIGINT).

The eval runs in a child process (a real Ctrl-C, SIGINT to its main thread) against a fake model on loopback that
answers the first cases and holds the next one open; the signal is sent once that call is in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from hearth.evals.runner import summarize
from hearth.evals.suites import load_suite
from tests.evals.test_eval_runner import valid_reply
from tests.fakes.openai_server import Behavior, FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
ANSWERED = 3

CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a real terminal's Ctrl-C, whatever started us
from pathlib import Path
from hearth.evals.runner import main
sys.exit(main(suite="companion", base_url=sys.argv[1], model="m", report=Path(sys.argv[2]), concurrency=1,
              samples=2, threshold=0.0, timeout_s=60.0))
"""


def stop_a_run(tmp_path, sig) -> tuple[int, str, Path]:
    """Run CHILD against a fake model that answers ANSWERED calls and holds the next one open; send `sig` once that
    call is in flight. (exit code, output, report path)"""
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
            child.send_signal(sig)
            out, _ = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    finally:
        server.stop()
    return child.returncode, out, report


def test_ctrl_c_writes_the_report_of_what_was_measured(tmp_path):
    code, out, report = stop_a_run(tmp_path, signal.SIGINT)
    assert code == 130, out
    assert report.exists(), out
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["planned"] == 2 * len(load_suite("companion"))
    assert doc["ok"] is False  # the fraction so far (3/3) is over the threshold, but the run did not finish
    rows = doc["cases"]
    assert len(rows) == ANSWERED and all(r["passed"] for r in rows)
    assert [(r["id"], r["sample"]) for r in rows] == sorted((r["id"], r["sample"]) for r in rows)
    assert doc["overall"]["total"] == ANSWERED and doc["overall"]["passed"] == ANSWERED
    assert "INTERRUPTED" in out and "PASS" not in out and f"{ANSWERED} of {doc['planned']} replies" in out


def test_a_complete_run_says_it_was_not_interrupted(tmp_path):
    from hearth.evals.runner import main

    cases = load_suite("feed")
    report = tmp_path / "eval.json"
    server = FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))).start_in_thread()
    try:
        code = main(suite="feed", base_url=server.base_url, model="m", report=report)
    finally:
        server.stop()
    doc = json.loads(report.read_text())
    assert code == 0 and doc["ok"] is True
    assert doc["interrupted"] is False and doc["planned"] == len(cases) == doc["overall"]["total"]
    assert summarize([])["overall"]["total"] == 0  # nothing measured yet still summarizes


def test_every_key_the_report_writes_is_named_in_the_docs_output_section(tmp_path):
    import re

    from hearth.evals.runner import main

    report = tmp_path / "eval.json"
    server = FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))).start_in_thread()
    try:
        main(suite="feed", base_url=server.base_url, model="m", report=report, samples=2)
    finally:
        server.stop()
    doc = json.loads(report.read_text())
    keys = set(doc) | set(doc["overall"]) | set(doc["overall"]["usage"]) | set(doc["cases"][0])
    text = (ROOT / "docs" / "eval.md").read_text(encoding="utf-8")
    output = text[text.index("## Output"):text.index("## Trying it without a model")]
    missing = sorted(k for k in keys if not re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", output))
    assert not missing, f"report keys docs/eval.md's Output section does not name: {missing}"
