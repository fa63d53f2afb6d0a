"""`hearth eval` against hearth's own gateway (docs/eval.md lists it as an endpoint), run on loopback with fake
providers behind it.

Was: the eval never told the gateway the envelope kind of a case, so the gateway checked every reply as its
default kind (chat): a valid feed comment or analyst reading was refused by every provider (502), and the feed and
analysts suites scored 0 whatever the model wrote. And a reply the gateway got only after another provider had
failed (an invalid envelope, a 500) counted as a pass with nothing in the report to show it.
"""

from __future__ import annotations

import asyncio

import pytest

from hearth.envelope import AnalystReading, ChatReply, FeedComment, dumps
from hearth.evals.runner import run_cases, summarize
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import gateway_url, make_config, provider

CASES = load_suite("companion")[:2] + load_suite("feed")[:3] + load_suite("analysts")[:3]


def good(case) -> str:
    if case.kind == "chat":
        return dumps(ChatReply(message="I'm here.", mood="calm", memories=[], affection=0, trust=0,
                               suggested_actions=[]))
    if case.kind == "feed_comment":
        return dumps(FeedComment(comment="Love this.", tone="warm"))
    return dumps(AnalystReading(analyst=case.expect["analyst"], reading="Through my lens.", advice="One step.",
                                risk="low"))


def case_of(body: dict):
    return next(c for c in CASES if c.user == body["messages"][-1]["content"]
                and c.system_prompt() == body["messages"][0]["content"])


@pytest.mark.parametrize("stream", [True, False])
def test_eval_through_the_gateway_sends_each_case_kind_and_records_who_answered(stream):
    flaky = CASES[3]  # a feed case: provider a answers prose, the gateway falls back to b

    def answer_a(body):
        case = case_of(body)
        return Behavior.reply("What a lovely loaf!" if case is flaky else good(case))

    async def go():
        async with FakeOpenAI(answer_a) as a, FakeOpenAI(lambda body: Behavior.reply(good(case_of(body)))) as b:
            timeouts = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}  # 5 s connect: room for a CI stall
            cfg = make_config(provider("a", a, model="hearth-lora", timeouts=timeouts),
                              provider("b", b, model="hearth-lora", timeouts=timeouts),
                              deadline_s=10.0, breaker_failures=10)
            async with gateway_url(cfg) as url:
                scores = await run_cases(CASES, base_url=url, model="hearth-lora", timeout_s=10, stream=stream)
            return scores, a.requests + b.requests

    scores, upstream = asyncio.run(go())
    assert [s.reason for s in scores] == [None] * len(CASES)
    assert all("hearth_kind" not in body for body in upstream)  # a header: other servers never see it
    by_id = {s.id: s for s in scores}
    assert by_id[flaky.id].provider == "b" and by_id[flaky.id].attempts == [["a", "invalid_envelope"], ["b", "ok"]]
    assert all(s.provider == "a" and s.attempts == [["a", "ok"]] for s in scores if s.id != flaky.id)
    summary = summarize(scores)
    assert summary["overall"]["providers"] == {"a": len(CASES) - 1, "b": 1}
    assert summary["overall"]["fallbacks"] == 1 and summary["suites"]["feed"]["fallbacks"] == 1
    assert summary["suites"]["analysts"]["fallbacks"] == 0
    row = by_id[flaky.id].to_json()
    assert row["provider"] == "b" and row["attempts"] == [["a", "invalid_envelope"], ["b", "ok"]]


def test_a_server_that_is_not_the_gateway_gets_the_kind_as_a_header_only():
    """Other servers see the kind only as an X-Hearth-Kind header (a body key would be refused by OpenAI), and
    the summary has no gateway figures for them."""
    async def go():
        async with FakeOpenAI(lambda body: Behavior.reply(good(case_of(body)))) as server:
            scores = await run_cases(CASES, base_url=server.base_url, model="m", timeout_s=5, stream=True)
            return scores, server.requests, server.headers

    scores, bodies, headers = asyncio.run(go())
    assert all(s.passed and s.provider is None and s.attempts is None for s in scores)
    assert sorted(h["X-Hearth-Kind"] for h in headers) == sorted(c.kind for c in CASES)
    # stream_options only where the request streams (chat; the others are asked for in one piece)
    assert all(set(b) == {"model", "messages", "stream", "max_tokens"} | ({"stream_options"} if b["stream"] else set())
               for b in bodies)
    assert any(b["stream"] for b in bodies) and not all(b["stream"] for b in bodies)
    overall = summarize(scores)["overall"]
    assert "providers" not in overall and "fallbacks" not in overall


def test_the_console_says_who_answered_and_how_many_after_a_fallback():
    from io import StringIO

    from rich.console import Console

    from hearth.evals.runner import _print
    from hearth.evals.scoring import CaseScore

    def row(i, provider, attempts):
        return CaseScore(suite="feed", id=f"feed-{i}", kind="feed_comment", passed=True, checks={}, reason=None,
                         latency_s=0.1, status=200, finish_reason="stop", repaired=False, provider=provider,
                         attempts=attempts)

    scores = [row(1, "finetune", [["finetune", "ok"]]), row(2, "hosted", [["finetune", "status_500"], ["hosted", "ok"]])]
    out = StringIO()
    _print(Console(file=out, width=200), summarize(scores), scores, 1.0)
    assert "answered by (gateway): finetune 1, hosted 1; 1 of 2 replies came after another provider" in out.getvalue()
    out = StringIO()
    plain = [row(1, None, None)]
    _print(Console(file=out, width=200), summarize(plain), plain, 1.0)
    assert "answered by" not in out.getvalue()
