"""Review 53e: the warm gate's wake() (a provider skipped for an open breaker) after the chain has closed.

A request still in flight while the chain closes (a library caller's task group) reached WarmGate.wake() after
WarmGate.aclose() had cancelled the gate's tasks: the wake started a task that nothing would cancel any more, its
probe ran on the closed (or closing) transport and two ERROR lines with tracebacks were logged (warm-wake,
warm-probe: "transport not started"). A closed gate now wakes nothing.
"""

import asyncio

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, make_config, scale_to_zero


def test_a_wake_after_the_chain_closed_starts_nothing():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=Behavior.status(503)) as ft:
            chain = Chain(make_config(scale_to_zero("ft", ft)))
            await chain.start()
            gate = chain.gates["ft"]
            await chain.aclose()
            gate.wake()                  # what a request planned after the close still calls
            started = len(gate._tasks)
            await gate.wait_warmup()     # had it started, its probe and warm-up end here
            return started, ft.health_calls, (await gate.state())["warming"]

    started, knocks, warming = asyncio.run(main())
    # before: 1 task (the wake), then a probe and a warm-up knocking after the close
    assert (started, knocks, warming) == (0, 0, False), (started, knocks, warming)
