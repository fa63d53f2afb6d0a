"""The eval waits for each reply as long as the app does for its kind (chat 60 s, analyst 45 s, feed comment 30 s:
hearth.envelope.REPLY_DEADLINE_S, the app settings' defaults): a reply later than the app's deadline is lost in
production, so it fails here. Was: one --timeout for every kind, default 120 s, and a feed comment the app drops
after 30 s passed. --timeout still sets one value for all."""

from __future__ import annotations

import asyncio
import json

from hearth.app.settings import AppSettings
from hearth.envelope import REPLY_DEADLINE_S
from hearth.evals import runner
from hearth.evals.runner import main, run_cases
from hearth.evals.suites import load_suite
from tests.evals.test_eval_runner import valid_reply
from tests.fakes.openai_server import Behavior, FakeOpenAI


def test_the_app_and_the_eval_wait_as_long_by_default():
    fields = AppSettings.model_fields
    assert fields["reply_deadline_s"].default == REPLY_DEADLINE_S["chat"]
    assert fields["analyst_timeout_s"].default == REPLY_DEADLINE_S["analyst"]
    assert fields["comment_timeout_s"].default == REPLY_DEADLINE_S["feed_comment"]


def test_a_reply_later_than_the_apps_deadline_for_its_kind_fails(monkeypatch):
    # the app's deadlines scaled down: a feed comment given 0.2 s, chat 5 s; every reply takes 0.5 s
    monkeypatch.setitem(REPLY_DEADLINE_S, "feed_comment", 0.2)
    monkeypatch.setitem(REPLY_DEADLINE_S, "chat", 5.0)
    cases = load_suite("feed")[:2] + load_suite("companion")[:2]

    def answer(body):
        kind = next(c.kind for c in cases if c.user == body["messages"][-1]["content"])
        return Behavior.reply(valid_reply(kind), delay_s=0.5)

    async def go(**kw):
        async with FakeOpenAI(answer) as server:
            return await run_cases(cases, base_url=server.base_url, model="m", **kw)

    scores = asyncio.run(go())
    assert [s.passed for s in scores] == [False, False, True, True], [(s.kind, s.reason) for s in scores]
    scores = asyncio.run(go(timeout_s=5.0))  # one timeout for all: the late feed comments pass
    assert all(s.passed for s in scores), [(s.kind, s.reason) for s in scores]


def test_the_report_says_how_long_each_kind_waited(tmp_path):
    report = tmp_path / "r.json"
    server = FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))).start_in_thread()
    try:
        assert main(suite="feed", base_url=server.base_url, model="m", report=report) == 0
        assert main(suite="feed", base_url=server.base_url, model="m", report=tmp_path / "t.json", timeout_s=7) == 0
    finally:
        server.stop()
    doc = json.loads(report.read_text())
    assert doc["timeout_s"] is None and doc["timeouts_s"] == {"feed_comment": REPLY_DEADLINE_S["feed_comment"]}
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["timeout_s"] == 7 and doc["timeouts_s"] == {"feed_comment": 7}
    assert runner.REPLY_DEADLINE_S is REPLY_DEADLINE_S
