"""Streamed replies are bounded in size, not only in time. Was: the client read a stream with httpx's
aiter_lines and kept every content delta, with no cap: a server that streamed content without end within the
timeout (loopback or LAN speed: gigabytes in a minute), or one line that never ended (httpx buffers a line whole),
grew the eval's memory until the call's timeout, and then reported only `timeout after Ns` (no status, nothing of
what came). Now the content (and reasoning) kept is capped at 8 MiB (REPLY_BODY_CAP, the cap on a reply in one
piece), one SSE line at 8 MiB too, and the bytes read at STREAM_BYTES_CAP; over a cap the reply fails at once with
its status (200) and the start of what came (ERROR_BODY_CAP characters), the reason naming the cap."""

from __future__ import annotations

import asyncio
import json
import httpx

from hearth.evals import client as eval_client
from hearth.evals.client import ERROR_BODY_CAP, REPLY_BODY_CAP, chat_completion
from tests.evals.test_evals_review50d_error_body import call


def delta(**fields) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}).encode() + b"\n\n"


def test_a_stream_of_content_without_end_fails_at_the_content_cap_keeping_status_and_a_prefix():
    for key in ("content", "reasoning_content"):
        got, took = call("200 OK", "text/event-stream", delta(role="assistant", content="Hello"),
                         delta(**{key: "y" * 65536}), 0, stream=True, timeout_s=5)
        assert got.status == 200 and got.error == "streamed reply over 8 MiB (content and reasoning), not read further", (key, got.error)
        assert got.ttft_s is not None and took < 2.5, (key, took)
        assert got.content.startswith("Hello") and len(got.content) <= ERROR_BODY_CAP, key
        if key == "reasoning_content":
            assert got.reasoning.startswith("yyy") and len(got.reasoning) <= ERROR_BODY_CAP


def test_a_stream_that_sends_only_padding_fails_at_the_byte_cap():
    # SSE comments (": ...") and empty deltas carry no content: nothing is kept, but the bytes are still bounded
    comment = b": " + b"p" * 65534 + b"\n"
    got, took = call("200 OK", "text/event-stream", delta(role="assistant", content="Hi"), comment, 0,
                     stream=True, timeout_s=8)
    assert got.status == 200 and got.error == f"stream over {getattr(eval_client, 'STREAM_BYTES_CAP', 0) >> 20} MiB, not read further", got.error
    assert got.content == "Hi" and took < 6, took


def test_one_line_without_end_fails_at_the_line_cap():
    got, took = call("200 OK", "text/event-stream", b'data: {"choices": [{"delta": {"content": "', b"z" * 65536, 0,
                     stream=True, timeout_s=5)
    assert got.status == 200 and got.error == f"stream line over {REPLY_BODY_CAP >> 20} MiB, not read further", got.error
    assert took < 2.5, took


def test_the_caps_are_the_documented_ones():
    assert REPLY_BODY_CAP == 8 << 20 and ERROR_BODY_CAP == 64 << 10
    assert getattr(eval_client, "STREAM_BYTES_CAP", 0) >= REPLY_BODY_CAP


async def _pieces_server(pieces: list[bytes]):
    """Headers, then each piece as its own chunk, drained one at a time, then the end."""
    async def handle(reader, writer):
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for p in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(p), p))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_lines_are_split_as_sse_says_across_any_piece_boundary():
    """CRLF, CR and LF line ends, every one (and every multi-byte character) split between pieces of 3 bytes, and a
    last line without its newline. Was: a JSON string holding a raw U+2028, U+2029 or U+0085 (servers that write
    non-ASCII unescaped, as vLLM does) failed as a malformed chunk: httpx's aiter_lines splits lines as
    str.splitlines does, SSE only at CR and LF."""
    text = "Caf\u00e9 \u2028 \u2029 \x85 ok \U0001f35e"
    body = (delta(role="assistant", content="")
            + b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}, ensure_ascii=False).encode()
            + b"\r\n\r\n" + delta(content="!").replace(b"\n\n", b"\r\r") + b": keep-alive\n"
            + b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\r\n\r\ndata: [DONE]')
    pieces = [body[i:i + 3] for i in range(0, len(body), 3)]

    async def go():
        server = await _pieces_server(pieces)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, f"http://127.0.0.1:{port}/v1",
                                             {"model": "m", "messages": [], "stream": True}, timeout_s=5)
        finally:
            server.close()

    got = asyncio.run(go())
    assert got.error is None and got.finish_reason == "stop", got
    assert got.content == text + "!", got.content
