"""A pooled keep-alive connection that the upstream closes as the gateway reuses it (the idle-timeout race) is sent
again once on a fresh connection and counts against no provider; anything else stays a provider failure."""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, ConnectionFailed, Timeout
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, FIRST_TOKEN_S, MARGIN_S, MESSAGES, make_config, provider, stopwatch

GOOD = Behavior.reply(CHAT_JSON)


async def _breaker(chain: Chain, name: str):
    return (await chain.store.breakers([name]))[0]


def test_a_pooled_connection_reset_before_any_reply_byte_is_sent_again_on_a_fresh_one():
    async def main():
        # 1st request: answered, its connection goes back to the pool; 2nd (on that pooled connection): reset with
        # no byte of a reply; 3rd: what the fresh connection of the retry gets
        async with FakeOpenAI([GOOD, Behavior.reset(), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                first = await chain.complete(MESSAGES, kind="chat")
                second = await chain.complete(MESSAGES, kind="chat")
                snap = await _breaker(chain, "a")
                errors = chain.metrics.render().decode()
        return first, second, snap, errors, len(a.requests)

    first, second, snap, errors, sent = asyncio.run(main())
    assert first.attempts == [("a", "ok")]
    # before: AllProvidersFailed([ConnectionFailed]) and, with breaker_failures=1, a's breaker open
    assert second.attempts == [("a", "ok")] and second.provider == "a"
    assert sent == 3
    assert snap.failures == 0 and not snap.tripped and snap.open_left_s == 0
    assert 'hearth_gateway_errors_total{error="connection",provider="a"}' not in errors


def test_a_stream_on_a_pooled_connection_reset_before_any_byte_is_sent_again():
    async def main():
        async with FakeOpenAI([GOOD, Behavior.reset(), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                await chain.complete(MESSAGES, kind="chat")
                events = [ev async for ev in chain.stream(MESSAGES, kind="chat")]
        return events[-1].result, len(a.requests)

    result, sent = asyncio.run(main())
    assert result.attempts == [("a", "ok")] and sent == 3


def test_the_retry_is_once_and_its_failure_counts():
    async def main():
        # the pooled connection is reset, and so is the fresh one: no third send, one failure counted
        async with FakeOpenAI([GOOD, Behavior.reset(), Behavior.reset(), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                await chain.complete(MESSAGES, kind="chat")
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat")
                failed = info.value
                snap = await _breaker(chain, "a")
        return failed, snap, len(a.requests)

    failed, snap, sent = asyncio.run(main())
    assert [type(e) for e in failed.exceptions] == [ConnectionFailed]
    assert sent == 3 and snap.open_left_s > 0


def test_a_reset_on_a_fresh_connection_is_not_retried():
    # passes before and after: the first request's connection is new, so its reset is the provider's failure
    async def main():
        async with FakeOpenAI([Behavior.reset(), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat")
                failed = info.value
                snap = await _breaker(chain, "a")
        return failed, snap, len(a.requests)

    failed, snap, sent = asyncio.run(main())
    assert [type(e) for e in failed.exceptions] == [ConnectionFailed]
    assert sent == 1 and snap.open_left_s > 0


def test_a_pooled_connection_closed_after_part_of_a_reply_is_not_retried():
    # a byte of the reply came (the start of a status line) before the upstream closed: it may have acted on the
    # request, so it is not sent again and the failure counts
    async def main():
        async with FakeOpenAI([GOOD, Behavior.hangup(b"HTTP/1.1 2"), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                await chain.complete(MESSAGES, kind="chat")
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat")
                failed = info.value
                snap = await _breaker(chain, "a")
        return failed, snap, len(a.requests)

    failed, snap, sent = asyncio.run(main())
    assert [type(e) for e in failed.exceptions] == [ConnectionFailed]
    assert sent == 2 and snap.open_left_s > 0


def test_a_pooled_connection_closed_with_no_reply_byte_is_sent_again():
    # the FIN form of the race (the server closed the idle connection cleanly as the request went out)
    async def main():
        async with FakeOpenAI([GOOD, Behavior.hangup(), GOOD]) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                await chain.complete(MESSAGES, kind="chat")
                second = await chain.complete(MESSAGES, kind="chat")
        return second, len(a.requests)

    second, sent = asyncio.run(main())
    assert second.attempts == [("a", "ok")] and sent == 3


def test_the_retry_stays_within_the_attempts_timeout():
    # the fresh connection's request hangs: the attempt still ends at its first-token timeout, as one send would
    async def main():
        async with FakeOpenAI([GOOD, Behavior.reset(), Behavior.hang()]) as a:
            async with Chain(make_config(provider("a", a))) as chain:
                await chain.complete(MESSAGES, kind="chat")
                with stopwatch() as took:
                    with pytest.raises(AllProvidersFailed) as info:
                        await chain.complete(MESSAGES, kind="chat")
                    failed = info.value
        return failed, took(), len(a.requests)

    failed, took, sent = asyncio.run(main())
    (err,) = failed.exceptions
    assert isinstance(err, Timeout) and err.kind == "first_token" and sent == 3
    assert took < FIRST_TOKEN_S + MARGIN_S
