"""Review 73: a peer's rows measured on another setup than hearth's are drawn apart in the plots, named as not ranked.

plot_series split lines by input layout (review 50) but not by setup: a peer row merged from a run on another GPU,
software or timing procedure -- which verdict, the GEOMEAN line and ratios.png do not rank against hearth -- was drawn
on the same unmarked line as that peer's ranked rows, beside hearth's, so the plot compared what the pages refuse to.
"""

from __future__ import annotations


def test_a_peer_row_from_another_setup_is_its_own_line_named_as_not_ranked():
    """benchmarks/h200/models: softmax's quack rows were timed by the procedure before 2026-12-04's last change; the
    verdict says 'win 1.8x vs compile (not ranked: quack on another setup)' at Gemma-3 fwd, while the plot drew quack
    (1.07 ms against hearth's 1.20) on one unmarked line beside hearth as if ranked. It is drawn apart, named so."""
    from hearth.bench import plots

    def r(p, label, gpu="NVIDIA H200"):
        return {"provider": p, "size_label": label, "status": "ok", "value": 1.0, "work": 1.0, "env": {"gpu": gpu}}

    rows = [r("hearth", "a"), r("hearth", "b"), r("quack", "a"), r("quack", "b", gpu="NVIDIA H100"), r("compile", "b")]
    series = plots.plot_series(rows)
    assert sorted(series) == ["compile", "hearth", "quack", "quack (another setup: not ranked)"]
    assert [x["size_label"] for x in series["quack (another setup: not ranked)"]] == ["b"]
    assert [x["size_label"] for x in series["quack"]] == ["a"]
