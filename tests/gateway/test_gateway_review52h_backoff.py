"""Review 52h: a scale-to-zero endpoint whose warm-up failed is held cold for a back-off, not knocked on for ever.

Before, an endpoint whose health route never turned healthy (a bad deploy, a quota) got, ttl_s after each failed
warm-up, a new probe on the next request and a new warm-up: it was knocked on every warmup_poll_s for as long as
traffic came (on a scale-to-zero platform each knock may start, and bill, a container), with one ERROR per budget.
Now a failed warm-up holds it cold (skipped: no probe, no warm-up) for warm.warmup_backoff_s, doubled after each
failed warm-up in a row up to warm.warmup_backoff_max_s; a healthy probe or warm-up ends it.

The state module's clock is moved by hand (the windows are a minute and more); the warm-ups themselves run on
real time with a 0.1 s budget against a loopback fake whose health route answers 503.
"""

import asyncio
import logging

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, Cold, label
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, scale_to_zero, steady

GOOD = Behavior.reply(CHAT_JSON)
BROKEN = Behavior.status(503)
HEALTHY = Behavior.status(200, body={"status": "ok"})
COLD = [("ft", "cold"), ("hosted", "ok")]


async def _fail_a_warmup(chain) -> object:
    """One request that finds the endpoint cold (its probe starts the warm-up), then that warm-up's end."""
    result = await chain.complete(MESSAGES, kind="chat")
    await chain.gates["ft"].wait_warmup()
    return result


def test_a_broken_endpoint_is_knocked_at_most_once_per_backoff_window(clock, caplog):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            # the default back-off: 60 s
            async with Chain(make_config(scale_to_zero("ft", ft), steady("hosted", hosted))) as chain:
                first = await _fail_a_warmup(chain)
                knocks = ft.health_calls
                held = []
                for _ in range(11):                      # 55 s of traffic, 5 requests every 5 s (ttl_s)
                    clock.offset += 5.0
                    held += await asyncio.gather(*(chain.complete(MESSAGES, kind="chat") for _ in range(5)))
                    await chain.gates["ft"].wait_warmup()
                during = ft.health_calls - knocks
                metrics = chain.metrics.render().decode()
                clock.offset += 6.0                      # 61 s: the window is over
                after = await _fail_a_warmup(chain)
                return first, held, during, metrics, after, ft.health_calls - knocks, len(ft.requests)

    with caplog.at_level(logging.ERROR, logger="hearth.gateway.warm"):
        first, held, during, metrics, after, knocked_after, ft_chats = asyncio.run(main())
    assert first.attempts == COLD and all(r.attempts == COLD for r in held) and after.attempts == COLD
    # before: 11 probes and 11 warm-ups (about 60 knocks) in the window, one ERROR each
    assert during == 0, during
    assert knocked_after >= 2                    # the window's end: one probe, then a warm-up knocks again
    assert ft_chats == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    assert "held cold for 60 s (1 failed warm-up in a row" in errors[0], errors[0]
    assert "held cold for 120 s (2 failed warm-ups in a row" in errors[1], errors[1]
    assert 'hearth_gateway_warm_backoff_skips_total{provider="ft"} 55.0' in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="ft"} 56.0' in metrics


@pytest.mark.parametrize("warm, windows", [
    ({}, [60, 120, 240, 480, 900, 900]),                                        # the defaults
    ({"warmup_backoff_s": 10.0, "warmup_backoff_max_s": 35.0}, [10, 20, 35, 35]),
])
def test_the_backoff_doubles_after_each_failed_warmup_and_stops_at_its_cap(clock, warm, windows):
    async def main():
        seen = []
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(scale_to_zero("ft", ft, **warm), steady("hosted", hosted))) as chain:
                gate = chain.gates["ft"]
                for window in windows:
                    await _fail_a_warmup(chain)
                    state = await gate.state()
                    await chain.sync_breaker_gauge()           # what a /metrics scrape does
                    gauge = chain.metrics.render().decode()
                    clock.offset += window - 1.0                # still inside the window: nothing knocks
                    knocks = ft.health_calls
                    inside = await chain.complete(MESSAGES, kind="chat")
                    seen.append((state, gauge, ft.health_calls - knocks, inside.attempts))
                    clock.offset += 1.1                         # past it
        return seen

    seen = asyncio.run(main())
    for n, (window, (state, gauge, knocked, attempts)) in enumerate(zip(windows, seen), start=1):
        assert state["failed_warmups"] == n and window - 0.5 < state["held_cold_s"] <= window, (n, state)
        assert state["warm"] is False and state["warming"] is False
        value = float(gauge.split('hearth_gateway_warm_backoff_seconds{provider="ft"} ')[1].split()[0])
        assert window - 0.5 < value <= window, (n, value)
        assert knocked == 0 and attempts == COLD


def test_a_healthy_probe_or_warmup_ends_the_backoff(clock):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(scale_to_zero("ft", ft), steady("hosted", hosted))) as chain:
                gate = chain.gates["ft"]
                await _fail_a_warmup(chain)                     # held 60 s
                clock.offset += 61.0
                await _fail_a_warmup(chain)                     # held 120 s: two in a row
                doubled = await gate.state()
                ft.health = HEALTHY                             # the deploy is fixed
                clock.offset += 121.0
                served = await chain.complete(MESSAGES, kind="chat")   # a healthy probe: warm, and no back-off
                reset = await gate.state()
                await chain.sync_breaker_gauge()
                gauge = chain.metrics.render().decode()
                ft.health = BROKEN                              # broken again: the back-off starts over at 60 s
                clock.offset += 6.0                             # the warm answer's ttl_s is over
                await _fail_a_warmup(chain)
                again = await gate.state()
                ft.health = [BROKEN, HEALTHY]                   # cold at the probe, warm at the warm-up's knock
                ft._health_pos = 0
                clock.offset += 61.0
                await _fail_a_warmup(chain)                     # the warm-up succeeds
                warmed = await gate.state()
                served_after_warmup = await chain.complete(MESSAGES, kind="chat")
                return doubled, served, reset, gauge, again, warmed, served_after_warmup

    doubled, served, reset, gauge, again, warmed, served_after_warmup = asyncio.run(main())
    assert doubled["failed_warmups"] == 2 and doubled["held_cold_s"] > 119
    assert served.attempts == [("ft", "ok")]
    assert reset["failed_warmups"] == 0 and reset["held_cold_s"] == 0 and reset["warm"] is True
    assert 'hearth_gateway_warm_backoff_seconds{provider="ft"} 0.0' in gauge
    assert again["failed_warmups"] == 1 and 59 < again["held_cold_s"] <= 60      # before: it went on to 240 s
    assert warmed["failed_warmups"] == 0 and warmed["held_cold_s"] == 0 and warmed["warm"] is True
    assert served_after_warmup.attempts == [("ft", "ok")]


def test_the_backoff_holds_for_every_worker_that_shares_the_state(clock):
    # two chains on one store stand for two workers on one Redis (the Redis version: test_gateway_review52h_redis)
    async def main():
        store = MemoryStore()
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("ft", ft), steady("hosted", hosted))
            async with Chain(cfg, store=store) as one, Chain(cfg, store=store) as two:
                await _fail_a_warmup(one)                      # worker one's warm-up fails: held 60 s
                knocks = ft.health_calls
                clock.offset += 30.0                           # worker two never saw the endpoint before
                burst = await asyncio.gather(*(c.complete(MESSAGES, kind="chat") for c in (one, two) * 10))
                await two.gates["ft"].wait_warmup()
                state = await two.gates["ft"].state()
                return burst, ft.health_calls - knocks, state

    burst, knocked, state = asyncio.run(main())
    assert all(r.attempts == COLD for r in burst)
    assert knocked == 0                                # before: worker two probed and started a warm-up of its own
    assert state["failed_warmups"] == 1 and 29 < state["held_cold_s"] <= 30


def test_a_request_for_the_held_endpoint_alone_is_told_it_is_held_cold_not_warming(clock):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(scale_to_zero("ft", ft), steady("hosted", hosted))) as chain:
                await _fail_a_warmup(chain)
                clock.offset += 20.0
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat", model="ft-model")   # the fine-tune's group only
                return info.value.exceptions, ft.health_calls

    (error,), _ = asyncio.run(main())
    assert isinstance(error, Cold) and label(error) == "cold"          # a 503 like any cold skip
    # before: "scale-to-zero endpoint is not warm; skipped (warm-up running)" while nothing was running
    assert "held cold for 40 s more after failed warm-ups" in str(error), str(error)
