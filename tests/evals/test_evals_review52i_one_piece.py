"""Feed comments and analyst readings are asked for in one piece, as the app asks for them (review 52i).

Was: with --stream (the default) the eval streamed every case. The app streams only chat replies (companion chat and
rehearsal: routes/_util.reply_events); a feed comment (feed._comment) and an analyst's reading
(simulation._ask_analyst) are Chain.complete calls. Through hearth's gateway a stream is held to the streamed rule
for every kind (the first object-like span must be the envelope; a provider failing after the first delta is no
fallback), so a feed comment or reading that the app takes was failed by the eval.
"""

from __future__ import annotations

import asyncio

from hearth.envelope import AnalystReading, FeedComment, dumps
from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import gateway_url, make_config, provider

FEED = load_suite("feed")[0]
ANALYST = load_suite("analysts")[0]
CHAT = load_suite("companion")[0]


def drafted(case) -> str:
    """A valid envelope after a broken draft of it: repair skips the draft as chatter, a stream shows it."""
    if case.kind == "feed_comment":
        good = dumps(FeedComment(comment="Love this.", tone="warm"))
    else:
        good = dumps(AnalystReading(analyst=case.expect["analyst"], reading="Through my lens.", advice="One step.",
                                    risk="low"))
    return '{"draft": oops}\n' + good


def test_a_feed_comment_or_reading_the_app_takes_passes_the_eval_through_the_gateway():
    cases = [FEED, ANALYST]
    replies = {c.user: drafted(c) for c in cases}

    async def go():
        timeouts = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}  # 5 s connect: room for a CI stall
        async with FakeOpenAI(lambda body: Behavior.reply(replies[body["messages"][-1]["content"]])) as a:
            cfg = make_config(provider("a", a, model="hearth-lora", timeouts=timeouts), deadline_s=10.0)
            async with Chain(cfg) as chain:  # what the app does with these kinds: one complete call each
                taken = [await chain.complete(c.messages(), kind=c.kind, deadline_s=10.0) for c in cases]
            async with gateway_url(cfg) as url:
                scores = await run_cases(cases, base_url=url, model="hearth-lora", timeout_s=10, stream=True)
        return taken, scores

    taken, scores = asyncio.run(go())
    assert [t.provider for t in taken] == ["a", "a"]  # the app takes both replies
    assert [(s.id, s.reason) for s in scores] == [(FEED.id, None), (ANALYST.id, None)]
    assert [s.request["stream"] for s in scores] == [False, False]


def test_only_the_kinds_the_app_streams_are_streamed():
    seen: list[tuple[str, bool]] = []

    def handler(body):
        kind = next(c.kind for c in (CHAT, FEED, ANALYST) if c.user == body["messages"][-1]["content"])
        seen.append((kind, bool(body.get("stream"))))
        return Behavior.reply("{}")

    async def go():
        async with FakeOpenAI(handler) as server:
            for stream in (True, False):
                await run_cases([CHAT, FEED, ANALYST], base_url=server.base_url, model="m", timeout_s=5,
                                stream=stream, concurrency=1)

    asyncio.run(go())
    assert seen == [("chat", True), ("feed_comment", False), ("analyst", False),
                    ("chat", False), ("feed_comment", False), ("analyst", False)]
