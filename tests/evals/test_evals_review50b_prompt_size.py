"""The suites reach the app's largest real prompt, not only a first turn (review 50b).

Was: every case was first-turn sized (one companion case had a two-turn history; no memories in a rehearsal's
panel context; every shared context about 3.5k characters), while the app sends up to ``chat_context_turns``
earlier turns, the companion's latest ``prompt_memories`` memories and a shared context of up to MAX_CONTEXT
characters. Long chats are where a fine-tune loses the envelope (the format instruction ends up far back), so the
eval did not measure the case that matters most.

These tests compare the suites against the app's own constants and functions: raise a limit in the app and they
fail until the suite follows.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from hearth import prompts
from hearth.app import simulation
from hearth.app.companions import MAX_CONTEXT, ChatContext, CompanionView, MessageView, chat_messages
from hearth.app.relationship import STAGES as APP_STAGES, Standing
from hearth.app.settings import AppSettings
from hearth.app.textlimits import AGENT_FIELD_LIMITS
from hearth.envelope import ChatReply
from hearth.evals.suites import HERE, SUITES, load_suite

TURNS = AppSettings.model_fields["chat_context_turns"].default  # earlier turns a chat (and a rehearsal) sends
MEMORIES = AppSettings.model_fields["prompt_memories"].default  # the companion's latest memories in its prompts
MAX_TEXT = AppSettings.model_fields["max_text_chars"].default  # one message the user types
AT_THE_CAP = 0.97  # "at the cap": a shared context within 3% of MAX_CONTEXT
DOCS = Path(__file__).resolve().parents[2] / "docs" / "eval.md"
T0 = datetime(2026, 11, 2, 21, 0)


def size(case) -> int:
    """A case's prompt in characters: every message the request carries (system, history, user)."""
    return sum(len(m["content"]) for m in case.messages())


def _check_history_shape(case) -> None:
    assert len(case.history) == 2 * TURNS, (case.id, len(case.history))  # load_chat_context: limit=2 * turns
    assert [t["role"] for t in case.history] == ["user", "assistant"] * TURNS  # turns are saved in pairs
    for turn in case.history:
        if turn["role"] == "user":
            assert 0 < len(turn["content"]) <= MAX_TEXT
    assert 0 < len(case.user) <= MAX_TEXT


def _at_the_cap(shared: str) -> None:
    assert AT_THE_CAP * MAX_CONTEXT <= len(shared) <= MAX_CONTEXT, len(shared)
    assert shared == shared.strip()  # as clean_text stores it


def test_the_largest_chat_case_is_the_largest_prompt_the_app_sends():
    chats = [c for c in load_suite("companion") if c.spec.get("prompt", "companion") == "companion"]
    largest = max(chats, key=size)
    _check_history_shape(largest)
    memories = largest.spec["memories"]
    assert len(memories) == MEMORIES and all(0 < len(m) <= 300 for m in memories)  # ChatReply memories: <= 300
    _at_the_cap(largest.spec["shared_context"])
    stage = largest.spec["stage"]
    assert stage in {key for key, *_ in APP_STAGES}  # a stage the app can reach (confidant it never sends)

    # the app's own chat_messages, given this chat and memories older than the ones it keeps, builds the same
    # request: the case holds as many memories as the app sends, and its turns in the app's order and roles
    companion = CompanionView(id="c1", name="Mina", persona=largest.spec["persona"],
                              world_view=largest.spec["world_view"], share_context=True, affection=30, trust=20,
                              standing=Standing(key=stage, label=stage, score=50, next_at=None))
    recent = [MessageView(id=f"m{i}", role="user" if t["role"] == "user" else "companion", text=t["content"],
                          created_at=T0 + timedelta(minutes=i)) for i, t in enumerate(largest.history)]
    older = [f"An older memory, number {i}." for i in range(7)]
    ctx = ChatContext(companion=companion, shared_context=largest.spec["shared_context"],
                      memories=older + list(memories), recent=recent)
    assert chat_messages(ctx, largest.user, prompt_memories=MEMORIES) == largest.messages()


def test_memories_stored_during_the_history_are_in_the_prompt_as_the_app_would_have_them():
    """The app stores a reply's memories with the turn, so the next turn's prompt carries them."""
    largest = max((c for c in load_suite("companion") if c.spec.get("prompt", "companion") == "companion"), key=size)
    raw = next(json.loads(line) for line in (HERE / "companion.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip() and json.loads(line)["id"] == largest.id)
    history = raw["history"]
    if isinstance(history, str):
        history = json.loads((HERE / "histories.json").read_text(encoding="utf-8"))[history]
    learned = [m for t in history if t["role"] == "assistant" for m in ChatReply.model_validate(t["envelope"]).memories]
    assert learned, "a 20-turn chat in which the companion learned nothing new is not a realistic one"
    assert largest.spec["memories"][-len(learned):] == learned  # the newest memories, in the order stored


def test_a_rehearsal_at_full_length_with_the_companions_memories_in_its_panel_context():
    rehearsals = [c for c in load_suite("companion") if c.spec.get("prompt") == "rehearsal"]
    assert rehearsals
    largest = max(rehearsals, key=size)
    _check_history_shape(largest)
    memories, companion = largest.spec["memories"], largest.spec["companion"]
    assert len(memories) == MEMORIES and companion
    _at_the_cap(largest.spec["shared_context"])
    agent = largest.spec["rehearsal"]
    assert all(len(agent[f]) <= limit for f, limit in AGENT_FIELD_LIMITS.items())
    assert f"What {companion}, the user's companion, remembers" in largest.system_prompt()

    # what the app sends: simulation.panel_context (the companion's latest memories after the shared context),
    # then rehearsal_messages with the rehearsal's last turns; older turns and memories are left out as the app does
    older_memories = [f"An older memory, number {i}." for i in range(5)]
    panel = prompts.panel_context(largest.spec["shared_context"], companion=companion,
                                  memories=(older_memories + list(memories))[-MEMORIES:])
    older_turns = [simulation.TurnView(id=f"o{i}", role="user" if i % 2 == 0 else "agent", text=f"older line {i}",
                                       created_at=T0 - timedelta(hours=1, minutes=-i)) for i in range(6)]
    turns = [simulation.TurnView(id=f"t{i}", role="user" if t["role"] == "user" else "agent", text=t["content"],
                                 created_at=T0 + timedelta(minutes=i)) for i, t in enumerate(largest.history)]
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=older_turns + turns,
                                    agent=simulation.AgentView(id="a1", **agent))
    assert simulation.rehearsal_messages(view, panel, largest.user, TURNS) == largest.messages()


def test_an_analyst_panel_at_the_context_cap_with_the_companions_memories():
    largest = max(load_suite("analysts"), key=size)
    assert len(largest.spec["memories"]) == MEMORIES and largest.spec["companion"]
    _at_the_cap(largest.spec["shared_context"])
    assert 0 < len(largest.user) <= MAX_TEXT  # the situation the user types (routes.simulation: max_text_chars)
    panel = prompts.panel_context(largest.spec["shared_context"], companion=largest.spec["companion"],
                                  memories=largest.spec["memories"])
    assert largest.messages() == [
        {"role": "system", "content": prompts.analyst_system_prompt(largest.spec["analyst"], shared_context=panel)},
        {"role": "user", "content": largest.user}]  # simulation._ask_analyst's two messages


def test_every_case_is_within_the_apps_limits():
    """No case sends what the app could not: a context over its cap, more memories or turns than it keeps."""
    for name in SUITES:
        for case in load_suite(name):
            assert len(case.spec.get("shared_context", "")) <= MAX_CONTEXT, case.id
            assert len(case.spec.get("memories", [])) <= MEMORIES, case.id
            assert len(case.history) <= 2 * TURNS, case.id
            assert len(case.user) <= MAX_TEXT, case.id


def _k(chars: int) -> str:
    return f"{chars / 1000:.1f}k"


def test_docs_state_each_suites_prompt_size_range_as_measured():
    """docs/eval.md has a row per suite: its smallest and largest prompt (characters of every message sent),
    and the largest case. Measured here, so a change to the prompts or the suites that moves them fails until
    the docs follow."""
    text = DOCS.read_text(encoding="utf-8")
    for name in SUITES:
        cases = load_suite(name)
        sizes = sorted(size(c) for c in cases)
        largest = max(cases, key=size)
        row = next((line for line in text.splitlines() if line.startswith(f"| {name} |")), None)
        assert row is not None, f"docs/eval.md has no size row for {name}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert f"{_k(sizes[0])}-{_k(sizes[-1])}" in cells, (name, cells, _k(sizes[0]), _k(sizes[-1]))
        assert any(largest.id in cell for cell in cells), (name, largest.id, cells)
    overall = [size(c) for n in SUITES for c in load_suite(n)]
    assert re.search(rf"\b{re.escape(_k(min(overall)))} to {re.escape(_k(max(overall)))} characters", text), (
        _k(min(overall)), _k(max(overall)))


def test_named_histories_and_memories_are_checked_like_inline_ones(tmp_path):
    """A case may name a shared history or memory list (histories.json, memories.json) as it names a context;
    an unknown name is the file and line's error, like any other malformed case."""
    base = {"id": "c-1", "kind": "chat", "persona": "wren", "world_view": "grounded", "stage": "friend",
            "user": "hello"}
    path = tmp_path / "c.jsonl"
    for key, value in (("history", "no-such-history"), ("memories", "no-such-memories")):
        path.write_text(json.dumps({**base, key: value}) + "\n", encoding="utf-8")
        with pytest.raises(ValueError, match=rf"c\.jsonl:1: .*{value}"):
            load_suite("custom", path)
