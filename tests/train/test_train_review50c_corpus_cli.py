"""Review 50c (train): `hearth corpus build` builds for a deployment's chat_context_turns / prompt_memories, and the
example corpus's panel conversations carry what the app gives the panel.

Was: corpus.build() took context_turns and prompt_memories (the app's settings of those names), but the command had
no flags for them, so a deployment that changed them could not build its corpus from the command line. And the
example corpus's rehearsal and analyst conversations had no ``companion`` / ``memories``: the app gives the panel
and a rehearsal's agent the companion's memories (hearth.prompts.panel_context, from
hearth.app.simulation.panel_context), so they trained a smaller prompt than the app sends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hearth import prompts
from hearth.app.settings import AppSettings
from hearth.cli import app
from hearth.train.corpus import read_corpus

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"
TURNS = AppSettings.model_fields["chat_context_turns"]
MEMORIES = AppSettings.model_fields["prompt_memories"]


def _bound(field, kind: str):
    return next(getattr(m, kind) for m in field.metadata if hasattr(m, kind))


def _build(tmp_path, *flags):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["corpus", "build", str(EXAMPLE), str(out), *flags])
    stats = json.loads((out / "stats.json").read_text()) if (out / "stats.json").is_file() else None
    return result, stats


# ------------------------------------------------------------------------------------------- 1: the flags
def test_without_the_flags_the_build_uses_the_apps_defaults(tmp_path):
    result, stats = _build(tmp_path)
    assert result.exit_code == 0, result.output
    assert stats["context_turns"] == TURNS.default and stats["prompt_memories"] == MEMORIES.default


def test_the_flags_build_for_a_deployment_that_changed_the_settings(tmp_path):
    result, stats = _build(tmp_path, "--context-turns", "1", "--prompt-memories", "0")
    assert result.exit_code == 0, result.output
    assert stats["context_turns"] == 1 and stats["prompt_memories"] == 0
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "train.jsonl").read_text().splitlines())}
    # prompt_memories 0: the app sends no memories, so every companion prompt has none, even after a reply learns one
    later = rows["wren-tama-scholarship#3"]["text"]
    assert "## What you remember from earlier conversations\n(nothing yet)" in later
    assert "- Tama's brother Niko is 9 and loves sharks." not in later
    assert "the scholarship email came" in later  # context_turns 1: the one earlier exchange is sent


@pytest.mark.parametrize("flag,field", [("--context-turns", TURNS), ("--prompt-memories", MEMORIES)])
def test_values_the_app_refuses_are_refused_naming_the_flag(tmp_path, flag, field):
    for value in (_bound(field, "ge") - 1, _bound(field, "le") + 1):
        result, stats = _build(tmp_path, flag, str(value))
        assert result.exit_code == 2, (flag, value, result.output)
        assert flag in result.output and stats is None, result.output
    for value in (_bound(field, "ge"), _bound(field, "le")):  # the app's own bounds are accepted
        # with a budget that holds 500 memories, as the app requires at start-up (hearth.prompt_budget)
        result, _ = _build(tmp_path, flag, str(value), "--max-prompt-chars", "200000")
        assert result.exit_code == 0, (flag, value, result.output)


def test_docs_name_the_flags():
    text = (ROOT / "docs" / "corpus.md").read_text(encoding="utf-8")
    assert "--context-turns" in text and "--prompt-memories" in text


# --------------------------------------------------------------------- 2: the panel's context in the example
def test_every_analyst_and_rehearsal_conversation_carries_the_companions_memories():
    convs = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    panel = [c for c in convs if c.get("prompt", prompts.DEFAULT_PROMPT.get(c.get("kind"))) in ("analyst", "rehearsal")]
    assert len(panel) >= 4
    for conv in panel:
        companion, memories = conv.get("companion"), conv.get("memories")
        assert isinstance(companion, str) and companion.strip(), conv["id"]
        assert isinstance(memories, list) and len(memories) >= 5, conv["id"]
        assert len(memories) <= MEMORIES.default and all(isinstance(m, str) and 0 < len(m) <= 300 for m in memories)
        assert len({m.casefold() for m in memories}) == len(memories), conv["id"]  # stored once each
    # and the examples built from them carry the block the app's panel_context adds
    built = read_corpus(EXAMPLE.read_text(encoding="utf-8").splitlines())
    for conv in panel:
        example = next(e for e in built.examples if e.id.startswith(conv["id"] + "#"))
        assert f"What {conv['companion']}, the user's companion, remembers" in example.rendered.text, conv["id"]


def test_a_panel_conversations_companion_is_one_of_that_users_chat_companions():
    """The memories are the companion's: an analyst reading of Ines's situation names a companion Ines chats with
    in the example corpus, and its memories agree with what that chat starts from."""
    convs = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    chats = [c for c in convs if c.get("kind") == "chat" and "prompt" not in c and c.get("memories")]
    for conv in convs:
        if conv.get("prompt", prompts.DEFAULT_PROMPT.get(conv.get("kind"))) not in ("analyst", "rehearsal"):
            continue
        same_user = [c for c in chats if c["shared_context"] == conv["shared_context"]]
        mine = [c for c in same_user if prompts.PERSONAS[c["persona"]].name == conv["companion"]]
        assert mine, (conv["id"], conv["companion"])
        folded = {m.casefold() for m in conv["memories"]}
        assert all(m.casefold() in folded for c in mine for m in c["memories"]), conv["id"]
