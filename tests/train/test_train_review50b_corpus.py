"""Review 50b (train): the corpus builds each example's prompt as the app builds its request, from the same data.

Was: conversation_examples put EVERY earlier turn of a conversation into each example, and every memory of the
conversation into its system prompt, as given, for the whole conversation. The app (hearth.app.companions.chat_messages,
hearth.app.simulation.rehearsal_messages / panel_context) sends the last ``chat_context_turns`` = 20 earlier turns
and the companion's latest ``prompt_memories`` = 30 memories; the memories a chat reply lists are stored with the
turn (deduplicated, case-insensitively), so the next turn's prompt carries them; the user's messages and shared
context are stored stripped, with CRLF as LF (clean_text); a feed comment and an analyst reading go out with no
history. A corpus conversation longer than 20 turns, with more than 30 memories, or whose replies learn memories
trained on prompts the app never sends. Also refused now: what the app cannot send at all (a shared context over
MAX_CONTEXT, a custom persona over MAX_PERSONA, a world view or stage the app does not have).

Each test builds the app's own messages for the same data with the app's functions and compares the rendered
text."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from hearth import prompts
from hearth.app import companions, simulation
from hearth.app.common import clean_text
from hearth.app.relationship import STAGES as APP_STAGES
from hearth.app.relationship import Standing
from hearth.app.settings import AppSettings
from hearth.envelope import ChatReply, dumps
from hearth.train import corpus as C
from hearth.train.chat_format import render

TURNS = AppSettings.model_fields["chat_context_turns"].default
MEMORIES = AppSettings.model_fields["prompt_memories"].default
MAX_TEXT = AppSettings.model_fields["max_text_chars"].default
T0 = datetime(2026, 11, 2, 21, 0)
SHARED = "\n  About me: I'm Ines, 31, a product designer.\r\nMy sister Lu lives in Porto.\r\n\n"


def reply(i: int, memories=()) -> dict:
    return {"message": f"Reply {i}: tell me more about that.", "mood": "warm", "memories": list(memories),
            "affection": 0, "trust": 0, "suggested_actions": [f"Option {i}"]}


def learned(i: int) -> list[str]:
    """What reply i learns: a new fact every third turn, and once a fact already known (another case)."""
    if i == 7:
        return ["ines HAS A SISTER CALLED LU."]  # memory 0 in other letters: the app stores it once
    return [f"Ines mentioned detail number {i}."] if i % 3 == 0 else []


def chat_conversation(exchanges: int, memories: int) -> dict:
    turns = []
    for i in range(exchanges):
        turns.append({"role": "user", "content": f"  Message {i}: something happened today.\r\nMore on it.  "})
        turns.append({"role": "assistant", "envelope": reply(i, learned(i))})
    return {"id": "long", "kind": "chat", "persona": "mina", "world_view": "grounded", "stage": "friend",
            "shared_context": SHARED,
            "memories": ["Ines has a sister called Lu."] + [f"Older memory {m}." for m in range(memories - 1)],
            "turns": turns}


def app_chat_texts(conv: dict, turns: int = TURNS, prompt_memories: int = MEMORIES) -> list[str]:
    """What the app sends at each assistant turn of ``conv``, rendered: its stored chat replayed turn by turn
    through chat_messages, with save_turn's memory rule (companions._new_memories, MAX_MEMORIES_KEPT)."""
    standing = Standing(key=conv["stage"], label=conv["stage"], score=26, next_at=45)
    companion = companions.CompanionView(id="c1", name="Mina", persona=conv["persona"], world_view=conv["world_view"],
                                         share_context=True, affection=16, trust=10, standing=standing)
    shared = clean_text(conv["shared_context"], "shared_context", companions.MAX_CONTEXT, required=False)
    stored: list[companions.MessageView] = []
    memories = list(conv["memories"])
    out = []
    for i in range(0, len(conv["turns"]), 2):
        text = clean_text(conv["turns"][i]["content"], "message", MAX_TEXT)
        ctx = companions.ChatContext(companion=companion, shared_context=shared, memories=list(memories),
                                     recent=stored[-2 * turns:])  # load_chat_context: history(limit=2 * turns)
        messages = companions.chat_messages(ctx, text, prompt_memories=prompt_memories)
        envelope = ChatReply.model_validate(conv["turns"][i + 1]["envelope"])
        out.append(render(messages[0]["content"], messages[1:] + [{"role": "assistant", "content": dumps(envelope)}]).text)
        stored += [companions.MessageView(id=f"u{i}", role="user", text=text, created_at=T0),
                   companions.MessageView(id=f"r{i}", role="companion", text=envelope.message, created_at=T0)]
        memories = (memories + companions._new_memories(memories, list(envelope.memories)))[-companions.MAX_MEMORIES_KEPT:]
    return out


def test_the_limits_are_the_app_s():
    assert C.CHAT_CONTEXT_TURNS == TURNS and C.PROMPT_MEMORIES == MEMORIES
    assert C.MAX_CONTEXT == companions.MAX_CONTEXT and C.MAX_PERSONA == companions.MAX_PERSONA
    assert C.MAX_MEMORIES_KEPT == companions.MAX_MEMORIES_KEPT
    assert {key for key, *_ in APP_STAGES} <= set(C.APP_STAGES) == set(prompts.STAGES)


def test_a_long_chat_is_built_as_the_app_sends_each_turn():
    conv = chat_conversation(exchanges=TURNS + 5, memories=MEMORIES - 2)
    examples = C.conversation_examples(json.loads(json.dumps(conv)))
    want = app_chat_texts(conv)
    assert len(examples) == len(want) == TURNS + 5
    for k, (example, text) in enumerate(zip(examples, want)):
        assert example.rendered.text == text, k
    last = examples[-1].rendered.text
    assert "Message 3:" not in last and "Message 4:" in last  # the last 20 earlier turns: 4..23
    # the latest 30 of 28 + 8 learned (replies 0, 3, ..., 21; reply 7's is one the companion already has)
    assert "Ines mentioned detail number 21." in last and "Older memory 4." not in last and "Older memory 5." in last
    assert not any("SISTER CALLED LU" in e.rendered.text.split("<|im_start|>user")[0] for e in examples)  # the prompt


def test_a_deployment_s_own_limits_build_its_requests(tmp_path):
    # a deployment that sets chat_context_turns = 3 and prompt_memories = 4 (hearth.app.settings): build() takes them
    conv = chat_conversation(exchanges=8, memories=3)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(conv) + "\n", encoding="utf-8")
    stats = C.build(src, tmp_path / "out", context_turns=3, prompt_memories=4)
    rows = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == app_chat_texts(conv, turns=3, prompt_memories=4)
    assert stats["context_turns"] == 3 and stats["prompt_memories"] == 4


def test_a_short_chat_is_unchanged_by_the_windows():
    conv = chat_conversation(exchanges=3, memories=2)
    assert [e.rendered.text for e in C.conversation_examples(conv)] == app_chat_texts(conv)


def test_a_long_rehearsal_is_built_as_the_app_sends_it():
    agent = {"name": "Dana", "personality": "Direct, busy, fair.", "backstory": "Ines's manager for two years.",
             "relationship": "my manager"}
    memories = [f"Memory {m} of the chat with Mina." for m in range(MEMORIES + 6)]
    turns = []
    for i in range(TURNS + 3):
        turns += [{"role": "user", "content": f"Line {i}: I would like to talk about my workload. "},
                  {"role": "assistant", "envelope": reply(i, learned(i))}]  # a rehearsal stores no memories
    conv = {"id": "reh", "kind": "chat", "prompt": "rehearsal", "rehearsal": agent, "companion": "Mina",
            "memories": memories, "shared_context": SHARED, "turns": turns}
    examples = C.conversation_examples(conv)

    shared = clean_text(SHARED, "shared_context", companions.MAX_CONTEXT, required=False)
    panel = prompts.panel_context(shared, companion="Mina", memories=memories[-MEMORIES:])  # simulation.panel_context
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=[],
                                    agent=simulation.AgentView(id="a1", **agent))
    assert len(examples) == TURNS + 3
    for k, example in enumerate(examples):
        text = clean_text(turns[2 * k]["content"], "message", MAX_TEXT)
        messages = simulation.rehearsal_messages(view, panel, text, TURNS)
        envelope = ChatReply.model_validate(turns[2 * k + 1]["envelope"])
        want = render(messages[0]["content"], messages[1:] + [{"role": "assistant", "content": dumps(envelope)}]).text
        assert example.rendered.text == want, k
        view.turns += [simulation.TurnView(id=f"u{k}", role="user", text=text, created_at=T0),
                       simulation.TurnView(id=f"a{k}", role="agent", text=envelope.message, created_at=T0)]


@pytest.mark.parametrize("conv", [
    {"id": "f", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": [
        {"role": "user", "content": "Baked bread."}, {"role": "assistant", "envelope": {"comment": "Good.", "tone": "warm"}},
        {"role": "user", "content": "And jam."}, {"role": "assistant", "envelope": {"comment": "Better.", "tone": "warm"}}]},
    {"id": "a", "kind": "analyst", "analyst": "cynic", "turns": [
        {"role": "user", "content": "s"}, {"role": "assistant", "envelope": {"analyst": "cynic", "reading": "r", "advice": "a", "risk": "low"}},
        {"role": "user", "content": "t"}, {"role": "assistant", "envelope": {"analyst": "cynic", "reading": "r", "advice": "a", "risk": "low"}}]},
])
def test_a_feed_or_analyst_conversation_has_no_history(conv):
    # the app sends a feed comment request and an analyst's reading with one user message and no earlier turns
    with pytest.raises(C.CorpusError, match="no history"):
        C.conversation_examples(conv)
    one = {**conv, "turns": conv["turns"][:2]}
    assert len(C.conversation_examples(one)) == 1


@pytest.mark.parametrize("change, needle", [
    ({"shared_context": "x" * (8000 + 1)}, "shared_context: 8001 characters"),
    ({"world_view": "World view: everything is a metaphor."}, "world_view"),
    ({"stage": "You have known the user for ten years."}, "stage"),
    ({"persona": "p" * 4001}, "persona: 4001 characters"),
])
def test_what_the_app_cannot_send_is_refused(change, needle):
    conv = {**chat_conversation(exchanges=1, memories=1), **change}
    with pytest.raises(C.CorpusError, match=needle):
        C.conversation_examples(conv)


def test_a_shared_context_at_the_cap_after_cleaning_is_accepted():
    conv = {**chat_conversation(exchanges=1, memories=1), "shared_context": "  " + "y" * 8000 + "\n"}
    (example,) = C.conversation_examples(conv)
    assert "y" * 8000 + "\n\n##" in example.rendered.text


def test_the_example_corpus_builds_as_before():
    examples = C.read_corpus(C.TEMPLATE_PATH.with_name("example_corpus.jsonl").read_text(encoding="utf-8").splitlines())
    assert len(examples.rejected) == 1 and len(examples.examples) == 12
