"""The corpus moves a companion chat's relationship stage with its replies, as the app does.

Was: conversation_examples sent the conversation's ``stage`` in every example's prompt. The app adds each chat
reply's ``affection`` and ``trust`` to the companion's running totals when it saves the turn
(hearth.app.companions.save_turn) and reads the stage from the totals (hearth.app.relationship.standing) when it
builds the next request (load_chat_context -> chat_messages), so a conversation whose replies crossed a threshold
trained prompts with a stage the app had left. The end-to-end tests run the app's own chat turns on a database,
with a model that answers the corpus's envelopes, and compare what it sent with the corpus's examples.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import update

from hearth import prompts
from hearth.app import companions
from hearth.app.relationship import STAGES as LADDER
from hearth.app.relationship import standing
from hearth.app.storage.models import Companion
from hearth.app.textlimits import DEFAULT_MAX_TEXT_CHARS
from hearth.envelope import ChatReply, dumps
from hearth.train import corpus as C
from hearth.train.chat_format import render
from tests.app.app_users import sqlite_user

SHARED = "About me: I'm Ines, 31, a product designer."


def reply(i: int, affection: int, trust: int, memories=()) -> dict:
    return {"message": f"Reply {i}: go on.", "mood": "warm", "memories": list(memories), "affection": affection,
            "trust": trust, "suggested_actions": []}


# (affection, trust) of each reply: from acquaintance's entry (6, 0) over the friend gate (score 20 with trust 6),
# back under it on trust alone, over it again, and down
MOVES = [(2, 2), (2, 2), (2, 2), (2, 0), (0, -1), (0, 1), (-2, -2), (1, 0)]


def conversation(moves, **start) -> dict:
    turns = []
    for i, (a, t) in enumerate(moves):
        turns += [{"role": "user", "content": f"Message {i}: about my week."},
                  {"role": "assistant", "envelope": reply(i, a, t, [f"Ines said thing {i}."] if i == 2 else [])}]
    return {"id": "ines-wren", "kind": "chat", "persona": "wren", "world_view": "grounded", "memories": [],
            "shared_context": SHARED, "turns": turns, **start}


def stage_in(text: str) -> str:
    """The stage whose prompt text the example's system prompt carries."""
    system = text.split("<|im_start|>user")[0]
    (key,) = [k for k, v in prompts.STAGES.items() if v in system]
    return key


def expected_stages(start: tuple[int, int], moves) -> list[str]:
    """The stage the app sends at each turn: the totals before that turn's reply, through the app's function."""
    a, t = start
    out = []
    for da, dt in moves:
        out.append(standing(a, t).key)
        a, t = a + da, t + dt
    return out


# ------------------------------------------------------------------------------ the app, end to end
class Scripted:
    """The model: answers the conversation's envelopes in order, and keeps the messages of each request."""

    def __init__(self, envelopes: list[dict]):
        self.envelopes, self.calls = envelopes, []

    async def complete(self, messages, *, kind, deadline_s=None, max_tokens=None, request_id=None):
        assert kind == "chat"
        self.calls.append(messages)
        envelope = ChatReply.model_validate(self.envelopes[len(self.calls) - 1])
        return SimpleNamespace(envelope=envelope, provider="scripted")


async def _app_requests(tmp_path, conv: dict, start: tuple[int, int]) -> list[str]:
    """Every request the app sends for ``conv``'s user turns (its chat_turn, on a fresh SQLite database, the companion
    at ``start`` totals), rendered with the reply the corpus trains."""
    async with sqlite_user(tmp_path, "ines") as (db, cipher):
        envelopes = [t["envelope"] for t in conv["turns"][1::2]]
        model = Scripted(envelopes)
        async with db.sessions() as s:
            comp = await companions.create_companion(s, cipher, persona=conv["persona"], world_view=conv["world_view"])
            await companions.set_shared_context(s, cipher, conv["shared_context"])
            async with s.begin():  # the totals a companion has after its earlier chats
                await s.execute(update(Companion).where(Companion.id == comp.id)
                                .values(affection=start[0], trust=start[1]))
            for turn in conv["turns"][0::2]:
                await companions.chat_turn(s, model, cipher, comp.id, turn["content"], max_chars=DEFAULT_MAX_TEXT_CHARS,
                                           turns=C.CHAT_CONTEXT_TURNS, prompt_memories=C.PROMPT_MEMORIES,
                                           deadline_s=5.0)
            after = await companions.get_companion(s, cipher, comp.id)
    assert (after.affection, after.trust) == (start[0] + sum(a for a, _ in conv_moves(conv)),
                                              start[1] + sum(t for _, t in conv_moves(conv)))
    return [render(m[0]["content"], m[1:] + [{"role": "assistant", "content": dumps(ChatReply(**e))}]).text
            for m, e in zip(model.calls, envelopes)]


def conv_moves(conv: dict) -> list[tuple[int, int]]:
    return [(t["envelope"]["affection"], t["envelope"]["trust"]) for t in conv["turns"][1::2]]


@pytest.mark.parametrize("start, given", [
    (C.stage_start("acquaintance"), {"stage": "acquaintance"}),  # a stage alone: the lowest totals that reach it
    ((13, 6), {"affection": 13, "trust": 6}),  # totals alone: acquaintance, one point under friend
    ((12, 7), {"stage": "acquaintance", "affection": 12, "trust": 7}),  # both, agreeing
])
def test_the_stage_moves_turn_by_turn_as_the_app_moves_it(tmp_path, start, given):
    conv = conversation(MOVES, **given)
    examples = C.conversation_examples(json.loads(json.dumps(conv)))
    want = asyncio.run(_app_requests(tmp_path, conv, start))
    assert len(examples) == len(want) == len(MOVES)
    for k, (example, text) in enumerate(zip(examples, want)):
        assert example.rendered.text == text, k
    stages = [stage_in(e.rendered.text) for e in examples]
    assert stages == expected_stages(start, MOVES)
    assert len(set(stages)) == 2 and stages[0] == "acquaintance"  # it moved, from where it was given


def test_replies_without_affection_or_trust_move_nothing():
    # every reply 0 / 0 (the envelope requires both fields): the stage given is every example's, as before
    conv = conversation([(0, 0)] * 6, stage="friend")
    examples = C.conversation_examples(conv)
    assert [stage_in(e.rendered.text) for e in examples] == ["friend"] * 6
    fixed = prompts.system_prompt_for({**conv, "memories": []})[1]
    assert examples[0].rendered.text.startswith(f"<|im_start|>system\n{fixed}<|im_end|>")
    # a friend at the entry point (14, 6): the lowest point of the stage; any loss of trust leaves it
    dropped = C.conversation_examples(conversation([(0, -1), (0, 0)], stage="friend"))
    assert [stage_in(e.rendered.text) for e in dropped] == ["friend", "acquaintance"]


def test_the_stage_s_start_is_the_lowest_point_of_the_app_s_ladder():
    for key, _label, min_score, min_trust in LADDER:
        affection, trust = C.stage_start(key)
        assert standing(affection, trust).key == key
        if key == "stranger":
            assert (affection, trust) == (0, 0)  # where the app starts every companion (create_companion)
            continue
        assert standing(affection - 1, trust).key != key  # one point of affection less is the stage below
        if min_trust > 0:
            assert standing(affection + 1, trust - 1).key != key  # the trust gate, exactly
    with pytest.raises(KeyError):
        C.stage_start("soulmate")


def test_a_rehearsal_s_replies_move_no_totals():
    # the app does not add a rehearsal reply's affection / trust to anything, and its prompt has no stage
    agent = {"name": "Dana", "personality": "Direct.", "backstory": "My manager.", "relationship": "my manager"}
    conv = {"id": "reh", "kind": "chat", "prompt": "rehearsal", "rehearsal": agent, "turns": [
        {"role": "user", "content": "Can we talk?"}, {"role": "assistant", "envelope": reply(0, 2, 2)},
        {"role": "user", "content": "About my workload."}, {"role": "assistant", "envelope": reply(1, 2, 2)}]}
    first, second = C.conversation_examples(conv)
    assert first.rendered.text.split("<|im_start|>user")[0] == second.rendered.text.split("<|im_start|>user")[0]


@pytest.mark.parametrize("change, needle", [
    ({"stage": "friend", "affection": 3, "trust": 1}, "stage: 'friend', but affection 3 and trust 1 are the app's "
                                                      "'stranger'"),
    ({"affection": 14}, "trust: missing beside 'affection'"),
    ({"trust": 6, "stage": "friend"}, "affection: missing beside 'trust'"),
    ({"affection": 14, "trust": "6"}, "trust: the companion's running total must be an integer, got str"),
    ({"affection": True, "trust": 6}, "affection: the companion's running total must be an integer, got bool"),
    ({"affection": 14.0, "trust": 6}, "affection: the companion's running total must be an integer, got float"),
])
def test_bad_starting_totals_are_refused_naming_the_field(change, needle):
    conv = {k: v for k, v in conversation([(0, 0)]).items()}
    conv.update(change)
    with pytest.raises(C.CorpusError) as info:
        C.conversation_examples(conv)
    assert needle in info.value.reason


def test_totals_outside_a_companion_chat_are_refused_with_the_line():
    agent = {"name": "Dana", "personality": "Direct.", "backstory": "My manager.", "relationship": "my manager"}
    rehearsal = {"id": "reh", "kind": "chat", "prompt": "rehearsal", "rehearsal": agent, "affection": 10,
                 "trust": 10, "turns": [{"role": "user", "content": "Hi."},
                                        {"role": "assistant", "envelope": reply(0, 0, 0)}]}
    bad_stage = conversation([(0, 0)], stage="friend", affection=0, trust=0)
    result = C.read_corpus([json.dumps(conversation([(1, 1)], stage="friend")), json.dumps(rehearsal),
                            json.dumps(bad_stage)])
    assert len(result.examples) == 1
    assert [(r["line"], r["id"]) for r in result.rejected] == [(2, "reh"), (3, "ines-wren")]
    assert result.rejected[0]["reason"].startswith("affection: only a companion chat has relationship totals")
    assert result.rejected[1]["reason"].startswith("stage: 'friend', but affection 0 and trust 0")


def test_the_corpus_loads_no_part_of_the_app():
    # the ladder, the text limits and the settings' bounds come from hearth.companion_rules, the bottom-layer module
    # the app takes them from too: the corpus must not pull the app (its database, its crypto) into a training
    # install (no hearth[app] extras)
    probe = ("import sys, hearth.train.corpus; print(sorted(m for m in sys.modules if m.startswith('hearth.app') "
             "or m.split('.')[0] in ('sqlalchemy', 'fastapi', 'starlette', 'cryptography', 'argon2', 'alembic')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == [], out.stdout


def test_the_docs_give_each_stage_s_start_as_the_builder_computes_it():
    doc = (Path(__file__).parents[2] / "docs" / "corpus.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `affection`, `trust` |"))
    given = {key: (int(a), int(t)) for key, a, t in re.findall(r"`(\w+)` (-?\d+)/(-?\d+)", row)}
    assert given == {key: C.stage_start(key) for key in C.APP_STAGES}
