"""--extra-body against the eval's own options: a key that one of them sets is refused at start-up, naming the
option and the key, so the report's option fields are what the requests carried; every reply records the
parameters its request was sent with.

Was: --extra-body was merged into each request last, so '{"temperature": 0.7}' with --temperature 0 sent 0.7
while the report said 0, '{"seed": 5}' gave every sample seed 5 while the report said "sample i: --seed + i",
'{"max_completion_tokens": 4096}' replaced --max-tokens on vLLM (which prefers it), and '{"n": 3}' had three
replies joined into one streamed text.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.envelope import FeedComment, dumps, response_format
from hearth.evals.runner import request_body, run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI

GOOD = dumps(FeedComment(comment="Look at that loaf.", tone="proud"))


def run_cli(server, *args: str):
    return CliRunner().invoke(app, ["eval", "feed", "--base-url", server.base_url, "--model", "m", "--timeout", "5",
                                    *args])


@pytest.mark.parametrize(
    "extra, flags, named",
    [
        ('{"temperature": 0.7}', ["--temperature", "0"], "--temperature"),
        ('{"temperature": 0.7}', [], "--temperature"),  # the report would say temperature null (server default)
        ('{"seed": 5}', ["--seed", "1", "--samples", "2"], "--seed"),
        ('{"seed": 5}', [], "--seed"),
        ('{"max_tokens": 4096}', [], "--max-tokens"),  # the default --max-tokens 1024 was replaced
        ('{"max_tokens": 4096}', ["--max-tokens", "0"], "--max-tokens"),
        ('{"max_completion_tokens": 4096}', [], "--max-tokens"),  # vLLM and SGLang use it over max_tokens
        ('{"n_predict": 4096}', ["--max-tokens", "64"], "--max-tokens"),  # llama.cpp's name, read over max_tokens
        ('{"n": 3}', [], "--samples"),  # three replies to one request, streamed into one text
        ('{"response_format": {"type": "json_object"}}', ["--json-schema"], "--json-schema"),
        # hearth's gateway reads the kind from the body before the X-Hearth-Kind header: one kind for every case
        ('{"hearth_kind": "chat"}', [], "kind"),
    ],
)
def test_a_key_an_option_sets_is_refused_at_start_naming_both(extra, flags, named):
    with FakeOpenAI(lambda body: Behavior.reply(GOOD)) as server:
        result = run_cli(server, "--extra-body", extra, *flags)
        assert server.requests == [], "nothing may be sent"
    key = next(iter(json.loads(extra)))
    assert result.exit_code == 2, result.output
    assert "--extra-body" in result.output and named in result.output and key in result.output, result.output


def test_nan_in_extra_body_is_refused_at_start():
    """json.loads reads NaN and Infinity, but httpx refuses to send them: every call failed with a ValueError and
    the run reported 0/15 instead of naming the option."""
    with FakeOpenAI(lambda body: Behavior.reply(GOOD)) as server:
        for extra in ('{"top_p": NaN}', '{"logit_bias": {"1": -Infinity}}'):
            result = run_cli(server, "--extra-body", extra)
            assert result.exit_code == 2 and "--extra-body" in result.output and "NaN" in result.output, result.output
        assert server.requests == []


def test_run_cases_refuses_the_same_keys_and_the_eval_keys_win_in_request_body():
    """The library entry point checks too (it raised nothing and sent the override), and request_body puts the
    eval's own keys last, so no path sends an extra_body value over an option's."""
    cases = load_suite("feed")[:1]
    with pytest.raises(ValueError, match="--temperature"):
        asyncio.run(run_cases(cases, base_url="http://127.0.0.1:1/v1", model="m", temperature=0.0,
                              extra_body={"temperature": 0.7}))
    body = request_body(cases[0], model="m", json_schema=True, max_tokens=64, temperature=0.0, seed=3,
                        extra_body={"temperature": 0.7, "seed": 9, "max_tokens": 4096, "model": "x",
                                    "response_format": {"type": "json_object"}, "top_p": 0.9})
    assert (body["temperature"], body["seed"], body["max_tokens"], body["model"]) == (0.0, 3, 64, "m")
    assert body["response_format"] == response_format("feed_comment") and body["top_p"] == 0.9


def test_each_row_records_the_parameters_its_request_was_sent_with(tmp_path):
    """The report's rows carry `request`: the body as sent, less the messages, the eval's response_format by its
    schema name. What the options do not set (max_completion_tokens once --max-tokens 0 sends no max_tokens, a
    response_format of the user's own without --json-schema) goes through and is recorded."""
    report = tmp_path / "r.json"
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "top_p": 0.8}
    with FakeOpenAI(lambda body: Behavior.reply(GOOD)) as server:
        result = run_cli(server, "--extra-body", json.dumps(extra), "--temperature", "0.7", "--seed", "4",
                         "--samples", "2", "--json-schema", "--no-stream", "--report", str(report))
        assert result.exit_code == 0, result.output
        sent = sorted((json.dumps({k: v for k, v in r.items() if k not in ("messages", "response_format")},
                                  sort_keys=True) for r in server.requests))
    doc = json.loads(report.read_text())
    rows = doc["cases"]
    assert len(rows) == 30
    for row in rows:
        assert row["request"] == {"model": "m", "stream": False, "max_tokens": 1024, "temperature": 0.7,
                                  "seed": 4 + row["sample"], **extra,
                                  "response_format": {"type": "json_schema", "name": "hearth_feed_comment"}}
    assert sorted(json.dumps({k: v for k, v in r["request"].items() if k != "response_format"}, sort_keys=True)
                  for r in rows) == sent

    with FakeOpenAI(lambda body: Behavior.reply(GOOD)) as server:
        result = run_cli(server, "--max-tokens", "0", "--extra-body",
                         '{"max_completion_tokens": 512, "response_format": {"type": "json_object"}}',
                         "--report", str(report))
        assert result.exit_code == 0, result.output
        assert all(r["max_completion_tokens"] == 512 and "max_tokens" not in r for r in server.requests)
    rows = json.loads(report.read_text())["cases"]
    # a feed comment is asked for in one piece, as the app asks for it: no stream_options
    assert all(r["request"] == {"model": "m", "stream": False,
                                "max_completion_tokens": 512, "response_format": {"type": "json_object"}}
               for r in rows)
