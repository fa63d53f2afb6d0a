"""review76: a streamed chat case is read as hearth's gateway reads the stream it asks a provider for.

Was: the eval's client read a stream request's answer by its Content-Type: text/event-stream as SSE, anything else
as a completion in one piece. The gateway (gateway/providers.py ChatStream) reads the answer to its stream request
as SSE whatever the Content-Type says: "data:" lines, nothing else. So, scored straight from a model:

    * a server that ignores "stream": true and answers with one application/json completion passed the eval, while
      the app's streamed chat (every chat turn of a page with its script on) failed every turn ("the stream ended
      without a finish_reason or [DONE]": no data line);
    * a server that streams SSE under another Content-Type (text/plain, a proxy's rewrite) failed the eval
      ("malformed completion"), while the app showed and saved those replies.

Each answer is served by a real loopback server, once straight to the eval and once through the real gateway as
the app's chat streams it: the two verdicts must agree.
"""

from __future__ import annotations

import asyncio
import json

from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI, completion_json
from tests.gateway.gateway_helpers import gateway_url, make_config, provider

CHAT_CASE = load_suite("companion")[0]
GOOD = json.dumps({"message": "I'm here.", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
                   "suggested_actions": []})
# connect_s: a loopback connect is instant, but a loaded CI machine can stall the process for about a second
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}


def _event(delta: dict, finish: str | None) -> str:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                        "finish_reason": finish}]}
    return "data: " + json.dumps(chunk) + "\n\n"


SSE = _event({"role": "assistant", "content": GOOD[:20]}, None) + _event({"content": GOOD[20:]}, None) \
    + _event({}, "stop") + "data: [DONE]\n\n"

ANSWERS = {
    "one piece, application/json": Behavior.raw(json.dumps(completion_json(GOOD, "m"))),
    "SSE as text/plain": Behavior.raw(SSE, content_type="text/plain"),
    "SSE with no content type": Behavior.raw(SSE, content_type=""),
    "SSE as text/event-stream": Behavior.raw(SSE, content_type="text/event-stream"),
}


def verdicts() -> tuple[dict, dict]:
    current: list[Behavior] = []

    async def go():
        async with FakeOpenAI(lambda body: current[0]) as model:
            cfg = make_config(provider("a", model, model="hearth-lora", timeouts=TIMEOUTS), deadline_s=10.0,
                              breaker_failures=1000)
            direct, gateway = {}, {}
            async with gateway_url(cfg) as url:
                for name, answer in ANSWERS.items():
                    current[:] = [answer]
                    direct[name], = await run_cases([CHAT_CASE], base_url=model.base_url, model="m", timeout_s=10,
                                                    stream=True)
                    gateway[name], = await run_cases([CHAT_CASE], base_url=url, model="hearth-lora", timeout_s=10,
                                                     stream=True)
            return direct, gateway

    return asyncio.run(go())


def test_a_streamed_chat_answer_passes_the_eval_exactly_when_the_apps_streamed_chat_takes_it():
    direct, gateway = verdicts()
    disagree = {name: (direct[name].reason, gateway[name].reason) for name in ANSWERS
                if direct[name].passed != gateway[name].passed}
    assert not disagree, disagree
    assert {name for name in ANSWERS if direct[name].passed} == {
        "SSE as text/plain", "SSE with no content type", "SSE as text/event-stream"}


def test_an_answer_in_one_piece_to_a_stream_request_says_so():
    direct, _ = verdicts()
    row = direct["one piece, application/json"]
    assert row.status == 200 and row.checks["response"] is False, (row.status, row.checks)
    assert "not as server-sent events" in row.reason and "application/json" in row.reason, row.reason
