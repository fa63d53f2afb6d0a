"""The transport seam: every request the chain makes (chat and health probes) goes through it."""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed, Transport, UpstreamResponse
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider


class RecordingTransport(Transport):
    """Wraps the real transport and records (method, url, headers) of each request."""

    def __init__(self) -> None:
        self.inner = AiohttpTransport()
        self.calls: list[tuple[str, str, dict]] = []

    async def start(self) -> None:
        await self.inner.start()

    async def open(self, method, url, *, headers, body, connect_timeout_s) -> UpstreamResponse:
        self.calls.append((method, url, dict(headers)))
        return await self.inner.open(method, url, headers=headers, body=body, connect_timeout_s=connect_timeout_s)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_chain_sends_everything_through_the_given_transport():
    async def main():
        transport = RecordingTransport()
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as ft, FakeOpenAI(Behavior.reply(CHAT_JSON)) as hosted:
            gated = provider("ft", ft, scale_to_zero=True, health_url=ft.health_url)
            async with Chain(make_config(gated, provider("hosted", hosted)), transport=transport) as chain:
                result = await chain.complete(MESSAGES, kind="chat", request_id="rid-7")
            return result, transport.calls, ft.headers

    result, calls, ft_headers = asyncio.run(main())
    assert result.provider == "ft"
    assert [(m, u.rsplit("/", 1)[-1]) for m, u, _ in calls] == [("GET", "health"), ("POST", "completions")]
    assert calls[1][2]["X-Request-ID"] == "rid-7" and ft_headers[0]["X-Request-ID"] == "rid-7"


def test_aiohttp_transport_errors_are_typed():
    async def main():
        t = AiohttpTransport()
        with pytest.raises(RuntimeError, match="not started"):
            await t.open("GET", "http://127.0.0.1:1/", headers={}, body=None, connect_timeout_s=0.1)
        await t.start()
        try:
            with pytest.raises(ConnectFailed):
                await t.open("GET", f"http://127.0.0.1:{free_port()}/", headers={}, body=None, connect_timeout_s=0.5)
            async with FakeOpenAI(Behavior.reset()) as server:
                with pytest.raises(ConnectFailed):
                    await t.open("POST", server.base_url + "/chat/completions", headers={}, body=b"{}", connect_timeout_s=0.5)
        finally:
            await t.aclose()
        with pytest.raises(ValueError, match="max_connections"):
            AiohttpTransport(0)

    asyncio.run(main())
