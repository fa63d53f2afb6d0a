"""Defects found by review 55 of the gateway (one test per defect; each failed before its fix). Real loopback
fake providers, no sleeps."""

from __future__ import annotations

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.transport import AiohttpTransport, ConnectFailed
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, scale_to_zero, steady

# Host names the system resolver cannot even encode (an empty label, a label over 63 characters): getaddrinfo
# raises UnicodeError (a ValueError), not a resolution failure.
UNENCODABLE_HOSTS = ["a..b", "a" * 64 + ".example"]


@pytest.mark.parametrize("host", UNENCODABLE_HOSTS, ids=["empty-label", "long-label"])
def test_a_health_redirect_to_an_unencodable_host_reads_cold_and_the_request_falls_through(host):
    # A health route (another origin than base_url: the probe carries no headers, so the HTTP client follows its
    # redirects) that answers 302 to a host name the resolver cannot encode: the UnicodeError escaped the
    # transport, the probe task died with it, verdict() raised it into the chain's plan, and every chat request
    # was a 500 (each re-probed: nothing was trusted), although the hosted provider behind it was fine.
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON),
                              health=Behavior.status(302, headers={"Location": f"http://{host}/health"})) as ft, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            gated = scale_to_zero("ft", ft)
            gated["health_url"] = gated["health_url"].replace("127.0.0.1", "localhost")  # another origin
            async with Chain(make_config(gated, steady("b", b))) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
                gate = chain.gates["ft"]
                await gate.wait_warmup()
                return result, gate.last_error, len(ft.requests)

    result, last_error, sent_to_ft = asyncio.run(main())
    assert result.provider == "b" and result.attempts[0] == ("ft", "cold")
    assert sent_to_ft == 0 and last_error is not None


@pytest.mark.parametrize("host", UNENCODABLE_HOSTS, ids=["empty-label", "long-label"])
def test_transport_open_to_an_unencodable_host_is_a_connect_failure(host):
    async def main():
        transport = AiohttpTransport()
        await transport.start()
        try:
            await transport.open("GET", f"http://{host}/health", headers={}, body=None, connect_timeout_s=1.0)
        finally:
            await transport.aclose()

    with pytest.raises(ConnectFailed):
        asyncio.run(main())
