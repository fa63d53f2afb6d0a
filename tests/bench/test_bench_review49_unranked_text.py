"""Review 49: a case whose every fused peer is unranked (wrong, failed, or from another setup) names them.

The model-shape suite runs without eager, so when every fused peer of a case is wrong the verdict had no fallback and
said 'no peer ran' (peers did run: they were wrong), and the GEOMEAN line counted the case as '1 without a fused peer'
without naming them; a wrong or failed peer row is never ranked and never silently dropped.
"""

from __future__ import annotations

from hearth.bench import report


def _row(p, ms, status="ok"):
    return {"provider": p, "ms": ms, "p20_ms": ms, "p80_ms": ms, "status": status, "op": "softmax", "size_label": "s",
            "dtype": "bfloat16", "mode": "fwd"}


def test_every_fused_peer_wrong_is_named_in_the_verdict_and_the_geomean_line():
    case = [_row("hearth", 1.0), _row("compile", 0.0, status="wrong"), _row("quack", 0.0, status="error")]
    v = report.verdict(case)
    assert v["verdict"] == "none" and v["peer"] is None
    assert v["text"] == "no peer ran correctly (not ranked: compile wrong, quack error)"
    assert report.geomean_lines(case)[0].endswith("1 without a fused peer: compile wrong, quack error)")
    ranked = [{**r, "size_label": "t"} for r in (_row("hearth", 0.5), _row("compile", 0.6))]
    line = report.geomean_lines(case + ranked)[0]
    assert "1 of 2 cases ranked, 1 without a fused peer (compile wrong, quack error)" in line


def test_no_fused_peer_at_all_still_reads_no_peer_ran():
    assert report.verdict([_row("hearth", 1.0)])["text"] == "no peer ran"
