"""The by-case interval (ci95_by_case, printed as "resampling cases" with --samples above 1).

It was the 2.5th / 97.5th percentile of 2000 case resamples. A percentile bootstrap has nothing to resample
when every case scores the same, and too little near 0 and 1: 90/90 printed "95% CI 1.000-1.000", and two
identical samples per case (no more information than one) printed an interval narrower than the Wilson
interval of one sample per case (README's example: 0.822-0.978 where 45 single samples give 0.793-0.965).
"""

from __future__ import annotations

from hearth.evals.runner import summarize, wilson
from hearth.evals.scoring import CaseScore


def replies(outcomes: list[list[bool]]) -> list[CaseScore]:
    """One CaseScore per sample: outcomes[c][i] is whether sample i of case c passed."""
    return [CaseScore(suite="feed", id=f"feed-{c:02d}", kind="feed_comment", passed=ok, checks={}, reason=None,
                      latency_s=0.1, status=200, finish_reason="stop", repaired=False, sample=i)
            for c, samples in enumerate(outcomes) for i, ok in enumerate(samples)]


def test_every_reply_passing_is_not_a_zero_width_interval():
    """45 cases x 2 samples, all pass: the samples of a case may be one reply twice, so the honest interval is
    at most as narrow as 45 independent cases' (Wilson at 45/45), never [1, 1]."""
    overall = summarize(replies([[True, True]] * 45))["overall"]
    assert overall["ci95"] == wilson(90, 90)
    assert overall["ci95_by_case"] == wilson(45, 45) == [0.9213, 1.0]
    none = summarize(replies([[False, False]] * 45))["overall"]
    assert none["ci95_by_case"] == wilson(0, 45) == [0.0, 0.0787]


def test_identical_samples_give_the_interval_of_one_sample():
    """README's example: the fake server answers both samples of a case alike (its reply is chosen by a hash of
    the prompt), 4 of 45 cases fail: 82/90, with exactly the information of 41/45."""
    outcomes = [[False, False]] * 4 + [[True, True]] * 41
    overall = summarize(replies(outcomes))["overall"]
    assert (overall["passed"], overall["total"]) == (82, 90)
    assert overall["ci95_by_case"] == wilson(41, 45) == [0.7927, 0.9649]
    # one case failing both samples: the lower bound was 0.933 (a resample rarely holds 3 copies of it)
    overall = summarize(replies([[False, False]] + [[True, True]] * 44))["overall"]
    assert overall["ci95_by_case"] == wilson(44, 45)


def test_samples_that_vary_within_cases_narrow_the_interval_towards_wilson_over_replies():
    """Between the extremes: when the cases score alike the samples carry (up to) independent information,
    and the interval is never narrower than Wilson over all replies; when they split by case it is that of
    the cases."""
    even = summarize(replies([[True, False, True]] * 4))["overall"]  # every case 2 of 3
    assert even["ci95_by_case"] == even["ci95"] == wilson(8, 12)
    outcomes = [[True, False]] * 10 + [[True, True]] * 30 + [[False, False]] * 5
    mixed = summarize(replies(outcomes))["overall"]
    low, high = mixed["ci95_by_case"]
    wl, wh = mixed["ci95"]
    cl, ch = wilson(35, 45)  # as if each case were one reply that passed or failed
    assert cl <= low <= wl and wh <= high <= ch and (low, high) != (wl, wh)
    assert summarize(replies(outcomes)) == summarize(replies(outcomes))  # no randomness: same scores, same figures
