"""Defects found by review 49 of the gateway (one test per defect; each failed before its fix)."""

import asyncio
import json

import pytest

from hearth.gateway.chain import Chain, StreamDelta, StreamDone
from hearth.gateway.config import ConfigError, config_from_dict
from hearth.gateway.errors import AllProvidersFailed, InvalidResponse, StreamInterrupted, Timeout
from hearth.gateway.state import MemoryStore, StateStoreError
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MARGIN_S, MESSAGES, gateway, make_config, provider, stopwatch, steady


def _event(delta: dict, finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _stream(chain):
    events = []
    try:
        async for ev in chain.stream(MESSAGES, kind="chat"):
            events.append(ev)
    except (StreamInterrupted, AllProvidersFailed) as exc:
        events.append(exc)
    return events


# ------------------------------------------------------------------ 1. a malformed reply escaped the chain
DEEP = b"[" * 50_000 + b"]" * 50_000   # over the JSON decoder's recursion limit: RecursionError, not ValueError


@pytest.mark.parametrize("stream, body, content_type", [
    (False, b'{"choices": ' + DEEP + b"}", "application/json"),
    (True, b"data: " + DEEP + b"\n\n", "text/event-stream"),
    (True, _event({"content": 5}), "text/event-stream"),          # content not a string
    (True, _event({"content": ["x"]}), "text/event-stream"),
], ids=["json-deep-nesting", "sse-deep-nesting", "sse-content-int", "sse-content-list"])
def test_a_malformed_provider_reply_falls_through_instead_of_escaping_the_chain(stream, body, content_type):
    async def main():
        async with FakeOpenAI(Behavior.raw(body, content_type=content_type)) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            async with Chain(make_config(provider("a", a), steady("b", b))) as chain:
                if stream:
                    events = await _stream(chain)
                    assert isinstance(events[-1], StreamDone), events[-1]
                    return events[-1].result
                return await chain.complete(MESSAGES, kind="chat")

    # before: RecursionError / TypeError escaped chain.complete / chain.stream (the server's 500), no fallback
    result = asyncio.run(main())
    assert result.provider == "b"
    assert result.attempts == [("a", "invalid_response"), ("b", "ok")]


def test_a_non_string_delta_after_the_first_byte_is_an_interruption_not_a_crash():
    body = _event({"content": CHAT_JSON[:10]}) + _event({"content": {"text": "x"}})

    async def main():
        async with FakeOpenAI(Behavior.raw(body, content_type="text/event-stream")) as a:
            async with Chain(make_config(provider("a", a))) as chain:
                return await _stream(chain)

    events = asyncio.run(main())   # before: TypeError out of the stream
    assert [type(e) for e in events] == [StreamDelta, StreamInterrupted]
    assert isinstance(events[-1].__cause__, InvalidResponse)


# ------------------------------------------------------------------ 2. keep-alives reset the idle gap
class TricklingUpstream:
    """Sends headers and `first`, then `filler` (an SSE comment, an empty or a reasoning delta: never content)
    every 50 ms until the gateway hangs up."""

    def __init__(self, first: bytes, filler: bytes) -> None:
        self.first, self.filler = first, filler

    async def __aenter__(self):
        self._writers = set()
        self._done = set()
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc):
        self._server.close()
        for w in self._writers:   # each handler then ends on its own (never cancelled: asyncio would log that)
            w.close()
        await asyncio.gather(*(d.wait() for d in self._done))

    @staticmethod
    def _chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def _conn(self, reader, writer):
        done = asyncio.Event()
        self._writers.add(writer)
        self._done.add(done)
        try:
            await self._serve(reader, writer)
        finally:
            done.set()

    async def _serve(self, reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + self._chunk(self.first))
        try:
            while True:
                await writer.drain()
                await asyncio.sleep(0.05)   # the upstream's own keep-alive period (this is what is simulated)
                writer.write(self._chunk(self.filler))
        except ConnectionError:
            pass
        finally:
            writer.close()


FILLERS = [b": keep-alive\n\n", _event({"content": ""}), _event({"reasoning_content": "hmm, let me think"})]
SLOW_TOTAL = {"connect_s": 1.0, "first_token_s": 0.8, "total_s": 5.0}


@pytest.mark.parametrize("filler", FILLERS, ids=["comment", "empty-delta", "reasoning-delta"])
def test_keep_alives_do_not_reset_the_gap_between_two_content_deltas(filler):
    async def main():
        async with TricklingUpstream(_event({"content": CHAT_JSON[:10]}), filler) as up:
            p = {"name": "a", "base_url": up.base_url, "model": "m", "timeouts": SLOW_TOTAL}
            async with Chain(make_config(p, deadline_s=8.0)) as chain:
                with stopwatch() as t:
                    events = await _stream(chain)
                return events, t()

    events, elapsed = asyncio.run(main())
    assert [type(e) for e in events] == [StreamDelta, StreamInterrupted]
    cause = events[-1].__cause__
    # before: every keep-alive line restarted the idle timer, so the stall ran to total_s (5 s)
    assert isinstance(cause, Timeout) and cause.kind == "first_token", cause
    assert elapsed < SLOW_TOTAL["first_token_s"] + MARGIN_S + 0.1


def test_keep_alives_before_the_first_byte_still_fall_back_after_first_token_s():
    async def main():
        # the first delta is a think block's opening: nothing reached the client yet, so this may fall back
        async with TricklingUpstream(_event({"content": "<think>"}), FILLERS[0]) as up, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            p = {"name": "a", "base_url": up.base_url, "model": "m", "timeouts": SLOW_TOTAL}
            async with Chain(make_config(p, steady("b", b), deadline_s=8.0)) as chain:
                with stopwatch() as t:
                    events = await _stream(chain)
                return events, t()

    events, elapsed = asyncio.run(main())
    assert isinstance(events[-1], StreamDone)
    assert events[-1].result.attempts == [("a", "timeout_first_token"), ("b", "ok")]
    assert elapsed < SLOW_TOTAL["first_token_s"] + MARGIN_S + 0.1


# ------------------------------------------------------------------ 3. a state store failure after the first SSE byte
class StoreGoneOnFailure(MemoryStore):
    """Redis going away mid-request: the store answers until the attempt's failure is recorded."""

    async def failure(self, *args, **kwargs):
        raise StateStoreError("Redis at redis://127.0.0.1:1/0: Connection refused")


def test_state_store_failure_mid_stream_ends_the_sse_with_an_error_event_not_a_hang():
    async def main():
        async with FakeOpenAI(Behavior.stream([CHAT_JSON[:10], CHAT_JSON[10:]], stall_after=1)) as a:
            cfg = make_config(provider("a", a))
            async with gateway(cfg, chain=Chain(cfg, store=StoreGoneOnFailure())) as client:
                async with client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True}) as r:
                    # before: the middleware's 503 could not be sent after the SSE headers; the stream never ended
                    return r.status, await asyncio.wait_for(r.read(), 5.0)

    status, body = asyncio.run(main())
    assert status == 200
    events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == CHAT_JSON[:10]
    error = json.loads(events[-1])["error"]
    assert error["code"] == "state_store_unavailable", error
    assert "[DONE]" not in events


# ------------------------------------------------------------------ 4. base_url that can only fail at request time
def test_a_base_url_that_cannot_work_is_a_config_error_not_a_failure_of_every_request():
    base = {"name": "a", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    bad = [  # before: all accepted. Credentials plus a key: aiohttp's ValueError on every request (a 500, no
             # fallback); a query or fragment: chat/completions appended after it (a 404 that opens the breaker)
        ({**base, "base_url": "http://user:pw@127.0.0.1:9/v1", "api_key_env": "KEY"}, {"KEY": "sk"}),
        ({**base, "base_url": "http://user:pw@127.0.0.1:9/v1", "headers": {"authorization": "Bearer x"}}, {}),
        ({**base, "base_url": "https://example.openai.azure.com/openai?api-version=2024-06-01"}, {}),
        ({**base, "base_url": "http://127.0.0.1:9/v1#frag"}, {}),
    ]
    for p, env in bad:
        with pytest.raises(ConfigError) as err:
            config_from_dict({"providers": [p]}, env)
        assert err.value.field == "providers[0].base_url", (p, str(err.value))
        assert "pw" not in str(err.value) and "sk" not in str(err.value)
    # credentials alone are aiohttp's basic auth, and a health_url may carry a query: both still load
    config_from_dict({"providers": [{**base, "base_url": "http://user:pw@127.0.0.1:9/v1"}]}, {})
    config_from_dict({"providers": [{**base, "scale_to_zero": True,
                                     "health_url": "http://127.0.0.1:9/health?full=1"}]}, {})


# ------------------------------------------------------------------ 5. connect_s did not cover name resolution
def test_connect_s_bounds_name_resolution_too():
    async def main():
        loop = asyncio.get_running_loop()
        real = loop.getaddrinfo
        never = asyncio.Event()

        async def resolver_that_never_answers(host, *args, **kwargs):
            if host == "localhost":   # a resolver that is down; nothing else is affected
                await never.wait()
            return await real(host, *args, **kwargs)

        loop.getaddrinfo = resolver_that_never_answers
        try:
            async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
                a = {"name": "a", "base_url": "http://localhost:9/v1", "model": "m",
                     "timeouts": {"connect_s": 0.1, "first_token_s": 1.0, "total_s": 2.0}}
                async with Chain(make_config(a, steady("b", b))) as chain:
                    with stopwatch() as t:
                        result = await chain.complete(MESSAGES, kind="chat")
                    return result, t()
        finally:
            del loop.getaddrinfo

    result, elapsed = asyncio.run(main())
    # before: [("a", "timeout_first_token"), ...] after first_token_s (1 s): DNS ran outside connect_s
    assert result.attempts == [("a", "timeout_connect"), ("b", "ok")]
    assert elapsed < 0.1 + MARGIN_S


# ------------------------------------------------------------ 6. a runaway stream was never cut at MAX_REPLY_CHARS
def test_a_stream_past_max_reply_chars_fails_at_once_not_at_its_end():
    from hearth.envelope import MAX_REPLY_CHARS
    from hearth.gateway.errors import InvalidEnvelope

    piece = "x" * 10_000
    runaway_think = ["<think>"] + [piece] * (MAX_REPLY_CHARS // len(piece) + 1)       # then it stalls
    runaway_object = ['{"message": "'] + [piece] * (MAX_REPLY_CHARS // len(piece) + 1)

    async def main():
        async with FakeOpenAI([Behavior.stream(runaway_think, stall_after=len(runaway_think)),
                               Behavior.stream(runaway_object, stall_after=len(runaway_object))]) as a, \
                FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
            cfg = make_config(provider("a", a, timeouts={"total_s": 3.0}), steady("b", b), deadline_s=5.0)
            async with Chain(cfg) as chain:
                before = await _stream(chain)      # nothing shown yet: falls back
                async with Chain(make_config(provider("a", a, timeouts={"total_s": 3.0}))) as alone:
                    after = await _stream(alone)   # the object is being shown: an interruption
                return before, after

    before, after = asyncio.run(main())
    # before the fix: each waited for the stall (timeout_first_token) after relaying/holding all of it
    assert isinstance(before[-1], StreamDone)
    assert before[-1].result.attempts == [("a", "invalid_envelope"), ("b", "ok")]
    assert isinstance(after[-1], StreamInterrupted) and isinstance(after[-1].__cause__, InvalidEnvelope)
    shown = sum(len(e.text) for e in after if isinstance(e, StreamDelta))
    assert shown <= MAX_REPLY_CHARS
