"""hearth.evals.client against a real loopback server: odd but possible server replies are failures, never crashes."""

from __future__ import annotations

import asyncio
import json

import httpx

from hearth.evals.client import chat_completion
from tests.fakes.openai_server import Behavior, FakeOpenAI

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def call(behavior: Behavior, *, stream: bool = False, timeout_s: float = 5.0):
    async def go():
        async with FakeOpenAI(lambda body: behavior) as server:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, server.base_url, {**BODY, "stream": stream}, timeout_s=timeout_s)

    return asyncio.run(go())


def test_error_body_whose_error_is_not_an_object_is_a_failure():
    # {"error": "..."} (a string) and {"error": null} are what several proxies send with a 429/502
    for body, shown in [({"error": "rate limited"}, "HTTP 429: rate limited"), ({"error": None}, "HTTP 429"),
                        ([1, 2], "HTTP 429"), ({"error": {"message": None}}, "HTTP 429")]:
        for stream in (False, True):
            result = call(Behavior.status(429, body=body), stream=stream)
            assert result.status == 429 and result.error == shown, (body, stream, result)


def sse(*events: str) -> Behavior:
    return Behavior.raw("".join(f"data: {e}\n\n" for e in events), content_type="text/event-stream")


def test_malformed_stream_chunks_are_failures():
    good = '{"choices": [{"delta": {"content": "{}"}, "finish_reason": "stop"}]}'
    for bad in ["null", "[1]", '"text"', '{"choices": [3]}', '{"choices": [{"delta": "x"}]}',
                '{"choices": [{"delta": {"content": ["a"]}}]}', '{"choices": {"delta": {}}}']:
        result = call(sse(bad, good, "[DONE]"), stream=True)
        assert result.status == 200 and result.error.startswith("malformed stream chunk"), (bad, result)
        assert result.content == ""


def test_non_string_message_content_is_not_an_envelope():
    """The gateway refuses a completion whose message.content is not a string; the eval must not pass it."""
    import json

    from hearth.envelope import FeedComment
    from hearth.evals.scoring import score
    from hearth.evals.suites import load_suite

    envelope = FeedComment(comment="Look at that loaf.", tone="proud").model_dump()
    for content in (envelope, [{"type": "text", "text": json.dumps(envelope)}]):
        body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
        result = call(Behavior.raw(json.dumps(body)))
        assert result.status == 200 and result.error == f"message.content is {type(content).__name__}, not a string"
        scored = score(load_suite("feed")[0], result)
        assert not scored.passed and scored.checks["response"] is False


def test_stream_cut_short_is_a_failure():
    """A body that ends cleanly with neither a finish_reason nor [DONE] was cut short (the gateway refuses it),
    even when what arrived happens to parse; either end marker alone is a complete stream."""
    text = '{"comment": "Look at that loaf.", "tone": "proud"}'
    cut = call(Behavior.stream([text[:10], text[10:]], cut=True), stream=True)
    assert cut.status == 200 and cut.error == "stream ended without a finish_reason or [DONE] (cut short)"
    assert cut.content == text  # what arrived is kept for the report
    whole = call(Behavior.stream([text[:10], text[10:]]), stream=True)
    assert whole.error is None and whole.content == text and whole.finish_reason == "stop"
    chunk = '{"choices": [{"delta": {"content": "%s"}, "finish_reason": %s}]}'
    no_finish = call(sse(chunk % ("{}", "null"), "[DONE]"), stream=True)
    assert no_finish.error is None and no_finish.content == "{}"
    no_done = call(sse(chunk % ("{}", '"stop"')), stream=True)
    assert no_done.error is None and no_done.finish_reason == "stop"


def test_error_event_in_a_stream_is_a_failure():
    """vLLM and OpenAI report a failure mid-stream as a chunk with an "error" object; it was skipped (no
    choices), so a reply whose content had arrived before it passed, and the gateway refuses that stream."""
    text = '{"comment": "Look at that loaf.", "tone": "proud"}'
    content = json.dumps({"choices": [{"delta": {"content": text}, "finish_reason": None}]})
    error = json.dumps({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
    result = call(sse(content, error, "[DONE]"), stream=True)
    assert result.status == 200 and result.error == "error in stream: engine died", result
