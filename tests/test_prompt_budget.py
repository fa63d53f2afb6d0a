"""hearth.companion_rules.fit_history: the prompt budget (max_prompt_chars).

Was: no request had a size limit. max_text_chars may be up to 50,000 and a chat or rehearsal sends up to
chat_context_turns (20: 40 messages) earlier turns, so a request grew far past the served model's context, and once
a chat held a few long turns every later turn failed (the long turns stay in the history) until the chat was
cleared. fit_history drops the oldest earlier exchanges, whole, until the request fits; the system prompt and the
new message are never cut.
"""

from __future__ import annotations

import pytest

from hearth import companion_rules as R


def _turn(role: str, n: int, tag: str) -> dict:
    return {"role": role, "content": tag + "x" * (n - len(tag))}


def _chat(*sizes: int) -> list[dict]:
    """Exchanges of (user, reply) sizes, oldest first; each turn's text starts with its index (u0, a0, u1, ...)."""
    out = []
    for i, (u, a) in enumerate(zip(sizes[::2], sizes[1::2])):
        out += [_turn("user", u, f"u{i}"), _turn("assistant", a, f"a{i}")]
    return out


def test_everything_that_fits_is_kept():
    earlier = _chat(10, 10, 10, 10)
    assert R.fit_history("s" * 10, earlier, "new", 100) == earlier
    assert R.fit_history("s", [], "new", 100) == []


def test_the_oldest_exchanges_go_first_whole_and_the_newest_stay():
    earlier = _chat(100, 100, 10, 10, 20, 20)  # 260 characters of history
    kept = R.fit_history("s" * 50, earlier, "n" * 50, 200)  # 100 left for history: the last two exchanges (60)
    assert kept == earlier[2:]
    kept = R.fit_history("s" * 50, earlier, "n" * 50, 139)  # 39 left: only the newest exchange (40) does not fit
    assert kept == []
    kept = R.fit_history("s" * 50, earlier, "n" * 50, 140)  # 40 left: the newest exchange
    assert kept == earlier[4:]
    for n in range(0, 400):  # never half of an exchange: the kept turns start with a user turn
        kept = R.fit_history("s" * 50, earlier, "n" * 50, 100 + n)
        assert not kept or kept[0]["role"] == "user"
        assert kept == earlier[len(earlier) - len(kept):]  # a suffix: the newest turns


def test_the_exact_boundary_fits():
    earlier = _chat(30, 30, 20, 20)
    total = 10 + 100 + 5
    assert R.fit_history("s" * 10, earlier, "n" * 5, total) == earlier
    assert R.fit_history("s" * 10, earlier, "n" * 5, total - 1) == earlier[2:]
    assert R.prompt_chars([{"role": "system", "content": "s" * 10}, *earlier, {"role": "user", "content": "n" * 5}]) \
        == total


def test_the_system_prompt_and_the_new_message_are_never_cut():
    earlier = _chat(10, 10)
    system, text = "s" * 500, "n" * 500
    assert R.fit_history(system, earlier, text, 100) == []  # over the budget on their own: sent whole, no history
    assert len(system) == 500 and len(text) == 500


def test_replies_whose_turn_was_left_out_go_first():
    # a user turn whose text did not open is not sent: its reply leads the history on its own
    earlier = [_turn("assistant", 10, "a-")] + _chat(10, 10)
    assert R.fit_history("", earlier, "", 20) == earlier[1:]
    assert R.fit_history("", earlier, "", 30) == earlier
    # two user turns in a row (a reply left out): each starts an exchange of its own
    earlier = [_turn("user", 10, "u0"), _turn("user", 10, "u1"), _turn("assistant", 10, "a1")]
    assert R.fit_history("", earlier, "", 20) == earlier[1:]


def test_a_bad_budget_is_a_type_error():
    with pytest.raises(TypeError, match="budget"):
        R.fit_history("s", [], "n", 10.5)


def test_the_default_holds_the_apps_limits():
    default, least, most = R.SETTING_BOUNDS["max_prompt_chars"]
    assert default == R.MAX_PROMPT_CHARS == 32000 and least <= default <= most
