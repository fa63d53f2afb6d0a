"""The fake OpenAI server itself: each scripted behaviour does what its docstring says, over real HTTP."""

import asyncio
import json
import time

import aiohttp
import httpx
import pytest

from tests.fakes.openai_server import Behavior, FakeOpenAI


async def _post(session, server, body=None):
    return await session.post(server.base_url + "/chat/completions", json=body or {"messages": []})


def test_script_in_order_then_exhausted():
    async def main():
        script = [Behavior.reply("one"), Behavior.status(429, headers={"Retry-After": "7"}), Behavior.raw(b"{nope")]
        async with FakeOpenAI(script) as server, aiohttp.ClientSession() as s:
            r = await _post(s, server, {"messages": [{"role": "user", "content": "x"}]})
            doc = await r.json()
            assert (r.status, doc["choices"][0]["message"]["content"], doc["choices"][0]["finish_reason"]) == (200, "one", "stop")
            r = await _post(s, server)
            assert (r.status, r.headers["Retry-After"]) == (429, "7")
            assert (await r.json())["error"]["code"] == 429
            r = await _post(s, server)
            assert (r.status, await r.read()) == (200, b"{nope")
            r = await _post(s, server)
            assert r.status == 500 and "exhausted" in (await r.text())
            assert server.requests[0] == {"messages": [{"role": "user", "content": "x"}]}
            assert len(server.requests) == 4

    asyncio.run(main())


def test_callable_handler_sync_and_async():
    async def main():
        async def handler(body):
            return Behavior.reply(body["messages"][0]["content"].upper(), finish_reason="length")

        async with FakeOpenAI(handler) as server, aiohttp.ClientSession() as s:
            doc = await (await _post(s, server, {"messages": [{"role": "user", "content": "abc"}]})).json()
            assert doc["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "ABC"}, "finish_reason": "length"}
        async with FakeOpenAI(lambda body: Behavior.status(503)) as server, aiohttp.ClientSession() as s:
            assert (await _post(s, server)).status == 503

    asyncio.run(main())


def _sse_contents(lines):
    out, finish = [], None
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"][0]
            out.append(choice["delta"].get("content", ""))
            finish = choice["finish_reason"] or finish
    return out, finish


def test_reply_streams_when_asked_and_stream_stalls():
    async def main():
        async with FakeOpenAI([Behavior.reply("hello world"), Behavior.stream(["a", "b", "c"], stall_after=1)]) as server, \
                aiohttp.ClientSession() as s:
            r = await _post(s, server, {"messages": [], "stream": True})
            assert r.headers["Content-Type"].startswith("text/event-stream")
            text = [line for line in (await r.text()).splitlines() if line]
            contents, finish = _sse_contents(text)
            assert "".join(contents) == "hello world" and finish == "stop" and text[-1] == "data: [DONE]"
            r = await _post(s, server, {"messages": [], "stream": True})
            got = []
            # the chunks that come are waited for generously (a loaded CI machine can stall a second), the stall briefly
            while sum(line.startswith("data: ") for line in got) < 2:
                line = await asyncio.wait_for(r.content.readline(), 10)
                assert line, got  # the body ended before its chunks came
                got.append(line.decode().strip())
            with pytest.raises(asyncio.TimeoutError):
                while True:
                    line = await asyncio.wait_for(r.content.readline(), 0.5)
                    assert line, got  # the body ended: no stall
                    got.append(line.decode().strip())
            contents, _ = _sse_contents(got)
            assert contents == ["", "a"]  # role chunk, one content chunk, then nothing
            r.close()

    asyncio.run(main())


def test_hang_reset_and_delays():
    async def main():
        async with FakeOpenAI([Behavior.hang(), Behavior.reset(), Behavior.reply("late", delay_s=0.2)]) as server:
            # the hang timed out by aiohttp's own timeout, in a session of its own: asyncio.wait_for's cancel of the
            # hung request once reached the next request on a loaded CI machine (a TimeoutError where the reset's
            # ClientConnectionError was due)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as hung:
                with pytest.raises(asyncio.TimeoutError):
                    await _post(hung, server)
            async with aiohttp.ClientSession() as s:
                with pytest.raises(aiohttp.ClientConnectionError):
                    await _post(s, server)
                start = time.perf_counter()
                r = await _post(s, server)
                assert r.status == 200 and time.perf_counter() - start >= 0.19

    asyncio.run(main())


def test_health_models_and_thread_mode():
    server = FakeOpenAI(Behavior.reply("x"), model="m1",
                        health=[Behavior.status(503), Behavior.status(200, body={"status": "ok"})]).start_in_thread()
    try:
        assert httpx.get(server.health_url).status_code == 503
        assert httpx.get(server.health_url).status_code == 200
        assert httpx.get(server.health_url).status_code == 200  # script over: default healthy
        assert server.health_calls == 3
        assert httpx.get(server.base_url + "/models").json()["data"][0]["id"] == "m1"
        r = httpx.post(server.base_url + "/chat/completions", json={"messages": []})
        assert r.json()["choices"][0]["message"]["content"] == "x"
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(server.base_url + "/chat/completions", json={}, timeout=1)


def test_stop_returns_while_a_request_hangs():
    server = FakeOpenAI(Behavior.hang()).start_in_thread()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/chat/completions", json={}, timeout=0.1)
    thread = server._thread
    start = time.perf_counter()
    server.stop()  # joins the server's thread for at most 10 s
    assert not thread.is_alive()
    assert time.perf_counter() - start < 6.0  # the hang ends at once; a loaded CI machine can stall a second


def test_behavior_arguments_are_checked():
    with pytest.raises(ValueError, match="delay_s"):
        Behavior.reply("x", delay_s=-1)
    with pytest.raises(TypeError, match="chunks"):
        Behavior.stream("abc")
    with pytest.raises(ValueError, match="code"):
        Behavior.status(42)


def test_command_line_serves_valid_envelopes_on_the_given_port():
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from hearth.envelope import parse_envelope
    from tests.fakes.openai_server import PORT_TRIES, free_port, port_taken

    root = Path(__file__).resolve().parents[2]
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        # SIGINT at its default in the child, as in a terminal: pytest started in the background (`nohup ... &`)
        # ignores SIGINT, a child inherits that, and Python then installs no Ctrl-C handler (the server never stopped)
        proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port)], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        banner = proc.stdout.readline()
        if f"http://127.0.0.1:{port}/v1" in banner or attempt == PORT_TRIES:
            break
        rest, _ = proc.communicate(timeout=30)
        assert port_taken(banner + rest), banner + rest  # only a port taken meanwhile is tried again
    try:
        assert f"http://127.0.0.1:{port}/v1" in banner, banner
        base = f"http://127.0.0.1:{port}/v1"
        chat = {"model": "fake-model", "messages": [{"role": "system", "content": "You are Wren."},
                                                    {"role": "user", "content": "hello there"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "hearth_chat", "schema": {}}}}
        r = httpx.post(base + "/chat/completions", json=chat, timeout=10)
        envelope = parse_envelope(r.json()["choices"][0]["message"]["content"], "chat")
        assert envelope.message == "Echo: hello there"
        with httpx.stream("POST", base + "/chat/completions", json={**chat, "stream": True}, timeout=10) as s:
            text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                           for line in s.iter_lines() if line.startswith("data: {"))
        assert parse_envelope(text, "chat").message == "Echo: hello there"
        assert httpx.get(base + "/models", timeout=10).json()["data"][0]["id"] == "fake-model"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:  # never leave the server running past the test
                proc.kill()
                proc.wait()
    bad = subprocess.run([sys.executable, "-m", "tests.fakes.openai_server", "--port", "70000"], cwd=root,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--port" in bad.stderr
