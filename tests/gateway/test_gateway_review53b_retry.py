"""Review 53b: when to come back after a 502/503/504, and waking a scale-to-zero endpoint during a cooldown.

1. A 502/504 carries Retry-After (and next_available) when no provider may be tried again at once, as the breakers
   stand once the chain gave up: an attempt that opened its provider's breaker counts. Before, a 502/504 never
   had one, so a client learnt nothing about when the breakers it just opened close. When a provider may be
   tried again at once (a failure that opened nothing), there is none, and its failure says available_in_s 0.
2. A cold endpoint whose warm-up is running counts toward Retry-After with the time left of the warm-up's budget
   (the latest it ends: warm, or failed and held cold), capped at max_retry_after_s. Before: no wait known, no
   Retry-After, though the warm-up's end is known to the gateway.
3. A request that finds a scale-to-zero provider's breaker open still wakes its gate: a cold endpoint's warm-up
   runs during the cooldown, so the half-open trial after it finds the endpoint warm. Before, nothing knocked
   until the cooldown ended, and the first request after it found the endpoint cold. The wake adds no knock
   while the endpoint is held cold after failed warm-ups.

Real HTTP on loopback (the gateway and fake providers); the breaker and warm state in this process and in Redis
(skipped without HEARTH_TEST_REDIS_URL). Where a window of a minute must pass, the state module's clock is moved
by hand (the `clock` fixture: in-process state only).
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import (
    BACKENDS, CHAT_JSON, MESSAGES, backend_settings, failure_waits, gateway, make_config, post_chat, provider,
    scale_to_zero, steady)

GOOD = Behavior.reply(CHAT_JSON)
BROKEN = Behavior.status(503)
HEALTHY = Behavior.status(200, body={"status": "ok"})
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
# a warm-up that runs for the whole test: the health route never answers, each knock may wait 30 s
LONG_WARMUP = {"warmup_budget_s": 60.0, "warmup_request_timeout_s": 30.0}


# ------------------------------------------------------------------ 1. a 502/504 says when its breakers close
@STREAM
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_502_whose_attempts_opened_every_breaker_has_retry_after_the_soonest(backend, stream):
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a, \
                FakeOpenAI(Behavior.status(503, headers={"Retry-After": "10"})) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1, cooldown_s=30.0,
                              **backend_settings(backend))
            async with gateway(cfg) as client:
                return await post_chat(client, stream)

    status, retry_after, body = asyncio.run(main())
    # before: 502 without Retry-After, though a is closed for 30 s and b for 10 s from now
    assert (status, retry_after) == (502, "10"), (status, retry_after, body)
    assert body["error"]["code"] == "upstream_failed"
    assert body["error"]["next_available"] == {"provider": "b", "available_in_s": 10.0}, body
    waits = failure_waits(body)
    assert 29 < waits["a"] <= 30 and waits["b"] == 10.0, waits
    assert body["error"]["message"].endswith("'b' may be tried again in 10 s"), body["error"]["message"]


@STREAM
def test_a_502_with_a_provider_that_may_be_tried_at_once_has_no_retry_after(stream):
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a, \
                FakeOpenAI(Behavior.status(503, headers={"Retry-After": "10"})) as b:
            # a's one 500 does not open its breaker (2 needed): the next request tries a again at once
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=2)
            async with gateway(cfg) as client:
                return await post_chat(client, stream)

    status, retry_after, body = asyncio.run(main())
    assert (status, retry_after) == (502, None), (status, retry_after, body)
    assert "next_available" not in body["error"]
    # before: a's wait was null, as for a wait not known
    assert failure_waits(body) == {"a": 0.0, "b": 10.0}


def test_a_504_whose_timeout_opened_the_breaker_has_retry_after_the_cooldown():
    async def main():
        async with FakeOpenAI(Behavior.hang()) as a:
            async with gateway(make_config(provider("a", a), breaker_failures=1, cooldown_s=30.0)) as client:
                return await post_chat(client)

    status, retry_after, body = asyncio.run(main())
    # before: 504 without Retry-After
    assert (status, retry_after) == (504, "30"), (status, retry_after, body)
    assert body["error"]["code"] == "upstream_timeout" and body["error"]["next_available"]["provider"] == "a"


# ------------------------------------------------------------------ 2. a warm-up running: its budget's end
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cold_endpoint_warming_up_is_a_503_with_the_warmups_budget_left_capped(backend):
    async def main(warm, **gateway_settings):
        async with FakeOpenAI(GOOD, health=Behavior.hang()) as ft:
            cfg = make_config(scale_to_zero("ft", ft, **warm), **backend_settings(backend), **gateway_settings)
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                reply = await post_chat(client)          # the probe gets no answer: cold, the warm-up starts
                return reply, (await chain.gates["ft"].state())["warming"]

    (status, retry_after, body), warming = asyncio.run(main(LONG_WARMUP))
    assert warming
    # before: 503 with no Retry-After and no next_available (the warm-up's end was not counted)
    assert (status, retry_after) == (503, "60"), (status, retry_after, body)
    assert body["error"]["next_available"]["provider"] == "ft" and 59 < failure_waits(body)["ft"] <= 60, body
    (status, retry_after, body), _ = asyncio.run(main({**LONG_WARMUP, "warmup_budget_s": 600.0},
                                                      max_retry_after_s=300.0))
    assert (status, retry_after) == (503, "300"), (status, retry_after, body)
    assert body["error"]["next_available"] == {"provider": "ft", "available_in_s": 300.0}
    assert 599 < failure_waits(body)["ft"] <= 600        # the failure itself says when the warm-up ends


@STREAM
def test_the_warmups_wait_shrinks_as_it_runs_and_the_soonest_provider_wins(clock, stream):
    async def main():
        async with FakeOpenAI(GOOD, health=Behavior.hang()) as ft, FakeOpenAI(Behavior.status(500)) as a:
            cfg = make_config(scale_to_zero("ft", ft, **LONG_WARMUP), provider("a", a), breaker_failures=1,
                              cooldown_s=30.0)
            async with gateway(cfg) as client:
                first = await post_chat(client, stream)   # ft cold (warm-up starts), a's 500 opens it for 30 s
                clock.offset += 45.0                      # 15 s of the warm-up's 60 s left; a half-open
                second = await post_chat(client, stream)  # a's trial fails: open 30 s again
                return first, second

    (s1, ra1, b1), (s2, ra2, b2) = asyncio.run(main())
    # before: 502 without Retry-After, then 503 with "30" (a's cooldown, the warm-up not counted)
    assert (s1, ra1) == (502, "30") and b1["error"]["next_available"]["provider"] == "a", (s1, ra1, b1)
    assert 59 < failure_waits(b1)["ft"] <= 60
    assert (s2, ra2) == (502, "15") and b2["error"]["next_available"]["provider"] == "ft", (s2, ra2, b2)


# ------------------------------------------------------------------ 3. an open breaker still wakes the endpoint
def test_a_request_that_finds_the_breaker_open_wakes_the_cold_endpoint_for_the_trial(clock):
    async def main():
        # the probe reads warm, then (after the failed attempt) cold, then the warm-up's knock finds it up
        async with FakeOpenAI([Behavior.reset(), GOOD], health=[HEALTHY, BROKEN, HEALTHY]) as ft, \
                FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("ft", ft, ttl_s=60.0), steady("hosted", hosted), breaker_failures=1,
                              cooldown_s=30.0)
            async with Chain(cfg) as chain:
                gate = chain.gates["ft"]
                failed = await chain.complete(MESSAGES, kind="chat")   # scaled to zero under a "warm" answer
                skipped = await chain.complete(MESSAGES, kind="chat")  # breaker open: ft not tried, but woken
                await gate.wait_warmup()
                during = await gate.state(), ft.health_calls
                clock.offset += 31.0                                    # the cooldown is over: the trial
                trial = await chain.complete(MESSAGES, kind="chat")
                return failed, skipped, during, trial

    failed, skipped, (state, knocks), trial = asyncio.run(main())
    assert failed.attempts == [("ft", "connection"), ("hosted", "ok")]
    assert skipped.attempts == [("ft", "cooldown"), ("hosted", "ok")]
    # before: nothing knocked during the cooldown (1 probe in all), and the trial's request found ft cold:
    # [("ft", "cold"), ("hosted", "ok")], its warm-up only starting then
    assert knocks == 3 and state["warm"] is True, (knocks, state)
    assert trial.attempts == [("ft", "ok")]


def test_the_wake_knocks_on_nothing_while_the_endpoint_is_held_cold(clock):
    # passes before and after: it pins that the wake obeys the back-off after a failed warm-up
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(GOOD) as hosted:
            async with Chain(make_config(scale_to_zero("ft", ft), steady("hosted", hosted))) as chain:
                gate = chain.gates["ft"]
                await chain.complete(MESSAGES, kind="chat")             # cold: the warm-up fails, held 60 s
                await gate.wait_warmup()
                await chain.store.failure("ft", threshold=1, cooldown_s=30.0, open_s=None, why="test", status=None,
                                          trial=None)                   # and its breaker is open
                knocks = ft.health_calls
                result = await chain.complete(MESSAGES, kind="chat")
                await gate.wait_warmup()
                return result, ft.health_calls - knocks, await gate.state()

    result, knocked, state = asyncio.run(main())
    assert result.attempts == [("ft", "cooldown"), ("hosted", "ok")]
    assert knocked == 0 and state["warming"] is False and state["failed_warmups"] == 1


def test_a_provider_cooling_down_and_held_cold_is_available_when_both_end(clock):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft:
            cfg = make_config(scale_to_zero("ft", ft))
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                await post_chat(client)                                # cold: the warm-up fails, held 60 s
                await chain.gates["ft"].wait_warmup()
                await chain.store.failure("ft", threshold=1, cooldown_s=30.0, open_s=None, why="test", status=None,
                                          trial=None)                  # and its breaker is open for 30 s
                return await post_chat(client)

    status, retry_after, body = asyncio.run(main())
    # before: "30" (the breaker's cooldown), though the endpoint stays held cold for 60 s
    assert (status, retry_after) == (503, "60"), (status, retry_after, body)
    assert 59 < failure_waits(body)["ft"] <= 60
