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
from typing import Mapping, Sequence

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
# [app] max_prompt_chars' default: the most characters a chat or rehearsal request carries (every message's text:
# the system prompt, the earlier turns, the new message); fit_history drops the oldest earlier exchanges to stay
# within it. Why 32,000: the fine-tune trains at seq_len 8192 tokens, which docs/training.md gives as the length that
# holds the app's full-size prompts, and the eval scores it at up to 23.7k characters (companion-14). Take from the
# 8192 tokens the reply's room, 1,024 tokens (the eval's --max-tokens; the longest chat envelope, a 2,000-character
# message with 5 memories and 3 actions, is about 4k characters): 7,168 tokens of prompt, at the 4.5 characters a
# token that docs/training.md measured on companion-14 (a lower bound on the token count: an estimate, no Qwen
# tokenizer is available offline), is 32,256 characters; rounded down, 32,000. It also holds what the app must
# always be able to send whole (hearth.app.settings checks it at start-up): its largest system prompt at the
# defaults (a rehearsal with every field of the person, the shared context and 30 memories at their caps: 27.2k
# characters) and one max_text_chars = 4,000 message. A deployment that serves a shorter context, or raises
# prompt_memories / max_text_chars, sets max_prompt_chars to match.
MAX_PROMPT_CHARS = 32000

# hearth.app.settings.AppSettings' fields of these names: setting -> (default, least, most), both bounds allowed. The
# settings take their Field from here, and `hearth corpus build` checks its flags for them against the same bounds,
# so a corpus is built for a configuration the app can run.
SETTING_BOUNDS: dict[str, tuple[int, int, int]] = {
    "chat_context_turns": (CHAT_CONTEXT_TURNS, 1, 200),
    "prompt_memories": (PROMPT_MEMORIES, 0, 500),
    "max_text_chars": (DEFAULT_MAX_TEXT_CHARS, 10, FORM_TEXT_MAX),
    "max_prompt_chars": (MAX_PROMPT_CHARS, 1000, 10**7),
}


# ------------------------------------------------------------------------------------------------ the prompt budget
def prompt_chars(messages: Sequence[Mapping[str, str]]) -> int:
    """The size of a request as max_prompt_chars counts it: the characters of every message's content."""
    return sum(len(m["content"]) for m in messages)


def fit_history(system: str, earlier: Sequence[Mapping[str, str]], text: str, budget: int) -> list[Mapping[str, str]]:
    """The earlier turns a request sends within ``budget`` characters (max_prompt_chars): ``earlier`` (oldest
    first, {"role": "user" | "assistant", "content": text}) less its oldest exchanges, as few as needed for
    len(system) + the kept turns' text + len(text) <= budget. An exchange is a user turn and the replies after it,
    dropped whole (never a reply without the turn it answers, nor a turn without its reply); replies before the
    first user turn (their turn was left out: its text did not open) are the oldest exchange. The system prompt (its reply format
    instruction included) and the new message ``text`` are never cut: when they alone are over the budget no
    earlier turn is kept, and the request is sent as it is (the app's start-up check makes that impossible for a
    text within max_text_chars). The app (chat and rehearsal requests) and the corpus builder (each example's
    prompt) call it with the same budget, so a fine-tune trains on the requests production sends; so do both for
    the panel's message after a rehearsal turn (hearth.prompts.rehearsal_exchange, given max_prompt_chars), whose
    ``earlier`` are its earlier lines (each line's text and line break, in the role of who said it: a user's line and
    the person's lines after it are one exchange) and ``text`` the rest of that message."""
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise TypeError(f"budget: expected int, got {type(budget).__name__}")
    starts = [i for i, turn in enumerate(earlier) if i == 0 or turn["role"] == "user"]  # where each exchange starts
    size = len(system) + len(text) + prompt_chars(earlier)
    for at, end in zip(starts, starts[1:] + [len(earlier)]):
        if size <= budget:
            return list(earlier[at:])
        size -= prompt_chars(earlier[at:end])
    return []
