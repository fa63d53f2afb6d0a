"""Error bodies read within the call's timeout and up to a cap. Was: the client read a non-200 body whole, with
no limit on its size, and one that dripped (headers out, body never finished) read as `timeout after Ns` with
no status, as if the server had never answered; a body with no end was read into memory until the timeout.
Now an error body is read for at most the rest of the call's timeout and at most 64 KiB (the gateway's own cap on
error bodies), the status is kept either way, and a one-piece 200 body is capped too (8 MiB, the gateway's cap
on a JSON reply)."""

from __future__ import annotations

import asyncio
import time

import httpx

from hearth.evals.client import chat_completion


async def _serve(status: str, content_type: str, body_start: bytes, then: bytes, every_s: float,
                 length: int | None = None):
    """A raw HTTP/1.1 server on loopback: headers, body_start, then `then` every `every_s` seconds, forever."""
    async def handle(reader, writer):
        try:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            length_header = f"Content-Length: {length}\r\n" if length else "Transfer-Encoding: chunked\r\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{length_header}\r\n".encode())

            def piece(data: bytes) -> bytes:
                return data if length else b"%x\r\n%s\r\n" % (len(data), data)

            writer.write(piece(body_start))
            while True:
                await writer.drain()
                if every_s:
                    await asyncio.sleep(every_s)
                writer.write(piece(then))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def call(status, content_type, body_start, then, every_s, *, stream, timeout_s, length=None):
    async def go():
        server = await _serve(status, content_type, body_start, then, every_s, length)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                start = time.perf_counter()
                got = await chat_completion(client, f"http://127.0.0.1:{port}/v1",
                                            {"model": "m", "messages": [], "stream": stream}, timeout_s=timeout_s)
                return got, time.perf_counter() - start
        finally:
            server.close()

    return asyncio.run(go())


def test_an_error_body_that_drips_keeps_its_status_and_ends_within_the_timeout():
    for stream in (False, True):
        got, took = call("502 Bad Gateway", "application/json", b'{"error": {"message": "upstream', b" ", 0.05,
                         stream=stream, timeout_s=2.0, length=4096)
        # 2 s, not less: the status line must come within the timeout, and a loaded CI machine can stall ~1 s
        assert got.status == 502, (stream, got)
        assert got.error == "HTTP 502 (error body not complete after 2s)", (stream, got)
        assert 1.9 < took < 5.0, took  # the drip would run 200 s


def test_an_error_body_without_end_is_read_up_to_the_cap_only():
    for stream in (False, True):
        for length in (None, 1 << 30):  # chunked with no last chunk; a Content-Length of 1 GiB
            got, took = call("500 Internal Server Error", "application/json", b'{"error": {"message": "x", "pad": "',
                             b"y" * 8192, 0, stream=stream, timeout_s=5, length=length)
            assert got.status == 500, (stream, got)
            assert got.error == "HTTP 500 (error body over 64 KiB, not read)", (stream, got)
            assert took < 2.5, took


def test_a_one_piece_reply_body_without_end_is_capped():
    got, took = call("200 OK", "application/json", b'{"choices": [{"message": {"content": "', b"y" * 65536, 0,
                     stream=False, timeout_s=5)
    assert got.status == 200 and got.error == "reply body over 8 MiB, not read", got
    assert took < 2.5, took
    # one that drips is a timeout, as before (no status: no reply came)
    got, took = call("200 OK", "application/json", b'{"choices": [', b" ", 0.05, stream=False, timeout_s=0.5)
    assert got.status is None and got.error == "timeout after 0.5s", got
