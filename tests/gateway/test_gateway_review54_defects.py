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


def test_a_warmup_that_dies_on_the_state_store_is_counted_failed(caplog):
    # The module's promise: a background warm-up's failure is logged at ERROR and counted in
    # hearth_gateway_warmups_total{outcome="failed"}. A warm-up whose state store failed under it (Redis gone while it
    # knocked: set_warm raised) was logged but not counted, so the dashboard's failed warm-ups read 0.
    import logging

    from hearth.gateway.state import MemoryStore, StateStoreError

    class StoreGoneDuringWarmup(MemoryStore):
        calls = 0

        async def set_warm(self, name, warm, ttl_s):
            StoreGoneDuringWarmup.calls += 1
            if StoreGoneDuringWarmup.calls > 1:  # the request's own probe wrote "cold"; the warm-up's write fails
                raise StateStoreError("Redis at redis://127.0.0.1:1/0: Connection refused")
            await super().set_warm(name, warm, ttl_s)

    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=Behavior.status(503)) as ft, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as hosted:
            ft_cfg = {"name": "ft", "base_url": f"http://127.0.0.1:{ft.port}/v1", "model": "lora",
                      "scale_to_zero": True, "health_url": f"http://127.0.0.1:{ft.port}/health",
                      "warm": {"probe_timeout_s": 0.5, "ttl_s": 30.0, "warmup_budget_s": 5.0, "warmup_poll_s": 0.02,
                               "warmup_request_timeout_s": 1.0}}
            cfg = make_config(ft_cfg, steady("hosted", hosted))
            async with Chain(cfg, store=StoreGoneDuringWarmup()) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
                await chain.gates["ft"].wait_warmup()
                await asyncio.sleep(0)  # let the done-callback log
                return result, chain.metrics.render().decode()

    with caplog.at_level(logging.ERROR, logger="hearth.gateway.warm"):
        result, metrics = asyncio.run(main())
    assert result.provider == "hosted"
    assert any("Connection refused" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert 'hearth_gateway_warmups_total{outcome="failed",provider="ft"} 1.0' in metrics, metrics
