"""Review 51a, item 2: a client that stops reading JSON replies (socket open, receive window full) is cut after
[gateway].stream_write_timeout_s, as a streaming one is. aiohttp wrote every reply the handler returned with no
time limit: once the replies a client left unread passed aiohttp's and the kernel's buffers, the write waited for
good, holding the connection and its handler task (and a graceful shutdown for its whole timeout).

Real sockets on loopback: the client has a small receive buffer, keeps pipelining requests and never reads; the
gateway's listening socket has a small send buffer (inherited by the accepted connection) so the buffers fill
after a few hundred KiB. The client learns that it was cut when a send fails (the gateway's reset); before the fix
its sends blocked for good (the gateway stopped reading behind its stuck write).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import MESSAGES, make_config, provider, served

WRITE_TIMEOUT_S = 0.3
WAIT_S = 6.0  # far above WRITE_TIMEOUT_S (a loaded box); before the fix nothing ended the wait

# the largest chat envelope: each JSON reply is a few KiB, so a few dozen unread ones fill the buffers
BIG = json.dumps({"message": "x" * 2000, "mood": "warm", "memories": ["m" * 300] * 5, "affection": 0, "trust": 0,
                  "suggested_actions": ["a" * 120] * 3})


def _request(route: str) -> bytes:
    if route == "models":
        return b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = json.dumps({"messages": MESSAGES}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))


async def _pipeline_until_cut(port: int, request: bytes) -> int:
    """Send `request` again and again on one connection, never reading; the number sent when a send fails."""
    loop = asyncio.get_running_loop()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: it sets the TCP window
    s.setblocking(False)
    try:
        await loop.sock_connect(s, ("127.0.0.1", port))
        sent = 0
        while True:
            try:
                await loop.sock_sendall(s, request)
            except (ConnectionResetError, BrokenPipeError):
                return sent
            sent += 1
    finally:
        s.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("route", ["chat", "models"])
def test_a_client_that_stops_reading_json_replies_is_disconnected(route):
    async def main():
        async with FakeOpenAI(Behavior.reply(BIG)) as up:
            cfg = make_config(provider("a", up), stream_write_timeout_s=WRITE_TIMEOUT_S)
            chain = Chain(cfg)
            async with served(cfg, chain=chain, send_buffer=16384, shutdown_timeout=1.0) as port:
                # before: the gateway's write of an unread reply waited for good, so these sends blocked for good
                sent = await asyncio.wait_for(_pipeline_until_cut(port, _request(route)), WAIT_S)
                # the gateway still answers everyone else
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await asyncio.wait_for(reader.read(), WAIT_S)
                writer.close()
                return sent, answer, chain

    handler = _Records()
    server_log = logging.getLogger("hearth.gateway.server")
    server_log.addHandler(handler)
    old_level = server_log.level
    server_log.setLevel(logging.INFO)
    try:
        sent, answer, chain = asyncio.run(main())
    finally:
        server_log.removeHandler(handler)
        server_log.setLevel(old_level)
    assert sent > 10  # it was served replies until its buffers were full
    assert answer.startswith(b"HTTP/1.1 200")
    stalls = [r for r in handler.records if getattr(r, "error", None) == "client_stalled"]
    assert any(r.levelno == logging.WARNING for r in stalls)
    if route == "chat":
        # the request log line of the reply that was cut: nginx's 499 with client_stalled, as for a stream; its
        # outcome was recorded when the chain answered (ok), never client_stalled on top
        cut = [r for r in stalls if r.getMessage() == "request"]
        assert len(cut) == 1 and cut[0].status == 499
        ok = chain.metrics.registry.get_sample_value("hearth_gateway_requests_total", {"kind": "chat", "outcome": "ok"})
        stalled = chain.metrics.registry.get_sample_value("hearth_gateway_requests_total",
                                                          {"kind": "chat", "outcome": "client_stalled"})
        assert ok >= 10 and not stalled
