"""Streamed replies under what servers send: every chunk the gateway refuses is a failure here too, and the
order of the results and the bound on calls in flight do not depend on which call finishes first."""

from __future__ import annotations

import asyncio
import json

import httpx

from hearth.envelope import FeedComment, dumps
from hearth.evals.client import chat_completion
from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI

GOOD = dumps(FeedComment(comment="Look at that loaf.", tone="proud"))
CONTENT = json.dumps({"choices": [{"index": 0, "delta": {"content": GOOD}, "finish_reason": None}]})
FINISH = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})


def streamed(*events: str):
    behavior = Behavior.raw("".join(f"data: {e}\n\n" for e in events), content_type="text/event-stream")

    async def go():
        async with FakeOpenAI(lambda body: behavior) as server:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, server.base_url, {"model": "m", "messages": [], "stream": True},
                                             timeout_s=5)

    return asyncio.run(go())


def test_a_chunk_without_choices_is_a_failure_as_in_the_gateway():
    """The gateway (providers.py: json.loads(data)["choices"]) refuses a stream chunk with no choices list; the
    eval skipped it, so an error in the bare OpenAI error shape ({"object": "error", "message": ...}, what vLLM
    sends as an error body) after the content, or a chunk whose choices is null, passed."""
    bare_error = json.dumps({"object": "error", "message": "engine died", "type": "InternalServerError", "code": 500})
    result = streamed(CONTENT, bare_error, FINISH, "[DONE]")
    assert result.status == 200 and result.error == "error in stream: engine died", result
    for bad in ('{"choices": null}', '{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}', "[" * 100_000):
        result = streamed(CONTENT, bad, FINISH, "[DONE]")
        assert result.status == 200 and result.error == f"malformed stream chunk: {bad[:200]!r}", (bad[:50], result)
    # still as before: the usage chunk of include_usage (choices: []), and an error object with choices absent
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    ok = streamed(CONTENT, FINISH, usage, "[DONE]")
    assert ok.error is None and ok.content == GOOD and ok.usage == {"prompt_tokens": 3, "completion_tokens": 5}
    error = streamed(CONTENT, json.dumps({"error": {"message": "engine died"}}), "[DONE]")
    assert error.error == "error in stream: engine died"


def test_results_are_in_case_order_whatever_finishes_first():
    """The first case's call is held until every other call has been answered: the results still come back
    case by case, sample by sample, each with its own seed."""
    cases = load_suite("feed")[:4]
    others_done = asyncio.Event()
    answered = []

    async def handler(body):
        user = body["messages"][-1]["content"]
        if user == cases[0].user:
            await others_done.wait()
        answered.append((user, body["seed"]))
        if len(answered) == 6:  # the 3 other cases x 2 samples
            others_done.set()
        return Behavior.reply(GOOD if body["seed"] == 3 else "prose, not JSON")

    async def go():
        async with FakeOpenAI(handler) as server:
            return await run_cases(cases, base_url=server.base_url, model="m", samples=2, seed=3, concurrency=8,
                                   timeout_s=10)

    scores = asyncio.run(go())
    assert answered[0][0] != cases[0].user and {u for u, _ in answered[-2:]} == {cases[0].user}
    assert [(s.id, s.sample, s.seed) for s in scores] == [(c.id, i, 3 + i) for c in cases for i in range(2)]
    assert [s.passed for s in scores] == [True, False] * 4
