"""Review 73 (train): the length percentiles `hearth corpus build` prints and writes to stats.json are the values
their names say.

Was: p95 was ``ordered[int(0.95 * n)]`` and p50 ``ordered[n // 2]``, one rank high wherever 0.95 n (or n / 2) is a
whole number: with 20 examples "p95" was the longest of them (the maximum, printed in the p95 column), with 100 the
96th; with 2 examples "p50" was the longer one. The eval's report (hearth.evals.runner.summarize) gives p50 as the
median and p95 by nearest rank (with 20 values the 19th), and the corpus's table now says the same.
"""

from __future__ import annotations

import json
import math
import statistics

from hearth.train.corpus import build


def _conversation(i: int) -> dict:
    # one feed exchange per line; each post one character longer than the last, so every example's length differs
    return {"id": f"post-{i:02d}", "kind": "feed_comment", "persona": "wren", "world_view": "grounded",
            "turns": [{"role": "user", "content": "I went for a walk today" + "!" * i},
                      {"role": "assistant", "envelope": {"comment": "That sounds lovely.", "tone": "warm"}}]}


def _build(tmp_path, n: int) -> tuple[dict, list[int]]:
    src = tmp_path / "conversations.jsonl"
    src.write_text("".join(json.dumps(_conversation(i)) + "\n" for i in range(n)), encoding="utf-8")
    stats = build(src, tmp_path / "out")
    lengths = sorted(len(json.loads(line)["text"])
                     for line in (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines())
    assert len(set(lengths)) == n  # distinct lengths: a rank off shows
    return json.loads((tmp_path / "out" / "stats.json").read_text(encoding="utf-8")), lengths


def test_p95_of_20_examples_is_the_19th_not_the_longest(tmp_path):
    stats, lengths = _build(tmp_path, 20)
    assert stats["length"]["max"] == lengths[-1]
    assert stats["length"]["p95"] == lengths[math.ceil(0.95 * 20) - 1] == lengths[18] != lengths[-1]


def test_p50_of_an_even_count_is_the_median_not_the_upper_middle(tmp_path):
    stats, lengths = _build(tmp_path, 2)
    assert stats["length"]["p50"] == statistics.median(lengths) < lengths[-1]
    assert stats["length"]["p95"] == lengths[-1]  # nearest rank: ceil(0.95 x 2) = the 2nd


def test_an_odd_count_keeps_its_middle_and_nearest_rank(tmp_path):
    stats, lengths = _build(tmp_path, 5)
    assert stats["length"]["p50"] == lengths[2]
    assert stats["length"]["p95"] == lengths[4]
