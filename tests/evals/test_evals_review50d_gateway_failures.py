"""A reply no provider got right, through hearth's gateway: its error body (an HTTP 502, or 504 / 503 / 429)
lists each provider's failure under error.failures. Was: the row showed only `HTTP 502: all 2 providers failed`,
with no attempts, so the report could not say which providers failed or how; and a failed row that had tried two
providers would have counted as a "fallback" (a reply that came after another provider failed). Now its attempts
are [provider, outcome] from that list, the reason names them, and the summary counts unanswered replies and the
failed attempts per provider. Other servers' error bodies are read as before."""

from __future__ import annotations

import asyncio
import json
from io import StringIO

import httpx
from rich.console import Console

from hearth.evals.client import chat_completion
from hearth.evals.runner import _print, main, run_cases, summarize
from tests.evals.test_evals_review50_gateway import CASES, case_of, gateway_url, good
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import make_config, provider

# connect_s: a loopback connect is instant, but a loaded CI machine can stall the process for about a second
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}


def run_through_gateway(stream: bool, doomed):
    """Provider a answers prose to the doomed cases, b a 500: the gateway has nothing valid for them (502)."""
    def answer_a(body):
        case = case_of(body)
        return Behavior.reply("What a lovely loaf!" if case in doomed else good(case))

    def answer_b(body):
        case = case_of(body)
        return Behavior.status(500) if case in doomed else Behavior.reply(good(case))

    async def go():
        async with FakeOpenAI(answer_a) as a, FakeOpenAI(answer_b) as b:
            cfg = make_config(provider("a", a, model="hearth-lora", timeouts=TIMEOUTS),
                              provider("b", b, model="hearth-lora", timeouts=TIMEOUTS),
                              deadline_s=10.0, breaker_failures=100)
            async with gateway_url(cfg) as url:
                return await run_cases(CASES, base_url=url, model="hearth-lora", timeout_s=10, stream=stream)

    return asyncio.run(go())


def test_a_gateway_502_lists_which_providers_failed_and_how():
    doomed = [CASES[1], CASES[4]]
    for stream in (False, True):
        scores = run_through_gateway(stream, doomed)
        by_id = {s.id: s for s in scores}
        for case in doomed:
            row = by_id[case.id]
            assert row.status == 502 and not row.passed and row.provider is None, (stream, row)
            assert row.attempts == [["a", "invalid_envelope"], ["b", "status_500"]], (stream, row.attempts)
            assert row.reason == "HTTP 502: all 2 providers failed (a: invalid_envelope, b: status_500)", row.reason
            assert row.to_json()["attempts"] == [["a", "invalid_envelope"], ["b", "status_500"]]
        assert all(s.passed and s.attempts == [["a", "ok"]] for s in scores if s.id not in {c.id for c in doomed})
        overall = summarize(scores)["overall"]
        assert overall["fallbacks"] == 0  # no reply came after a fallback: the two that tried b got none
        assert overall["unanswered"] == 2
        assert overall["failed_attempts"] == {"a": {"invalid_envelope": 2}, "b": {"status_500": 2}}
        assert overall["providers"] == {"a": len(CASES) - 2}


def test_the_console_says_how_many_replies_no_provider_got_right():
    scores = run_through_gateway(False, [CASES[0]])
    out = StringIO()
    _print(Console(file=out, width=300), summarize(scores), scores, 1.0)
    text = out.getvalue()
    assert "1 of 8 replies no provider got right" in text, text
    assert "a: invalid_envelope 1" in text and "b: status_500 1" in text, text


def test_the_report_rows_of_a_failed_gateway_reply_carry_its_attempts(tmp_path):
    """A server that answers every case with the gateway's 502 body: each row of the report has the attempts."""
    failures = [{"provider": "vllm", "error": "Timeout", "label": "timeout_first_token", "message": "no token",
                 "timeout": "first_token"},
                {"provider": "hosted", "error": "UpstreamStatus", "label": "status_429", "message": "HTTP 429: slow",
                 "status": 429, "retry_after": None},
                {"provider": "spare", "error": "Cooldown", "label": None, "message": "cooling down"}]
    body = {"error": {"message": "all 3 providers failed", "type": "hearth_gateway", "param": None,
                      "code": "upstream_failed", "failures": failures}}
    report = tmp_path / "r.json"
    with FakeOpenAI(lambda _: Behavior.status(502, body=body)) as server:
        assert main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report) == 1
    doc = json.loads(report.read_text())
    attempts = [["vllm", "timeout_first_token"], ["hosted", "status_429"], ["spare", "Cooldown"]]
    assert all(c["attempts"] == attempts and c["status"] == 502 for c in doc["cases"]), doc["cases"][0]
    assert doc["overall"]["unanswered"] == 15 and doc["overall"]["fallbacks"] == 0


def test_other_servers_error_bodies_are_read_as_before():
    bodies = [({"error": {"message": "bad gateway"}}, "HTTP 502: bad gateway"),
              ({"error": {"message": "x", "failures": "not a list"}}, "HTTP 502: x"),
              ({"error": {"message": "x", "failures": [{"no": "provider"}, 3]}}, "HTTP 502: x"),
              ({"detail": "nope"}, "HTTP 502")]

    async def go(body, stream):
        async with FakeOpenAI(lambda _: Behavior.status(502, body=body)) as server:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, server.base_url, {"model": "m", "messages": [], "stream": stream},
                                             timeout_s=5)

    for body, shown in bodies:
        for stream in (False, True):
            got = asyncio.run(go(body, stream))
            assert got.status == 502 and got.error == shown and got.attempts is None, (body, got)
