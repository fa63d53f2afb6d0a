"""Review 52f: the gateway stopping with a warm-up probe (and the warm-up it starts) in flight leaves no task behind."""

import asyncio

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider, steady


def test_stopping_the_gateway_with_a_probe_in_flight_leaves_no_warm_task():
    async def main():
        probing = asyncio.Event()

        def health():  # the probe's GET has reached the health route, which hangs (a cold start)
            probing.set()
            return Behavior.hang()

        async with FakeOpenAI(Behavior.reply(CHAT_JSON), health=health) as ft, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as hosted:
            cfg = make_config(provider("ft", ft, scale_to_zero=True, health_url=ft.health_url,
                                       warm={"probe_timeout_s": 2.0, "warmup_request_timeout_s": 30.0}),
                              steady("hosted", hosted))
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                request = asyncio.create_task(client.post("/v1/chat/completions", json={"messages": MESSAGES}))
                await probing.wait()
            await asyncio.gather(request, return_exceptions=True)
            left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("warm-") and not t.done()]
            return left, chain.started

    left, started = asyncio.run(main())
    assert not started
    assert left == []  # the probe was cancelled and awaited by the chain's close, not left pending
