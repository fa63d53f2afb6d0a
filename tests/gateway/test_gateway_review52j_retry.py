"""Review 52j: what a client is told when no provider can be tried now, over real HTTP on loopback.

A 429/503 whose providers were all skipped or rate-limited carries Retry-After = the soonest any of them may be
tried again (a breaker's cooldown left, a held-cold window left after failed warm-ups, an upstream's Retry-After),
in whole seconds rounded up and capped at max_retry_after_s; the body says which provider that is and when
(`next_available`, and `available_in_s` on each failure whose wait is known). Before, a held-cold endpoint's window
was left out (a 503 for it alone had no Retry-After), and a breaker's cooldown_s above max_retry_after_s was passed
on uncapped. (Since review 53b a cold endpoint whose warm-up is running counts too, with the time left of the
warm-up's budget: test_gateway_review53b_retry.py.)

The state module's clock is moved by hand (the windows are a minute long); the warm-ups run on real time with a
0.1 s budget against a loopback fake whose health route answers 503.
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import (
    CHAT_JSON, failure_waits, gateway, make_config, post_chat, provider, scale_to_zero, steady)

GOOD = Behavior.reply(CHAT_JSON)
BROKEN = Behavior.status(503)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_endpoint_held_cold_alone_is_a_503_with_the_window_left_as_retry_after(clock, stream):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft:
            cfg = make_config(scale_to_zero("ft", ft))
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                warming = await post_chat(client, stream)     # cold: its warm-up starts (and fails)
                await chain.gates["ft"].wait_warmup()
                clock.offset += 20.0                          # 40 s of the 60 s window left
                held = await post_chat(client, stream)
                return warming, held

    (s1, ra1, b1), (s2, ra2, b2) = asyncio.run(main())
    # a warm-up running (review 53b): it ends within its budget (0.1 s here), so Retry-After 1 naming ft
    assert s1 == 503 and ra1 == "1" and b1["error"]["next_available"]["provider"] == "ft", (s1, ra1, b1)
    assert 0 < failure_waits(b1)["ft"] <= 0.1
    # before: 503 without Retry-After (the window was not counted)
    assert s2 == 503 and ra2 == "40", (s2, ra2, b2)
    assert b2["error"]["code"] == "providers_unavailable"
    nxt = b2["error"]["next_available"]
    assert nxt["provider"] == "ft" and 39 < nxt["available_in_s"] <= 40, nxt
    assert 39 < failure_waits(b2)["ft"] <= 40 and 39 < b2["error"]["failures"][0]["held_cold_s"] <= 40
    assert "'ft' may be tried again in 40 s" in b2["error"]["message"], b2["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_soonest_of_a_cooldown_and_a_held_cold_window_is_the_retry_after(clock, stream):
    async def main():
        async with FakeOpenAI(GOOD, health=BROKEN) as ft, FakeOpenAI(Behavior.status(500)) as a:
            cfg = make_config(scale_to_zero("ft", ft), provider("a", a), breaker_failures=1, cooldown_s=30.0)
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                await post_chat(client, stream)               # ft cold (warm-up fails), a 500: a opens
                await chain.gates["ft"].wait_warmup()
                clock.offset += 50.0                          # ft held 10 s more; a half-open
                tried = await post_chat(client, stream)       # a's trial fails: open 30 s again
                return tried, await post_chat(client, stream)

    (s1, _, _), (s2, ra, body) = asyncio.run(main())
    assert s1 == 502
    # before: "30" (a's cooldown), though ft may be tried in 10 s
    assert s2 == 503 and ra == "10", (s2, ra, body)
    assert body["error"]["next_available"]["provider"] == "ft", body
    waits = failure_waits(body)
    assert 9 < waits["ft"] <= 10 and 29 < waits["a"] <= 30, waits


def test_a_cooldown_longer_than_max_retry_after_s_is_capped(clock):
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a:
            cfg = make_config(provider("a", a), breaker_failures=1, cooldown_s=100.0, max_retry_after_s=30.0)
            async with gateway(cfg) as client:
                first = await post_chat(client, False)
                return first, await post_chat(client, True), await post_chat(client, False)

    (s1, _, _), (s2, ra2, b2), (s3, ra3, b3) = asyncio.run(main())
    assert s1 == 502
    # before: Retry-After "100", past the setting that caps every Retry-After the gateway passes on
    assert (s2, ra2) == (503, "30") and (s3, ra3) == (503, "30"), (s2, ra2, s3, ra3)
    for body in (b2, b3):
        assert body["error"]["next_available"] == {"provider": "a", "available_in_s": 30.0}, body
        assert 99 < failure_waits(body)["a"] <= 100   # the failure itself says how long the breaker stays open


def test_an_upstream_retry_after_names_its_provider(clock):
    async def main():
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": "7"})) as a, \
                FakeOpenAI(Behavior.status(429, headers={"Retry-After": "3"})) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                return await post_chat(client, False)

    status, ra, body = asyncio.run(main())
    assert (status, ra) == (429, "3") and body["error"]["code"] == "rate_limited"
    assert body["error"]["next_available"] == {"provider": "b", "available_in_s": 3.0}, body   # before: KeyError
    assert failure_waits(body) == {"a": 7.0, "b": 3.0}
