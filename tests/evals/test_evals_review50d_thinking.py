"""Thinking left on (Qwen3's default): the model spends its token budget in a <think> block and the envelope is
cut off. Was: a non-empty think block showed only inside `repaired` (when the reply still parsed) or as an
"unterminated <think> block" / "empty reply" failure, with nothing that named the cause; a reasoning field
(vLLM's reasoning parser: message.reasoning_content / reasoning, and their stream deltas) was not read at all.
Now every reply that carried a non-empty think block is counted (per suite and overall), a truncated one says so
in its reason, and the console ends with a warning naming the fix."""

from __future__ import annotations

import asyncio
import json
from io import StringIO

import httpx
from rich.console import Console

from hearth.envelope import FeedComment, dumps
from hearth.evals.client import ChatResult, chat_completion
from hearth.evals.runner import _print, main, summarize
from hearth.evals.scoring import score
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI

GOOD = dumps(FeedComment(comment="Look at that loaf.", tone="proud"))
CASE = load_suite("feed")[0]
FIX = """--extra-body '{"chat_template_kwargs": {"enable_thinking": false}}'"""


def result(content: str, finish: str | None = "stop", reasoning: str | None = None) -> ChatResult:
    return ChatResult(content, finish, 200, None, 0.1, reasoning=reasoning)


def test_a_non_empty_think_block_is_counted_an_empty_one_is_not():
    thought = score(CASE, result(f"<think>\nThe user baked bread. Be warm.\n</think>\n\n{GOOD}"))
    assert thought.passed and thought.repaired and thought.thinking is True
    empty = score(CASE, result(f"<think>\n\n</think>\n\n{GOOD}"))  # Qwen3 with enable_thinking false
    assert empty.passed and empty.thinking is False
    assert score(CASE, result(GOOD)).thinking is False
    # a template that opens <think> in the prompt: the reply carries only the reasoning and </think>
    opened = score(CASE, result(f"The user baked bread.\n</think>\n\n{GOOD}"))
    assert opened.thinking is True
    # vLLM's reasoning parser moves the block into a field of its own
    assert score(CASE, result(GOOD, reasoning="The user baked bread.")).thinking is True
    assert score(CASE, result(GOOD, reasoning="  \n")).thinking is False
    assert score(CASE, ChatResult("", None, 500, "HTTP 500", 0.1)).thinking is False
    assert thought.to_json()["thinking"] is True


def test_a_reply_whose_envelope_mentions_the_closing_tag_is_not_counted_as_thinking():
    """"</think>" inside the envelope's text (a message quoting it) was read as a think block closed with no opening
    tag: the reply counted as thinking, and cut off by the token limit its reason blamed a think block."""
    quoting = dumps(FeedComment(comment="You typed </think> at the end, a tag of mine.", tone="proud"))
    assert score(CASE, result(quoting)).thinking is False
    assert score(CASE, result(f"```json\n{quoting}\n```")).thinking is False
    cut = score(CASE, result(quoting[:40], finish="length"))
    assert cut.thinking is False and "think" not in cut.reason, cut.reason


def test_a_truncated_reply_with_a_think_block_says_so_in_its_reason():
    inside = score(CASE, result("<think>\nThe user baked bread. Let me consider every angle" * 40, "length"))
    assert not inside.passed and inside.thinking
    assert inside.reason.startswith("truncated (finish_reason=length) inside a <think> block"), inside.reason
    assert "thinking is on" in inside.reason
    after = score(CASE, result(f"<think>\nThe user baked bread.\n</think>\n\n{GOOD[:20]}", "length"))
    assert after.reason.startswith("truncated (finish_reason=length) after a <think> block"), after.reason
    # reasoning field, no content at all: the cause is the thinking, not an "empty reply"
    field = score(CASE, result("", "length", reasoning="The user baked bread. " * 50))
    assert field.reason.startswith("truncated (finish_reason=length) inside a <think> block"), field.reason
    # no think block: the reason is as it was
    plain = score(CASE, result(GOOD[:20], "length"))
    assert plain.reason == "truncated (finish_reason=length)" and plain.thinking is False


def test_the_client_reads_a_reasoning_field_streamed_and_not():
    msg = {"role": "assistant", "content": GOOD, "reasoning_content": "Warm, short."}
    whole = Behavior.raw(json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}))
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": "Warm, "}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"reasoning": "short."}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"content": GOOD}, "finish_reason": "stop"}]}]
    streamed = Behavior.raw("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n",
                            content_type="text/event-stream")

    async def go(behavior, stream):
        async with FakeOpenAI(lambda body: behavior) as server:
            async with httpx.AsyncClient(trust_env=False) as client:
                return await chat_completion(client, server.base_url, {"model": "m", "messages": [], "stream": stream},
                                             timeout_s=5)

    for behavior, stream in ((whole, False), (streamed, True)):
        got = asyncio.run(go(behavior, stream))
        assert got.error is None and got.content == GOOD and got.reasoning == "Warm, short.", (stream, got)
        assert got.ttft_s is None or stream  # reasoning is not the first content token
    plain = asyncio.run(go(Behavior.reply(GOOD), True))
    assert plain.reasoning is None


def test_summary_counts_thinking_per_suite_and_overall_and_the_console_warns():
    feed, analysts = load_suite("feed")[:3], load_suite("analysts")[:2]
    scores = [score(feed[0], result(f"<think>Warm.</think>{GOOD}")),
              score(feed[1], result("<think>Warm, but" * 10, "length")),
              score(feed[2], result(GOOD))] + [score(c, result("", "length", reasoning="Hmm.")) for c in analysts]
    for c, s in zip(feed + analysts, scores):
        s.suite = c.suite
    summary = summarize(scores)
    assert summary["suites"]["feed"]["thinking"] == 2 and summary["suites"]["feed"]["thinking_truncated"] == 1
    assert summary["suites"]["analysts"]["thinking"] == 2 and summary["suites"]["analysts"]["thinking_truncated"] == 2
    assert summary["overall"]["thinking"] == 4 and summary["overall"]["thinking_truncated"] == 3
    out = StringIO()
    _print(Console(file=out, width=300), summary, scores, 1.0)
    text = out.getvalue()
    last = text.strip().splitlines()[-3:]
    assert any("4 of 5 replies carried a non-empty <think> block" in line for line in last), text
    assert "3 of them were cut off" in text and FIX in text
    clean = [score(feed[2], result(GOOD))]
    out = StringIO()
    _print(Console(file=out, width=300), summarize(clean), clean, 1.0)
    assert "think" not in out.getvalue() and summarize(clean)["overall"]["thinking"] == 0


def test_report_and_console_of_a_run_with_thinking_on(tmp_path, capsys):
    def handler(body):
        if "Owen" in body["messages"][-1]["content"] or len(body["messages"][-1]["content"]) % 2:
            return Behavior.reply("<think>\nLet me think about the post. " * 30, finish_reason="length")
        return Behavior.reply(f"<think>\nShort thought.\n</think>\n\n{GOOD}")

    report = tmp_path / "r.json"
    with FakeOpenAI(handler) as server:
        main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report)
    doc = json.loads(report.read_text())
    assert doc["overall"]["thinking"] == 15 == doc["suites"]["feed"]["thinking"]
    cut = [c for c in doc["cases"] if c["finish_reason"] == "length"]
    assert cut and doc["overall"]["thinking_truncated"] == len(cut)
    assert all(c["thinking"] and "inside a <think> block" in c["reason"] for c in cut)
    out = capsys.readouterr().out
    assert "15 of 15 replies carried a non-empty <think> block" in " ".join(out.split())
    assert FIX in " ".join(out.split())


def test_a_report_stays_strict_json_when_a_server_sends_nan_in_its_usage(tmp_path):
    """Python's JSON reader takes NaN / Infinity from a server's usage, and the report was written with them as bare
    NaN / Infinity tokens, which strict JSON readers (jq, JavaScript's JSON.parse) refuse. Now they are null."""
    usage = {"prompt_tokens": float("nan"), "completion_tokens": float("inf"), "total_tokens": 3}
    report = tmp_path / "r.json"
    with FakeOpenAI(lambda body: Behavior.reply(GOOD, usage=usage)) as server:
        main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report)

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    doc = json.loads(report.read_text(), parse_constant=refuse)
    assert doc["cases"] and all(c["usage"] == {"prompt_tokens": None, "completion_tokens": None, "total_tokens": 3}
                                for c in doc["cases"]), doc["cases"][0]["usage"]
