"""Streaming through the chain: fallback only before the first byte, an error after it."""

import asyncio

import pytest

from hearth.envelope import ChatReply
from hearth.gateway.chain import Chain, StreamDelta, StreamDone
from hearth.gateway.errors import AllProvidersFailed, InvalidEnvelope, StreamInterrupted, Timeout
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, FIRST_TOKEN_S, MARGIN_S, MESSAGES, make_config, provider, stopwatch, steady

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
        cfg = make_config(provider("a", a, timeouts=timeouts), steady("b", b))
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
    assert err.__cause__.kind == "first_token"         # the stall costs one idle timeout, not the total
    assert not b.requests                              # never fell back after bytes were sent
    assert elapsed < FIRST_TOKEN_S + MARGIN_S


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


# ------------------------------------------------------------------ issue 13 item 5: what a streaming client receives
THINK_FENCED = ["<th", "ink>\nThe user says hi. {not json} I answer warmly.\n</thi", "nk>\n\n```json\n",
                CHAT_JSON[:12], CHAT_JSON[12:30], CHAT_JSON[30:] + "\n```", "\nHope that helps!"]


def test_think_block_fences_and_chatter_never_reach_the_client():
    events, _, a, b = asyncio.run(_two(Behavior.stream(THINK_FENCED)))
    deltas = [e for e in events if isinstance(e, StreamDelta)]
    assert "".join(d.text for d in deltas) == CHAT_JSON       # exactly the envelope's JSON text
    assert all("think" not in d.text and "`" not in d.text and "Hope" not in d.text for d in deltas)
    done = events[-1]
    assert isinstance(done, StreamDone) and done.result.provider == "a" and done.result.envelope == ChatReply(**CHAT)
    assert done.result.finish_reason == "stop" and not b.requests


def test_envelope_filter_gives_repairs_answer_at_every_split():
    from hearth.envelope import repair
    from hearth.gateway.streamfilter import EnvelopeFilter

    replies = ["".join(THINK_FENCED), "<think>\n\n</think>\n\n" + CHAT_JSON, "```json\n" + CHAT_JSON + "\n```",
               "Here it is: " + CHAT_JSON + " -- done", '  {"message": "a } brace and a \\" quote", "x": {"y": 1}}']
    for raw in replies:
        for i in range(len(raw) + 1):
            for j in range(i, len(raw) + 1, 7):    # every 2-way split, and 3-way splits at a stride
                cut = EnvelopeFilter()
                shown = cut.feed(raw[:i]) + cut.feed(raw[i:j]) + cut.feed(raw[j:])
                assert shown == repair(raw) and cut.complete, (raw, i, j, shown)


def test_stream_cut_without_done_is_an_interruption_not_a_success():
    events, _, _, b = asyncio.run(_two(Behavior.stream(PIECES, finish_reason=None, cut=True)))
    err = events[-1]
    assert isinstance(err, StreamInterrupted) and "cut short" in str(err.__cause__)
    assert not any(isinstance(e, StreamDone) for e in events) and not b.requests


def test_sse_over_http_carries_only_envelope_text_and_never_invents_finish_reason():
    import json

    from tests.gateway.gateway_helpers import gateway

    async def main():
        script = [Behavior.stream(THINK_FENCED), Behavior.stream(PIECES, finish_reason=None, cut=True)]
        async with FakeOpenAI(script) as a:
            async with gateway(make_config(provider("a", a))) as client:
                out = []
                for _ in range(2):
                    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                    out.append(await r.text())
                return out

    ok, cut = asyncio.run(main())
    events = [json.loads(line[6:]) for line in ok.splitlines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == CHAT_JSON
    assert "think" not in ok and "```" not in ok and ok.rstrip().endswith("data: [DONE]")
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["hearth"]["envelope"] == CHAT
    events = [json.loads(line[6:]) for line in cut.splitlines() if line.startswith("data: {")]
    assert "data: [DONE]" not in cut and events[-1]["error"]["code"] == "stream_interrupted"
    assert all(e.get("choices", [{}])[0].get("finish_reason") is None for e in events[:-1])
