"""The panel's message after a rehearsal turn is built by hearth.prompts (review 50).

Was: hearth.app.simulation.exchange_for_panel wrote it in the app's own code, so the eval had no case for it and
the corpus could not train it: the analysts' user message after a rehearsal turn was a prompt only production sent.
Now hearth.prompts.rehearsal_exchange writes it (the app calls it, byte for byte what the app sent before), and
rehearsal_exchange_for builds it from a spec, which the eval's after-rehearsal case and the corpus's analyst user
turns use.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from hearth import prompts
from hearth.app import simulation
from hearth.envelope import ChatReply
from hearth.train.corpus import CorpusError, conversation_examples

T0 = datetime(2026, 11, 6, 9, 0)


def _old_exchange_for_panel(view, text: str, reply: str) -> str:
    """hearth.app.simulation.exchange_for_panel as it was before this change, verbatim."""
    a = view.agent
    lines = [f"I am rehearsing a hard conversation with {a.name} ({a.relationship}). "
             f"{a.name}: {a.personality}", "", "The conversation so far:"]
    for t in view.turns[-6:]:
        lines.append(f"{'Me' if t.role == 'user' else a.name}: {t.text}")
    lines += [f"Me: {text}", f"{a.name}: {reply}", "", "How is it going, and what should I say next?"]
    return "\n".join(lines)


AGENT = simulation.AgentView(
    id="a1", name="Dana", personality="Direct and fast; says 'let's discuss' when she hasn't decided.",
    backstory="Ines's manager for two years.", relationship="Line manager, 1:1 on Thursdays")
LINES = ["Hi Dana, have you got ten minutes?", "Five. Go.", "It's about the lead role.\nAnd the wrinkle.",
         "Say it plainly.", "I want the role. Ünïcode — “quotes” too.", "Then make the case.",
         "The numbers: +14%.",
         "Numbers are good. What else?", "Two juniors I mentor.", "Fine. And Marco?"]


def _view(n: int) -> simulation.RehearsalView:
    turns = [simulation.TurnView(id=f"t{i}", role="user" if i % 2 == 0 else "agent", text=LINES[i],
                                 created_at=T0 + timedelta(minutes=i)) for i in range(n)]
    return simulation.RehearsalView(id="r1", companion_id="c1", agent=AGENT, turns=turns)


@pytest.mark.parametrize("n", [0, 1, 4, 6, 7, 10])
def test_the_apps_panel_message_is_byte_identical_and_comes_from_prompts(n):
    view = _view(n)
    text, reply = "Let me start again: I'm asking for the role.", "Good. That's the ask. Now the wrinkle."
    before = _old_exchange_for_panel(view, text, reply)
    system = prompts.analyst_system_prompt("mentor", shared_context="")  # well within the budget: nothing left out
    assert simulation.exchange_for_panel(view, text, reply, system) == before
    earlier = [{"role": "user" if t.role == "user" else "assistant", "content": t.text} for t in view.turns]
    assert prompts.rehearsal_exchange(name=AGENT.name, personality=AGENT.personality,
                                      relationship=AGENT.relationship, earlier=earlier, text=text,
                                      reply=reply) == before


def test_the_app_calls_the_prompts_function(monkeypatch):
    """So a change to the panel's message is made once, in hearth.prompts, and the eval and corpus follow."""
    monkeypatch.setattr(prompts, "rehearsal_exchange", lambda **kw: f"from prompts: {kw['text']}")
    assert simulation.exchange_for_panel(_view(2), "hello", "hi", "") == "from prompts: hello"


def test_the_window_is_the_last_six_earlier_turns():
    earlier = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i}"} for i in range(9)]
    text = prompts.rehearsal_exchange(name="Sam", personality="p", relationship="r", earlier=earlier, text="t",
                                      reply="x")
    assert prompts.PANEL_EXCHANGE_TURNS == 6
    assert "line 2" not in text and "Sam: line 3\nMe: line 4" in text and "Me: line 8\nMe: t\nSam: x" in text


def test_the_spec_form_sends_assistant_turns_as_their_message():
    reply_env = {"message": "Five. Go.", "mood": "brisk", "memories": [], "affection": 0, "trust": 0,
                 "suggested_actions": ["Lead with the ask"]}
    spec = {"rehearsal": {"name": "Dana", "personality": AGENT.personality, "backstory": AGENT.backstory,
                          "relationship": AGENT.relationship},
            "history": [{"role": "user", "content": LINES[0]}, {"role": "assistant", "envelope": reply_env}],
            "text": "Lead role. Now.", "reply": "Good."}
    assert prompts.rehearsal_exchange_for(spec) == _old_exchange_for_panel(_view(2), "Lead role. Now.", "Good.")
    assert prompts.history_turn(ChatReply.model_validate(reply_env)) == "Five. Go."


@pytest.mark.parametrize("change,exc,match", [
    (dict(name=""), ValueError, "name"),
    (dict(personality=3), TypeError, "personality"),
    (dict(reply="  "), ValueError, "reply"),
    (dict(earlier="not a list"), TypeError, "earlier"),
    (dict(earlier=[{"role": "system", "content": "x"}]), ValueError, r"earlier\[0\]"),
    (dict(earlier=[{"role": "user", "content": None}]), TypeError, r"earlier\[0\]\.content"),
])
def test_bad_arguments_name_the_argument(change, exc, match):
    args = dict(name="Sam", personality="p", relationship="r", earlier=[], text="t", reply="x") | change
    with pytest.raises(exc, match=match):
        prompts.rehearsal_exchange(**args)


@pytest.mark.parametrize("spec,match", [
    ({"history": [], "text": "t", "reply": "x"}, "rehearsal"),
    ({"rehearsal": {"name": "S", "personality": "p", "backstory": "b", "relationship": "r"}, "text": "t"}, "reply"),
    ({"rehearsal": {"name": "S", "personality": "p", "backstory": "b", "relationship": "r"}, "text": "t",
      "reply": "x", "history": [{"role": "assistant", "content": "no envelope"}]}, r"history\[0\].*envelope"),
])
def test_bad_specs_name_the_key(spec, match):
    with pytest.raises((ValueError, TypeError), match=match):
        prompts.rehearsal_exchange_for(spec)


def _analyst_conv(user_turn: dict) -> dict:
    return {"id": "mentor-after-rehearsal", "kind": "analyst", "analyst": "mentor", "shared_context": "I'm Ines.",
            "turns": [user_turn, {"role": "assistant", "envelope": {
                "analyst": "mentor", "reading": "She answered the ask, not the hedge.",
                "advice": "Name the wrinkle back to her and ask what would settle it.", "risk": "medium"}}]}


def test_the_corpus_trains_the_panel_after_a_rehearsal_turn():
    after = {"rehearsal": {"name": "Dana", "personality": AGENT.personality, "backstory": AGENT.backstory,
                           "relationship": AGENT.relationship},
             "history": [{"role": "user", "content": LINES[0]}, {"role": "assistant", "envelope": {
                 "message": "Five. Go.", "mood": "brisk", "memories": [], "affection": 0, "trust": 0,
                 "suggested_actions": []}}],
             "text": "Lead role. Now.", "reply": "Good."}
    example, = conversation_examples(_analyst_conv({"role": "user", "after_rehearsal": after}))
    user = prompts.rehearsal_exchange_for(after)
    assert "<|im_start|>user\n" + user + "<|im_end|>" in example.rendered.text
    # a turn gives its text one way only, and a bad spec is the conversation's error, naming the key
    with pytest.raises(CorpusError, match="content or after_rehearsal"):
        conversation_examples(_analyst_conv({"role": "user", "content": "hi", "after_rehearsal": after}))
    with pytest.raises(CorpusError, match=r"turns\[0\]\.after_rehearsal.*reply"):
        conversation_examples(_analyst_conv({"role": "user", "after_rehearsal": {**after, "reply": ""}}))
    json.dumps(after)  # the spec is plain JSON, as a corpus line holds it
