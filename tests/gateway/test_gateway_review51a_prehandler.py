"""Review 51a, item 3: which errors leave the gateway as OpenAI-shaped JSON, over a raw socket.

Everything the router decides (an unknown path, a method a route does not serve, even one aiohttp's parser accepts
but no route knows) passes the gateway's middleware: JSON with X-Request-ID. What aiohttp refuses before any
middleware runs (its HTTP parser) is aiohttp's text/plain reply: aiohttp has no supported hook for those replies
(docs/gateway.md, Errors). An unknown Expect on a gateway route is JSON since review 53g (tested there). These tests
pin both halves, so a change on either side (a regression of the JSON errors, or an aiohttp that starts calling the
middleware) shows.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gateway.gateway_helpers import make_config, served

CFG = {"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


async def _raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data`, read the reply until the gateway closes: (status, headers in lower case, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _ask(data: bytes) -> tuple[int, dict[str, str], bytes]:
    async def main():
        async with served(make_config(CFG)) as port:
            return await _raw(port, data)
    return asyncio.run(main())


ROUTED = {
    "method_not_served": (b"PUT /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 405),
    "options": (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405),
    "unknown_path": (b"GET /v1/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404),
}


@pytest.mark.parametrize("case", list(ROUTED))
def test_what_the_router_refuses_is_an_openai_shaped_json_error(case):
    data, status = ROUTED[case]
    got, headers, body = _ask(data)
    assert got == status
    assert headers["content-type"].startswith("application/json") and headers.get("x-request-id")
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    if status == 405:
        assert headers.get("allow")


BEFORE_ANY_HANDLER = {
    "bad_request_line": (b"GARBAGE\r\n\r\n", 400),
    "method_the_parser_refuses": (b"BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "header_line_over_8190_bytes": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 400),
    "broken_chunked_body": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
}


@pytest.mark.parametrize("case", list(BEFORE_ANY_HANDLER))
def test_what_aiohttp_refuses_before_the_middleware_stays_its_text_plain_reply(case):
    data, status = BEFORE_ANY_HANDLER[case]
    got, headers, body = _ask(data)
    assert got == status
    # documented: aiohttp's own reply, which no middleware sees (no X-Request-ID either)
    assert headers["content-type"].startswith("text/plain") and "x-request-id" not in headers
    assert body and not body.startswith(b"{")
