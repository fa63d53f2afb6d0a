"""A stream's provider clock (total_s, the request deadline's cap on the attempt, attempt_seconds) does not run while
the gateway delivers a delta to its own client: a slow client never makes a healthy provider time out."""

import asyncio

from hearth.gateway import chain as chain_module, providers as providers_module
from hearth.gateway.chain import Chain, StreamDelta, StreamDone
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, StateClock, make_config, provider

HELD_S = 5.0  # how long the consumer holds each delta: past total_s (1 s) and deadline_s (3 s)


def test_time_spent_delivering_deltas_is_not_the_providers(monkeypatch):
    # the clock of the chain and the providers, moved by hand while the consumer holds a delta: what a server
    # blocked writing that delta to a slow client (up to stream_write_timeout_s per write) looks like to them
    clock = StateClock()
    monkeypatch.setattr(providers_module, "time", clock)
    monkeypatch.setattr(chain_module, "time", clock)
    third = len(CHAT_JSON) // 3
    chunks = [CHAT_JSON[:third], CHAT_JSON[third:2 * third], CHAT_JSON[2 * third:]]

    async def main():
        async with FakeOpenAI(Behavior.stream(chunks)) as a:
            async with Chain(make_config(provider("a", a), breaker_failures=1)) as chain:
                events = []
                async for ev in chain.stream(MESSAGES, kind="chat"):
                    events.append(ev)
                    if isinstance(ev, StreamDelta):
                        clock.offset += HELD_S
                snap = (await chain.store.breakers(["a"]))[0]
                attempt = chain.metrics.registry.get_sample_value("hearth_gateway_attempt_seconds_sum",
                                                                 {"provider": "a", "outcome": "ok"})
        return events, snap, attempt

    events, snap, attempt = asyncio.run(main())
    deltas = [ev for ev in events if isinstance(ev, StreamDelta)]
    # before: StreamInterrupted (a's total timeout, counted: breaker_failures=1 opened its breaker)
    assert isinstance(events[-1], StreamDone) and events[-1].result.attempts == [("a", "ok")]
    assert len(deltas) >= 2 and snap.failures == 0 and snap.open_left_s == 0
    assert attempt is not None and attempt < 1.0   # the provider's time only
    assert events[-1].result.latency_s >= len(deltas) * HELD_S   # the request's own latency keeps all of it
