"""The gateway's HTTP server, through a real aiohttp server on loopback (and once through the CLI)."""

import asyncio
import json
import logging
import os
import subprocess
import sys
import time

import httpx

from hearth.gateway.server import main
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, MESSAGES, gateway, make_config, provider, steady

GOOD = Behavior.reply(CHAT_JSON)


def _sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_chat_json_kind_request_id_and_provider():
    async def main():
        async with FakeOpenAI(Behavior.status(500)) as a, FakeOpenAI([GOOD, Behavior.reply('{"comment": "ok", "tone": "calm"}')]) as b:
            async with gateway(make_config(provider("a", a), steady("b", b), breaker_failures=10)) as client:
                r1 = await client.post("/v1/chat/completions", json={"messages": MESSAGES}, headers={"X-Request-ID": "req-42"})
                d1 = await r1.json()
                r2 = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 32},
                                       headers={"X-Hearth-Kind": "feed_comment"})
                d2 = await r2.json()
                return r1, d1, r2, d2, b.requests

    r1, d1, r2, d2, b_requests = asyncio.run(main())
    assert r1.status == 200 and r1.headers["X-Request-ID"] == "req-42" and r1.headers["X-Hearth-Provider"] == "b"
    assert json.loads(d1["choices"][0]["message"]["content"]) == CHAT
    assert d1["hearth"]["attempts"] == [["a", "status_500"], ["b", "ok"]] and d1["hearth"]["kind"] == "chat"
    assert r2.status == 200 and len(r2.headers["X-Request-ID"]) == 32          # generated when absent
    assert json.loads(d2["choices"][0]["message"]["content"]) == {"comment": "ok", "tone": "calm"}
    assert b_requests[1]["max_tokens"] == 32


def test_all_failed_is_502_listing_each_provider_and_bad_requests_400():
    async def main():
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": "3"})) as a, FakeOpenAI(Behavior.reply("nope")) as b:
            async with gateway(make_config(provider("a", a), steady("b", b))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                failed = (r.status, await r.json())
                bad = []
                for body in ({"messages": []}, {"messages": MESSAGES, "hearth_kind": "poem"},
                             {"messages": MESSAGES, "max_tokens": 0}, {"messages": MESSAGES, "hearth_deadline_s": 99}):
                    r = await client.post("/v1/chat/completions", json=body)
                    bad.append((r.status, (await r.json())["error"].get("param")))
                r = await client.post("/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"})
                bad.append((r.status, None))
                return failed, bad

    (status, body), bad = asyncio.run(main())
    assert status == 502
    a, b = body["error"]["failures"]
    assert a["provider"] == "a" and a["status"] == 429 and a["retry_after"] == 3.0 and a["label"] == "status_429"
    assert b["provider"] == "b" and b["error"] == "InvalidEnvelope"
    assert bad == [(400, "messages"), (400, "hearth_kind"), (400, "max_tokens"), (400, "hearth_deadline_s"), (400, None)]


def test_all_timed_out_is_504():
    async def main():
        async with FakeOpenAI(Behavior.hang()) as a:
            async with gateway(make_config(provider("a", a))) as client:
                r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                return r.status, await r.json()

    status, body = asyncio.run(main())
    assert status == 504 and body["error"]["failures"][0]["timeout"] == "first_token"


def test_sse_stream_fallback_and_interruption():
    pieces = [CHAT_JSON[:20], CHAT_JSON[20:]]

    async def main():
        async with FakeOpenAI([Behavior.status(500), Behavior.stream(pieces, stall_after=1)]) as a, \
                FakeOpenAI(Behavior.stream(pieces)) as b:
            async with gateway(make_config(provider("a", a), steady("b", b), breaker_failures=10)) as client:
                r1 = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                t1 = await r1.text()
                r2 = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
                t2 = await r2.text()
                return r1, t1, r2, t2, len(b.requests)

    r1, t1, r2, t2, b_calls = asyncio.run(main())
    assert r1.status == 200 and r1.headers["Content-Type"].startswith("text/event-stream")
    assert r1.headers["X-Hearth-Provider"] == "b"
    events = _sse(t1)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == CHAT_JSON
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["hearth"]["envelope"] == CHAT
    assert t1.rstrip().endswith("data: [DONE]")
    events = _sse(t2)                                   # a sent its first piece, then stalled
    assert events[1]["choices"][0]["delta"]["content"] == pieces[0]
    assert events[-1]["error"]["provider"] == "a" and events[-1]["error"]["cause"]["label"] == "timeout_first_token"
    assert "[DONE]" not in t2 and b_calls == 1          # no fallback after the first byte


def test_models_health_ready_providers_metrics():
    async def main():
        async with FakeOpenAI(Behavior.status(429, headers={"Retry-After": "60"})) as a:
            async with gateway(make_config(provider("a", a))) as client:
                out = {}
                for path in ("/v1/models", "/healthz", "/readyz"):
                    r = await client.get(path)
                    out[path] = (r.status, await r.json())
                await client.post("/v1/chat/completions", json={"messages": MESSAGES})
                for path in ("/readyz", "/v1/providers"):
                    r = await client.get(path)
                    out[path + " after"] = (r.status, await r.json())
                r = await client.get("/metrics")
                out["/metrics"] = (r.status, await r.text())
                return out

    out = asyncio.run(main())
    assert out["/v1/models"] == (200, {"object": "list", "data": [
        {"id": "hearth", "object": "model", "created": 0, "owned_by": "hearth"},
        {"id": "a-model", "object": "model", "created": 0, "owned_by": "a"}]})
    assert out["/healthz"] == (200, {"status": "ok", "pid": os.getpid()})
    assert out["/readyz"][0] == 200 and out["/readyz"][1]["providers"][0]["state"] == "closed"
    status, body = out["/readyz after"]      # a provider cooling down does not make the gateway unready
    assert status == 200 and body["ready"] is True and body["providers"][0]["state"] == "open"
    assert out["/v1/providers after"][1]["providers"][0]["why"].startswith("Retry-After 60")
    metrics = out["/metrics"][1]
    assert 'hearth_gateway_errors_total{error="status_429",provider="a"} 1.0' in metrics
    assert 'hearth_gateway_requests_total{kind="chat",outcome="failed"} 1.0' in metrics
    assert "hearth_gateway_attempt_seconds_bucket" in metrics


def test_main_refuses_bad_config(tmp_path, capsys):
    cfg = tmp_path / "g.toml"
    cfg.write_text('[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\napi_key_env = "HEARTH_TEST_UNSET_KEY"\n')
    hearth_log = logging.getLogger("hearth")
    saved = (hearth_log.handlers[:], hearth_log.level)
    try:
        assert main(cfg, "127.0.0.1", 0) == 2          # main() installs the JSON log handler
    finally:
        hearth_log.handlers[:], _ = saved
        hearth_log.setLevel(saved[1])
    assert "HEARTH_TEST_UNSET_KEY" in capsys.readouterr().err


def test_cli_serves_requests_end_to_end(tmp_path):
    upstream = FakeOpenAI(GOOD).start_in_thread()
    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[[providers]]\nname = "up"\nbase_url = "{upstream.base_url}"\nmodel = "m"\n')
    proc = subprocess.Popen([sys.executable, "-m", "hearth.cli", "gateway", "--config", str(cfg), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 20
        while True:  # a child process has no event to wait on: poll its liveness route
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": MESSAGES},
                       headers={"X-Request-ID": "cli-1"})
        assert r.status_code == 200 and r.headers["X-Hearth-Provider"] == "up"
        assert json.loads(r.json()["choices"][0]["message"]["content"]) == CHAT
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        upstream.stop()
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert any(l.get("request_id") == "cli-1" and l.get("status") == 200 and l.get("provider") == "up" for l in lines), err


def test_generated_request_ids_are_unique_and_differ_in_a_forked_child():
    import os

    from hearth.gateway import server

    ids = {server._new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its first id and leave at once
        os.write(write, server._new_request_id().encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child_id) == 32 and child_id[:16] != server._new_request_id()[:16]
