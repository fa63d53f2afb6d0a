"""Defects found by review 55 of the gateway (one test per defect; each failed before its fix). Real loopback
fake providers, no sleeps."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from hearth.gateway.chain import Chain, StreamDone
from hearth.gateway.transport import AiohttpTransport, ConnectFailed
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, MESSAGES, make_config, provider, scale_to_zero, steady

# Host names the system resolver cannot even encode (an empty label, a label over 63 characters): getaddrinfo
# raises UnicodeError (a ValueError), not a resolution failure.
UNENCODABLE_HOSTS = ["a..b", "a" * 64 + ".example"]


@pytest.mark.parametrize("host", UNENCODABLE_HOSTS, ids=["empty-label", "long-label"])
def test_a_health_redirect_to_an_unencodable_host_reads_cold_and_the_request_falls_through(host):
    # A health route (another origin than base_url: the probe carries no headers, so the HTTP client follows its
    # redirects) that answers 302 to a host name the resolver cannot encode: the UnicodeError escaped the
    # transport, the probe task died with it, verdict() raised it into the chain's plan, and every chat request
    # was a 500 (each re-probed: nothing was trusted), although the hosted provider behind it was fine.
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON),
                              health=Behavior.status(302, headers={"Location": f"http://{host}/health"})) as ft, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            gated = scale_to_zero("ft", ft)
            gated["health_url"] = gated["health_url"].replace("127.0.0.1", "localhost")  # another origin
            async with Chain(make_config(gated, steady("b", b))) as chain:
                result = await chain.complete(MESSAGES, kind="chat")
                gate = chain.gates["ft"]
                await gate.wait_warmup()
                return result, gate.last_error, len(ft.requests)

    result, last_error, sent_to_ft = asyncio.run(main())
    assert result.provider == "b" and result.attempts[0] == ("ft", "cold")
    assert sent_to_ft == 0 and last_error is not None


@pytest.mark.parametrize("host", UNENCODABLE_HOSTS, ids=["empty-label", "long-label"])
def test_transport_open_to_an_unencodable_host_is_a_connect_failure(host):
    async def main():
        transport = AiohttpTransport()
        await transport.start()
        try:
            await transport.open("GET", f"http://{host}/health", headers={}, body=None, connect_timeout_s=1.0)
        finally:
            await transport.aclose()

    with pytest.raises(ConnectFailed):
        asyncio.run(main())


@pytest.mark.parametrize("field", ["base_url", "health_url"])
@pytest.mark.parametrize("url, words", [
    ("http://a..b/v1", "host name"),
    ("http://" + "a" * 64 + ".example/v1", "host name"),
    ("http://.example/v1", "host name"),
    # a ${VAR} with a trailing space: "http://10.0.0.5:8000 /v1" resolved the host "10.0.0.5:8000 " (a DNS failure on
    # every request); "http://10.0.0.5:8000/v1 /chat/completions" went out as /v1%20/chat/completions (a 404 each)
    ("http://10.0.0.5 /v1", "whitespace"),
    ("http://10.0.0.5:8000/v1 ", "whitespace"),
    ("http://10.0.0.5:8000/v1\n", "whitespace"),
])
def test_a_url_whose_host_or_path_cannot_work_is_a_start_up_error(field, url, words):
    # Such URLs loaded, and each request (or probe) to them failed: a host the resolver cannot encode raised a
    # UnicodeError inside the HTTP client (a 500 for every request), a host with a space failed name resolution, a
    # path with a space got a 404 — all counted against the provider, none said at start-up.
    from hearth.gateway.config import ConfigError, config_from_dict

    p = {"name": "a", "base_url": "http://10.0.0.5:8000/v1", "model": "m", "scale_to_zero": True,
         "health_url": "http://10.0.0.5:8000/health"}
    p[field] = url.replace("/v1", "/health") if field == "health_url" else url
    with pytest.raises(ConfigError) as info:
        config_from_dict({"providers": [p]})
    assert info.value.field == f"providers[0].{field}" and words in str(info.value)


@pytest.mark.parametrize("url", ["http://[::1]:8000/v1", "https://bücher.example/v1", "http://a_b.example/v1",
                                 "http://localhost./v1", "https://you--hearth-vllm-serve.modal.run/v1"])
def test_urls_with_usable_hosts_still_load(url):
    from hearth.gateway.config import config_from_dict

    assert config_from_dict({"providers": [{"name": "a", "base_url": url, "model": "m"}]}).providers[0].base_url == url


def _event(delta: dict, finish: str | None) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


@pytest.mark.parametrize("ending", ["stall", "close"])
def test_a_stream_whose_finish_reason_arrived_is_complete_however_its_connection_ends(ending):
    # The whole reply and its final chunk (finish_reason "stop") arrived; then the upstream neither sent [DONE] nor
    # ended the body cleanly: it held the connection open (stall), or closed it without the body's last chunk
    # (close: aiohttp's "payload is not completed"). A clean EOF there was a success; these two were a
    # StreamInterrupted after the client had the whole envelope (its final chunk and [DONE] never came) and a
    # failure counted against the provider.
    async def main():
        release = asyncio.Event()

        async def chat(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for part in (CHAT_JSON[:20], CHAT_JSON[20:]):
                await resp.write(_event({"content": part}, None))
            await resp.write(_event({}, "stop"))
            if ending == "close":
                request.transport.close()
            await release.wait()
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]

        class Up:
            base_url = f"http://127.0.0.1:{port}/v1"

        try:
            async with Chain(make_config(provider("a", Up))) as chain:
                events = [ev async for ev in chain.stream(MESSAGES, kind="chat")]
                return events, (await chain.status())[0]
        finally:
            release.set()
            await runner.cleanup()

    events, state = asyncio.run(main())
    done = events[-1]
    assert isinstance(done, StreamDone), done
    assert done.result.provider == "a" and done.result.finish_reason == "stop" and done.result.envelope.model_dump() == CHAT
    assert state["consecutive_failures"] == 0
