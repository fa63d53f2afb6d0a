"""A stream hearth's gateway had begun and could not finish: once the first delta is out it cannot fall back, so
it ends the stream with an error event, {"error": {"code": "stream_interrupted", "provider": ..., "cause": ...}}
(gateway/server.py). Was: the row kept only `error in stream: ...`, no attempts, so the report's gateway figures
did not count it as a reply no provider got right, nor say which provider broke. Now the event's provider is the
row's provider and its attempts are the event's attempts list when it sends one, else [[provider,
"stream_interrupted"]], as a 502's failures list already was. Other servers' error events are read as before."""

from __future__ import annotations

import asyncio
import json

import httpx

from hearth.evals.client import chat_completion
from hearth.evals.runner import run_cases, summarize
from tests.evals.test_evals_review50_gateway import CASES, case_of, gateway_url, good
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import make_config, provider

# connect_s: a loopback connect is instant, but a loaded CI machine can stall the process for about a second
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}


def test_a_stream_the_gateway_could_not_finish_names_the_provider_that_broke():
    # a chat case (the kind the app streams, so the eval streams it): provider a streams half of it, then the body
    # ends (no finish_reason, no [DONE])
    broken = CASES[1]
    assert broken.kind == "chat"

    def answer_a(body):
        case = case_of(body)
        text = good(case)
        if case is broken:
            return Behavior.stream([text[: len(text) // 2], text[len(text) // 2:]], stall_after=None, cut=True)
        return Behavior.reply(text)

    async def go():
        async with FakeOpenAI(answer_a) as a, FakeOpenAI(lambda body: Behavior.reply(good(case_of(body)))) as b:
            cfg = make_config(provider("a", a, model="hearth-lora", timeouts=TIMEOUTS),
                              provider("b", b, model="hearth-lora", timeouts=TIMEOUTS),
                              deadline_s=10.0, breaker_failures=100)
            async with gateway_url(cfg) as url:
                return await run_cases(CASES, base_url=url, model="hearth-lora", timeout_s=10, stream=True), b.requests

    scores, asked_b = asyncio.run(go())
    assert not asked_b  # no fallback once the stream had begun
    row = next(s for s in scores if s.id == broken.id)
    assert not row.passed and row.status == 200 and row.reason.startswith("error in stream: a: "), row.reason
    assert row.provider == "a" and row.attempts == [["a", "stream_interrupted"]], (row.provider, row.attempts)
    assert all(s.passed and s.attempts == [["a", "ok"]] for s in scores if s is not row)
    overall = summarize(scores)["overall"]
    assert overall["unanswered"] == 1 and overall["fallbacks"] == 0
    assert overall["failed_attempts"] == {"a": {"stream_interrupted": 1}}
    assert row.to_json()["attempts"] == [["a", "stream_interrupted"]]


def stream_ending_with(error_event: dict, headers: str = ""):
    """A 200 SSE stream: one content delta, then the error event (no [DONE]); raw, so any header can be left out."""
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": '{"comment": "Lo'}, "finish_reason": None}]})
    body = f"data: {first}\n\ndata: {json.dumps(error_event)}\n\n".encode()

    async def handle(reader, writer):
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{headers}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1",
                                             {"model": "m", "messages": [], "stream": True}, timeout_s=5)
        finally:
            server.close()

    return asyncio.run(go())


def test_the_event_alone_names_the_provider_and_its_attempts_list_is_kept():
    event = {"error": {"message": "b: stream interrupted after first byte: reset", "type": "hearth_gateway",
                       "param": None, "code": "stream_interrupted", "provider": "b", "cause": None}}
    got = stream_ending_with(event)  # no X-Hearth-Provider header (a proxy in between dropped it)
    assert got.status == 200 and got.error == "error in stream: b: stream interrupted after first byte: reset"
    assert got.provider == "b" and got.attempts == [["b", "stream_interrupted"]] and got.content == '{"comment": "Lo'
    with_list = {"error": {**event["error"], "attempts": [["a", "status_500"], ["b", "interrupted"]]}}
    got = stream_ending_with(with_list, "X-Hearth-Provider: b\r\n")
    assert got.provider == "b" and got.attempts == [["a", "status_500"], ["b", "interrupted"]]
    malformed = {"error": {**event["error"], "attempts": [["a"], 3]}}  # not [provider, outcome] pairs
    assert stream_ending_with(malformed).attempts == [["b", "stream_interrupted"]]


def test_other_error_events_are_read_as_before():
    for event in ({"error": {"message": "engine died", "code": 500}},
                  {"error": {"message": "engine died", "provider": "x"}},  # no stream_interrupted code
                  {"error": {"message": "engine died", "code": "stream_interrupted"}},  # no provider named
                  {"error": {"message": "the gateway's state store is unavailable", "type": "service_unavailable",
                             "code": "state_store_unavailable", "param": None}},
                  {"object": "error", "message": "engine died", "code": "stream_interrupted", "provider": 3}):
        got = stream_ending_with(event)
        assert got.error == f"error in stream: {(event.get('error') or event)['message']}", event
        assert got.provider is None and got.attempts is None, event
    got = stream_ending_with({"error": {"message": "engine died"}}, "X-Hearth-Provider: a\r\n")
    assert got.provider == "a" and got.attempts is None  # the header, as before
