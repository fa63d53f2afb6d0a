"""Review 63: hearth_gateway_errors_total{error="cooldown"} counts every request that skipped a provider for its
breaker, wherever the skip was decided.

It was counted only when a half-open trial claim was refused; the far more common skips, the plan's (the breaker
open when the request arrived) and the re-read before a later attempt (opened while an earlier attempt of the same
request ran), were not: a dashboard of cooldown skips showed next to nothing while a provider shed all its traffic.
"""

import asyncio

from hearth.gateway.chain import Chain
from hearth.gateway.errors import UpstreamStatus
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider, steady


def _cooldowns(chain: Chain, name: str) -> float:
    return chain.metrics.registry.get_sample_value("hearth_gateway_errors_total",
                                                   {"provider": name, "error": "cooldown"}) or 0.0


def test_a_skip_by_the_plan_counts_as_a_cooldown():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1)
            async with Chain(cfg) as chain:
                await chain.breakers["a"].failure(UpstreamStatus("a", 500), None)  # open for 30 s
                result = await chain.complete(MESSAGES, kind="chat")
                return result.attempts, _cooldowns(chain, "a"), len(a.requests)

    attempts, counted, a_calls = asyncio.run(main())
    assert attempts == [("a", "cooldown"), ("b", "ok")] and a_calls == 0
    assert counted == 1


def test_a_skip_by_the_re_read_before_a_later_attempt_counts_as_a_cooldown():
    async def main():
        in_x, go_on = asyncio.Event(), asyncio.Event()

        async def x_fails(body):  # x's attempt is in flight while a's breaker opens
            in_x.set()
            await go_on.wait()
            return Behavior.status(500)

        async with FakeOpenAI(x_fails) as x, FakeOpenAI(Behavior.reply(CHAT_JSON)) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            cfg = make_config(steady("x", x), provider("a", a), steady("b", b), breaker_failures=1)
            async with Chain(cfg) as chain:
                request = asyncio.create_task(chain.complete(MESSAGES, kind="chat"))
                await in_x.wait()
                await chain.breakers["a"].failure(UpstreamStatus("a", 500), None)
                go_on.set()
                result = await request
                return result.attempts, _cooldowns(chain, "a"), len(a.requests)

    attempts, counted, a_calls = asyncio.run(main())
    assert attempts == [("x", "status_500"), ("a", "cooldown"), ("b", "ok")] and a_calls == 0
    assert counted == 1
