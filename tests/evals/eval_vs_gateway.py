"""One answer scored by the eval twice: straight from a model server on loopback, and through the real gateway in
front of it, as the app's chat gets it. The review-76 eval tests require the two verdicts to agree: the eval must
score a reply exactly when the app would take it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Mapping

from aiohttp import web

from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import FakeOpenAI
from tests.gateway.gateway_helpers import gateway_url, make_config, provider

CHAT_CASE = load_suite("companion")[0]
GOOD = json.dumps({"message": "I'm here.", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
                   "suggested_actions": []})
# connect_s: a loopback connect is instant, but a loaded CI machine can stall the process for about a second
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}


def event(delta: dict, finish: str | None = None, *, ensure_ascii: bool = True) -> str:
    """One chat.completion.chunk as its SSE event (data line and blank line)."""
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                        "finish_reason": finish}]}
    return "data: " + json.dumps(chunk, ensure_ascii=ensure_ascii) + "\n\n"


# GOOD streamed in two content chunks, then the finish chunk and [DONE]
SSE = event({"role": "assistant", "content": GOOD[:20]}) + event({"content": GOOD[20:]}) + event({}, "stop") \
    + "data: [DONE]\n\n"


def fake_model() -> FakeOpenAI:
    """A FakeOpenAI that answers with its ``answer`` attribute (a Behavior); serve_fake sets it."""
    model = FakeOpenAI(lambda body: model.answer)
    return model


def serve_fake(model: FakeOpenAI, answer) -> bool:
    model.answer = answer
    return True


def verdicts(model, answers: Mapping[str, Any], serve: Callable[[Any, Any], bool], *,
             timeouts: dict = TIMEOUTS, direct_timeout_s: float = 10.0) -> tuple[dict, dict]:
    """{name: value} -> (the eval's rows straight from ``model``, its rows through a gateway in front of it), by name.
    ``model``: a loopback model server (an async context manager with base_url); ``serve(model, value)`` sets what it
    answers next and returns whether the eval asks for a stream."""

    async def go():
        async with model:
            cfg = make_config(provider("a", model, model="hearth-lora", timeouts=timeouts), deadline_s=10.0,
                              breaker_failures=1000)
            direct, gateway = {}, {}
            async with gateway_url(cfg) as url:
                for name, value in answers.items():
                    streamed = serve(model, value)
                    direct[name], = await run_cases([CHAT_CASE], base_url=model.base_url, model="m",
                                                    timeout_s=direct_timeout_s, stream=streamed)
                    gateway[name], = await run_cases([CHAT_CASE], base_url=url, model="hearth-lora", timeout_s=10,
                                                     stream=streamed)
            return direct, gateway

    return asyncio.run(go())


def agree(direct: dict, gateway: dict) -> None:
    disagree = {name: (direct[name].reason, gateway[name].reason) for name in direct
                if direct[name].passed != gateway[name].passed}
    assert not disagree, disagree


class LoopbackModel:
    """A model server on loopback whose /v1/chat/completions is the subclass's ``_chat``; ``closing`` is set when it
    stops (a handler waiting on it ends)."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def __aenter__(self):
        self.closing = asyncio.Event()
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
