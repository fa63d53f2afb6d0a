"""Relationship stages, from the affection and trust a companion has accumulated.

Each chat reply carries ``affection`` and ``trust`` in [-2, 2]; the app adds them to the companion's
running totals in the same transaction that saves the turn. The stage is a pure function of the
totals (nothing else is stored), so it can never disagree with them:

    stage          needs (affection + trust)   and trust
    stranger       below 6                     -
    acquaintance   >= 6                        -
    friend         >= 20                       >= 6
    close_friend   >= 45                       >= 18
    confidant      >= 90                       >= 40

The stage keys are hearth.prompts.STAGES, all of them and in the same order (a test holds the two together), so
the companion prompt describes the same stage the UI shows, and every stage the corpus trains and the eval scores
is one production reaches. Trust gates the higher stages: warmth alone does not make someone a close friend, or a
confidant. The thresholds roughly double up the ladder: a reply moves the totals by 0 on an ordinary turn
(the prompt reserves 2 and -2 for turns that really change things), so a warm relationship gains well under a
point a turn, and confidant (about twice close_friend's score, trust near half of it) takes a few hundred
replies: weeks of daily talk, not an evening (docs/app.md).
"""

from __future__ import annotations

from dataclasses import dataclass

# (stage key, label shown in the UI, minimum affection + trust, minimum trust), lowest first
STAGES: tuple[tuple[str, str, int, int], ...] = (
    ("stranger", "stranger", -10**9, -10**9),
    ("acquaintance", "acquaintance", 6, -10**9),
    ("friend", "friend", 20, 6),
    ("close_friend", "close", 45, 18),
    ("confidant", "confidant", 90, 40),
)


@dataclass(frozen=True)
class Standing:
    key: str       # hearth.prompts.STAGES key
    label: str     # what the UI shows
    score: int     # affection + trust
    next_at: int | None  # score needed for the next stage (None at the top)


def standing(affection: int, trust: int) -> Standing:
    """The stage for these totals. TypeError for non-integers."""
    for name, value in (("affection", affection), ("trust", trust)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: expected int, got {type(value).__name__}")
    score = affection + trust
    reached = 0
    for i, (_, _, min_score, min_trust) in enumerate(STAGES):
        if score >= min_score and trust >= min_trust:
            reached = i
        else:
            break  # stages are cumulative: no skipping over a gate
    key, label, _, _ = STAGES[reached]
    next_at = STAGES[reached + 1][2] if reached + 1 < len(STAGES) else None
    return Standing(key=key, label=label, score=score, next_at=next_at)
