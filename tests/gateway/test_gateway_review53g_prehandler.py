"""Review 53g, item 1: the errors aiohttp answered before the gateway's handlers, driven over raw loopback sockets.

51a pinned what aiohttp refuses before any middleware runs as its text/plain reply. Two of those can be the
gateway's JSON through aiohttp's supported API, and now are:

* an Expect other than 100-continue on a route the gateway serves: aiohttp's default expect handler raised a
  text/plain 417 before the middleware; the routes' own expect handler (a documented hook) leaves it to the
  middleware, which refuses it with a JSON 417 (X-Request-ID, the request log line, a chat request's outcome);
  100-continue still gets its interim reply;
* a body the parser cannot decode while the handler reads it (Content-Encoding gzip that is not gzip): a 500
  "internal gateway error" with a traceback logged, now a JSON 400 (a client's fault, outcome rejected).

What aiohttp's HTTP parser refuses (request line, headers, chunk framing in the first bytes) still never reaches
a handler or middleware, and aiohttp 3.14 has no supported hook for that reply: every kind of it found is pinned
below as text/plain, so an aiohttp that starts passing them to the middleware (its 4.0 does) shows here.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.gateway.gateway_helpers import make_config, served

CFG = {"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _gateway(**gateway):
    return served(make_config(CFG, **gateway))


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


async def _reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One reply, read by its Content-Length (the connection may stay open after it)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status, headers, _ = _parse(head)
    return status, headers, await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)


async def _send(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data`, read until the gateway closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return _parse(await asyncio.wait_for(reader.read(), 10))
    finally:
        writer.close()


def _ask(data: bytes, **gateway) -> tuple[int, dict[str, str], bytes]:
    async def main():
        async with _gateway(**gateway) as port:
            return await _send(port, data)
    return asyncio.run(main())


def _json_error(headers: dict[str, str], body: bytes) -> dict:
    assert headers["content-type"].startswith("application/json") and headers.get("x-request-id"), headers
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    return err


# ------------------------------------------------------------------------------------------------ Expect
def _expect_metrics(request: bytes):
    async def main():
        async with _gateway() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(request)
                reply = await _reply(reader)
            finally:
                writer.close()
            _, _, metrics = await _send(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return reply, metrics.decode()
    return asyncio.run(main())


@pytest.mark.parametrize("request_line, body", [
    (CHAT + b"Content-Length: 2\r\n", b"{}"),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", b""),
], ids=["chat", "models"])
def test_an_expect_other_than_100_continue_on_a_route_is_a_json_417(request_line, body):
    (status, headers, body), metrics = _expect_metrics(
        request_line + b"Expect: 100-bogus\r\nX-Request-ID: rid-53g\r\n\r\n" + body)
    # before: aiohttp's text/plain 417 "Unknown Expect: 100-bogus", no X-Request-ID, no outcome counted
    assert status == 417, (status, body)
    err = _json_error(headers, body)
    assert headers["x-request-id"] == "rid-53g"
    assert err["code"] == "expectation_failed" and "100-bogus" in err["message"]
    assert err["type"] == "invalid_request_error"
    assert headers.get("connection", "").lower() == "close"  # a body may still follow: not a connection to reuse
    if request_line.startswith(b"POST"):
        assert 'hearth_gateway_requests_total{kind="unknown",outcome="rejected"} 1.0' in metrics


def test_100_continue_still_gets_its_interim_reply_then_the_request_is_handled():
    async def main():
        async with _gateway() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(CHAT + b"Content-Length: 2\r\nExpect: 100-Continue\r\nConnection: close\r\n\r\n")
                interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                writer.write(b"{}")  # the body, sent only once the gateway said to go on (as curl does)
                return interim, _parse(await asyncio.wait_for(reader.read(), 10))
            finally:
                writer.close()

    interim, (status, headers, body) = asyncio.run(main())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status == 400 and _json_error(headers, body)["param"] == "messages"  # the handler read the body


def test_an_http_1_0_expect_is_ignored_as_before():
    status, headers, body = _ask(b"GET /v1/models HTTP/1.0\r\nHost: x\r\nExpect: 100-bogus\r\n\r\n")
    assert status == 200 and json.loads(body)["object"] == "list"


# ------------------------------------------------------------------------------------------------ the body
def test_a_body_the_parser_cannot_decode_is_a_json_400_not_a_500(caplog):
    caplog.set_level(logging.ERROR, logger="hearth")
    (status, headers, body), metrics = _expect_metrics(
        CHAT + b"Content-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd")
    # before: 500 internal_error and "unhandled error" logged with a traceback
    assert status == 400, (status, body)
    err = _json_error(headers, body)
    assert err["code"] == "invalid_body" and "gzip" in err["message"]
    assert not [r for r in caplog.records if r.name.startswith("hearth")], caplog.text
    assert 'hearth_gateway_requests_total{kind="unknown",outcome="rejected"} 1.0' in metrics


def test_a_chunked_body_broken_after_the_headers_is_a_json_reply_when_the_deadline_ends():
    # aiohttp's C parser drops that payload error (the read never ends); its Python parser fails the read: both JSON
    status, headers, body = _broken_chunk_later()
    assert status in (400, 408), (status, body)
    assert _json_error(headers, body)["code"] in ("invalid_body", "request_timeout")


def _broken_chunk_later():
    async def main():
        async with _gateway(deadline_s=0.5) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(CHAT + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
                # the interim reply: the headers were parsed and the request dispatched, so the broken chunk below
                # arrives on its own, while the handler reads the body
                assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(b"zz\r\n")
                return await _reply(reader)  # aiohttp then lingers on the unfinished body before it closes
            finally:
                writer.close()
    return asyncio.run(main())


# ------------------------------------------------------------------------------------------------ still aiohttp's
H = b"Host: x\r\n"
PARSER_REFUSES = {
    "request_line_over_8190_bytes": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + H + b"\r\n",
    "more_than_128_headers": b"GET /v1/models HTTP/1.1\r\n" + H + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
                             + b"\r\n",
    "http_version_1_2": b"GET /v1/models HTTP/1.2\r\n" + H + b"\r\n",
    "http2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "tls_to_the_http_port": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,
    "lf_line_ends": b"GET /v1/models HTTP/1.1\nHost: x\n\n",
    "nul_in_the_path": b"GET /v1/mo\x00dels HTTP/1.1\r\n" + H + b"\r\n",
    "space_in_the_header_name": b"GET /v1/models HTTP/1.1\r\n" + H + b"Bad Name: 1\r\n\r\n",
    "control_char_in_a_header_value": b"GET /v1/models HTTP/1.1\r\n" + H + b"X-A: a\x01b\r\n\r\n",
    "folded_header_line": b"GET /v1/models HTTP/1.1\r\n" + H + b"X-A: a\r\n b\r\n\r\n",
    "content_length_and_chunked": CHAT + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "content_length_not_a_number": CHAT + b"Content-Length: abc\r\n\r\n{}",
    "content_length_twice": CHAT + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "transfer_encoding_not_chunked": CHAT + b"Transfer-Encoding: gzip\r\n\r\n{}",
    "negative_chunk_size": CHAT + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
    "malformed_trailer": CHAT + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nBad Trailer\r\n\r\n",
    "garbage_pipelined_after_a_request": b"GARBAGE\r\n\r\n",  # after a good request on the same connection
}


async def _after_a_good_request(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """`data` sent once the reply to a good request came, on the same connection (in the same packet as the good
    request, aiohttp drops the good one and answers only the 400)."""
    async with _gateway() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\n" + H + b"\r\n")
            assert (await _reply(reader))[0] == 200
            writer.write(data)
            return _parse(await asyncio.wait_for(reader.read(), 10))
        finally:
            writer.close()


@pytest.mark.parametrize("case", list(PARSER_REFUSES))
def test_what_the_http_parser_refuses_is_still_aiohttps_text_plain_400(case):
    data = PARSER_REFUSES[case]
    if case == "garbage_pipelined_after_a_request":
        status, headers, body = asyncio.run(_after_a_good_request(data))
    else:
        status, headers, body = _ask(data)
    assert status == 400, (status, body)
    # aiohttp's reply (HTTP/1.0, the connection closed after it: _send read to its end), no X-Request-ID
    assert headers["content-type"].startswith("text/plain") and "x-request-id" not in headers


@pytest.mark.parametrize("request_line", [b"POST /v1/nope HTTP/1.1\r\n", b"PUT /v1/models HTTP/1.1\r\n"],
                         ids=["unknown_path", "method_not_served"])
def test_an_unknown_expect_where_no_route_serves_is_still_aiohttps_text_plain_417(request_line):
    # the router's 404/405 have no expect handler of the gateway's (aiohttp's own SystemRoute)
    status, headers, body = _ask(request_line + H + b"Content-Length: 2\r\nExpect: 100-bogus\r\n"
                                 b"Connection: close\r\n\r\n{}")
    assert status == 417 and headers["content-type"].startswith("text/plain") and "x-request-id" not in headers
