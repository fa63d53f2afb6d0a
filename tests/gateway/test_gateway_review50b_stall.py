"""Review 50b, item 1: a streaming client that stops reading (socket open, nothing taken) is cut after
[gateway].stream_write_timeout_s: the client connection and the upstream are closed, the attempt counts against
no provider, and the request's one metrics outcome is client_stalled.

Everything is real sockets on loopback: the client is a plain TCP socket with a small receive buffer that sends its
request and then never reads; the upstream is a bare asyncio server that streams SSE deltas for as long as anyone
takes them. The gateway's listening socket gets a small send buffer too (inherited by the accepted connection), so
the stall shows after a few hundred KiB instead of the megabytes loopback autotuning would otherwise buffer.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from hearth.gateway.chain import Chain, StreamDone
from hearth.gateway.config import ConfigError
from hearth.gateway.errors import ClientStalled
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config, provider, served

WRITE_TIMEOUT_S = 0.5
PATIENT = {"connect_s": 2.0, "first_token_s": 30.0, "total_s": 60.0}  # the upstream side never ends it first
WAIT_S = 20.0  # far above WRITE_TIMEOUT_S (a loaded box), far below the upstream's 60 s


def _event(text: str) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    data = b"data: " + json.dumps(obj).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class EndlessUpstream:
    """An OpenAI-style SSE stream that keeps sending deltas of one envelope (never ending it) until the gateway
    closes the connection; records that close."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.closed = asyncio.Event()
        self.sent_deltas = 0

    async def __aenter__(self) -> "EndlessUpstream":
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opened.set()
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(_event('{"message": "'))
            # 4 characters a delta: the envelope's 64,000-character limit is ~3 MB of the gateway's SSE away,
            # far past what the buffers hold, so only the stall can end this stream
            while True:
                writer.write(_event("abcd"))
                self.sent_deltas += 1
                await writer.drain()  # blocks while the gateway does not read; raises once it closes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            writer.close()


async def _stalled_client(port: int, body: dict) -> socket.socket:
    """A client that sends its request and never reads (its receive buffer is small, so it fills at once)."""
    loop = asyncio.get_running_loop()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sets the TCP window
    s.setblocking(False)
    await loop.sock_connect(s, ("127.0.0.1", port))
    raw = json.dumps(body).encode()
    await loop.sock_sendall(s, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    return s


async def _until_closed(s: socket.socket) -> bytes:
    """Read what the gateway sent until it closes the connection (EOF or reset); the first bytes."""
    loop = asyncio.get_running_loop()
    head = bytearray()
    while True:
        try:
            data = await loop.sock_recv(s, 65536)
        except ConnectionResetError:
            return bytes(head)
        if not data:
            return bytes(head)
        if len(head) < 4096:
            head += data


def _count(chain: Chain, name: str, **labels) -> float:
    return chain.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_stream_client_that_stops_reading_is_disconnected_and_the_upstream_closed():
    async def main():
        async with EndlessUpstream() as up:
            p = {"name": "a", "base_url": f"http://127.0.0.1:{up.port}/v1", "model": "m", "timeouts": PATIENT}
            cfg = make_config(p, breaker_failures=1, deadline_s=60.0, stream_write_timeout_s=WRITE_TIMEOUT_S)
            chain = Chain(cfg)
            async with served(cfg, chain=chain, send_buffer=16384, shutdown_timeout=1.0) as port:
                body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
                client = await _stalled_client(port, body)
                try:
                    await asyncio.wait_for(up.opened.wait(), WAIT_S)
                    # before: the gateway's write waited for the client for good, holding the upstream stream open
                    await asyncio.wait_for(up.closed.wait(), WAIT_S)
                    head = await asyncio.wait_for(_until_closed(client), WAIT_S)
                finally:
                    client.close()
                status = {s["name"]: s["state"] for s in await chain.status()}
                return head, status, chain, up.sent_deltas

    head, status, chain, sent = asyncio.run(main())
    assert head.startswith(b"HTTP/1.1 200"), head[:200]   # it was streaming to that client
    assert sent > 100                                      # and took many deltas before the stall showed
    # exactly one outcome, the client's: not "ok", not "interrupted" (the provider did nothing wrong)
    done = {o: _count(chain, "hearth_gateway_requests_total", kind="chat", outcome=o)
            for o in ("ok", "failed", "interrupted", "client_cancelled", "client_stalled", "error", "rejected")}
    assert done == {"ok": 0, "failed": 0, "interrupted": 0, "client_cancelled": 0, "client_stalled": 1, "error": 0,
                    "rejected": 0}
    assert _count(chain, "hearth_gateway_request_seconds_count", kind="chat", outcome="client_stalled") == 1
    # the provider is not blamed: no error counted, breaker (threshold 1) still closed
    assert "hearth_gateway_errors_total{" not in chain.metrics.render().decode()
    assert status == {"a": "closed"}


def _outcomes(chain: Chain) -> dict[str, float]:
    return {o: v for o in ("ok", "interrupted", "client_cancelled", "client_stalled", "error")
            if (v := _count(chain, "hearth_gateway_requests_total", kind="chat", outcome=o))}


@pytest.mark.parametrize("when", ["mid_stream", "after_done"])
def test_a_stall_thrown_into_the_chains_stream_records_one_outcome_and_blames_no_provider(when):
    async def main():
        chunks = [CHAT_JSON[:10], CHAT_JSON[10:20], CHAT_JSON[20:]]
        async with FakeOpenAI(Behavior.stream(chunks)) as up:
            async with Chain(make_config(provider("a", up), breaker_failures=1)) as chain:
                events = chain.stream(MESSAGES, kind="chat")
                ev = await anext(events)
                if when == "after_done":
                    while not isinstance(ev, StreamDone):
                        ev = await anext(events)
                with pytest.raises(ClientStalled):  # the stream ends with it (its upstream closed)
                    await events.athrow(ClientStalled(0.5))
                await events.aclose()
                status = {s["name"]: s["state"] for s in await chain.status()}
                return _outcomes(chain), status, chain.metrics.render().decode()

    outcomes, status, text = asyncio.run(main())
    # mid-stream: the client's doing (not "client_cancelled": the gateway cut it); after the last chunk: still "ok"
    assert outcomes == ({"client_stalled": 1} if when == "mid_stream" else {"ok": 1})
    assert "hearth_gateway_errors_total{" not in text and status == {"a": "closed"}


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan")])
def test_stream_write_timeout_s_is_checked_at_start_up(value):
    with pytest.raises(ConfigError) as err:
        make_config({"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}, stream_write_timeout_s=value)
    assert err.value.field == "gateway.stream_write_timeout_s"


def test_stream_write_timeout_s_defaults_to_ten_seconds():
    cfg = make_config({"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert cfg.gateway.stream_write_timeout_s == 10.0
