"""The transport seam: every request the chain makes (chat and health probes) goes through it."""

import asyncio

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed, Transport, UpstreamResponse
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider, steady


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
            async with Chain(make_config(gated, steady("hosted", hosted)), transport=transport) as chain:
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


def test_the_pool_reuses_a_connection_only_while_it_is_younger_than_the_upstreams_idle_limit():
    """uvicorn (vLLM's OpenAI server) closes a keep-alive connection idle for 5 s; aiohttp's pool kept one for 15 s,
    so a request could go out on a connection the upstream was closing (a reset, counted against the provider).
    The pool now drops a connection idle for pool_idle_s (POOL_IDLE_S, below 5 s by default) and opens a new one."""
    from hearth.gateway.transport.client import POOL_IDLE_S

    assert POOL_IDLE_S < 5.0

    async def main():
        accepted = 0

        async def serve(reader, writer):
            nonlocal accepted
            accepted += 1
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/health"
        t = AiohttpTransport(pool_idle_s=0.2)
        await t.start()
        counts = []
        try:
            for pause in (0.0, 0.0, 0.4):  # two back to back; the third after the connection idled past 0.2 s
                await asyncio.sleep(pause)
                resp = await t.open("GET", url, headers={}, body=None, connect_timeout_s=2.0)
                assert resp.status == 200 and await resp.read(100) == b"{}"
                resp.close()
                counts.append(accepted)
        finally:
            await t.aclose()
            server.close()
        return counts

    assert asyncio.run(main()) == [1, 1, 2]


def test_a_bad_pool_idle_time_is_refused_naming_it():
    with pytest.raises(ValueError, match="pool_idle_s"):
        AiohttpTransport(pool_idle_s=0)
