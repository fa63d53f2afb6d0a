"""The app's rules that the fine-tune corpus must follow too: the relationship ladder, how long the texts a user
writes may be, and the default and bounds of the settings that shape a request.

A bottom-layer module (it imports nothing of hearth, nor anything outside the standard library), so both the app
(hearth.app.relationship, hearth.app.textlimits, hearth.app.common and hearth.app.settings take these names from
here) and the corpus builder (hearth.train.corpus) use the same numbers, and the builder refuses what the app refuses
and builds the requests the app sends, without loading the app (its database and crypto).

Relationship stages, from the affection and trust a companion has accumulated. Each chat reply carries
``affection`` and ``trust`` in [-2, 2]; the app adds them to the companion's running totals in the same transaction
that saves the turn. The stage is a pure function of the totals (nothing else is stored), so it can never disagree
with them:

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

Text limits: characters once cleaned (hearth.app.common.clean_text: stripped, CRLF as LF); the app refuses a longer
text (InputError naming the field). The forms' text boxes take their maxlength from here too (main._templates); the
message boxes take the settings' max_text_chars (main.create_app).
"""

from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------------------- the relationship ladder
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


# ------------------------------------------------------------------------------------------------ the text limits
MAX_NAME = 60  # a companion's name (companions.create_companion / update_companion)
MAX_PERSONA = 4000  # a custom persona
MAX_CONTEXT = 8000  # the context the user shares with their companions

MAX_AGENT_NAME = 60  # the name of the person a rehearsal plays (simulation.create_agent)
MAX_AGENT_FIELD = 2000  # their personality, backstory and relationship to the user
# every field of the rehearsed person, in the order the app asks for them, and its limit (each is required)
AGENT_FIELD_LIMITS: dict[str, int] = {"name": MAX_AGENT_NAME, "personality": MAX_AGENT_FIELD,
                                      "backstory": MAX_AGENT_FIELD, "relationship": MAX_AGENT_FIELD}

# what a form's free-text field (a message, a post, a situation) may hold once cleaned, whatever max_text_chars
# says; settings refuse a max_text_chars above it at start-up (texts over it met a 422 only when sent)
FORM_TEXT_MAX = 50000

# ------------------------------------------------------------------------------- the settings that shape a request
# the default of [app] max_text_chars: the longest chat message, feed post, situation or rehearsal line; a deployment
# may change the setting, and the app enforces the loaded value (the corpus builder's --max-text-chars)
DEFAULT_MAX_TEXT_CHARS = 4000
CHAT_CONTEXT_TURNS = 20  # [app] chat_context_turns' default: earlier turns a chat or a rehearsal sends back
PROMPT_MEMORIES = 30  # [app] prompt_memories' default: the companion's latest memories in its prompt

# hearth.app.settings.AppSettings' fields of these names: setting -> (default, least, most), both bounds allowed. The
# settings take their Field from here, and `hearth corpus build` checks its flags for them against the same bounds,
# so a corpus is built for a configuration the app can run.
SETTING_BOUNDS: dict[str, tuple[int, int, int]] = {
    "chat_context_turns": (CHAT_CONTEXT_TURNS, 1, 200),
    "prompt_memories": (PROMPT_MEMORIES, 0, 500),
    "max_text_chars": (DEFAULT_MAX_TEXT_CHARS, 10, FORM_TEXT_MAX),
}
