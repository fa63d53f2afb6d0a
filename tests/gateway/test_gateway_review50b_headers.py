"""Review 50b, items 2 and 3 and the header sweep: what the gateway sends upstream, header by header.

    * a health probe carries the provider's own headers (its key, its `headers` table) when health_url is the same
      origin (scheme, host, port) as base_url, never to another origin, not even along a redirect;
    * api_key_env plus an Authorization header (any case) is a start-up error naming the provider and both settings;
    * one header name twice in a provider's `headers` (differing in case only) is a start-up error;
    * a provider header that is one of the gateway's own (Content-Type, Accept, X-Request-ID), in any case, replaces
      it instead of going out beside it.

The upstreams record the raw request head, so a header sent twice is seen twice (a dict would fold it).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.config import ConfigError, config_from_dict, same_origin
from tests.fakes.openai_server import completion_json
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, make_config


class RawUpstream:
    """An HTTP/1.1 server on loopback that records each request's head as (method, path, [(name, value), ...]).

    GET /health... answers 200 when the request carries every header in `health_requires` (name, value), else 401;
    `health_redirect` makes GET /health answer 307 to that URL instead. POST .../chat/completions answers a JSON chat
    completion, or an SSE stream when the body asks for one.
    """

    def __init__(self, health_requires: dict[str, str] | None = None, health_redirect: str | None = None) -> None:
        self.health_requires = {k.lower(): v for k, v in (health_requires or {}).items()}
        self.health_redirect = health_redirect
        self.requests: list[tuple[str, str, list[tuple[str, str]]]] = []

    async def __aenter__(self) -> "RawUpstream":
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def headers(self, method: str | None = None, name: str | None = None) -> list[list[str]]:
        """Per recorded request (of `method`), the values of header `name` (case-insensitive), in order."""
        return [[v for k, v in head if k.lower() == name.lower()] for m, _, head in self.requests
                if method is None or m == method]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = raw.decode("latin-1").split("\r\n")
                method, path, _ = line.split(" ", 2)
                head = [tuple(x.strip() for x in h.split(":", 1)) for h in rest if h]
                self.requests.append((method, path, head))
                length = int(next((v for k, v in head if k.lower() == "content-length"), "0"))
                body = json.loads(await reader.readexactly(length)) if length else None
                writer.write(self._answer(method, path, dict((k.lower(), v) for k, v in head), body))
                await writer.drain()
        finally:
            writer.close()

    def _answer(self, method: str, path: str, head: dict[str, str], body) -> bytes:
        if method == "GET" and path.startswith("/health"):
            if self.health_redirect and path == "/health":
                return b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (
                    self.health_redirect.encode())
            ok = all(head.get(k) == v for k, v in self.health_requires.items())
            status, data = (b"200 OK", b'{"status": "ok"}') if ok else (b"401 Unauthorized", b'{"error": "key"}')
            return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                status, len(data), data)
        if body and body.get("stream"):
            events = [{"choices": [{"index": 0, "delta": {"content": CHAT_JSON}, "finish_reason": None}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            ctype = b"text/event-stream"
        else:
            data, ctype = json.dumps(completion_json(CHAT_JSON, "m")).encode(), b"application/json"
        return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (ctype, len(data), data)


def _provider(up: RawUpstream, **extra) -> dict:
    return {"name": "a", "base_url": up.origin + "/v1", "model": "m",
            "timeouts": {"connect_s": 1.0, "first_token_s": 5.0, "total_s": 5.0}, **extra}


KEY = {"A_KEY": "sk-a"}
WARM = {"probe_timeout_s": 2.0, "ttl_s": 60.0, "warmup_budget_s": 0.05, "warmup_request_timeout_s": 1.0}


# ------------------------------------------------------------------ item 2: the health probe's headers
def test_a_same_origin_health_url_gets_the_providers_key_so_an_authenticated_health_route_reads_warm():
    async def main():
        async with RawUpstream(health_requires={"Authorization": "Bearer sk-a", "api-key": "k2"}) as up:
            p = _provider(up, api_key_env="A_KEY", headers={"api-key": "k2"}, scale_to_zero=True,
                          health_url=up.origin + "/health", warm=WARM)
            async with Chain(make_config(p, env=KEY)) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
            return result, up

    result, up = asyncio.run(main())
    # before: the probe went without the key, the route said 401 and every probe read the provider as cold
    assert result.attempts == [("a", "ok")]
    assert up.headers("GET", "Authorization") == [["Bearer sk-a"]]
    assert up.headers("GET", "api-key") == [["k2"]]


@pytest.mark.parametrize("where", ["other_port", "other_host_name"])
def test_a_health_url_of_another_origin_never_gets_the_providers_key(where):
    async def main():
        async with RawUpstream() as chat_up, RawUpstream() as health_up:
            # other_host_name: the same server under another name is another origin (as a browser reads it)
            health = (health_up.origin if where == "other_port" else f"http://localhost:{chat_up.port}") + "/health"
            p = _provider(chat_up, api_key_env="A_KEY", headers={"api-key": "k2"}, scale_to_zero=True,
                          health_url=health, warm=WARM)
            async with Chain(make_config(p, env=KEY)) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
            return result, chat_up, health_up

    result, chat_up, health_up = asyncio.run(main())
    assert result.attempts == [("a", "ok")]  # the health route there needs no key: warm
    probes = [h for up in (chat_up, health_up) for m, _, h in up.requests if m == "GET"]
    assert len(probes) == 1
    assert [k for k, _ in probes[0] if k.lower() in ("authorization", "api-key")] == []
    assert chat_up.headers("POST", "Authorization") == [["Bearer sk-a"]]  # the chat request still has it


def test_a_health_probe_with_the_key_does_not_follow_a_redirect_to_another_origin():
    async def main():
        async with RawUpstream() as elsewhere:
            async with RawUpstream(health_redirect=elsewhere.origin + "/health") as up:
                p = _provider(up, api_key_env="A_KEY", headers={"api-key": "k2"}, scale_to_zero=True,
                              health_url=up.origin + "/health", warm=WARM)
                async with Chain(make_config(p, env=KEY)) as chain:
                    warm = await chain.gates["a"].is_warm()
                    await chain.gates["a"].wait_warmup()
                    why = chain.gates["a"].last_error
                return warm, why, elsewhere.requests

    warm, why, elsewhere = asyncio.run(main())
    # followed, the probe would take the key along: aiohttp strips only Authorization on a cross-origin redirect, so
    # api-key would reach the other origin. A probe with the provider's headers follows redirects only within its
    # origin: a 3xx to elsewhere is cold.
    assert [k for _, _, head in elsewhere for k, _ in head if k.lower() in ("authorization", "api-key")] == []
    assert elsewhere == []
    assert warm is False and "307" in why


def test_a_health_probe_with_the_key_follows_a_redirect_within_its_origin():
    async def main():
        async with RawUpstream(health_requires={"Authorization": "Bearer sk-a"}) as up:
            up.health_redirect = up.origin + "/health/ready"   # e.g. a trailing-slash or moved route
            p = _provider(up, api_key_env="A_KEY", scale_to_zero=True, health_url=up.origin + "/health", warm=WARM)
            async with Chain(make_config(p, env=KEY)) as chain:
                warm = await chain.gates["a"].is_warm()
            return warm, [(m, path) for m, path, _ in up.requests], up.headers("GET", "Authorization")

    warm, requests, auth = asyncio.run(main())
    assert warm is True
    assert requests == [("GET", "/health"), ("GET", "/health/ready")]
    assert auth == [["Bearer sk-a"], ["Bearer sk-a"]]


@pytest.mark.parametrize("a, b, same", [
    ("http://h:8000/v1", "http://h:8000/health", True),
    ("http://H/v1", "http://h:80/health", True),
    ("https://h/v1", "https://h:443/x", True),
    ("http://user:pw@h/v1", "http://h/health", True),          # credentials are not part of the origin
    ("http://h/v1", "https://h/health", False),
    ("http://h:8000/v1", "http://h:8001/health", False),
    ("http://h/v1", "http://h.example/health", False),
    ("http://127.0.0.1/v1", "http://localhost/health", False),
    ("http://[::1]:8000/v1", "http://[::1]:8000/health", True),
])
def test_same_origin(a, b, same):
    assert same_origin(a, b) is same


# ------------------------------------------------------------------ item 3: two Authorization headers
@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
def test_api_key_env_and_an_authorization_header_is_a_start_up_error_naming_both(name):
    doc = {"providers": [{"name": "keyed", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "A_KEY",
                          "headers": {name: "Bearer other"}}]}
    # before: accepted; with aiohttp 3.14 the `headers` value silently replaced the key (one header, the wrong one)
    with pytest.raises(ConfigError) as err:
        config_from_dict(doc, KEY)
    assert err.value.field == "providers[0].headers"
    assert "'keyed'" in str(err.value) and "api_key_env" in str(err.value) and f"headers.{name}" in str(err.value)


def test_one_header_name_twice_in_a_providers_headers_is_a_start_up_error():
    doc = {"providers": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                          "headers": {"X-Api-Key": "one", "x-api-key": "two"}}]}
    with pytest.raises(ConfigError) as err:
        config_from_dict(doc, {})
    assert err.value.field == "providers[0].headers"
    assert "'X-Api-Key'" in str(err.value) and "'x-api-key'" in str(err.value)


@pytest.mark.parametrize("provider_extra, error", [
    ({"api_key_env": "A_KEY"}, True),                                  # Authorization + URL credentials: refused
    ({"headers": {"authorization": "Basic eA=="}}, True),              # ... by the HTTP client on every probe
    ({}, False),                                                       # URL credentials alone: fine
    ({"api_key_env": "A_KEY", "cross_origin": True}, False),           # another origin gets no Authorization
])
def test_health_url_credentials_beside_the_probes_authorization_is_a_start_up_error(provider_extra, error):
    extra = dict(provider_extra)
    port = 8001 if extra.pop("cross_origin", False) else 8000
    doc = {"providers": [{"name": "a", "base_url": "http://127.0.0.1:8000/v1", "model": "m", "scale_to_zero": True,
                          "health_url": f"http://u:pw@127.0.0.1:{port}/health", **extra}]}
    if not error:
        assert config_from_dict(doc, KEY).providers[0].health_url.endswith("/health")
        return
    # a guard for item 2 (the probe now sends the provider's Authorization to its own origin): without this check
    # every probe raised aiohttp's ValueError ("Cannot combine AUTHORIZATION header with ... credentials encoded in
    # URL") out of the warm gate, a 500 on every request rather than a cold provider (seen with the check left out)
    with pytest.raises(ConfigError) as err:
        config_from_dict(doc, KEY)
    assert err.value.field == "providers[0].health_url"


@pytest.mark.parametrize("name, value", [("Content-Length", "5"), ("transfer-encoding", "chunked"),
                                         ("Content-Encoding", "gzip")])
def test_a_provider_header_that_frames_the_body_is_a_start_up_error(name, value):
    doc = {"providers": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m", "headers": {name: value}}]}
    # before: sent beside aiohttp's own framing; a Content-Length cut every request body short (a provider failure
    # on each request, opening its breaker), "chunked" went out beside a Content-Length over an unchunked body
    with pytest.raises(ConfigError) as err:
        config_from_dict(doc, {})
    assert err.value.field == "providers[0].headers" and repr(name) in str(err.value)


# ------------------------------------------------------------------ sweep: a header the gateway sets itself
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_provider_header_named_like_one_of_the_gateways_goes_out_once_with_the_right_value(stream):
    async def main():
        async with RawUpstream() as up:
            p = _provider(up, headers={"content-type": "application/json; charset=utf-8", "accept": "application/json",
                                       "x-request-id": "fixed"})
            async with Chain(make_config(p)) as chain:
                if stream:
                    async for _ in chain.stream(MESSAGES, kind="chat", request_id="rid-1"):
                        pass
                else:
                    await chain.complete(MESSAGES, kind="chat", request_id="rid-1")
            return up

    up = asyncio.run(main())
    # before: the merge was a case-sensitive dict, so "accept" and "Accept" were two keys; aiohttp then kept the last
    # in dict order, and the provider's `accept` replaced the stream's text/event-stream
    assert up.headers("POST", "Content-Type") == [["application/json; charset=utf-8"]]
    assert up.headers("POST", "Accept") == [["text/event-stream" if stream else "application/json"]]
    assert up.headers("POST", "X-Request-ID") == [["rid-1"]]   # the request's own id wins: logs join on it
