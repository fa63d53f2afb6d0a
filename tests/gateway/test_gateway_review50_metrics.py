"""Review 50: every chat request ends in exactly ONE request outcome, with its duration, in /metrics.

Before: only requests the chain finished (ok, all failed) were counted with a duration. A stream cut
mid-way (upstream gone, stall timeout) counted "interrupted" with no duration; a client hanging up
(JSON or SSE), a state store failure and a request the gateway refused counted nothing at all, so
the dashboards under-counted failures and tail latency.

Each test runs the gateway over loopback, waits for the outcome to be recorded (an event, no sleep)
and scrapes /metrics: hearth_gateway_requests_total must hold exactly that one outcome, and
hearth_gateway_request_seconds exactly one observation of that outcome.
"""

import asyncio
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hearth.gateway.chain import Chain
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.state import MemoryStore, StateStoreError
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider

PIECES = [CHAT_JSON[:20], CHAT_JSON[20:]]
PATIENT = {"connect_s": 1.0, "first_token_s": 10.0, "total_s": 20.0}   # only the client ends these requests
WAIT_S = 3.0   # bound on waiting for the outcome event (a failing test says so instead of hanging)


class RecordingMetrics(GatewayMetrics):
    """GatewayMetrics that also remembers each request outcome and wakes a waiting test."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[tuple[str, str]] = []
        self.recorded = asyncio.Event()

    def request_done(self, kind: str, outcome: str, seconds: float) -> None:
        super().request_done(kind, outcome, seconds)
        self.outcomes.append((kind, outcome))
        self.recorded.set()


async def _outcome_recorded(m: RecordingMetrics) -> None:
    try:
        await asyncio.wait_for(m.recorded.wait(), WAIT_S)
    except TimeoutError:   # nothing recorded: the scrape below says what is missing
        pass


def _scrape(text: str) -> tuple[dict, dict]:
    """({(kind, outcome): count} of requests_total, {(kind, outcome): count} of request_seconds)."""
    requests, seconds = {}, {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "hearth_gateway_requests_total" and s.value:
                requests[(s.labels["kind"], s.labels["outcome"])] = s.value
            elif s.name == "hearth_gateway_request_seconds_count" and s.value:
                seconds[(s.labels["kind"], s.labels.get("outcome"))] = s.value
    return requests, seconds


async def _metrics(client, m: RecordingMetrics) -> tuple[dict, dict, list]:
    await _outcome_recorded(m)
    await asyncio.sleep(0)   # let a second (wrong) record of the same request land, if there is one
    r = await client.get("/metrics")
    assert r.status == 200
    return (*_scrape(await r.text()), list(m.outcomes))


def _assert_one(scraped, outcome: str, kind: str = "chat") -> None:
    requests, seconds, outcomes = scraped
    assert requests == {(kind, outcome): 1.0}, requests
    assert seconds == {(kind, outcome): 1.0}, seconds      # the duration of that request, under its outcome
    assert outcomes == [(kind, outcome)], outcomes


def _sse_events(text: str) -> list:
    return [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]


# ------------------------------------------------------------------ completed requests (already counted before)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_completed_request_is_one_ok_with_its_duration(stream):
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": stream})
                assert r.status == 200
                await r.read()
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "ok")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_provider_failing_is_one_failed_with_its_duration(stream):
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": stream})
                assert r.status == 502
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "failed")


# ------------------------------------------------------------------ streams that end mid-way
@pytest.mark.parametrize("behavior", [
    Behavior.stream(PIECES, cut=True),            # the upstream dies after the first byte
    Behavior.stream(PIECES, stall_after=1),       # the upstream stalls past first_token_s
], ids=["upstream-cut", "stall-timeout"])
def test_a_stream_interrupted_after_the_first_byte_is_one_interrupted_with_its_duration(behavior):
    async def main():
        async with FakeOpenAI(behavior) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                events = _sse_events(await r.text())
                assert events[-1]["error"]["code"] == "stream_interrupted"
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "interrupted")   # before: counted, but no duration at all


def test_a_client_hanging_up_mid_stream_is_one_client_cancelled():
    async def main():
        async with FakeOpenAI(Behavior.stream(PIECES, stall_after=1)) as a:
            cfg = make_config(provider("a", a, timeouts=PATIENT), deadline_s=30.0)
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                assert r.status == 200
                await r.content.readuntil(PIECES[0].encode()[-5:])   # the first delta is shown ...
                r.close()                                           # ... and the client goes away
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "client_cancelled")   # before: nothing at all


def test_a_client_hanging_up_on_a_json_request_is_one_client_cancelled():
    async def main():
        upstream_has_it = asyncio.Event()

        def hang(body):
            upstream_has_it.set()
            return Behavior.hang()

        async with FakeOpenAI(hang) as a:
            cfg = make_config(provider("a", a, timeouts=PATIENT), deadline_s=30.0)
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                call = asyncio.ensure_future(client.post("/v1/chat/completions", json={"messages": MESSAGES}))
                await upstream_has_it.wait()
                call.cancel()          # the client hangs up while the provider thinks
                with pytest.raises(asyncio.CancelledError):
                    await call
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "client_cancelled")   # before: nothing at all


# ------------------------------------------------------------------ the gateway's own failures and refusals
class StoreDown(MemoryStore):
    async def breakers(self, names):
        raise StateStoreError("Redis at redis://127.0.0.1:1/0: Connection refused")


class StoreGoneOnFailure(MemoryStore):
    async def failure(self, *args, **kwargs):
        raise StateStoreError("Redis at redis://127.0.0.1:1/0: Connection refused")


@pytest.mark.parametrize("store, stream, behavior, status", [
    (StoreDown, False, Behavior.reply(CHAT_JSON), 503),
    (StoreDown, True, Behavior.reply(CHAT_JSON), 503),
    (StoreGoneOnFailure, True, Behavior.stream(PIECES, stall_after=1), 200),   # after the SSE headers
], ids=["json-store-down", "sse-store-down", "sse-store-gone-mid-stream"])
def test_a_state_store_failure_is_one_error_with_its_duration(store, stream, behavior, status):
    async def main():
        async with FakeOpenAI(behavior) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m, store=store())) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": stream})
                assert r.status == status
                await r.read()
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "error")


@pytest.mark.parametrize("send, status, kind", [
    (dict(json={"messages": []}), 400, "unknown"),
    (dict(data=b"{not json", headers={"Content-Type": "application/json"}), 400, "unknown"),
    (dict(data=b"hi", headers={"Content-Type": "text/plain"}), 415, "unknown"),
    (dict(json={"messages": MESSAGES, "hearth_kind": "analyst", "model": "nope"}), 404, "analyst"),
    (dict(data=b"{" + b" " * (4 * 1024 * 1024 + 10) + b"}", headers={"Content-Type": "application/json"}), 413,
     "unknown"),
], ids=["400-messages", "400-json", "415", "404-model", "413"])
def test_a_request_the_gateway_refuses_is_one_rejected(send, status, kind):
    """kind: the request's envelope kind once read, "unknown" when it was refused before that."""
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                r = await client.post("/v1/chat/completions", **send)
                assert r.status == status
                assert (await r.json())["error"]["message"]
                out = await _metrics(client, m)
                return out, len(a.requests)

    scraped, upstream_calls = asyncio.run(main())
    assert upstream_calls == 0
    _assert_one(scraped, "rejected", kind=kind)   # before: nothing at all


def test_other_routes_are_not_chat_requests():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            cfg = make_config(provider("a", a))
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                for method, path in (("GET", "/healthz"), ("GET", "/v1/models"), ("GET", "/nope"),
                                     ("GET", "/v1/chat/completions")):
                    r = await client.request(method, path)
                    await r.read()
                r = await client.get("/metrics")
                return _scrape(await r.text()), m.outcomes

    (requests, seconds), outcomes = asyncio.run(main())
    assert requests == {} and seconds == {} and outcomes == []


def test_a_client_gone_while_sending_its_body_is_one_client_cancelled():
    async def main():
        async with FakeOpenAI(Behavior.reply(CHAT_JSON)) as a:
            cfg = make_config(provider("a", a), deadline_s=30.0)
            m = RecordingMetrics()
            async with gateway(cfg, chain=Chain(cfg, metrics=m)) as client:
                url = client._base_url   # the gateway's address (the helper's session is bound to it)
                reader, writer = await asyncio.open_connection(url.host, url.port)
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{\"messages\": [")
                await writer.drain()
                writer.close()   # gone before the body is complete
                return await _metrics(client, m)

    _assert_one(asyncio.run(main()), "client_cancelled", kind="unknown")

