"""Defects found by review 54 of the gateway (one test per defect; each failed before its fix). Real loopback
fake providers, no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from hearth.gateway.chain import Chain, StreamDone
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import (
    BACKENDS, CHAT_JSON, MESSAGES, backend_settings, make_config, provider, steady)


def _vllm_like(body: dict) -> Behavior:
    """vLLM's (and OpenAI's) request check: stream_options without stream is a 400."""
    if body.get("stream_options") and not body.get("stream"):
        return Behavior.status(400, body={"error": {"message": "Stream options can only be defined when "
                                                               "`stream=True`.", "type": "BadRequestError"}})
    return Behavior.reply(CHAT_JSON)


def test_extra_body_stream_options_is_sent_only_with_streaming_requests():
    # docs/gateway.md: "a server that refuses the option takes extra_body = { stream_options = { include_usage =
    # false } }". That table went out with every JSON (non-streaming) request too, which vLLM and OpenAI refuse
    # with a 400: every feed comment / analyst reading (the app asks for those in one piece) failed on that
    # provider, and being a client error it never even counted toward the breaker.
    async def main():
        async with FakeOpenAI(_vllm_like) as up:
            cfg = make_config(provider("a", up, extra_body={"stream_options": {"include_usage": False}}))
            async with Chain(cfg) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
                events = [ev async for ev in chain.stream(MESSAGES, kind="chat")]
            return result, events, up.requests

    result, events, bodies = asyncio.run(main())
    assert result.provider == "a" and result.attempts == [("a", "ok")]
    assert isinstance(events[-1], StreamDone) and events[-1].result.provider == "a"
    json_body, sse_body = bodies
    assert "stream_options" not in json_body and "stream" not in json_body
    assert sse_body["stream"] is True and sse_body["stream_options"] == {"include_usage": False}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("retry_after, max_retry_after_s", [("0", 300.0), ("30", 0.0)],
                         ids=["retry-after-0", "max_retry_after_s-0"])
def test_failures_with_a_zero_retry_after_still_open_the_breaker(backend, retry_after, max_retry_after_s):
    # A 503 whose Retry-After came to 0 s (the upstream's "0", an HTTP-date in the past, or any value under
    # [gateway] max_retry_after_s = 0) skipped the consecutive-failure rule: the store returned "not opened" before
    # counting toward breaker_failures, so a provider failing every request that way was never cooled down and
    # every request paid its failed attempt first.
    async def main():
        async with FakeOpenAI(Behavior.status(503, headers={"Retry-After": retry_after})) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=3,
                              max_retry_after_s=max_retry_after_s, **backend_settings(backend))
            async with Chain(cfg) as chain:
                results = [await chain.complete(MESSAGES, kind="chat") for _ in range(4)]
                state = {s["name"]: s for s in await chain.status()}
            return results, len(a.requests), state

    results, sent_to_a, state = asyncio.run(main())
    assert all(r.provider == "b" for r in results)
    assert sent_to_a == 3                                  # the 4th request skipped it
    assert results[3].attempts[0] == ("a", "cooldown")
    assert state["a"]["state"] == "open" and state["a"]["consecutive_failures"] == 3


@pytest.mark.parametrize("mode", ["complete", "stream"])
@pytest.mark.parametrize("arg, value, error", [
    ("max_tokens", 0, ValueError), ("max_tokens", -5, ValueError), ("max_tokens", "64", TypeError),
    ("max_tokens", True, TypeError), ("max_tokens", 64.0, TypeError),
    ("deadline_s", "5", TypeError), ("deadline_s", True, TypeError),
    ("request_id", 7, TypeError),
])
def test_bad_chain_arguments_are_refused_naming_the_argument(mode, arg, value, error):
    # Chain.complete/stream promise ValueError/TypeError for bad arguments (the app calls the chain in process,
    # without the HTTP layer's checks). max_tokens was not checked at all: 0, "64" or True went out to every
    # provider, each answered 400, and the caller got AllProvidersFailed naming no argument; deadline_s="5" raised
    # a bare "'>' not supported" TypeError, deadline_s=True was taken as 1 s, and a non-string request_id failed
    # inside the HTTP client.
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as up:
            async with Chain(make_config(provider("a", up))) as chain:
                with pytest.raises(error) as info:
                    if mode == "complete":
                        await chain.complete(MESSAGES, kind="chat", **{arg: value})
                    else:
                        [ev async for ev in chain.stream(MESSAGES, kind="chat", **{arg: value})]
                metrics = chain.metrics.render().decode()
            return info.value, len(up.requests), metrics

    exc, sent, metrics = asyncio.run(main())
    assert arg in str(exc), exc
    assert sent == 0                                      # refused before any provider
    assert "hearth_gateway_requests_total{" not in metrics  # not a request: no outcome
