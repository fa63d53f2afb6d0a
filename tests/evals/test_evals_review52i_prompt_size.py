"""The report gives the prompt sizes the run measured, per reply and per suite (review 52i).

Was: the eval exists to measure envelope validity at production prompt size, but the report held no prompt size of
its own: each row's usage carried the server's prompt_tokens, and the summaries only their SUM over the replies
(45 prompts added up), which says nothing about how large a prompt was. The characters sent were in no row at all.
"""

from __future__ import annotations

import asyncio
import json

from hearth.evals.runner import main, run_cases, summarize
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI

CASES = load_suite("feed")[:3] + load_suite("analysts")[:2]


def test_each_row_and_summary_gives_the_prompt_size_sent_and_counted():
    sent: dict[str, int] = {}

    def handler(body):
        chars = sum(len(m["content"]) for m in body["messages"])
        sent[body["messages"][0]["content"], body["messages"][-1]["content"]] = chars
        # a server's own count: here one token per 4 characters
        return Behavior.reply("{}", usage={"prompt_tokens": chars // 4, "completion_tokens": 1, "total_tokens": 0})

    async def go():
        async with FakeOpenAI(handler) as server:
            return await run_cases(CASES, base_url=server.base_url, model="m", timeout_s=5, stream=False)

    scores = asyncio.run(go())
    rows = [s.to_json() for s in scores]
    assert [r["prompt_chars"] for r in rows] == [sent[c.system_prompt(), c.user] for c in CASES]
    summary = summarize(scores)
    feed = [sent[c.system_prompt(), c.user] for c in CASES if c.suite == "feed"]
    assert summary["suites"]["feed"]["prompt_chars"] == {"min": min(feed), "max": max(feed)}
    assert summary["suites"]["feed"]["usage"]["prompt_tokens_max"] == max(feed) // 4
    assert summary["suites"]["feed"]["usage"]["prompt_tokens_min"] == min(feed) // 4
    every = list(sent.values())
    assert summary["overall"]["prompt_chars"] == {"min": min(every), "max": max(every)}
    assert summary["overall"]["usage"]["prompt_tokens_max"] == max(every) // 4


def test_no_count_from_the_server_is_none_not_zero(tmp_path):
    server = FakeOpenAI(lambda body: Behavior.reply("{}", usage=None)).start_in_thread()
    try:
        main(suite="feed", base_url=server.base_url, model="m", report=tmp_path / "r.json")
    finally:
        server.stop()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["overall"]["usage"]["prompt_tokens_max"] is None
    assert doc["overall"]["prompt_chars"]["max"] == max(c["prompt_chars"] for c in doc["cases"]) > 6000
