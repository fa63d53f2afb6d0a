"""scripts/attention_launch_model.py: the greedy model of a fused-backward launch behind BENCHMARKS.md's tail figures."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _model():
    return SimpleNamespace(**runpy.run_path(str(ROOT / "scripts" / "attention_launch_model.py"), run_name="launch_model"))


def test_programs_follow_the_grid_order():
    """One program per (pair, key block), groups of pairs with key blocks interleaved; causal steps GROUP x the
    64-query blocks from the diagonal on; key blocks past a short sequence's keys take none."""
    m = _model()
    steps = m.programs([256, 128], kv_heads=1, group=2, pairs_per_group=2)
    # key block 0 of both, then key block 1 of both (the 128-token sequence has none)
    assert steps == [2 * 4, 2 * 2, 2 * 2, 0]
    assert m.programs([256, 128], kv_heads=1, group=2, pairs_per_group=1) == [8, 4, 4, 0]
    assert m.programs([128, 256], kv_heads=1, group=2, pairs_per_group=2, longest_first=True) == [8, 4, 4, 0]
    assert len(m.programs([2048] * 8, kv_heads=4, group=5, pairs_per_group=8)) == 8 * 4 * 16


def test_efficiency_and_the_orders():
    """Equal programs filling the SMs evenly: no tail; the 1:3 packing in groups of 8 pairs: longest first scores
    above the packed order (the staged switch's premise); bad input is an error that names it."""
    m = _model()
    assert m.efficiency([10] * 264, sms=132, overhead=0) == pytest.approx(1.0)
    assert m.efficiency([10] * 133, sms=132, overhead=0) == pytest.approx(133 / 132 / 2)
    lens = [1024, 3072] * 4
    packed = m.efficiency(m.programs(lens, 4, 5, 8))
    longest = m.efficiency(m.programs(lens, 4, 5, 8, longest_first=True))
    assert 0 < packed < longest <= 1
    with pytest.raises(ValueError, match="lens"):
        m.programs([0, 10], 1, 1, 1)
    with pytest.raises(ValueError, match="sms"):
        m.efficiency([1], sms=0)
    assert m._lens("2048x2,512") == [2048, 2048, 512]
