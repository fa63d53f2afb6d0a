"""Relationship stages from accumulated affection and trust."""

from __future__ import annotations

import pytest

from hearth import prompts
from hearth.app.relationship import STAGES, standing


@pytest.mark.parametrize("affection,trust,stage", [
    (0, 0, "stranger"), (-5, -5, "stranger"), (3, 3, "acquaintance"), (14, 5, "acquaintance"),
    (14, 6, "friend"), (30, 10, "friend"), (27, 18, "close_friend"), (100, 17, "friend"), (40, 40, "close_friend"),
])
def test_stage_follows_the_totals_and_trust_gates_the_higher_stages(affection, trust, stage):
    assert standing(affection, trust).key == stage


def test_stages_exist_in_the_production_prompts_and_are_monotone():
    assert all(key in prompts.STAGES for key, *_ in STAGES)
    order = [key for key, *_ in STAGES]
    last = 0
    for a in range(-10, 60, 3):
        idx = order.index(standing(a, a).key)
        assert idx >= last
        last = idx
    assert standing(0, 0).next_at == 6 and standing(40, 40).next_at == 90 and standing(60, 40).next_at is None


def test_bad_types_are_refused():
    with pytest.raises(TypeError, match="affection"):
        standing("1", 0)
    with pytest.raises(TypeError, match="trust"):
        standing(0, True)
