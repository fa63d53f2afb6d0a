"""Defects found by review 50 of the gateway (one test per defect; each failed before its fix)."""

import asyncio

import aiohttp
import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.errors import ConnectionFailed
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import (
    BACKENDS, CHAT_JSON, MARGIN_S, MESSAGES, SLOW_S, backend_settings, make_config, provider, served, stopwatch, steady)


# ------------------------------------------------------------------ 1. an upstream redirect was followed
@pytest.mark.parametrize("code", [307, 308, 302])
def test_a_provider_redirect_is_a_failure_not_followed_with_its_key_and_the_prompt(code):
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as elsewhere, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            moved = Behavior.status(code, headers={"Location": elsewhere.base_url + "/chat/completions"}, body=b"")
            async with FakeOpenAI(moved) as a:
                cfg = make_config(provider("a", a, api_key_env="A_KEY", headers={"api-key": "a-secret"}),
                                  steady("b", b), env={"A_KEY": "sk-a"})
                async with Chain(cfg) as chain:
                    result = await chain.complete(MESSAGES, kind="chat")
                return result, elsewhere.requests, elsewhere.headers

    result, requests, headers = asyncio.run(main())
    # before: aiohttp followed it. 307/308 re-sent the user's messages and a's `api-key` header to the other
    # origin (it strips only Authorization) and took that server's reply as a's; 302 turned the POST into a GET
    assert requests == [] and headers == []
    assert result.attempts == [("a", f"status_{code}"), ("b", "ok")]


# ------------------------------------------------------------------ 2. one upstream's cookies went to the others
def test_cookies_one_provider_sets_are_never_sent_upstream():
    async def main():
        set_cookie = {"Set-Cookie": "session=a-secret; Path=/"}
        async with FakeOpenAI([Behavior.status(500, headers=set_cookie), Behavior.reply(CHAT_JSON)]) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            # one host name (a cookie is per host, not per port): two deployments behind one domain
            pa = provider("a", a, base_url=f"http://localhost:{a.port}/v1")
            pb = steady("b", b, base_url=f"http://localhost:{b.port}/v1")
            async with Chain(make_config(pa, pb, breaker_failures=5)) as chain:
                first = await chain.complete(MESSAGES, kind="chat")
                second = await chain.complete(MESSAGES, kind="chat")
            return first, second, a.headers, b.headers

    first, second, a_headers, b_headers = asyncio.run(main())
    assert [x.provider for x in (first, second)] == ["b", "a"]
    # before: the session's cookie jar sent a's cookie to b (and back to a, shared by every user's request)
    assert [h.get("Cookie") for h in b_headers + a_headers] == [None, None, None]


# ------------------------------------------------------------------ 3. a breaker that opened mid-request was ignored
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_breaker_that_opens_while_a_request_is_on_an_earlier_provider_is_skipped(backend):
    async def main():
        chain_of: list[Chain] = []

        async def a_fails_while_b_opens(body):
            # while this request waits on a, other requests fail on b and open its breaker
            await chain_of[0].breakers["b"].failure(ConnectionFailed("b", "refused"), None)
            return Behavior.status(500)

        async with FakeOpenAI(a_fails_while_b_opens) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as c:
            cfg = make_config(provider("a", a), steady("b", b), provider("c", c), breaker_failures=1,
                              **backend_settings(backend))
            async with Chain(cfg) as chain:
                chain_of.append(chain)
                result = await chain.complete(MESSAGES, kind="chat")
                status = {s["name"]: s["state"] for s in await chain.status()}
            return result, len(b.requests), status

    result, b_calls, status = asyncio.run(main())
    assert status["b"] == "open"
    # before: the request went to b anyway (its breaker state was read once, before a), so an open breaker
    # shed none of the requests already in flight, and a half-open one could get a second "single" trial
    assert b_calls == 0
    assert result.attempts == [("a", "status_500"), ("b", "cooldown"), ("c", "ok")]


# ------------------------------------------------------------------ 4. a client that never finishes its body
def test_a_request_body_that_never_arrives_is_a_408_within_the_deadline():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            cfg = make_config(provider("a", a), deadline_s=0.5)
            async with served(cfg) as port:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                body = b'{"messages": [{"role": "user", "content": "hi"}]}'
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])   # ... and nothing more
                await writer.drain()
                with stopwatch() as t:
                    try:   # before: no answer at all; the handler (and the connection) waited forever
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5 + SLOW_S)
                    except TimeoutError:
                        head = b"(no answer)"
                    rest = await reader.read(4096) if head != b"(no answer)" else b""
                writer.close()
                async with aiohttp.ClientSession() as client:
                    async with client.get(f"http://127.0.0.1:{port}/metrics") as r:
                        metrics = await r.text()
                return head, rest, t(), len(a.requests), metrics

    head, rest, elapsed, upstream_calls, metrics = asyncio.run(main())
    assert head.startswith(b"HTTP/1.1 408"), head
    assert b'"code": "request_timeout"' in rest and b'"type": "invalid_request_error"' in rest
    assert elapsed < 0.5 + MARGIN_S + 0.25
    assert upstream_calls == 0
    assert 'hearth_gateway_requests_total{kind="unknown",outcome="rejected"} 1.0' in metrics


# ------------------------------------------------------------------ 5. a reply body was read whole, however large
class EndlessBody:
    """An upstream that answers `status` and then sends body bytes without end (a broken or hostile server):
    `cap` bytes at full speed, then nothing more (the connection stays open). `sent` counts the body bytes it
    got out before the client dropped the connection (set `dropped`)."""

    def __init__(self, status: int, cap: int = 48 * 1024 * 1024) -> None:
        self.status, self.cap = status, cap
        self.sent = 0
        self.dropped = asyncio.Event()

    async def __aenter__(self):
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.base_url = "http://127.0.0.1:%d/v1" % self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self._server.close()

    async def _conn(self, reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     % self.status)
        piece = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        try:
            for _ in range(self.cap // 65536):
                writer.write(piece)
                await writer.drain()
                self.sent += 65536
            await reader.read()   # until the gateway drops the connection
        except ConnectionError:
            pass
        self.dropped.set()
        writer.close()


@pytest.mark.parametrize("status, label", [(200, "invalid_response"), (500, "status_500")])
def test_an_endless_reply_body_is_cut_at_a_size_limit_not_read_until_the_timeout(status, label):
    async def main():
        async with EndlessBody(status) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            pa = {"name": "a", "base_url": a.base_url, "model": "m",
                  "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "total_s": 4.0}}
            async with Chain(make_config(pa, steady("b", b), deadline_s=10.0)) as chain:
                with stopwatch() as t:
                    result = await chain.complete(MESSAGES, kind="chat")
                elapsed = t()
                await asyncio.wait_for(a.dropped.wait(), SLOW_S)
                return result, elapsed, a.sent, a.cap

    result, elapsed, sent, cap = asyncio.run(main())
    # before: the whole body was buffered (48 MiB here; without end, whatever arrived in total_s, or 1 s for an
    # error body) and the attempt ended only at the timeout: timeout_total, or status_500 after a second
    assert result.attempts == [("a", label), ("b", "ok")]
    assert sent < cap / 2, f"the upstream got {sent} of {cap} bytes out: the body was read on, not cut"
    assert elapsed < MARGIN_S


def test_a_health_answer_with_an_endless_body_is_judged_by_its_status():
    async def main():
        async with EndlessBody(200) as health, FakeOpenAI(Behavior.reply(CHAT_JSON)) as ft:
            gated = provider("ft", ft, scale_to_zero=True, health_url=health.base_url + "/health",
                             warm={"probe_timeout_s": SLOW_S, "warmup_budget_s": 2 * SLOW_S})
            async with Chain(make_config(gated, deadline_s=3 * SLOW_S)) as chain:
                with stopwatch() as t:
                    warm = await chain.gates["ft"].is_warm()
                return warm, t()

    warm, elapsed = asyncio.run(main())
    # before: the probe buffered the body until probe_timeout_s (SLOW_S here) ran out and called a 200 "cold"
    assert warm is True and elapsed < MARGIN_S
