"""Review 74: a malformed upstream reply must not put the provider's API key into the error a client reads.

aiohttp raises a reply it cannot parse (a bad status line, a bad header or Content-Length, a Content-Encoding it cannot decode) as a
ClientResponseError whose repr carries its RequestInfo, which holds the request's headers: 'Authorization':
'Bearer <key>', the provider's `headers` (api-key, x-api-key). The transport made that repr the ConnectFailed's text,
so the key went into the 502's failures[].message that every client gets, and, for a health probe sent with the
provider's headers (same origin), into the warm gate's last_error shown by GET /v1/providers and into its log lines.
A service on the port that does not speak HTTP (a TLS port behind an http:// base_url, a wrong port) answers so.
Real loopback sockets: a raw server answers each request with bytes that are no HTTP reply.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

from hearth.gateway.transport.client import AiohttpTransport, ConnectFailed
from tests.gateway.gateway_helpers import MESSAGES, gateway, make_config

pytestmark = pytest.mark.anyio
KEY = "sk-reviewSeventyFourKey9"
ENV = {"PROVIDER_KEY": KEY}
REPLIES = [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
           b"HTTP/1.1 503 Busy\r\nContent-Length: abc\r\n\r\n"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def raw_server(reply: bytes):
    """A loopback server that answers every request with `reply` and closes the connection; yields its base URL."""
    async def handle(reader, writer):
        try:
            await reader.read(65536)
            writer.write(reply)
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@pytest.mark.parametrize("reply", REPLIES)
async def test_the_transports_error_for_a_malformed_reply_does_not_carry_the_request_headers(reply):
    transport = AiohttpTransport()
    await transport.start()
    try:
        async with raw_server(reply) as url:
            with pytest.raises(ConnectFailed) as caught:
                resp = await transport.open("POST", url + "/v1/chat/completions", body=b"{}", connect_timeout_s=2.0,
                                            headers={"Authorization": f"Bearer {KEY}", "api-key": KEY})
                resp.close()  # pragma: no cover - the open is what fails
    finally:
        await transport.aclose()
    assert KEY not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)  # still says where it failed


@pytest.mark.parametrize("stream", [False, True])
async def test_the_502_of_a_provider_answering_garbage_does_not_show_its_key(stream):
    async with raw_server(REPLIES[0]) as url:
        provider = {"name": "a", "base_url": url + "/v1", "model": "m", "api_key_env": "PROVIDER_KEY",
                    "headers": {"x-api-key": KEY}, "timeouts": {"connect_s": 2.0, "first_token_s": 2.0, "total_s": 2.5}}
        async with gateway(make_config(provider, env=ENV)) as client:
            r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": stream})
            body = await r.text()
    assert r.status == 502, body
    assert "connection" in body  # the failure is still described
    assert KEY not in body


async def test_the_health_probes_last_error_does_not_show_the_key():
    async with raw_server(REPLIES[0]) as url:
        provider = {"name": "lora", "base_url": url + "/v1", "model": "m", "api_key_env": "PROVIDER_KEY",
                    "timeouts": {"connect_s": 2.0, "first_token_s": 2.0, "total_s": 2.5}, "scale_to_zero": True,
                    "health_url": url + "/health", "warm": {"probe_timeout_s": 2.0}}
        async with gateway(make_config(provider, env=ENV)) as client:
            async with client.post("/v1/chat/completions", json={"messages": MESSAGES}) as resp:
                await resp.read()  # the probe runs (same origin: with the key) and reads the garbage
            async with client.get("/v1/providers") as resp:
                body = await resp.text()
    assert "last_error" in body and "127.0.0.1" in body, body
    assert KEY not in body
