"""Review 75: a request whose own deadline (hearth_deadline_s) runs out while a warm gate is still probing.

Chain._plan waited for every gate's verdict under the request's deadline. The gateway's deadline_s is checked against
probe_timeout_s at start-up (a request waits for the probe before any provider is tried), but a request may shorten
its deadline below probe_timeout_s: a health route that hung (mid cold start) then spent the WHOLE deadline in the
plan, and the request failed with every provider cold or "deadline exhausted", the healthy hosted fallback never
tried. The cut also cancelled every gate's verdict at once: a second endpoint already known warm was treated as cold
with it, and none of these cold decisions was counted in hearth_gateway_warm_decisions_total. Now a gate whose probe
the deadline left cannot cover answers from what it knows (else "cold") and probes in the background.

Real loopback fakes: endpoint "a" answers its health route at once, endpoint "b"'s health route hangs (its probe
timeout is longer than the request's deadline). What is asserted is which provider answered and the counters.
"""

import asyncio

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, scale_to_zero, steady

GOOD = Behavior.reply(CHAT_JSON)


def test_a_hung_probe_longer_than_the_request_deadline_does_not_spend_it():
    async def main():
        async with FakeOpenAI(GOOD, health=Behavior.hang()) as ft, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("ft", ft, probe_timeout_s=2.5), steady("hosted", hosted), deadline_s=5.0)
            async with Chain(cfg) as chain:
                result = await chain.complete(MESSAGES, kind="chat", deadline_s=1.0)
                metrics = chain.metrics.render().decode()
                return result, metrics, ft.health_calls

    result, metrics, health_calls = asyncio.run(main())
    assert result.provider == "hosted" and result.attempts == [("ft", "cold"), ("hosted", "ok")]
    assert health_calls == 1  # the probe still ran (in the background)
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="ft"} 1.0' in metrics


def test_a_slow_probe_cut_by_the_request_deadline_leaves_a_warm_endpoint_first_and_counts_its_cold_decision():
    async def main():
        async with FakeOpenAI(GOOD) as a, FakeOpenAI(GOOD, health=Behavior.hang()) as b, FakeOpenAI(GOOD) as hosted:
            cfg = make_config(scale_to_zero("a", a, ttl_s=30.0), scale_to_zero("b", b, probe_timeout_s=2.5),
                              steady("hosted", hosted), deadline_s=5.0)
            async with Chain(cfg) as chain:
                result = await chain.complete(MESSAGES, kind="chat", deadline_s=1.0)
                metrics = chain.metrics.render().decode()
                return result, metrics, len(a.requests)

    result, metrics, a_calls = asyncio.run(main())
    assert result.provider == "a", result.attempts  # warm: first, although b's probe outlived the deadline
    assert a_calls == 1
    assert ("b", "cold") in result.attempts
    assert 'hearth_gateway_warm_decisions_total{decision="warm",provider="a"} 1.0' in metrics
    assert 'hearth_gateway_warm_decisions_total{decision="cold",provider="b"} 1.0' in metrics
