"""Per-suite intervals with --samples above 1.

Was: each suite's block had only `ci95`, Wilson over replies, which counts the samples of one case as independent
replies; with every case answered alike it was as narrow as a run with that many distinct cases (15 cases x 4
identical samples: 0.943-1.0 instead of 15 cases' 0.796-1.0). The overall block had `ci95_by_case`; a suite's did not.
"""

from __future__ import annotations

from hearth.evals.runner import case_interval, summarize, wilson
from hearth.evals.scoring import CaseScore


def replies(suite: str, outcomes: list[list[bool]]) -> list[CaseScore]:
    return [CaseScore(suite=suite, id=f"{suite}-{c:02d}", kind="feed_comment", passed=ok, checks={}, reason=None,
                      latency_s=0.1, status=200, finish_reason="stop", repaired=False, sample=i)
            for c, samples in enumerate(outcomes) for i, ok in enumerate(samples)]


def test_each_suite_gets_the_by_case_interval_with_several_samples():
    feed = replies("feed", [[True] * 4] * 15)
    analysts = replies("analysts", [[False] * 4] * 3 + [[True] * 4] * 12)
    summary = summarize(feed + analysts)
    assert summary["suites"]["feed"]["ci95"] == wilson(60, 60)
    assert summary["suites"]["feed"]["ci95_by_case"] == wilson(15, 15)
    assert summary["suites"]["analysts"]["ci95_by_case"] == case_interval(analysts) == wilson(12, 15)
    assert summary["overall"]["ci95_by_case"] == wilson(27, 30)
    # one sample per case: nothing to add (as for the overall block)
    single = summarize(replies("feed", [[True]] * 15))
    assert "ci95_by_case" not in single["suites"]["feed"] and "ci95_by_case" not in single["overall"]
