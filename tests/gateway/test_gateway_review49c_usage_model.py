"""Review 49c of the gateway's OpenAI fidelity: `usage` carried from the answering provider, and `model` = the
model id that answered (not the provider's name). Real HTTP on loopback; the OpenAI SDK where the client's view
matters. Each test marked "before:" was seen failing against the gateway without these changes."""

import asyncio
import json
import re
from pathlib import Path

import openai
import pytest

from hearth.gateway.chain import Chain, StreamDone
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider, steady

ROOT = Path(__file__).resolve().parents[2]
A_USAGE = {"prompt_tokens": 11, "completion_tokens": 22, "total_tokens": 33}
B_USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
NOT_JSON = "Sorry, I cannot answer that."   # no JSON object: the provider fails (InvalidEnvelope), the chain falls back
URL = "/v1/chat/completions"


def _events(body: bytes) -> list:
    return [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")]


async def _sdk(client, **request):
    """One request through the OpenAI SDK: the completion, or the list of chunks when streaming. The SDK client is
    closed here (one left to the garbage collector closes itself in a later test's event loop, and fails there)."""
    async with openai.AsyncOpenAI(base_url=f"{client._base_url}/v1", api_key="unused", max_retries=0) as sdk:
        reply = await sdk.chat.completions.create(**request)
        return [c async for c in reply] if request.get("stream") else reply


# ------------------------------------------------------------------ usage: JSON
def test_json_reply_carries_the_answering_providers_usage_and_the_sdk_reads_it():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=A_USAGE)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                raw = await (await client.post(URL, json={"messages": MESSAGES})).json()
                sdk = await _sdk(client, model="hearth", messages=MESSAGES)
                return raw, sdk

    raw, sdk = asyncio.run(main())
    # before: no "usage" key at all (the SDK's completion.usage was None)
    assert raw["usage"] == A_USAGE
    assert sdk.usage is not None and (sdk.usage.prompt_tokens, sdk.usage.completion_tokens,
                                      sdk.usage.total_tokens) == (11, 22, 33)


@pytest.mark.parametrize("b_usage", [B_USAGE, None], ids=["b-reports", "b-reports-none"])
def test_json_usage_is_the_answering_attempts_never_a_failed_ones(b_usage):
    async def main():
        async with FakeOpenAI(Behavior.reply(NOT_JSON, usage=A_USAGE)) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON, usage=b_usage)) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post(URL, json={"messages": MESSAGES})
                return r.status, await r.json()

    status, body = asyncio.run(main())
    assert status == 200 and body["hearth"]["provider"] == "b"
    assert body["hearth"]["attempts"][0][0] == "a"
    if b_usage is None:
        assert "usage" not in body            # the provider reported none: none made up, and not a's
    else:
        assert body["usage"] == B_USAGE       # before: no usage


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": "many", "completion_tokens": 3, "total_tokens": 4},
    {"prompt_tokens": 1, "completion_tokens": True, "total_tokens": 2},
    {"prompt_tokens": -1, "completion_tokens": 3, "total_tokens": 2},
    {"completion_tokens": 3},
    "lots",
], ids=["string", "bool", "negative", "partial", "not-an-object"])
def test_malformed_upstream_usage_is_left_out_and_the_reply_still_served(usage):
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=usage)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                r = await client.post(URL, json={"messages": MESSAGES})
                return r.status, await r.json()

    status, body = asyncio.run(main())
    assert status == 200 and body["hearth"]["attempts"] == [["a", "ok"]] and "usage" not in body


def test_a_missing_total_is_the_sum_of_the_two_counts_the_provider_gave():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage={"prompt_tokens": 4, "completion_tokens": 6})) as up:
            async with gateway(make_config(provider("a", up))) as client:
                return await (await client.post(URL, json={"messages": MESSAGES})).json()

    # before: no usage
    assert asyncio.run(main())["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}


# ------------------------------------------------------------------ usage: SSE
def test_stream_asks_upstream_for_usage_and_the_sdk_gets_the_last_usage_chunk():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=A_USAGE)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                chunks = await _sdk(client, model="hearth", messages=MESSAGES, stream=True,
                                    stream_options={"include_usage": True})
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True,
                                                 "stream_options": {"include_usage": True}})
                return up.requests, chunks, _events(await r.read())

    sent, chunks, events = asyncio.run(main())
    # before: the gateway never asked upstream (no stream_options) and sent no usage chunk
    assert all(req["stream_options"] == {"include_usage": True} for req in sent)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (11, 22, 33)
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == CHAT_JSON
    # on the wire: ..., the finish chunk (hearth), the usage chunk (no choices), then [DONE]
    assert events[-1] == "[DONE]"
    usage_chunk, finish_chunk = json.loads(events[-2]), json.loads(events[-3])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == A_USAGE
    assert usage_chunk["object"] == "chat.completion.chunk" and usage_chunk["id"] == finish_chunk["id"]
    assert finish_chunk["choices"][0]["finish_reason"] == "stop" and "hearth" in finish_chunk
    assert all(json.loads(e)["usage"] is None for e in events[:-2])   # as OpenAI: null on every other chunk


def test_stream_without_include_usage_sends_no_usage_but_the_chain_result_has_it():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=A_USAGE)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True})
                events = _events(await r.read())
            async with Chain(make_config(provider("a", up))) as chain:
                done = [ev async for ev in chain.stream(MESSAGES, kind="chat")][-1]
            return events, done

    events, done = asyncio.run(main())
    assert events[-1] == "[DONE]" and "hearth" in json.loads(events[-2])
    assert all("usage" not in json.loads(e) for e in events[:-1])   # not asked: nothing about usage
    assert isinstance(done, StreamDone) and done.result.usage == A_USAGE   # before: ChainResult had no usage


@pytest.mark.parametrize("b_usage", [B_USAGE, None], ids=["b-reports", "b-reports-none"])
def test_stream_usage_is_the_answering_attempts_never_a_failed_ones(b_usage):
    async def main():
        async with FakeOpenAI(Behavior.reply(NOT_JSON, usage=A_USAGE)) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON, usage=b_usage)) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True,
                                                 "stream_options": {"include_usage": True}})
                return r.status, r.headers["X-Hearth-Provider"], _events(await r.read())

    status, served_by, events = asyncio.run(main())
    assert (status, served_by) == (200, "b") and events[-1] == "[DONE]"
    with_usage = [json.loads(e) for e in events[:-1] if json.loads(e).get("usage") is not None]
    if b_usage is None:
        assert with_usage == [] and "hearth" in json.loads(events[-2])   # none reported: no usage chunk
    else:
        assert [c["usage"] for c in with_usage] == [B_USAGE]              # before: no usage chunk
        assert with_usage[0]["choices"] == [] and json.loads(events[-2]) == with_usage[0]


def test_a_provider_can_opt_out_of_stream_options_through_extra_body():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=A_USAGE)) as up:
            cfg = make_config(provider("a", up, extra_body={"stream_options": {"include_usage": False}}))
            async with gateway(cfg) as client:
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True,
                                                 "stream_options": {"include_usage": True}})
                return up.requests, _events(await r.read())

    sent, events = asyncio.run(main())
    assert sent[0]["stream_options"] == {"include_usage": False}   # a server that refuses the option can be told
    assert events[-1] == "[DONE]" and all(json.loads(e).get("usage") is None for e in events[:-1])


@pytest.mark.parametrize("options", ["yes", [], {"include_usage": "true"}], ids=["string", "list", "non-bool"])
def test_bad_stream_options_are_a_400_naming_the_param(options):
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as up:
            async with gateway(make_config(provider("a", up))) as client:
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True, "stream_options": options})
                return r.status, await r.read(), len(up.requests)

    status, body, upstream_calls = asyncio.run(main())
    # before: 200 and a stream (the field was ignored)
    assert status == 400 and upstream_calls == 0
    assert json.loads(body)["error"]["param"].startswith("stream_options")


# ------------------------------------------------------------------ model: the model id, not the provider's name
def test_model_in_json_replies_is_the_answering_model_id_and_the_provider_stays_in_hearth():
    async def main():
        async with FakeOpenAI(Behavior.reply(NOT_JSON)) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            async with gateway(make_config(provider("a", a), provider("finetune", b, model="qwen3-lora"))) as client:
                r = await client.post(URL, json={"messages": MESSAGES})
                raw = (r.headers["X-Hearth-Provider"], await r.json())
                sdk = await _sdk(client, model="hearth", messages=MESSAGES)
                return raw, sdk

    (header, body), sdk = asyncio.run(main())
    assert body["model"] == "qwen3-lora" and sdk.model == "qwen3-lora"   # before: "finetune"
    assert header == "finetune" and body["hearth"]["provider"] == "finetune"


def test_model_in_every_streamed_chunk_is_the_answering_model_id():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as up:
            async with gateway(make_config(provider("finetune", up, model="qwen3-lora"))) as client:
                r = await client.post(URL, json={"messages": MESSAGES, "stream": True,
                                                 "stream_options": {"include_usage": True}})
                events = _events(await r.read())
                chunks = await _sdk(client, model="finetune", messages=MESSAGES, stream=True)
                return r.headers["X-Hearth-Provider"], events, chunks

    header, events, chunks = asyncio.run(main())
    objs = [json.loads(e) for e in events[:-1]]
    assert {o["model"] for o in objs} == {"qwen3-lora"} and {c.model for c in chunks} == {"qwen3-lora"}
    assert header == "finetune" and objs[-2]["hearth"]["provider"] == "finetune"   # objs[-1]: the usage chunk


def test_the_chain_result_names_the_model_id_beside_the_provider():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, usage=B_USAGE)) as up:
            async with Chain(make_config(provider("finetune", up, model="qwen3-lora"))) as chain:
                return await chain.complete(MESSAGES, kind="chat")

    result = asyncio.run(main())
    assert (result.provider, result.model, result.usage) == ("finetune", "qwen3-lora", B_USAGE)


# ------------------------------------------------------------------ docs
def test_docs_promise_usage_and_the_model_id():
    text = " ".join((ROOT / "docs" / "gateway.md").read_text(encoding="utf-8").split())
    assert "include_usage" in text and "`usage`" in text
    assert re.search(r"`model` is the (answering provider's )?model id", text), "docs must say what `model` is"

