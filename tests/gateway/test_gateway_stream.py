"""Streaming through the chain: fallback only before the first byte, an error after it."""

import asyncio

import pytest

from hearth.envelope import ChatReply
from hearth.gateway.chain import Chain, StreamDelta, StreamDone
from hearth.gateway.errors import AllProvidersFailed, InvalidEnvelope, StreamInterrupted, Timeout
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, FIRST_TOKEN_S, MARGIN_S, MESSAGES, make_config, provider, stopwatch

PIECES = [CHAT_JSON[:10], CHAT_JSON[10:40], CHAT_JSON[40:]]


async def _collect(chain, **kw):
    events = []
    with stopwatch() as t:
        try:
            async for ev in chain.stream(MESSAGES, kind="chat", **kw):
                events.append(ev)
        except (StreamInterrupted, AllProvidersFailed) as exc:
            events.append(exc)
    return events, t()


async def _two(primary, secondary=Behavior.stream(PIECES), **timeouts):
    async with FakeOpenAI(primary) as a, FakeOpenAI(secondary) as b:
        cfg = make_config(provider("a", a, timeouts=timeouts), provider("b", b))
        async with Chain(cfg) as chain:
            events, elapsed = await _collect(chain)
        return events, elapsed, a, b


@pytest.mark.parametrize("primary, outcome, budget_s", [
    (Behavior.status(500), "status_500", 0.0),
    (Behavior.hang(), "timeout_first_token", FIRST_TOKEN_S),
    (Behavior.stream(PIECES, first_token_delay_s=3 * FIRST_TOKEN_S), "timeout_first_token", FIRST_TOKEN_S),
    (Behavior.stream(PIECES, stall_after=0), "timeout_first_token", FIRST_TOKEN_S),  # headers, then nothing
    (Behavior.reset(), "connection", 0.0),
], ids=["500", "hang", "slow-first-token", "stall-before-first-delta", "reset"])
def test_stream_falls_back_before_first_byte(primary, outcome, budget_s):
    events, elapsed, a, b = asyncio.run(_two(primary))
    deltas = [e for e in events if isinstance(e, StreamDelta)]
    assert {d.provider for d in deltas} == {"b"}
    assert "".join(d.text for d in deltas) == CHAT_JSON
    done = events[-1]
    assert isinstance(done, StreamDone) and done.result.envelope == ChatReply(**CHAT)
    assert done.result.attempts == [("a", outcome), ("b", "ok")]
    assert b.requests[0]["stream"] is True
    assert elapsed < budget_s + MARGIN_S


def test_no_fallback_after_first_byte_stall_ends_stream():
    events, elapsed, a, b = asyncio.run(_two(Behavior.stream(PIECES, stall_after=1)))
    assert [type(e) for e in events] == [StreamDelta, StreamInterrupted]
    assert events[0].text == PIECES[0] and events[0].provider == "a"
    err = events[1]
    assert err.provider == "a" and isinstance(err.__cause__, Timeout)
    assert not b.requests                              # never fell back after bytes were sent
    assert elapsed < FIRST_TOKEN_S + MARGIN_S          # the stall costs one idle timeout


def test_total_timeout_ends_a_trickling_stream():
    trickle = Behavior.stream(list(CHAT_JSON), chunk_delay_s=0.05)
    events, elapsed, a, b = asyncio.run(_two(trickle, connect_s=0.2, first_token_s=0.2, total_s=0.4))
    err = events[-1]
    assert isinstance(err, StreamInterrupted) and isinstance(err.__cause__, Timeout)
    assert err.__cause__.kind == "total"
    assert 0.4 <= elapsed < 0.4 + MARGIN_S and not b.requests


def test_prose_reply_shows_nothing_and_falls_back():
    # no JSON object in the reply: not one byte reached the client, so the chain may still fall back
    events, _, a, b = asyncio.run(_two(Behavior.stream(["Sure, ", "here you go"])))
    assert isinstance(events[-1], StreamDone) and events[-1].result.provider == "b"
    assert events[-1].result.attempts == [("a", "invalid_envelope"), ("b", "ok")]
    assert "".join(e.text for e in events[:-1]) == CHAT_JSON and len(b.requests) == 1


def test_invalid_envelope_after_streaming_is_an_interruption():
    events, _, _, b = asyncio.run(_two(Behavior.stream(['{"message": ', '"hi"}'])))
    assert isinstance(events[-1], StreamInterrupted) and isinstance(events[-1].__cause__, InvalidEnvelope)
    assert "".join(e.text for e in events[:-1]) == '{"message": "hi"}' and not b.requests


def test_stream_all_fail_before_first_byte():
    events, _, _, _ = asyncio.run(_two(Behavior.status(500), Behavior.status(502)))
    (exc,) = events
    assert isinstance(exc, AllProvidersFailed)
    assert [e.status for e in exc.exceptions] == [500, 502]


def test_oversized_sse_line_falls_back_instead_of_escaping_the_error_tree():
    # A 256 KiB event line (over aiohttp's default read buffer) from a broken upstream must end as a
    # ProviderError of that provider, so the chain falls back before the first byte.
    huge = b"data: " + b"x" * (1 << 18) + b"\n\n"
    events, _, a, b = asyncio.run(_two(Behavior.raw(huge, content_type="text/event-stream")))
    assert isinstance(events[-1], StreamDone) and events[-1].result.provider == "b"
    assert events[-1].result.attempts[0] == ("a", "invalid_response")
