"""Chain fault tests against real loopback HTTP servers: who answered, and what it cost.

Each fault test asserts the provider that answered, the recorded attempts, and that the whole
request stayed inside its budget (a hung provider costs its timeout plus MARGIN_S at most).
"""

import asyncio
import json

import pytest

from hearth.envelope import ChatReply, FeedComment
from hearth.gateway.chain import Chain
from hearth.gateway.errors import (
    AllProvidersFailed, ConnectionFailed, Cooldown, DeadlineExceeded, InvalidEnvelope, InvalidResponse, Timeout,
    UpstreamStatus,
)
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import (
    CHAT, CHAT_JSON, FIRST_TOKEN_S, MARGIN_S, MESSAGES, SLOW_TIMEOUTS, make_config, provider, steady, stopwatch,
)

GOOD = Behavior.reply(CHAT_JSON)


async def _two(primary: Behavior, *, secondary=GOOD, a_timeouts=None, **gateway):
    """Run one request through [a: primary, b: secondary]; return (result or error, elapsed, a, b)."""
    async with FakeOpenAI(primary) as a, FakeOpenAI(secondary) as b:
        pa = provider("a", a, timeouts=a_timeouts or {})
        async with Chain(make_config(pa, steady("b", b), **gateway)) as chain:
            with stopwatch() as t:
                try:
                    out = await chain.complete(MESSAGES, kind="chat")
                except AllProvidersFailed as exc:
                    out = exc
            return out, t(), a, b


@pytest.mark.parametrize("primary, outcome, budget_s", [
    (Behavior.hang(), "timeout_first_token", FIRST_TOKEN_S),
    (Behavior.reply(CHAT_JSON, delay_s=3 * FIRST_TOKEN_S), "timeout_first_token", FIRST_TOKEN_S),
    (Behavior.status(500), "status_500", 0.0),
    (Behavior.status(503, body="overloaded"), "status_503", 0.0),
    (Behavior.reset(), "connection", 0.0),
    (Behavior.raw(b'{"choices": [ {"message": '), "invalid_response", 0.0),
    (Behavior.raw(b'{"object": "chat.completion", "choices": []}'), "invalid_response", 0.0),
    (Behavior.reply('{"message": "hi", "mood": "ok"}'), "invalid_envelope", 0.0),
    (Behavior.reply("Sure! Here is my reply: hello"), "invalid_envelope", 0.0),
    # a thinking block eats the token budget: truncated, finish_reason length, no JSON at all
    (Behavior.reply("<think>Let me consider the persona carefully. First, " * 20, finish_reason="length"),
     "invalid_envelope", 0.0),
], ids=["hang", "slow-first-token", "500", "503", "reset", "malformed-json", "no-choices", "envelope-missing-fields",
        "prose", "thinking-truncated"])
def test_fault_falls_through_to_next_provider(primary, outcome, budget_s):
    result, elapsed, a, b = asyncio.run(_two(primary))
    assert result.provider == "b", result
    assert result.attempts == [("a", outcome), ("b", "ok")]
    assert result.envelope == ChatReply(**CHAT)
    assert len(a.requests) == 1 and len(b.requests) == 1
    assert elapsed < budget_s + MARGIN_S, f"{outcome} cost {elapsed:.3f} s, budget {budget_s} s + {MARGIN_S} s"
    if budget_s:
        assert elapsed >= budget_s * 0.95  # really waited for the timeout, not a shortcut


def test_slow_first_token_within_budget_is_served_by_primary():
    # a first token 0.3 s late against a 6 s budget: the gap to the timeout is far above any load stall
    late = Behavior.reply(CHAT_JSON, delay_s=FIRST_TOKEN_S)
    result, elapsed, a, b = asyncio.run(_two(late, a_timeouts=SLOW_TIMEOUTS))
    assert result.provider == "a" and result.attempts == [("a", "ok")] and not b.requests
    assert FIRST_TOKEN_S <= elapsed < FIRST_TOKEN_S + MARGIN_S


def test_refused_connection_falls_through_fast():
    async def main():
        async with FakeOpenAI(GOOD) as b:
            # refused at once: a connect that waited for its timeout would cost SLOW_S
            dead = {"name": "a", "base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "m",
                    "timeouts": SLOW_TIMEOUTS}
            async with Chain(make_config(dead, steady("b", b))) as chain:
                with stopwatch() as t:
                    result = await chain.complete(MESSAGES, kind="chat")
        return result, t()

    result, elapsed = asyncio.run(main())
    assert result.provider == "b" and result.attempts == [("a", "connection"), ("b", "ok")]
    assert elapsed < MARGIN_S


def test_429_retry_after_cools_the_provider_down():
    async def main():
        async with FakeOpenAI([Behavior.status(429, headers={"Retry-After": "30"})]) as a, FakeOpenAI(GOOD) as b:
            async with Chain(make_config(provider("a", a), steady("b", b))) as chain:
                first = await chain.complete(MESSAGES, kind="chat")
                with stopwatch() as t:
                    second = await chain.complete(MESSAGES, kind="chat")
                state = {p["name"]: p for p in await chain.status()}
                metrics = chain.metrics.render().decode()
            return first, second, t(), state, len(a.requests), metrics

    first, second, elapsed, state, a_calls, metrics = asyncio.run(main())
    assert first.attempts == [("a", "status_429"), ("b", "ok")]
    assert second.attempts == [("a", "cooldown"), ("b", "ok")]
    assert a_calls == 1                      # the cooled provider was not contacted again
    # a cooled provider costs nothing but a lookup (a_calls above is the proof; this bounds the request to b, one
    # loopback round trip, by the suite's margin: 50 ms was within reach of a stall on the loaded 2-core CI box)
    assert elapsed < MARGIN_S
    assert state["a"]["state"] == "open" and 29 < state["a"]["cooldown_left_s"] <= 30
    assert "Retry-After 30" in state["a"]["why"]
    assert 'hearth_gateway_breaker_open{provider="a"} 1.0' in metrics


def test_breaker_opens_after_consecutive_failures_and_half_opens():
    async def main():
        script = [Behavior.status(500), Behavior.status(502), GOOD]
        async with FakeOpenAI(script) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=2, cooldown_s=0.3)
            async with Chain(cfg) as chain:
                r1 = await chain.complete(MESSAGES, kind="chat")
                r2 = await chain.complete(MESSAGES, kind="chat")
                r3 = await chain.complete(MESSAGES, kind="chat")   # breaker open: a skipped
                calls_while_open = len(a.requests)
                await asyncio.sleep(0.35)                          # the cooldown itself is the thing under test
                r4 = await chain.complete(MESSAGES, kind="chat")   # half-open: a tried, succeeds
                state = (await chain.status())[0]
        return r1, r2, r3, r4, calls_while_open, state

    r1, r2, r3, r4, calls_while_open, state = asyncio.run(main())
    assert [r.attempts[0] for r in (r1, r2, r3, r4)] == [("a", "status_500"), ("a", "status_502"), ("a", "cooldown"), ("a", "ok")]
    assert calls_while_open == 2
    assert r4.provider == "a" and state["state"] == "closed" and state["consecutive_failures"] == 0


def test_all_fail_lists_each_provider_in_order():
    async def main():
        async with FakeOpenAI(Behavior.status(503, headers={"Retry-After": "2"})) as a, \
                FakeOpenAI(Behavior.hang()) as b, FakeOpenAI(Behavior.reply("not json")) as c:
            cfg = make_config(provider("a", a), provider("b", b), provider("c", c))
            async with Chain(cfg) as chain:
                with stopwatch() as t:
                    with pytest.raises(AllProvidersFailed) as info:
                        await chain.complete(MESSAGES, kind="chat")
        return info.value, t()

    exc, elapsed = asyncio.run(main())
    assert isinstance(exc, ExceptionGroup)
    assert [e.provider for e in exc.exceptions] == ["a", "b", "c"]
    a, b, c = exc.exceptions
    assert isinstance(a, UpstreamStatus) and a.status == 503 and a.retry_after == 2.0
    assert isinstance(b, Timeout) and b.kind == "first_token"
    assert isinstance(c, InvalidEnvelope) and c.envelope_error.field is None
    assert "a: HTTP 503" in str(exc) and "b: first_token timeout" in str(exc)
    assert elapsed < FIRST_TOKEN_S + MARGIN_S
    timeouts, rest = exc.split(Timeout)
    assert [e.provider for e in timeouts.exceptions] == ["b"] and isinstance(rest, AllProvidersFailed)


def test_request_deadline_caps_every_attempt():
    async def main():
        async with FakeOpenAI(Behavior.hang()) as a, FakeOpenAI(GOOD) as b:
            slow = provider("a", a, timeouts={"first_token_s": 5.0, "total_s": 5.0})
            async with Chain(make_config(slow, steady("b", b))) as chain:
                with stopwatch() as t:
                    with pytest.raises(AllProvidersFailed) as info:
                        await chain.complete(MESSAGES, kind="chat", deadline_s=0.25)
        return info.value, t(), len(b.requests)

    exc, elapsed, b_calls = asyncio.run(main())
    assert [type(e) for e in exc.exceptions] == [DeadlineExceeded, DeadlineExceeded]
    assert b_calls == 0                      # nothing left of the deadline for b
    assert 0.24 <= elapsed < 0.25 + MARGIN_S


@pytest.mark.parametrize("whose", ["request", "gateway"])
def test_only_the_gateways_own_deadline_counts_toward_the_breaker(whose):
    """A provider slower than a request's own short hearth_deadline_s is not failing: three such requests leave
    its breaker closed (one client could otherwise open a healthy provider's breaker for everyone). Running past
    the gateway's deadline_s (the operator's) still counts, and opens it after breaker_failures."""
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, delay_s=0.5)) as a:
            slow = provider("a", a, timeouts={"first_token_s": 5.0, "total_s": 5.0})
            gateway_deadline = 3.0 if whose == "request" else 0.15
            async with Chain(make_config(slow, deadline_s=gateway_deadline, breaker_failures=2)) as chain:
                errors = []
                for _ in range(3):
                    with pytest.raises(AllProvidersFailed) as info:
                        await chain.complete(MESSAGES, kind="chat", deadline_s=0.15 if whose == "request" else None)
                    errors.append(info.value.exceptions[0])
                state = (await chain.status())[0]
        return errors, state, len(a.requests)

    errors, state, calls = asyncio.run(main())
    if whose == "request":
        assert [type(e) for e in errors] == [DeadlineExceeded] * 3 and all(e.client_set for e in errors)
        assert state["state"] == "closed" and state["consecutive_failures"] == 0 and calls == 3
    else:
        assert [type(e) for e in errors[:2]] == [DeadlineExceeded] * 2 and not any(e.client_set for e in errors[:2])
        assert isinstance(errors[2], Cooldown)  # opened after two: the third request skips it
        assert state["state"] == "open" and calls == 2


def test_request_body_json_schema_extra_body_and_key():
    async def main():
        async with FakeOpenAI(Behavior.reply('{"comment": "Nice!", "tone": "proud"}')) as a:
            p = provider("a", a, json_schema=True, api_key_env="A_KEY",
                         extra_body={"chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.7})
            async with Chain(make_config(p, env={"A_KEY": "sk-test"})) as chain:
                result = await chain.complete(MESSAGES, kind="feed_comment", max_tokens=64)
        return result, a.requests[0], a.headers[0]

    result, body, headers = asyncio.run(main())
    assert result.envelope == FeedComment(comment="Nice!", tone="proud")
    assert body["model"] == "a-model" and body["messages"] == MESSAGES and body["max_tokens"] == 64
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["temperature"] == 0.7
    assert body["response_format"]["type"] == "json_schema"
    assert "comment" in json.dumps(body["response_format"]["json_schema"])
    assert "stream" not in body
    assert headers["Authorization"] == "Bearer sk-test"


def test_bad_arguments_name_the_argument():
    async def main():
        async with FakeOpenAI(GOOD) as a:
            async with Chain(make_config(provider("a", a))) as chain:
                with pytest.raises(ValueError, match="kind"):
                    await chain.complete(MESSAGES, kind="poem")
                with pytest.raises(TypeError, match="messages"):
                    await chain.complete([], kind="chat")
                with pytest.raises(ValueError, match="deadline_s"):
                    await chain.complete(MESSAGES, kind="chat", deadline_s=0)
        with pytest.raises(TypeError, match="config"):
            Chain({"providers": []})

    asyncio.run(main())


def test_cooldown_error_type_in_group():
    async def main():
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": "10"})) as a:
            async with Chain(make_config(provider("a", a))) as chain:
                with pytest.raises(AllProvidersFailed):
                    await chain.complete(MESSAGES, kind="chat")
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat")
        return info.value

    exc = asyncio.run(main())
    (only,) = exc.exceptions
    assert isinstance(only, Cooldown) and 9 < only.remaining_s <= 10


def test_connection_failed_and_invalid_response_types():
    async def main():
        async with FakeOpenAI([Behavior.reset(), Behavior.raw(b"<html>")]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=10)) as chain:
                errors = []
                for _ in range(2):
                    with pytest.raises(AllProvidersFailed) as info:
                        await chain.complete(MESSAGES, kind="chat")
                    errors.append(info.value.exceptions[0])
        return errors

    reset, html = asyncio.run(main())
    assert isinstance(reset, ConnectionFailed) and isinstance(html, InvalidResponse)


def test_thinking_that_eats_the_budget_is_reported_as_truncated():
    async def main():
        thinking = Behavior.reply("<think>The user greets me. I should consider", finish_reason="length")
        async with FakeOpenAI(thinking) as a:
            async with Chain(make_config(provider("a", a))) as chain:
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat", max_tokens=16)
        return info.value.exceptions[0], a.requests[0]

    err, body = asyncio.run(main())
    assert isinstance(err, InvalidEnvelope) and err.finish_reason == "length"
    assert "truncated: finish_reason=length" in str(err) and "think" in err.envelope_error.reason
    assert body["max_tokens"] == 16


def test_retry_after_seconds_and_http_date():
    from email.utils import formatdate

    from hearth.gateway.providers import parse_retry_after

    now = 1_800_000_000.0
    assert parse_retry_after("5", now) == 5.0 and parse_retry_after(" 0.5 ", now) == 0.5
    assert parse_retry_after("-3", now) == 0.0
    assert parse_retry_after(formatdate(now + 120, usegmt=True), now) == 120.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None


def test_logs_and_breaker_reason_never_carry_upstream_text(caplog):
    """An upstream error body or an unusable reply can quote the model, and the model quotes the user: the
    gateway's logs and the breaker's reason (/v1/providers) name the failure's class and label only."""
    secret = "USER-SECRET-7731"

    async def main():
        script = [Behavior.status(500, body=f"boom {secret}"), Behavior.reply(f"Sure! {secret}")]
        async with FakeOpenAI(script) as a, FakeOpenAI(GOOD) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=2, cooldown_s=30)
            async with Chain(cfg) as chain:
                for _ in range(2):
                    await chain.complete(MESSAGES, kind="chat")
                return (await chain.status())[0]

    with caplog.at_level("DEBUG", logger="hearth.gateway"):
        state = asyncio.run(main())
    assert state["state"] == "open" and "InvalidEnvelope(invalid_envelope)" in state["why"], state
    assert secret not in json.dumps(state)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "UpstreamStatus(status_500)" in logged and secret not in logged
