"""The printed summary and the usage figures survive what a server may send: a lone surrogate escape in an
error message, and token counts that are not numbers. Both crashed the run after every call had finished,
before the report was written."""

from __future__ import annotations

import json

from hearth.envelope import FeedComment, dumps
from hearth.evals.runner import main
from tests.fakes.openai_server import Behavior, FakeOpenAI

GOOD = dumps(FeedComment(comment="Look at that loaf.", tone="proud"))


def test_error_text_with_a_lone_surrogate_is_printed_escaped_and_the_report_written(tmp_path, capsys):
    """'\\ud800' is valid JSON and decodes to a str that stdout (UTF-8) cannot encode: printing the failures
    table raised UnicodeEncodeError and the report was lost. Over HTTP and mid-stream."""
    http = Behavior.status(400, body=b'{"error": {"message": "bad \\ud800 byte"}}')
    event = Behavior.raw('data: {"error": {"message": "engine \\udcff died"}}\n\ndata: [DONE]\n\n',
                         content_type="text/event-stream")
    # the streamed variant on the companion suite: only chat is streamed (as the app streams it)
    for behavior, stream, suite, reason in [(http, False, "feed", "HTTP 400: bad \ud800 byte"),
                                            (event, True, "companion", "error in stream: engine \udcff died")]:
        report = tmp_path / f"r-{stream}.json"
        with FakeOpenAI(lambda body: behavior) as server:
            code = main(suite=suite, base_url=server.base_url, model="m", timeout_s=5, report=report, stream=stream)
        assert code == 1
        doc = json.loads(report.read_text(encoding="utf-8"))
        assert doc["overall"]["total"] == 15 and all(c["reason"] == reason for c in doc["cases"])
        out = capsys.readouterr().out
        # the escape, where the character was (up to it: the table may wrap the rest of a long reason)
        escaped = reason.encode("utf-8", "backslashreplace").decode()
        assert escaped[:escaped.index("\\u") + 6] in out


def test_usage_that_is_not_a_count_is_left_out_not_a_crash(tmp_path):
    """usage {"prompt_tokens": "n/a"} (a proxy) raised ValueError in summarize; {"completion_tokens": {...}}
    TypeError. A count that is not a non-negative integer is left out of the sums, and the mean completion
    tokens per reply is over the replies that reported completion tokens."""
    usages = iter([{"prompt_tokens": "n/a", "completion_tokens": 7}, {"prompt_tokens": 5, "completion_tokens": {"x": 1}},
                   {"prompt_tokens": 5}, {"prompt_tokens": 5, "completion_tokens": 9}, {"completion_tokens": True}]
                  + [{"prompt_tokens": 5, "completion_tokens": 8}] * 10)

    def handler(body):
        usage = next(usages)
        return Behavior.raw(json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": GOOD},
                                                     "finish_reason": "stop"}], "usage": usage}))

    report = tmp_path / "r.json"
    with FakeOpenAI(handler) as server:
        code = main(suite="feed", base_url=server.base_url, model="m", timeout_s=5, report=report, stream=False,
                    concurrency=1)
    assert code == 0
    usage = json.loads(report.read_text())["overall"]["usage"]
    # prompt: 5 x 3 + 5 x 10; completion: 7 + 9 + 8 x 10 over the 12 replies that reported a count
    assert usage["prompt_tokens"] == 65 and usage["completion_tokens"] == 96
    assert usage["completion_tokens_mean"] == 8.0
