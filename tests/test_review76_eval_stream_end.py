"""review76: a stream whose final chunk came ends there for the eval too, whatever follows, as it does in the gateway.

Was: once the chunk with the finish_reason had come, only [DONE] (and maybe the usage chunk) is missing; hearth's
gateway (gateway/providers.py ChatStream.next_delta) ends the reply there when the upstream then stalls or drops the
connection, as a clean end of the body does, and the app shows and saves it. The eval's client kept waiting: a stall
there was "timeout after Ns" and a dropped connection "RemoteProtocolError: ...", the whole reply thrown away and
the case failed (no status, no content) though the app takes it.

The answers come from a real loopback server, once straight to the eval and once through the real gateway as the
app's chat streams it: the two verdicts must agree.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.gateway.gateway_helpers import gateway_url, make_config, provider

CHAT_CASE = load_suite("companion")[0]
GOOD = json.dumps({"message": "I'm here.", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
                   "suggested_actions": []})
# first_token_s also bounds the gap between two lines of a stream in the gateway: how long it waits for [DONE]
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 1.0, "total_s": 8.0}


def _event(delta: dict, finish: str | None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                        "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class _Upstream:
    """A model server whose stream, after its final chunk, does what ``self.after`` says: "stall" (sends nothing
    more until the server stops), "drop" (the connection is cut, the chunked body never ended) or "done" ([DONE])."""

    def __init__(self) -> None:
        self.after = "done"
        self.closing = asyncio.Event()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event({"role": "assistant", "content": GOOD[:20]}, None))
        await resp.write(_event({"content": GOOD[20:]}, None))
        await resp.write(_event({}, "stop"))
        if self.after == "stall":
            await self.closing.wait()
        elif self.after == "drop":
            request.transport.abort()
            return resp
        else:
            await resp.write(b"data: [DONE]\n\n")
        try:
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp

    async def __aenter__(self) -> "_Upstream":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        self.closing.set()
        await self._runner.cleanup()


def verdicts(afters: tuple[str, ...]) -> tuple[dict, dict]:
    async def go():
        async with _Upstream() as model:
            cfg = make_config(provider("a", model, model="hearth-lora", timeouts=TIMEOUTS), deadline_s=10.0,
                              breaker_failures=1000)
            direct, gateway = {}, {}
            async with gateway_url(cfg) as url:
                for after in afters:
                    model.after = after
                    direct[after], = await run_cases([CHAT_CASE], base_url=model.base_url, model="m", timeout_s=3,
                                                     stream=True)
                    gateway[after], = await run_cases([CHAT_CASE], base_url=url, model="hearth-lora", timeout_s=10,
                                                      stream=True)
            return direct, gateway

    return asyncio.run(go())


def test_a_stream_that_stalls_or_breaks_after_its_final_chunk_is_scored_as_the_app_takes_it():
    direct, gateway = verdicts(("done", "stall", "drop"))
    assert all(row.passed for row in gateway.values()), {k: r.reason for k, r in gateway.items()}  # the app takes all
    assert {k: r.reason for k, r in direct.items()} == {"done": None, "stall": None, "drop": None}
    for row in direct.values():
        assert row.status == 200 and row.finish_reason == "stop" and row.content == GOOD, row
