"""AllProvidersFailed lists one ProviderError per provider in chain (config) order, as errors.py and chain.py say.

Chain._plan returned the skipped providers' errors in the order it decided them: the breaker skips first, then the
cold warm-gated ones, and the request put every skip before the attempts it made. So a chain [ft (scale-to-zero),
b, c] with b cooling down and ft cold failed with [b, ft, c], and one [hosted, ft] whose hosted fallback failed and
ft was cold with [ft, hosted]: the reply's `failures` and the log named providers in an order no config has, and
the server's next_available tie-break ("the first in chain order") picked by that order. A result's `attempts`
started with its skips in that order too; it now lists them in config order (they are decided together, before any
attempt), then the attempts in the order they were made.

Real loopback fakes: ft's health route answers 503 (cold), b answers 429 with Retry-After (its breaker then cools
down for the next request).
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, label
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, scale_to_zero, steady

GOOD = Behavior.reply(CHAT_JSON)
COLD = Behavior.status(503)
LIMITED = Behavior.status(429, headers={"Retry-After": "60"})
BROKEN = Behavior.status(500)


def test_skipped_providers_are_listed_in_config_order():
    async def main():
        async with FakeOpenAI(GOOD, health=COLD) as ft, FakeOpenAI(LIMITED) as b, FakeOpenAI(BROKEN) as c:
            cfg = make_config(scale_to_zero("ft", ft), steady("b", b), steady("c", c), deadline_s=5.0)
            async with Chain(cfg) as chain:
                with pytest.raises(AllProvidersFailed) as first:  # b's 429 starts its cooldown
                    await chain.complete(MESSAGES, kind="chat")
                with pytest.raises(AllProvidersFailed) as second:  # b cooling down, ft cold: both skipped
                    await chain.complete(MESSAGES, kind="chat")
                return first.value, second.value, len(b.requests)

    first, second, b_calls = asyncio.run(main())
    assert b_calls == 1
    assert [(e.provider, label(e)) for e in first.exceptions] == [("ft", "cold"), ("b", "status_429"),
                                                                  ("c", "status_500")]
    assert [(e.provider, label(e)) for e in second.exceptions] == [("ft", "cold"), ("b", "cooldown"),
                                                                   ("c", "status_500")]


def test_a_result_lists_its_skips_in_config_order_then_its_attempts():
    async def main():
        async with FakeOpenAI(GOOD, health=COLD) as ft, FakeOpenAI(LIMITED) as b, FakeOpenAI(GOOD) as c:
            cfg = make_config(scale_to_zero("ft", ft), steady("b", b), steady("c", c), deadline_s=5.0)
            async with Chain(cfg) as chain:
                await chain.complete(MESSAGES, kind="chat")  # b's 429 starts its cooldown; c answers
                return await chain.complete(MESSAGES, kind="chat")

    result = asyncio.run(main())
    assert result.provider == "c"
    assert result.attempts == [("ft", "cold"), ("b", "cooldown"), ("c", "ok")]


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
def test_an_attempt_before_a_cold_provider_in_config_order_is_listed_before_it(streamed):
    async def main():
        async with FakeOpenAI(BROKEN) as hosted, FakeOpenAI(GOOD, health=COLD) as ft:
            cfg = make_config(steady("hosted", hosted), scale_to_zero("ft", ft), deadline_s=5.0)
            async with Chain(cfg) as chain:
                with pytest.raises(AllProvidersFailed) as info:
                    if streamed:
                        async for _ in chain.stream(MESSAGES, kind="chat"):
                            pass
                    else:
                        await chain.complete(MESSAGES, kind="chat")
                return info.value, len(hosted.requests)

    exc, hosted_calls = asyncio.run(main())
    assert hosted_calls == 1
    assert [(e.provider, label(e)) for e in exc.exceptions] == [("hosted", "status_500"), ("ft", "cold")]
