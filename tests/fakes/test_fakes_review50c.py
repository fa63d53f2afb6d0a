"""Review 50c of the test fakes.

1. The fake OpenAI server's default usage said total_tokens 2 whatever the counts; it is now prompt_tokens +
   completion_tokens, in a JSON reply and in a stream's usage chunk.
2. tests/evals/fake_eval_server.py's docstring showed `[--port 8123]` as if that were the default; the default is
   a free port (the docs pass `--port 8123` explicitly, which keeps working).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.evals import fake_eval_server
from tests.fakes.openai_server import PORT_TRIES, Behavior, FakeOpenAI, free_port, port_taken, usage_json

ROOT = Path(__file__).resolve().parents[2]
CONTENT = "x" * 100  # 25 made-up completion tokens


@pytest.mark.parametrize("content", ["", "hi", CONTENT])
def test_default_usage_total_is_prompt_plus_completion(content):
    u = usage_json(content)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def _usage_over_http(stream: bool) -> dict:
    server = FakeOpenAI(Behavior.reply(CONTENT)).start_in_thread()
    try:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        r = httpx.post(server.base_url + "/chat/completions", json=body, timeout=10)
        assert r.status_code == 200
        if not stream:
            return r.json()["usage"]
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return [c for c in chunks if c.get("usage")][-1]["usage"]
    finally:
        server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_served_usage_adds_up(stream):
    u = _usage_over_http(stream)
    assert u["completion_tokens"] == 25
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def _run_eval_server(*args: str) -> int:
    """Start `python -m tests.evals.fake_eval_server ARGS --seconds 0`; the port of the base URL it prints."""
    out = subprocess.run([sys.executable, "-m", "tests.evals.fake_eval_server", *args, "--seconds", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    base_url = json.loads(out.splitlines()[0])["base_url"]
    return int(re.fullmatch(r"http://127\.0\.0\.1:(\d+)/v1", base_url).group(1))


def test_the_eval_servers_docstring_tells_its_real_default_port():
    usage = fake_eval_server.__doc__
    shown = re.search(r"\[--port (\S+)\]", usage).group(1)
    port = _run_eval_server()  # no --port: the default
    assert port > 0
    # a literal port in the usage line reads as the default: it must be the one it uses
    assert not shown.isdigit() or int(shown) == port, f"docstring shows [--port {shown}], the default was {port}"
    assert "free port" in usage


def test_an_explicit_port_as_the_docs_pass_it_is_used():
    for attempt in range(1, PORT_TRIES + 1):
        want = free_port()
        try:
            assert _run_eval_server("--port", str(want)) == want
            break
        except subprocess.CalledProcessError as e:
            if attempt == PORT_TRIES or not port_taken(e.stderr):  # only a port taken meanwhile is tried again
                raise
    for doc in ("README.md", "docs/eval.md"):  # the docs' commands: explicit --port, which the server takes
        assert "python -m tests.evals.fake_eval_server --port 8123" in (ROOT / doc).read_text()
