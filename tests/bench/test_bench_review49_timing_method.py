"""Review 49: a peer row measured with another timing procedure is not ranked against hearth.

The harness changed how it times twice on 2026-12-04: the wall time became the median of 5 blocks (e3baf84, one
block's mean before, which a single host stall raises) and the device sleep ahead of a timed call became at
least one whole call (1b662d2: under a shorter sleep a compute-bound call ran at a duty cycle that let the power
limit lower the SM clock, p80 up to 20% over p20 in the commit's matmul probe). --merge keeps a peer's row from an
earlier run while hearth is rerun, so the committed swiglu_mlp cases compared hearth's 15:56 rows (sleep >= one
call, 5 blocks) with Liger's of 08:46 (sleep by host time, 1 block): Liger's one-block wall was 'the best peer
wall' of all three cases (GEOMEAN swiglu_mlp 'wall/call 0.889x worst 0.862x ... vs liger'). SETUP_KEYS held GPU,
driver, torch and triton only.
"""

from __future__ import annotations

import pytest
import torch

from hearth.bench import report, runner, timing


def _row(p, ms, date, wall=None, **env):
    return {"provider": p, "ms": ms, "p20_ms": ms, "p80_ms": ms, "status": "ok", "op": "swiglu_mlp", "size_label": "Qwen3-4B",
            "dtype": "bfloat16", "mode": "full", "wall_ms": wall, "extra_mib": 1.0,
            "env": {"gpu": "NVIDIA H200", "driver": "580", "torch": "2.11", "triton": "3.6", "date": date, **env}}


def test_peer_timed_by_an_earlier_procedure_is_not_ranked_nor_the_wall_peer():
    # swiglu_mlp Qwen3-4B's committed dates: hearth and compile from the 15:56 run, liger merged from the 08:46 one
    # (its time lowered here below compile's so that ranking it would change the verdict)
    case = [_row("hearth", 7.829, "2026-12-04T15:56:21Z", wall=8.6), _row("compile", 7.232, "2026-12-04T15:56:21Z", wall=8.0),
            _row("liger", 7.0, "2026-12-04T08:46:10Z", wall=7.5)]
    v = report.verdict(case)
    assert v["peer"] == "compile" and v["ratio"] == pytest.approx(7.232 / 7.829)
    assert "liger on another setup" in v["text"]
    g = report.op_geomeans(case)["swiglu_mlp"]
    assert [(p, r) for r, _, p in g["walls"]] == [("compile", pytest.approx(8.0 / 8.6))]


def test_runs_of_one_procedure_still_compare():
    # softmax's committed quack rows (09:01) and hearth's (14:06): both 5 wall blocks, sleep by host time
    case = [_row("hearth", 1.205, "2026-12-04T14:06:08Z"), _row("quack", 1.074, "2026-12-04T09:01:33Z")]
    assert report.verdict(case)["peer"] == "quack"
    # rows of 12-02 (fixed 1 ms sleep) compare with each other, as the committed rope cases do
    assert report.verdict([_row("hearth", 0.2, "2026-12-02T00:54:20Z"), _row("compile", 0.21, "2026-12-02T00:54:20Z")])["peer"] \
        == "compile"
    # a row that names its procedure is judged by it, whatever its date
    named = [_row("hearth", 1.0, "2026-12-05T00:00:00Z", timing=timing.TIMING_METHOD),
             _row("compile", 0.9, "2026-12-05T01:00:00Z", timing="another"), _row("liger", 1.1, "2026-12-04T20:00:00Z")]
    v = report.verdict(named)
    assert v["peer"] == "liger" and "compile on another setup" in v["text"]


def test_rows_carry_the_timing_procedure():
    env = runner.env_info(torch.device("cpu"))
    assert env["timing"] == timing.TIMING_METHOD
    now = {"provider": "hearth", "env": env}
    assert report.timing_method(now) == report.timing_method({"env": {"date": "2026-12-04T19:03:24Z"}})
