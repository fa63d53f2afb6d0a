"""Review 49b of the gateway's server surface and OpenAI compatibility: one test per defect, each seen
failing before its fix. Real HTTP on loopback; the OpenAI SDK itself where the client's view matters."""

import asyncio
import json

import openai
import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.state import MemoryStore
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, MESSAGES, gateway, make_config, provider, steady


def _sse(*objs: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _events(body: bytes) -> list:
    return [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")]


def _streamed_text(events: list) -> str:
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events
                   if e != "[DONE]" and "choices" in json.loads(e))


# ------------------------------------------------------------------ 1. max_completion_tokens was dropped
def test_max_completion_tokens_from_the_openai_sdk_caps_the_reply_upstream():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                # closed here: an SDK client left open closes itself in a later test's event loop
                async with openai.AsyncOpenAI(base_url=f"{client._base_url}/v1", api_key="unused",
                                              max_retries=0) as sdk:
                    await sdk.chat.completions.create(model="hearth", messages=MESSAGES, max_completion_tokens=64)
                    await sdk.chat.completions.create(model="hearth", messages=MESSAGES, max_tokens=50,
                                                      max_completion_tokens=80)
                bad = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_completion_tokens": 0})
                return [r.get("max_tokens") for r in up.requests], bad.status, await bad.json()

    sent, status, bad = asyncio.run(main())
    # before: [None, 50]: the SDK's (and LangChain's) cap never reached the provider
    assert sent == [64, 50]
    assert status == 400 and bad["error"]["param"] == "max_completion_tokens"


# ------------------------------------------------------------------ 2. n > 1 answered with one choice
def test_n_other_than_1_is_refused_not_answered_with_one_choice():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                async with openai.AsyncOpenAI(base_url=f"{client._base_url}/v1", api_key="unused",
                                              max_retries=0) as sdk:
                    one = await sdk.chat.completions.create(model="hearth", messages=MESSAGES, n=1)
                    with pytest.raises(openai.BadRequestError) as refused:
                        await sdk.chat.completions.create(model="hearth", messages=MESSAGES, n=3)
                return one, refused.value, len(up.requests)

    one, refused, upstream_calls = asyncio.run(main())
    assert len(one.choices) == 1
    # before: 200 with 1 choice where the caller asked for 3 (a client indexing choices[2] crashed)
    assert refused.status_code == 400 and refused.param == "n"
    assert upstream_calls == 1


# ------------------------------------------------------------------ 3. an upstream chunk with no choices
AZURE_FILTER = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]}
USAGE = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}


def test_upstream_chunks_without_choices_are_skipped_not_a_provider_failure():
    body = _sse(AZURE_FILTER, _chunk({"role": "assistant", "content": ""}), _chunk({"content": CHAT_JSON[:20]}),
                _chunk({"content": CHAT_JSON[20:]}), _chunk({}, "stop"), USAGE)

    async def main():
        async with FakeOpenAI(Behavior.raw(body, content_type="text/event-stream")) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                return r.status, r.headers.get("X-Hearth-Provider"), await r.read()

    status, served_by, body = asyncio.run(main())
    events = _events(body)
    # before: Azure's first chunk (prompt_filter_results) and the include_usage chunk were "bad SSE events":
    # every stream from such a provider failed (and counted toward its breaker)
    assert (status, served_by) == (200, "a"), events
    assert events[-1] == "[DONE]"
    assert _streamed_text(events) == CHAT_JSON
    assert json.loads(events[-2])["hearth"]["attempts"] == [["a", "ok"]]


# ------------------------------------------------------------------ 4. an over-long SSE line escaped the chain
def test_an_upstream_sse_line_past_the_reader_limit_falls_through_not_a_500():
    line = b"data: " + json.dumps(_chunk({"content": " " * 600_000})).encode() + b"\n\n"

    async def main():
        async with FakeOpenAI(Behavior.raw(line, content_type="text/event-stream")) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            # the fallback's timing is not under test: steady() timeouts (its 0.5 s connect once ran out on a loaded
            # 2-core CI box after a's 600 KB line, and the request ended 502)
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                return r.status, await r.read()

    status, body = asyncio.run(main())
    # before: aiohttp's LineTooLong (no ClientError) escaped the chain: 500 internal_error, no fallback
    assert status == 200, body[:300]
    events = _events(body)
    assert _streamed_text(events) == CHAT_JSON
    assert json.loads(events[-2])["hearth"]["attempts"] == [["a", "connection"], ["b", "ok"]]


# ------------------------------------------------------------------ 5. a chatter brace started the streamed object
@pytest.mark.parametrize("chunks", [
    ["Reply in the format {message, mood}:\n```json\n", CHAT_JSON, "\n```"],
    ["<think>\n</think>\n\nUsing {", "braces} here: {", " \n" + CHAT_JSON[1:]],   # the object's '{' and '"' split
], ids=["one-delta", "split"])
def test_a_brace_in_chatter_before_the_object_is_dropped_like_repair_does(chunks):
    async def main():
        async with FakeOpenAI(Behavior.stream(chunks)) as a:
            async with gateway(make_config(provider("a", a))) as client:
                plain = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                return plain.status, r.status, await r.read()

    plain, status, body = asyncio.run(main())
    assert plain == 200   # the JSON route's repair() drops the chatter brace
    events = _events(body)
    # before: the stream started at the chatter's "{" ("{message, mood}:..." shown), then ended with
    # stream_interrupted (not the reply's envelope) and counted against the provider
    assert (status, events[-1]) == (200, "[DONE]"), events[-1]
    assert json.loads(_streamed_text(events)) == CHAT


# ------------------------------------------------------------------ 6. the breaker gauge stayed at 1
def test_breaker_open_gauge_follows_the_shared_state_not_what_this_worker_last_did(clock):
    # clock: the state module's clock, moved forward by hand (a cooldown ends without waiting for it)
    async def main():
        store = MemoryStore()   # shared by two chains, as two workers share Redis
        async with FakeOpenAI([Behavior.status(500), Behavior.reply(CHAT_JSON)]) as up:
            cfg = make_config(provider("a", up), breaker_failures=1, cooldown_s=30.0)
            worker_a, worker_b = Chain(cfg, store=store), Chain(cfg, store=store)
            async with worker_b, gateway(cfg, chain=worker_a) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                assert r.status == 502                                 # worker A opened the breaker
                opened = await (await client.get("/metrics")).text()
                clock.offset = 31.0                                     # the cooldown is over
                result = await worker_b.complete(MESSAGES, kind="chat")  # worker B's trial closed it
                assert result.attempts == [("a", "ok")]
                providers = await (await client.get("/v1/providers")).json()
                closed = await (await client.get("/metrics")).text()
                return opened, providers, closed

    opened, providers, closed = asyncio.run(main())
    assert 'hearth_gateway_breaker_open{provider="a"} 1.0' in opened
    assert providers["providers"][0]["state"] == "closed"
    # before: worker A's gauge said 1 for good (only A's own successes through a tripped breaker reset it)
    assert 'hearth_gateway_breaker_open{provider="a"} 0.0' in closed
