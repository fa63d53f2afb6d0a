"""Review 53g, item 2: the warm gate's verdict() after the chain has closed.

53e made a closed gate wake nothing (wake()); a request still in flight during shutdown also asks verdict()
(Chain's warm check before each attempt), and that started a probe after WarmGate.aclose() had cancelled the
gate's tasks: nothing cancelled it any more, it knocked on the closed transport and, cold, started a warm-up. A
closed gate now answers from what it already knows (a trusted answer, a back-off window) and otherwise "cold",
without a probe.
"""

import asyncio

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, make_config, scale_to_zero


def _after_close(health: Behavior, *, probe_first: bool):
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=health) as ft:
            chain = Chain(make_config(scale_to_zero("ft", ft, ttl_s=60.0)))
            await chain.start()
            gate = chain.gates["ft"]
            if probe_first:  # an answer trusted for ttl_s before the close
                await gate.verdict()
                await gate.wait_warmup()
            knocks = ft.health_calls
            await chain.aclose()
            verdict = await gate.verdict()  # what a request still in flight asks
            started = len(gate._tasks)
            await gate.wait_warmup()  # had it started a probe, the probe (and its warm-up) end here
            return verdict, started, ft.health_calls - knocks, (await gate.state())["warming"]
    return asyncio.run(main())


def test_a_verdict_after_the_chain_closed_probes_nothing_and_says_cold():
    verdict, started, knocks, warming = _after_close(Behavior.status(503), probe_first=False)
    # before: a probe task after the close (knocking on the closed transport), then a warm-up
    assert (started, knocks, warming) == (0, 0, False), (started, knocks, warming)
    assert verdict == (False, 0.0)


def test_a_closed_gate_still_gives_the_answer_it_trusts():
    verdict, started, knocks, warming = _after_close(Behavior.status(200), probe_first=True)
    assert verdict == (True, 0.0) and (started, knocks, warming) == (0, 0, False)


def test_a_verdict_waiting_on_the_probe_when_the_chain_closes_gets_cold_not_a_cancellation():
    async def main():
        probing = asyncio.Event()

        def health():
            probing.set()
            return Behavior.hang()

        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=health) as ft:
            chain = Chain(make_config(scale_to_zero("ft", ft, probe_timeout_s=2.0)))
            await chain.start()
            gate = chain.gates["ft"]
            asking = asyncio.create_task(gate.verdict())
            await probing.wait()  # the probe is in flight, the request waits on it
            await chain.aclose()  # cancels the probe
            (verdict,) = await asyncio.gather(asking, return_exceptions=True)
            return verdict, len(gate._tasks)

    verdict, left = asyncio.run(main())
    # before: CancelledError in a request that nobody cancelled
    assert verdict == (False, 0.0) and left == 0, (verdict, left)
