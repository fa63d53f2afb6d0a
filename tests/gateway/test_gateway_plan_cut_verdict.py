"""A warm gate's verdict that the request's deadline cuts in Chain._plan (the `except TimeoutError` fallback).

A gate whose probe the deadline cannot cover is not waited for (test_review75_plan_deadline.py), but a verdict can
still be cut: the state store stalls on the gate's read (a slow Redis), or a probe overruns probe_timeout_s by the
store writes after its GET. The fallback then called every gated provider cold, and:

    * a cut gate's cold decision was not counted in hearth_gateway_warm_decisions_total, as every other cold skip is;
    * a gate cut before its probe started never started one, so a cold endpoint was not woken (no warm-up) by the
      request that wanted it, unlike a cold skip or a breaker skip (WarmGate.wake);
    * a gate whose verdict had come back before the cut lost it: a warm endpoint was reported "cold" (its warm
      decision counted too, so it had both).

Real loopback fakes for the endpoints; the stall is a MemoryStore whose first read of one gate's warm state hangs
until it is cancelled (what the deadline's cut does to it).
"""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import AllProvidersFailed, Cold, DeadlineExceeded
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, scale_to_zero, steady

GOOD = Behavior.reply(CHAT_JSON)


class StalledWarmRead(MemoryStore):
    """The first read of `stalled`'s warm state hangs until cancelled (a stalled store); later reads answer."""

    def __init__(self, stalled: str) -> None:
        super().__init__()
        self.stalled = stalled
        self.stalls = 0

    async def warm(self, name):
        if name == self.stalled and not self.stalls:
            self.stalls += 1
            await asyncio.Event().wait()  # cancelled by the request's deadline
        return await super().warm(name)


def test_a_verdict_cut_by_the_deadline_counts_its_cold_decision_and_wakes_the_endpoint():
    async def main():
        async with FakeOpenAI(GOOD) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("ft", ft, probe_timeout_s=0.1), steady("hosted", hosted), deadline_s=5.0)
            store = StalledWarmRead("ft")
            async with Chain(cfg, store=store) as chain:
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat", deadline_s=0.5)
                await chain.gates["ft"].wait_warmup()  # the wake the skip started, if any
                metrics = chain.metrics.render().decode()
                return info.value, metrics, ft.health_calls, len(hosted.requests), store.stalls, \
                    (await store.warm("ft")).warm

    exc, metrics, health_calls, hosted_calls, stalls, warm = asyncio.run(main())
    assert stalls == 1  # the plan's read stalled: the deadline cut the verdict
    assert [(type(e), e.provider) for e in exc.exceptions] == [(Cold, "ft"), (DeadlineExceeded, "hosted")]
    assert hosted_calls == 0
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="ft"} 1.0' in metrics
    assert health_calls == 1 and warm is True  # woken: probed once, warm for the next request


def test_a_verdict_that_came_back_before_the_cut_is_kept():
    async def main():
        async with FakeOpenAI(GOOD) as a, FakeOpenAI(GOOD) as b, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("a", a, ttl_s=30.0), scale_to_zero("b", b, probe_timeout_s=0.1),
                              steady("hosted", hosted), deadline_s=5.0)
            async with Chain(cfg, store=StalledWarmRead("b")) as chain:
                with pytest.raises(AllProvidersFailed) as info:
                    await chain.complete(MESSAGES, kind="chat", deadline_s=0.5)
                await chain.gates["b"].wait_warmup()
                return info.value, chain.metrics.render().decode()

    exc, metrics = asyncio.run(main())
    by_provider = {e.provider: type(e) for e in exc.exceptions}
    # "a" answered warm before the deadline ran out: not tried for want of time, not for being cold
    assert by_provider == {"a": DeadlineExceeded, "b": Cold, "hosted": DeadlineExceeded}
    assert 'hearth_gateway_warm_decisions_total{decision="warm",provider="a"} 1.0' in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="a"}' not in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="b"} 1.0' in metrics
