"""review51d: the 95% intervals at small n, against values worked by hand.

The Wilson bounds are the roots in pi of (p - pi)^2 = z^2 pi (1 - pi) / n, z = 1.959964: for 1/2,
(1 + z^2/2) pi^2 - (1 + z^2/2) pi + 1/4 = 0, so pi = 1/2 -+ sqrt(1/4 - 1/(4 (1 + z^2/2))) = 0.0945, 0.9055.
The others below were solved the same way (the quadratic, not runner.wilson's centre-and-half-width form).
"""

from __future__ import annotations

import pytest

from hearth.evals.runner import case_interval, wilson
from hearth.evals.scoring import CaseScore


@pytest.mark.parametrize("passed, total, expected", [
    (0, 1, [0.0, 0.7935]), (1, 1, [0.2065, 1.0]), (1, 2, [0.0945, 0.9055]), (2, 3, [0.2077, 0.9385]),
    (1, 3, [0.0615, 0.7923]), (3, 4, [0.3006, 0.9544]), (0, 5, [0.0, 0.4345]), (4, 5, [0.3755, 0.9638]),
    (0, 0, [0.0, 1.0]),
])
def test_wilson_at_small_n_is_the_hand_computed_interval(passed, total, expected):
    assert wilson(passed, total) == expected


def rows(outcomes: list[list[bool]]) -> list[CaseScore]:
    return [CaseScore(suite="s", id=f"c{i}", kind="chat", passed=ok, checks={}, reason=None, latency_s=0.0,
                      status=200, finish_reason="stop", repaired=False, sample=j)
            for i, case in enumerate(outcomes) for j, ok in enumerate(case)]


@pytest.mark.parametrize("outcomes, expected", [
    # samples of each case alike: worth the 3 cases (variance 2.667/36 = p(1-p)/3), Wilson at 2/3
    ([[True, True], [True, True], [False, False]], [0.2077, 0.9385]),
    # 2/2 and 1/2: variance 0.5/16, p(1-p)/variance = 6, capped at the 4 replies: Wilson at 3/4
    ([[True, True], [True, False]], [0.3006, 0.9544]),
    # 2/2 and 0/2: variance 2/16 = p(1-p)/2: the 2 cases, Wilson at 1/2
    ([[True, True], [False, False]], [0.0945, 0.9055]),
])
def test_the_by_case_interval_at_small_n_is_the_hand_computed_one(outcomes, expected):
    assert case_interval(rows(outcomes)) == expected
