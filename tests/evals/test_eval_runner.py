"""`hearth eval` against a real OpenAI-compatible server on loopback (tests/fakes/openai_server.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.envelope import AnalystReading, ChatReply, FeedComment, dumps, response_format
from hearth.evals.client import ChatResult
from hearth.evals.runner import main, run_cases, summarize
from hearth.evals.scoring import score
from hearth.evals.suites import SUITES, load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI


def valid_reply(kind: str, analyst: str = "mentor") -> str:
    if kind == "chat":
        return dumps(ChatReply(message="I'm here. Tell me the worst part first.", mood="steady", memories=[],
                               affection=0, trust=1, suggested_actions=["Say the worst part"]))
    if kind == "feed_comment":
        return dumps(FeedComment(comment="Look at that loaf.", tone="delighted"))
    return dumps(AnalystReading(analyst=analyst, reading="Owen named the hard topic himself.",
                                advice="Ask what worries him before you argue.", risk="low"))


def case_of(body: dict, cases) -> object:
    """Which case a request is for: the last user message is unique per case within a suite run."""
    user = body["messages"][-1]["content"]
    system = body["messages"][0]["content"]
    return next(c for c in cases if c.user == user and c.system_prompt() == system)


# One scripted outcome per position in the companion suite (15 cases): what the fake replies, and
# whether the case should pass. Wrapping that repair may strip passes; anything else fails.
def companion_script(kind: str):
    good = valid_reply(kind)
    return [
        (Behavior.reply(good), True, None),
        (Behavior.reply(f"```json\n{good}\n```"), True, None),
        (Behavior.reply(f"<think>\n\n</think>\n\n{good}"), True, None),
        (Behavior.reply(f"<think>The user sounds tired; be gentle.</think>\n{good}"), True, None),
        (Behavior.reply(f"Sure! Here's my reply:\n{good}\nLet me know!"), True, None),
        (Behavior.reply(good[:-25], finish_reason="length"), False, "truncated"),
        (Behavior.reply(good, finish_reason="length"), False, "truncated"),  # parses, but was cut: still fails
        (Behavior.reply("I am so sorry to hear that. Do you want to talk about it?"), False, "not valid JSON"),
        (Behavior.status(500), False, "HTTP 500"),
        (Behavior.reply(json.dumps({**json.loads(good), "message": "   "})), False, "message: must not be empty"),
        (Behavior.reply(json.dumps({**json.loads(good), "trust": "1"})), False, "trust"),
        (Behavior.reply(good + "\n" + good), False, "2 JSON objects"),
        (Behavior.reply("<think>I should reply with {\"message\": \"hi\"}"), False, "unterminated <think>"),
        # a chat case is streamed (main's default): a body that is no SSE fails as the gateway fails it (review76)
        (Behavior.raw(b"<html>bad gateway</html>", content_type="text/html"), False, "not as server-sent events"),
        (Behavior.reply(""), False, "empty reply"),
    ]


@pytest.fixture()
def companion_server():
    cases = load_suite("companion")
    script = companion_script("chat")
    assert len(script) == len(cases) == 15
    by_id = {c.id: s for c, s in zip(cases, script)}
    server = FakeOpenAI(lambda body: by_id[case_of(body, cases).id][0]).start_in_thread()
    try:
        yield server, cases, by_id
    finally:
        server.stop()


def test_each_reply_shape_is_scored(companion_server, tmp_path):
    server, cases, by_id = companion_server
    report = tmp_path / "report.json"
    code = main(suite="companion", base_url=server.base_url, model="fake-model", report=report, threshold=0.3,
                concurrency=4, timeout_s=10)
    doc = json.loads(report.read_text())
    results = {c["id"]: c for c in doc["cases"]}
    for case_id, (_, should_pass, reason) in by_id.items():
        got = results[case_id]
        assert got["passed"] is should_pass, (case_id, got)
        if reason:
            assert reason in got["reason"], (case_id, got["reason"])
    assert doc["suites"]["companion"]["passed"] == 5 and doc["suites"]["companion"]["total"] == 15
    assert doc["suites"]["companion"]["repaired"] == 4  # fence, two think blocks, chatter
    # counted by hand from the script: e.g. json passes for the 5 clean/wrapped replies, the parseable
    # truncated one, the blank message and the string-typed trust; not_truncated is unknown (None) when
    # no completion arrived (500, malformed body) and False for the two finish_reason=length replies
    assert doc["suites"]["companion"]["checks"] == {"response": 12, "json": 8, "schema": 7, "non_empty": 7,
                                                    "not_truncated": 11, "expected": 6}
    assert code == 0 and doc["ok"] is True  # 5/15 >= 0.3
    checks = {c["id"]: c["checks"] for c in doc["cases"]}
    truncated_but_parses = cases[6].id
    assert checks[truncated_but_parses] == {"response": True, "json": True, "schema": True, "non_empty": True,
                                            "not_truncated": False, "expected": True}
    empty_message = cases[9].id
    assert checks[empty_message]["schema"] is True and checks[empty_message]["non_empty"] is False
    wrong_type = cases[10].id
    assert checks[wrong_type]["schema"] is False and checks[wrong_type]["non_empty"] is True
    assert results[cases[8].id]["status"] == 500
    # every request carried the production prompt, no response_format unless asked
    assert all("response_format" not in r for r in server.requests)
    assert all(len(r["messages"][0]["content"]) > 6000 and r["max_tokens"] == 1024 for r in server.requests)


def test_exit_code_follows_threshold(companion_server, tmp_path):
    server, _, _ = companion_server
    assert main(suite="companion", base_url=server.base_url, model="m", threshold=0.34, timeout_s=10) == 1
    assert main(suite="companion", base_url=server.base_url, model="m", threshold=0.33, timeout_s=10) == 0


def test_cli_all_suites_with_schema_key_and_extra_body(tmp_path, monkeypatch):
    cases = {c.id: c for name in SUITES for c in load_suite(name)}

    def handler(body):
        case = case_of(body, cases.values())
        return Behavior.reply(valid_reply(case.kind, case.expect.get("analyst", "mentor")))

    monkeypatch.setenv("HEARTH_TEST_KEY", "sk-test-123")
    with FakeOpenAI(handler) as server:
        report = tmp_path / "all.json"
        result = CliRunner().invoke(app, [
            "eval", "all", "--base-url", server.base_url, "--model", "hearth-test", "--json-schema",
            "--api-key-env", "HEARTH_TEST_KEY", "--extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}',
            "--report", str(report), "--concurrency", "3"])
        assert result.exit_code == 0, result.output
        for name in ("companion 15/15", "feed 15/15", "analysts 15/15", "overall 45/45"):
            assert name in result.output
        assert len(server.requests) == 45
        for body, headers in zip(server.requests, server.headers):
            case = case_of(body, cases.values())
            assert body["response_format"] == response_format(case.kind)
            assert body["chat_template_kwargs"] == {"enable_thinking": False}
            # chat streamed by default (first token), as the app streams it; a feed comment or a reading in one piece,
            # as the app asks for them
            streamed = case.kind == "chat"
            assert body["model"] == "hearth-test" and body["stream"] is streamed
            assert body.get("stream_options") == ({"include_usage": True} if streamed else None)
            assert "temperature" not in body and "seed" not in body
            assert headers["Authorization"] == "Bearer sk-test-123"
    doc = json.loads(report.read_text())
    assert doc["overall"] == {**doc["overall"], "passed": 45, "total": 45, "fraction": 1.0}
    assert "sk-test-123" not in report.read_text()


def test_analyst_must_answer_as_itself():
    cases = load_suite("analysts")
    wrong = score(cases[1], ChatResult(valid_reply("analyst", "optimist"), "stop", 200, None, 0.1))
    assert cases[1].expect == {"analyst": "cynic"}
    assert not wrong.passed and wrong.checks["expected"] is False and "expected 'cynic'" in wrong.reason


def test_hang_times_out_and_concurrency_is_bounded():
    cases = load_suite("feed")[:6]
    in_flight = {"now": 0, "max": 0}

    async def handler(body):
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.05)
        in_flight["now"] -= 1
        if body["messages"][-1]["content"] == cases[0].user:
            return Behavior.hang()
        return Behavior.reply(valid_reply("feed_comment"))

    async def go():
        async with FakeOpenAI(handler) as server:
            return await run_cases(cases, base_url=server.base_url, model="m", concurrency=2, timeout_s=1.5)

    scores = asyncio.run(go())
    assert in_flight["max"] == 2
    assert not scores[0].passed and "timeout after 1.5s" in scores[0].reason and scores[0].status is None
    assert 1.5 <= scores[0].latency_s < 3.0
    assert all(s.passed for s in scores[1:])


def test_connection_refused_is_a_failure_not_a_crash():
    from tests.fakes.openai_server import free_port

    scores = asyncio.run(run_cases(load_suite("feed")[:2], base_url=f"http://127.0.0.1:{free_port()}/v1",
                                   model="m", timeout_s=2))
    assert [s.passed for s in scores] == [False, False]
    assert all(s.checks["response"] is False and s.status is None for s in scores)


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "poems", "--base-url", "http://127.0.0.1:1/v1", "--model", "m"], "suite"),
        (["eval", "feed", "--base-url", "127.0.0.1:1", "--model", "m"], "--base-url"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", " "], "--model"),  # was sent 45 times
        (["eval", "feed", "--base-url", "http://[::1/v1", "--model", "m"], "--base-url"),  # crashed: InvalidURL
        (["eval", "feed", "--base-url", "http:///v1", "--model", "m"], "--base-url"),  # every call failed instead
        (["eval", "feed", "--base-url", "http://127.0.0.1:99999/v1", "--model", "m"], "--base-url"),  # crashed
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--threshold", "1.5"], "--threshold"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body", "{x"], "--extra-body"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body", "[1]"], "--extra-body"),
        # was: the eval's own messages (or model, or streaming) silently replaced while the report named the flags
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body",
          '{"messages": [{"role": "user", "content": "hi"}]}'], "--extra-body"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body", '{"model": "x"}'],
         "--extra-body"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body", '{"stream": true}'],
         "--extra-body"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--api-key-env", "HEARTH_UNSET_VAR_X"],
         "HEARTH_UNSET_VAR_X"),
        # was: an empty value (an empty shell variable) silently dropped: the run went out without the key / body
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--api-key-env", ""], "--api-key-env"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--extra-body", ""], "--extra-body"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--concurrency", "0"], "concurrency"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--samples", "0"], "samples"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--temperature", "3"], "temperature"),
        # an infinite (or NaN) timeout is no timeout: a hung server would hang the run
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--timeout", "inf"], "timeout"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--timeout", "nan"], "timeout"),
        (["eval", "feed", "--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--max-tokens", "-3"], "max_tokens"),
    ],
)
def test_bad_arguments_exit_2(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_suites_are_fifteen_production_size_cases_each():
    for name in SUITES:
        cases = load_suite(name)
        assert len(cases) == 15 and len({c.id for c in cases}) == 15
        assert all(len(c.system_prompt()) > 5000 for c in cases)
        assert len({(c.system_prompt(), c.user) for c in cases}) == 15  # cases are distinguishable
    assert {c.expect["analyst"] for c in load_suite("analysts")} == {
        "optimist", "cynic", "mentor", "status_observer", "gossiper"}
    with pytest.raises(ValueError, match="name"):
        load_suite("poems")


def test_samples_temperature_seed_ttft_usage_and_interval(tmp_path):
    """3 samples of each chat case (streamed, as the app streams chat) at temperature 0.7 with seed 11: seeds 11,
    12, 13 sent and recorded; the reply to seed 12 is prose (fails), so each case passes 2 of 3; streamed replies
    report their first token time, non-streamed ones (feed, asked for in one piece) the server's usage; the overall
    rate has a Wilson and a by-case interval."""
    cases = load_suite("companion")[:4]

    def handler(body):
        if body["seed"] == 12:
            return Behavior.reply("Nice bread!")
        return Behavior.stream(_chunks(valid_reply("chat")), first_token_delay_s=0.15)

    with FakeOpenAI(handler) as server:
        scores = asyncio.run(run_cases(cases, base_url=server.base_url, model="m", samples=3, temperature=0.7,
                                       seed=11, stream=True, timeout_s=10))
        assert len(server.requests) == 12
        assert all(r["temperature"] == 0.7 and r["stream"] is True for r in server.requests)
        assert sorted(r["seed"] for r in server.requests) == [11] * 4 + [12] * 4 + [13] * 4
    assert [(s.id, s.sample, s.seed) for s in scores[:3]] == [(cases[0].id, 0, 11), (cases[0].id, 1, 12), (cases[0].id, 2, 13)]
    assert [s.passed for s in scores] == [True, False, True] * 4
    assert all(s.ttft_s >= 0.15 for s in scores if s.seed != 12) and all(s.latency_s >= s.ttft_s for s in scores)
    summary = summarize(scores)
    overall = summary["overall"]
    assert overall["passed"] == 8 and overall["total"] == 12 and overall["cases"] == 4
    low, high = overall["ci95"]
    assert 0.35 < low < 0.45 and 0.85 < high < 0.92  # Wilson at 8/12
    # every case passes 2 of 3: the cases score alike, so the samples count as independent replies (was [0.6667,
    # 0.6667]: a percentile bootstrap over identical cases has no width)
    assert overall["ci95_by_case"] == overall["ci95"]
    assert overall["ttft_s"]["p50"] >= 0.15

    # without streaming: no first-token time, the server's usage is summed
    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        report = tmp_path / "r.json"
        result = CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m", "--samples", "2",
                                          "--temperature", "0", "--seed", "5", "--no-stream", "--report", str(report)])
        assert result.exit_code == 0, result.output
        assert all(r["stream"] is False and r["temperature"] == 0 for r in server.requests)
    doc = json.loads(report.read_text())
    assert doc["samples"] == 2 and doc["temperature"] == 0 and doc["seed"] == 5 and doc["stream"] is False
    assert doc["overall"]["total"] == 30 and doc["overall"]["ttft_s"] == {}
    want = sum(max(1, len(valid_reply("feed_comment")) // 4) for _ in range(30))  # what the fake reports
    assert doc["overall"]["usage"]["completion_tokens"] == want and doc["overall"]["usage"]["replies_with_usage"] == 30
    assert {c["seed"] for c in doc["cases"]} == {5, 6}
    assert "95% CI" in result.output


def test_wilson_interval():
    from hearth.evals.runner import wilson

    assert wilson(0, 45)[0] == 0.0 and 0.07 < wilson(0, 45)[1] < 0.08
    assert wilson(45, 45)[1] == 1.0 and 0.92 < wilson(45, 45)[0] < 0.93
    low, high = wilson(30, 45)
    assert low < 30 / 45 < high and high - low > 0.25  # 45 single samples: a wide interval


def _chunks(text: str) -> list[str]:
    return [text[:5], text[5:20], text[20:]]


def test_server_text_is_printed_literally_not_as_markup(tmp_path, capsys):
    """Failure reasons carry text the server wrote; rich must not read it as markup (a stray closing tag
    raised MarkupError after every call had finished, and the report was never written)."""
    message = "bad role [/system] in [bold]messages[/bold]"
    with FakeOpenAI(lambda body: Behavior.status(400, body={"error": {"message": message}})) as server:
        report = tmp_path / "r.json"
        code = main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report)
    assert code == 1
    doc = json.loads(report.read_text())
    assert doc["overall"]["total"] == 15 and all(c["reason"] == f"HTTP 400: {message}" for c in doc["cases"])
    assert "[/system]" in capsys.readouterr().out.replace("\n", "")
    # the user's own words too: a suite or model name with brackets
    result = CliRunner().invoke(app, ["eval", "[/poems]", "--base-url", "http://127.0.0.1:1/v1", "--model", "m"])
    assert result.exit_code == 2 and "[/poems]" in result.output, result.output
    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        assert main(suite="feed", base_url=server.base_url, model="[/org]/model", timeout_s=5) == 0


def test_one_call_raising_unexpectedly_is_scored_and_the_rest_kept():
    """Whatever one call raises (here what anyio raises for a port out of range), the other cases' results
    stay and that case is a failure with the reason, instead of the exception ending the run."""
    import httpx

    cases = load_suite("feed")[:4]

    class OneBadCall(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request):
            if cases[2].user in request.content.decode():
                raise OverflowError("connect(): port must be 0-65535.")
            return await super().handle_async_request(request)

    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        scores = asyncio.run(run_cases(cases, base_url=server.base_url, model="m", timeout_s=5,
                                       transport=OneBadCall()))
    assert [s.passed for s in scores] == [True, True, False, True]
    assert scores[2].reason == "OverflowError: connect(): port must be 0-65535." and scores[2].status is None


@pytest.mark.parametrize("key", ["sk-ü-123", "sk-123\n", "sk 123", "sk-\x7f"])
def test_api_key_that_cannot_be_a_header_is_refused_at_start_up(key, monkeypatch):
    """Was: every call failed at request time (a newline), or the run died with "'ascii' codec can't
    encode" (a non-ASCII key) without naming the option. The key itself is never printed."""
    monkeypatch.setenv("HEARTH_TEST_BAD_KEY", key)
    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        result = CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m",
                                          "--api-key-env", "HEARTH_TEST_BAD_KEY"])
        assert server.requests == []
    assert result.exit_code == 2 and "--api-key-env" in result.output and "HEARTH_TEST_BAD_KEY" in result.output
    assert key.strip() not in result.output


def test_latency_p95_is_the_nearest_rank():
    """p95 of n values is the ceil(0.95 n)-th smallest; with 20 replies that is the 19th, not the slowest."""
    from hearth.evals.scoring import CaseScore

    def scores(n):
        return [CaseScore(suite="feed", id=f"feed-{i}", kind="feed_comment", passed=True, checks={}, reason=None,
                          latency_s=float(i), status=200, finish_reason="stop", repaired=False) for i in range(1, n + 1)]

    assert summarize(scores(20))["overall"]["latency_s"] == {"p50": 10.5, "p95": 19.0, "max": 20.0}
    assert summarize(scores(100))["overall"]["latency_s"]["p95"] == 95.0
    assert summarize(scores(45))["overall"]["latency_s"]["p95"] == 43.0
    assert summarize(scores(1))["overall"]["latency_s"]["p95"] == 1.0


def test_whitespace_around_a_clean_reply_is_not_a_repair():
    """`repaired` counts wrapping that had to be stripped (fences, think block, chatter); a newline after the
    object is not wrapping (json.loads takes it as is), so a clean reply must not count as repaired."""
    case = load_suite("feed")[0]
    good = valid_reply("feed_comment")
    for text, repaired in [(good, False), (good + "\n", False), ("\n  " + good + " \n\n", False),
                           (f"```json\n{good}\n```", True), (f"<think>\n\n</think>\n\n{good}", True)]:
        scored = score(case, ChatResult(text, "stop", 200, None, 0.1))
        assert scored.passed and scored.repaired is repaired, repr(text)


def test_malformed_case_file_names_the_file_and_line(tmp_path):
    """load_suite promises a ValueError naming the file and line of a malformed case, whatever is wrong."""
    ok = {"id": "c-1", "kind": "feed_comment", "persona": "wren", "world_view": "grounded", "context": "tama",
          "user": "Made bread."}
    chat = {"id": "c-2", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
            "user": "Hi again."}
    bad_lines = [
        "{not json",
        "[1, 2]",
        json.dumps({k: v for k, v in ok.items() if k != "id"}),
        json.dumps({k: v for k, v in ok.items() if k != "persona"}),
        json.dumps({**ok, "persona": 7}),
        json.dumps({**ok, "context": "nobody"}),
        json.dumps({**chat, "history": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}),
        json.dumps({**chat, "history": [{"role": "user", "content": "hi"}, {"role": "assistant", "envelope": {"message": ""}}]}),
        json.dumps({**chat, "history": [{"role": "user"}]}),
        json.dumps({**ok, "user": "  "}),
    ]
    for bad in bad_lines:
        path = tmp_path / "suite.jsonl"
        path.write_text(json.dumps(ok) + "\n\n" + bad + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"suite\.jsonl:3: "):
            load_suite("custom", path)
    path.write_text(json.dumps(ok) + "\n", encoding="utf-8")
    assert [c.id for c in load_suite("custom", path)] == ["c-1"]


def test_unwritable_report_path_is_refused_before_any_call(tmp_path):
    """Was: the run went through every call and only then died writing the report (a directory, or a path
    under a file), losing the report of a run that may have taken an hour."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with FakeOpenAI(lambda body: Behavior.reply(valid_reply("feed_comment"))) as server:
        for report in (tmp_path, a_file / "r.json"):
            result = CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m",
                                              "--report", str(report)])
            assert result.exit_code == 2 and "--report" in result.output, result.output
        assert server.requests == []
        report = tmp_path / "new" / "r.json"  # a missing folder is created, as before
        result = CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m",
                                          "--report", str(report)])
        assert result.exit_code == 0 and json.loads(report.read_text())["overall"]["total"] == 15
    assert [p.name for p in report.parent.iterdir()] == ["r.json"]


def test_report_keeps_a_reply_with_a_lone_surrogate(tmp_path):
    """A reply cut inside an emoji can arrive as a lone surrogate escape ("\\ud83d"); writing the report with it
    raised UnicodeEncodeError after every call had run, and the report was lost."""
    broken = '{"comment": "Look at that loaf \ud83d", "tone": "proud"}'
    with FakeOpenAI(lambda body: Behavior.reply(broken)) as server:
        report = tmp_path / "r.json"
        code = main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report, stream=False)
    assert code == 1
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert doc["overall"]["total"] == 15 and all(c["content"] == broken for c in doc["cases"])
    assert not any(c["passed"] for c in doc["cases"])


def test_a_history_reply_is_sent_as_the_app_sends_it_not_as_its_envelope():
    """The app sends earlier replies back as their message text; a case with history must too, or the eval scores a
    conversation production never sends (and an easier one: the model sees its own envelope format repeated)."""
    from hearth.evals.suites import load_suite

    case = next(c for c in load_suite("companion") if c.history)
    assistant = [t["content"] for t in case.history if t["role"] == "assistant"]
    assert assistant == ["Long days leave a mark. Which part of it is still sitting with you?"]


def test_report_has_no_credentials_from_the_base_url_and_no_temporary_left(tmp_path):
    """Was: user:password@ in --base-url went into the report as is (a report is meant to be shared), and the
    report went through a fixed '<name>.tmp' that two runs writing one report would share."""
    with FakeOpenAI(lambda body: Behavior.status(400, body={"error": {"message": "no"}})) as server:
        url = server.base_url.replace("http://", "http://alice:s3cret@", 1)
        report = tmp_path / "r.json"
        main(suite="feed", base_url=url, model="m", timeout_s=5, report=report)
    text = report.read_text()
    assert "s3cret" not in text and "alice" not in text
    assert json.loads(text)["base_url"] == server.base_url
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_extra_body_still_reaches_the_request():
    """The refusal covers only the eval's own keys; the rest (e.g. a chat template switch) is sent as given."""
    from hearth.evals.runner import request_body

    case = load_suite("feed")[0]
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "top_p": 0.9}
    body = request_body(case, model="m", json_schema=False, max_tokens=64, extra_body=extra)
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_p"] == 0.9
    assert body["messages"] == case.messages() and body["model"] == "m"
