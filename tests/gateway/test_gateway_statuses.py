"""What the client gets when things go wrong, over real HTTP on loopback (issue 13 items 1, 2, 5, 6).

The client's own mistakes come back as the client's 4xx and never cool a provider down; rate limits
come back as 429/503 with Retry-After; every error is OpenAI-shaped JSON with X-Request-ID.
"""

import asyncio
import json

from hearth.gateway.chain import Chain
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, MESSAGES, gateway, make_config, provider, steady

GOOD = Behavior.reply(CHAT_JSON)
TOO_LONG = Behavior.status(400, body={"error": {"message": "This model's maximum context length is 8192 tokens",
                                                "type": "invalid_request_error", "param": "messages",
                                                "code": "context_length_exceeded"}})
LONG = [{"role": "user", "content": "x " * 50}]


def _too_long_or_good(body: dict) -> Behavior:
    return TOO_LONG if body["messages"][0]["content"].startswith("x ") else GOOD


def _shape(body: dict) -> None:
    """OpenAI's error shape."""
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body


# ------------------------------------------------------------------ item 1: the client's errors stay the client's
def test_client_400_from_every_provider_is_returned_and_never_opens_a_breaker():
    async def main():
        async with FakeOpenAI(_too_long_or_good) as a, FakeOpenAI(_too_long_or_good) as b:
            async with gateway(make_config(provider("a", a), steady("b", b), breaker_failures=3)) as client:
                bad = []
                for _ in range(3):
                    r = await client.post("/v1/chat/completions", json={"messages": LONG})
                    bad.append((r.status, await r.json()))
                good = []
                for _ in range(5):
                    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                    good.append((r.status, r.headers["X-Hearth-Provider"]))
                ready = await client.get("/readyz")
                return bad, good, ready.status, await ready.json()

    bad, good, ready_status, ready = asyncio.run(main())
    for status, body in bad:
        assert status == 400
        _shape(body)
        assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"
        assert "maximum context length" in body["error"]["message"]
        assert [f["label"] for f in body["error"]["failures"]] == ["status_400", "status_400"]
    assert good == [(200, "a")] * 5          # the primary still serves: nothing was cooled down
    assert ready_status == 200 and all(p["state"] == "closed" and p["consecutive_failures"] == 0
                                       for p in ready["providers"])


def test_a_4xx_one_provider_gives_falls_through_without_a_breaker_count():
    async def main():
        async with FakeOpenAI(TOO_LONG) as a, FakeOpenAI(GOOD) as b:
            chain = Chain(make_config(provider("a", a), steady("b", b), breaker_failures=2))
            async with chain:
                results = [await chain.complete(MESSAGES, kind="chat") for _ in range(5)]
                return results, len(a.requests), await chain.status()

    results, a_calls, status = asyncio.run(main())
    assert [r.attempts for r in results] == [[("a", "status_400"), ("b", "ok")]] * 5
    assert a_calls == 5 and status[0]["state"] == "closed" and status[0]["consecutive_failures"] == 0


def test_provider_side_4xx_still_counts():
    # 401 is our key, not the client's request: it cools the provider down like a 5xx
    async def main():
        async with FakeOpenAI(Behavior.status(401)) as a, FakeOpenAI(GOOD) as b:
            chain = Chain(make_config(provider("a", a), steady("b", b), breaker_failures=2))
            async with chain:
                results = [await chain.complete(MESSAGES, kind="chat") for _ in range(3)]
                return results, len(a.requests)

    results, a_calls = asyncio.run(main())
    assert results[2].attempts[0] == ("a", "cooldown") and a_calls == 2


# ------------------------------------------------------------------ item 2: rate limits -> 429 / 503 + Retry-After
def test_every_provider_rate_limited_is_429_with_the_shortest_retry_after():
    async def main():
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": "7"})) as a, \
                FakeOpenAI(Behavior.status(429, headers={"Retry-After": "3"})) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                out = []
                for _ in range(2):  # upstream 429s, then both cooling down
                    r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                    out.append((r.status, r.headers.get("Retry-After"), r.headers.get("X-Request-ID"), await r.json()))
                ready = await client.get("/readyz")
                return out, ready.status, len(a.requests) + len(b.requests)

    out, ready_status, upstream_calls = asyncio.run(main())
    (s1, ra1, rid1, b1), (s2, ra2, _, b2) = out
    assert (s1, ra1) == (429, "3") and rid1 and b1["error"]["code"] == "rate_limited"
    _shape(b1)
    assert s2 == 429 and ra2 in ("3", "2") and [f["label"] for f in b2["error"]["failures"]] == ["cooldown", "cooldown"]
    assert upstream_calls == 2               # the second request contacted nobody
    assert ready_status == 200               # the gateway itself is fine


def test_cooling_down_after_failures_and_rate_limit_mixed_is_503_with_retry_after():
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a, FakeOpenAI(Behavior.status(429, headers={"Retry-After": "5"})) as b:
            cfg = make_config(provider("a", a), steady("b", b), breaker_failures=1, cooldown_s=30.0)
            async with gateway(cfg) as client:
                r1 = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                r2 = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                return r1.status, r2.status, r2.headers.get("Retry-After"), await r2.json()

    s1, s2, ra, body = asyncio.run(main())
    assert s1 == 502                          # a real failure (500) among them: the gateway's 502
    assert s2 == 503 and ra in ("5", "4") and body["error"]["code"] == "providers_unavailable"


# ------------------------------------------------------------------ item 5: finish_reason is never made up
def test_json_reply_keeps_a_missing_finish_reason_missing():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON, finish_reason=None)) as a:
            async with gateway(make_config(provider("a", a))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                return r.status, await r.json()

    status, body = asyncio.run(main())
    assert status == 200 and body["choices"][0]["finish_reason"] is None
    assert json.loads(body["choices"][0]["message"]["content"]) == CHAT


# ------------------------------------------------------------------ item 6: bad input
def test_bad_input_gets_openai_shaped_json_errors_and_never_goes_upstream():
    async def main():
        async with FakeOpenAI(GOOD) as a:
            async with gateway(make_config(provider("a", a))) as client:
                out = {}

                async def post(name, **kw):
                    r = await client.post("/v1/chat/completions", **kw)
                    out[name] = (r.status, r.headers.get("Content-Type", ""), r.headers.get("X-Request-ID"),
                                 await r.json(content_type=None))

                await post("nested", data=b"[" * 200_000 + b"]" * 200_000, headers={"Content-Type": "application/json"})
                await post("huge", data=b'{"messages": "' + b"x" * (10 << 20) + b'"}',
                           headers={"Content-Type": "application/json"})
                await post("stream-string", json={"messages": MESSAGES, "stream": "false"})
                await post("text-plain", data=json.dumps({"messages": MESSAGES}), headers={"Content-Type": "text/plain"})
                await post("form", data={"messages": "hi"})
                await post("empty-message", json={"messages": [{}]})
                await post("bad-role", json={"messages": [{"role": "robot", "content": "hi"}]})
                await post("bad-content", json={"messages": [{"role": "user", "content": 5}]})
                await post("unknown-model", json={"messages": MESSAGES, "model": "gpt-9"})
                r = await client.get("/v1/nothing")
                out["404"] = (r.status, r.headers["Content-Type"], r.headers.get("X-Request-ID"), await r.json())
                r = await client.get("/v1/chat/completions")
                out["405"] = (r.status, r.headers["Content-Type"], r.headers.get("X-Request-ID"), await r.json())
                return out, len(a.requests)

    out, upstream_calls = asyncio.run(main())
    expect = {"nested": (400, None, "invalid_json"), "huge": (413, None, None),
              "stream-string": (400, "stream", None), "text-plain": (415, None, "unsupported_media_type"),
              "form": (415, None, "unsupported_media_type"), "empty-message": (400, "messages[0].role", None),
              "bad-role": (400, "messages[0].role", None), "bad-content": (400, "messages[0].content", None),
              "unknown-model": (404, "model", "model_not_found"), "404": (404, None, None), "405": (405, None, None)}
    for name, (status, param, code) in expect.items():
        got_status, ctype, rid, body = out[name]
        assert got_status == status, (name, got_status, body)
        assert ctype.startswith("application/json") and rid, (name, ctype, rid)
        _shape(body)
        assert body["error"]["param"] == param and body["error"]["code"] == code, (name, body)
    assert "gpt-9" in out["unknown-model"][3]["error"]["message"]
    assert upstream_calls == 0


def test_model_names_a_provider_group_or_the_whole_chain():
    async def main():
        async with FakeOpenAI(GOOD) as a, FakeOpenAI(GOOD) as b, FakeOpenAI(GOOD) as c:
            cfg = make_config(provider("a", a), steady("b", b, model="shared"), provider("c", c, model="shared"))
            async with gateway(cfg) as client:
                got = {}
                for model in ("shared", "c", "hearth", None):
                    body = {"messages": MESSAGES, **({"model": model} if model else {})}
                    r = await client.post("/v1/chat/completions", json=body)
                    got[model] = (r.status, (await r.json())["hearth"]["attempts"])
                models = await (await client.get("/v1/models")).json()
                return got, [m["id"] for m in models["data"]], len(a.requests)

    got, model_ids, a_calls = asyncio.run(main())
    assert got["shared"] == (200, [["b", "ok"]]) and got["c"] == (200, [["c", "ok"]])
    assert got["hearth"] == (200, [["a", "ok"]]) and got[None] == (200, [["a", "ok"]])
    assert model_ids == ["hearth", "a-model", "shared"] and a_calls == 2


def test_unexpected_error_is_a_json_500_with_request_id():
    class Broken(Chain):
        async def complete(self, *args, **kwargs):
            raise RuntimeError("boom")

    async def main():
        async with FakeOpenAI(GOOD) as a:
            cfg = make_config(provider("a", a))
            async with gateway(cfg, chain=Broken(cfg)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES}, headers={"X-Request-ID": "r-500"})
                return r.status, r.headers["X-Request-ID"], await r.json()

    status, rid, body = asyncio.run(main())
    assert status == 500 and rid == "r-500" and body["error"]["code"] == "internal_error"
    assert "boom" not in body["error"]["message"]   # internals stay in the log


def test_an_infinite_or_huge_retry_after_is_a_capped_429_not_a_500():
    # "Retry-After: inf" parsed to float('inf'), and math.ceil(inf) raised OverflowError: a 500 for a plain rate
    # limit. A huge one was passed on as it came, though the breaker reopens the provider after max_retry_after_s.
    async def main(header):
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": header})) as a:
            async with gateway(make_config(provider("a", a), max_retry_after_s=60.0)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                return r.status, r.headers.get("Retry-After"), await r.json()

    status, retry_after, body = asyncio.run(main("inf"))
    assert status == 429 and retry_after is None and body["error"]["code"] == "rate_limited", (status, body)
    _shape(body)
    status, retry_after, body = asyncio.run(main("86400"))
    assert (status, retry_after) == (429, "60"), (status, retry_after, body)


def test_a_body_nested_just_below_the_decoders_limit_is_a_400_not_a_500():
    """A content part nested just shallowly enough for the JSON decoder in the handler was taken, then failed when a
    provider encoded the messages deeper in the stack: RecursionError, a 500 internal_error logged as a gateway bug.
    No depth up to past the decoder's limit is a 500 now; the deepest are 400 invalid_json. (A body the gateway
    passes on can still fail upstream: the fake upstream here decodes it in this same process and thread, with
    its own recursion limit, which a real server does not share; that is the upstream's answer, not a 500.)"""
    import sys

    async def main():
        async with FakeOpenAI(GOOD) as a:
            async with gateway(make_config(provider("a", a))) as client:
                seen = {}
                limit = sys.getrecursionlimit()
                for depth in range(limit - 150, limit + 10):
                    raw = (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": '
                           + b"[" * depth + b"]" * depth + b"}]}]}")
                    r = await client.post("/v1/chat/completions", data=raw,
                                          headers={"Content-Type": "application/json"})
                    body = await r.json(content_type=None)
                    seen[depth] = (r.status, body.get("error", {}).get("code"))
                return seen

    seen = asyncio.run(main())
    assert not any(status == 500 for status, _ in seen.values()), {d: v for d, v in seen.items() if v[0] == 500}
    assert (200, None) in seen.values() and seen[max(seen)] == (400, "invalid_json"), seen
