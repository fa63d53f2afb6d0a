"""review76 (minors): the eval's client takes a model's answer exactly as hearth's gateway takes it.

Each answer is served by a real loopback server, once straight to the eval and once through the real gateway as the
app asks for it: the two verdicts must agree.

    * any 2xx status is an answer (gateway/providers.py Provider._open: ``200 <= status < 300``); the eval failed
      every status but 200.
    * an SSE line is read once stripped of ASCII whitespace (ChatStream.next_delta: ``line.strip()`` of its bytes,
      then ``line[5:].strip()``): the eval skipped a " data: ..." line the app reads, and stripped what str.strip
      strips (a no-break space, U+001C), reading lines the gateway refuses or skips.
    * a stream that stalls after its final chunk (the finish_reason) is a reply that ended there: the gateway takes
      it after its idle limit (first_token_s); the eval kept it too, but its latency ran on to the eval's timeout.
    * the summary's "cases" counts (suite, id) pairs: two suites with a case of the same id are two cases.
"""

from __future__ import annotations

import json

from hearth.evals.runner import summarize
from hearth.evals.scoring import CaseScore
from tests.evals.eval_vs_gateway import GOOD, SSE, agree, fake_model, verdicts as both
from tests.fakes.openai_server import Behavior, completion_json
from tests.test_review76_eval_stream_end import TIMEOUTS as IDLE_TIMEOUTS, verdicts as after_final_chunk


def _serve(model, answer: tuple[Behavior, bool]) -> bool:
    model.answer, streamed = answer
    return streamed


def verdicts(answers: dict[str, tuple[Behavior, bool]]) -> tuple[dict, dict]:
    """{name: (answer, streamed)} -> (the eval's row straight from the model, its row through the gateway)."""
    return both(fake_model(), answers, _serve)


def test_a_2xx_answer_other_than_200_is_scored_as_the_gateway_takes_it():
    answers = {}
    for code in (200, 201, 203, 299, 300):
        answers[f"{code} in one piece"] = (Behavior.raw(json.dumps(completion_json(GOOD, "m")), status=code), False)
        answers[f"{code} streamed"] = (Behavior.raw(SSE, content_type="text/event-stream", status=code), True)
    direct, gateway = verdicts(answers)
    agree(direct, gateway)
    assert {name for name in answers if direct[name].passed} == {name for name in answers if "300" not in name}
    assert {name: direct[name].status for name in answers} == {name: int(name[:3]) for name in answers}


def _framed(before: str, after: str) -> str:
    """SSE with every data line as ``before + "data: ..." + after``."""
    return "".join(before + line[:-1] + after + "\n" if line.startswith("data:") else line
                   for line in SSE.splitlines(True))


def test_an_sse_line_is_stripped_as_the_gateway_strips_it():
    frames = {"space before": (" ", ""), "tab before": ("\t", ""), "form feed before": ("\x0c", ""),
              "spaces after": ("", "  "), "no-break space before": ("\u00a0", ""),
              "no-break space after": ("", "\u00a0"), "U+001C before": ("\x1c", "")}
    answers = {name: (Behavior.raw(_framed(*frame), content_type="text/event-stream"), True)
               for name, frame in frames.items()}
    direct, gateway = verdicts(answers)
    agree(direct, gateway)
    assert {name for name in answers if direct[name].passed} == {
        "space before", "tab before", "form feed before", "spaces after"}


def test_a_stream_that_stalls_after_its_final_chunk_ends_its_latency_at_that_chunk():
    direct, gateway = (rows["stall"] for rows in after_final_chunk(("stall",)))
    assert direct.passed and gateway.passed, (direct.reason, gateway.reason)  # the app takes it, the eval too
    # the reply ended with its final chunk, sent at once: not at the eval's 3 s timeout, nor the gateway's 1 s wait
    assert direct.ttft_s <= direct.latency_s < IDLE_TIMEOUTS["first_token_s"], (direct.ttft_s, direct.latency_s)


def _score(suite: str, case: str, passed: bool) -> CaseScore:
    return CaseScore(suite=suite, id=case, kind="chat", passed=passed, checks={}, reason=None if passed else "no",
                     latency_s=0.1, status=200, finish_reason="stop", repaired=False)


def test_cases_are_counted_by_suite_and_id():
    # one reply to each of four cases, two ids shared by two suites: four cases, no samples to resample
    scores = [_score(suite, case, passed) for suite in ("companion", "custom")
              for case, passed in (("case-01", True), ("case-02", False))]
    summary = summarize(scores)
    assert summary["overall"]["cases"] == 4 and summary["overall"]["total"] == 4, summary["overall"]
    assert "ci95_by_case" not in summary["overall"], summary["overall"]
    assert {name: block["cases"] for name, block in summary["suites"].items()} == {"companion": 2, "custom": 2}
