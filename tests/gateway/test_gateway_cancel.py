"""A client that hangs up cancels its upstream call at once, and the provider is not blamed (issue 13 item 3).

The upstream here is a bare asyncio TCP server on loopback that never answers (or answers one SSE
delta and then goes quiet) and records when the gateway closes the connection.
"""

import asyncio
import json
import time

import aiohttp
import pytest

from hearth.gateway.chain import Chain
from tests.gateway.gateway_helpers import MARGIN_S, MESSAGES, gateway, make_config

SLOW = {"connect_s": 1.0, "first_token_s": 10.0, "total_s": 20.0}   # the gateway alone would wait 10-20 s
HANG_UP_AFTER_S = 0.2
BOUND_S = 2.0   # far under the 10 s the upstream call would otherwise stay open


class SilentUpstream:
    """Accepts, reads the request, optionally sends `preamble`, then says nothing; records the close."""

    def __init__(self, preamble: bytes = b"") -> None:
        self.preamble = preamble
        self.opened = asyncio.Event()
        self.closed = asyncio.Event()
        self.closed_at: float | None = None
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> "SilentUpstream":
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opened.set()
        if self.preamble:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(self.preamble)
            await writer.drain()
        try:
            while await reader.read(65536):   # b"" once the gateway closes its side
                pass
        except ConnectionError:
            pass
        self.closed_at = time.monotonic()
        self.closed.set()
        writer.close()


SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse_first_delta() -> bytes:
    event = {"choices": [{"index": 0, "delta": {"content": '{"message": "Hel'}, "finish_reason": None}]}
    return SSE_HEAD + _chunk(b"data: " + json.dumps(event).encode() + b"\n\n")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_client_hang_up_closes_the_upstream_call_and_counts_nothing(stream):
    async def main():
        async with SilentUpstream(_sse_first_delta() if stream else b"") as up:
            p = {"name": "a", "base_url": f"http://127.0.0.1:{up.port}/v1", "model": "m", "timeouts": SLOW}
            cfg = make_config(p, breaker_failures=1, deadline_s=30.0)
            chain = Chain(cfg)
            async with gateway(cfg, chain=chain) as client:
                body = {"messages": MESSAGES, "stream": stream}
                with pytest.raises((TimeoutError, asyncio.TimeoutError)):
                    async with client.post("/v1/chat/completions", json=body,
                                           timeout=aiohttp.ClientTimeout(total=HANG_UP_AFTER_S)) as r:
                        if stream:   # the first delta arrives; then the client goes away mid-stream
                            assert r.status == 200
                            assert b'"Hel' in await r.content.readuntil(b'"Hel')
                        await r.read()
                hung_up_at = time.monotonic()
                await asyncio.wait_for(up.closed.wait(), BOUND_S)
                await asyncio.sleep(0.05)   # let the cancelled handler finish its bookkeeping
                status = (await chain.status())[0]
                metrics = chain.metrics.render().decode()
                return up.closed_at - hung_up_at, status, metrics

    after_s, status, metrics = asyncio.run(main())
    assert after_s < MARGIN_S, f"upstream connection closed {after_s:.3f} s after the client hung up"
    assert status["consecutive_failures"] == 0 and status["state"] == "closed"
    assert "hearth_gateway_errors_total{" not in metrics     # the abandoned attempt is nobody's failure
