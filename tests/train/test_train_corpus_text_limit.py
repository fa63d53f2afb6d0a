"""The corpus refuses a user message longer than the app's max_text_chars.

Was: the corpus put a user turn into the prompt whatever its length; the app refuses a chat message, rehearsal line,
feed post or situation longer than its setting max_text_chars once cleaned (common.clean_text: stripped, CRLF as
one character), so the corpus could train prompts the app never sends. The limit is the app's setting: the default
read from hearth.app.settings.AppSettings, and `hearth corpus build --max-text-chars N` for a deployment that changed
it. The panel's message after a rehearsal turn is the app's own (not capped), but the user's lines in it are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hearth.app.common import InputError, clean_text
from hearth.app.settings import AppSettings
from hearth.app.textlimits import DEFAULT_MAX_TEXT_CHARS
from hearth.cli import app
from hearth.train import corpus as C

FIELD = AppSettings.model_fields["max_text_chars"]
LIMIT = FIELD.default
ROOT = Path(__file__).resolve().parents[2]

AGENT = {"name": "Dana", "personality": "Direct, busy, fair.", "backstory": "My manager for two years.",
         "relationship": "my manager"}
CHAT = {"message": "Go on.", "mood": "calm", "memories": [], "affection": 0, "trust": 0, "suggested_actions": []}
READING = {"analyst": "mentor", "reading": "It is going fine.", "advice": "Ask for a date.", "risk": "low"}
COMMENT = {"comment": "That sounds like a good day.", "tone": "warm"}


def at(limit: int, extra: int = 0) -> str:
    """A text of ``limit + extra`` characters once cleaned as the app cleans it (stripped, CRLF as LF); raw, it is
    longer than ``limit + 1`` (so a check of the raw text, or of CRLF as two, would refuse it)."""
    return "  \r\n" + "a" * (limit + extra - 4) + "\r\nb\r\nc \r\n"


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(envelope: dict) -> dict:
    return {"role": "assistant", "envelope": envelope}


def chat(first: str, second: str = "And then?") -> dict:
    return {"id": "chat-ann", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
            "memories": [], "turns": [user(first), reply(CHAT), user(second), reply(CHAT)]}


def rehearsal(text: str) -> dict:
    return {"id": "reh-dana", "kind": "chat", "prompt": "rehearsal", "rehearsal": AGENT, "companion": "Mina",
            "memories": [], "turns": [user("Can we talk?"), reply(CHAT), user(text), reply(CHAT)]}


def feed(text: str) -> dict:
    return {"id": "feed-post", "kind": "feed_comment", "persona": "wren", "world_view": "grounded",
            "turns": [user(text), reply(COMMENT)]}


def situation(text: str) -> dict:
    return {"id": "panel-situation", "kind": "analyst", "analyst": "mentor", "companion": "Mina", "memories": [],
            "turns": [user(text), reply(READING)]}


def after_rehearsal(text: str = "Can we talk?", earlier: str = "Hi Dana.", reply_text: str = "Sure.") -> dict:
    after = {"rehearsal": AGENT, "history": [user(earlier), reply(CHAT)], "text": text, "reply": reply_text}
    return {"id": "panel-dana", "kind": "analyst", "analyst": "mentor", "companion": "Mina", "memories": [],
            "turns": [{"role": "user", "after_rehearsal": after}, reply(READING)]}


# (conversation with the user text put in, where the reason names it, what the reason calls it)
CASES = {
    "chat, first message": (lambda t: chat(t), "turns[0].content", "chat message"),
    "chat, a later message": (lambda t: chat("Hi.", t), "turns[2].content", "chat message"),
    "rehearsal line": (rehearsal, "turns[2].content", "rehearsal line"),
    "feed post": (feed, "turns[0].content", "feed post"),
    "situation": (situation, "turns[0].content", "situation"),
    "after a rehearsal turn, the new line": (lambda t: after_rehearsal(text=t), "turns[0].after_rehearsal.text",
                                              "rehearsal line"),
    "after a rehearsal turn, an earlier line": (lambda t: after_rehearsal(earlier=t),
                                                 "turns[0].after_rehearsal.history[0].content", "rehearsal line"),
}


def test_the_default_is_the_app_settings_default():
    assert C.DEFAULT_MAX_TEXT_CHARS == DEFAULT_MAX_TEXT_CHARS == LIMIT
    assert C.APP_SETTING_FLAGS["--max-text-chars"] == "max_text_chars"
    assert C.app_setting("--max-text-chars", None) == LIMIT


def test_the_app_takes_the_text_at_the_limit_and_refuses_one_over():
    # what the corpus mirrors: the app's own check, at the app's default
    assert len(clean_text(at(LIMIT), "message", LIMIT)) == LIMIT
    with pytest.raises(InputError):
        clean_text(at(LIMIT, 1), "message", LIMIT)


@pytest.mark.parametrize("case", list(CASES))
def test_a_user_text_at_the_limit_is_accepted_and_one_over_refused_naming_it(case):
    make, where, what = CASES[case]
    assert C.conversation_examples(make(at(LIMIT)))  # at the limit once cleaned, though longer raw
    over = make(at(LIMIT, 1))
    result = C.read_corpus([json.dumps(make("Short.")), json.dumps(over)])
    assert result.conversations == 2 and result.examples  # the good line builds; the long one alone is refused
    (rejected,) = result.rejected
    assert rejected["line"] == 2 and rejected["id"] == over["id"], rejected
    assert rejected["reason"] == (f"{where}: {LIMIT + 1} characters, over the app's max_text_chars of {LIMIT} for "
                                  f"a {what} (the app refuses a longer one)"), rejected


def test_the_panels_own_message_may_be_longer_than_the_limit():
    # the app writes the message after a rehearsal turn itself (the person, earlier turns, the line, the reply): only
    # the user's lines in it are held to max_text_chars
    (example,) = C.conversation_examples(after_rehearsal(text=at(LIMIT), earlier=at(LIMIT), reply_text="b" * LIMIT))
    assert example.rendered.text.count("a" * (LIMIT - 4)) == 2


@pytest.mark.parametrize("case", list(CASES))
def test_the_limit_given_replaces_the_default(case):
    make, where, _ = CASES[case]
    small = 50
    assert C.conversation_examples(make(at(small)), max_text_chars=small)
    with pytest.raises(C.CorpusError, match=rf"^{re.escape(where)}: {small + 1} characters, over the app's "
                                            rf"max_text_chars of {small} "):
        C.conversation_examples(make(at(small, 1)), max_text_chars=small)
    # a deployment with a larger limit takes what the default refuses
    assert C.conversation_examples(make(at(LIMIT, 1)), max_text_chars=LIMIT + 1)
    result = C.read_corpus([json.dumps(make(at(small, 1)))], max_text_chars=small)
    assert [r["line"] for r in result.rejected] == [1] and not result.examples


# ---------------------------------------------------------------------------------------------- the command
def _write(tmp_path, convs) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in convs), encoding="utf-8")
    return src


def _build(tmp_path, src, *flags):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["corpus", "build", str(src), str(out), *flags])
    stats = json.loads((out / "stats.json").read_text()) if (out / "stats.json").is_file() else None
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()] if stats else None
    return result, stats, rejected


def test_the_command_holds_user_texts_to_the_apps_default(tmp_path):
    at_limit, over = chat(at(LIMIT)), {**chat("Hi.", at(LIMIT, 1)), "id": "chat-too-long"}
    src = _write(tmp_path, [at_limit, over])
    result, stats, rejected = _build(tmp_path, src)
    assert result.exit_code == 0, result.output
    assert stats["max_text_chars"] == LIMIT and (stats["accepted"], stats["rejected"]) == (1, 1)
    reason = f"turns[2].content: {LIMIT + 1} characters, over the app's max_text_chars of {LIMIT} for a chat message"
    assert rejected == [{"line": 2, "id": "chat-too-long", "reason": reason + " (the app refuses a longer one)"}]
    assert "rejected line 2 (chat-too-long): turns[2].content" in " ".join(result.output.split())


def test_the_option_changes_the_limit(tmp_path):
    src = _write(tmp_path, [chat("Hi."), {**feed(at(LIMIT, 1)), "id": "feed-long"}])
    result, stats, rejected = _build(tmp_path, src, "--max-text-chars", str(LIMIT + 1))
    assert result.exit_code == 0, result.output
    assert stats["max_text_chars"] == LIMIT + 1 and stats["rejected"] == 0 and rejected == []
    result, stats, rejected = _build(tmp_path, src, "--max-text-chars", "20")
    assert result.exit_code == 0, result.output
    assert stats["max_text_chars"] == 20 and [(r["line"], r["id"]) for r in rejected] == [(2, "feed-long")]
    assert rejected[0]["reason"].startswith(f"turns[0].content: {LIMIT + 1} characters, over the app's "
                                            "max_text_chars of 20 for a feed post")


def test_values_the_app_refuses_are_refused_naming_the_flag(tmp_path):
    src = _write(tmp_path, [chat("Hi.")])
    bounds = {k: next(getattr(m, k) for m in FIELD.metadata if hasattr(m, k)) for k in ("ge", "le")}
    for value in (bounds["ge"] - 1, bounds["le"] + 1):
        result, stats, _ = _build(tmp_path, src, "--max-text-chars", str(value))
        assert result.exit_code == 2 and stats is None, (value, result.output)
        assert "--max-text-chars" in result.output and "max_text_chars" in result.output, result.output
    for value in bounds.values():  # a budget that holds the largest message, as the app requires at start-up
        result, stats, _ = _build(tmp_path, src, "--max-text-chars", str(value), "--max-prompt-chars", "100000")
        assert result.exit_code == 0 and stats["max_text_chars"] == value, (value, result.output)


def test_docs_name_the_flag():
    text = (ROOT / "docs" / "corpus.md").read_text(encoding="utf-8")
    assert "--max-text-chars" in text and "max_text_chars" in text
