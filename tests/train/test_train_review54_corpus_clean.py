"""Review 54 (train): the texts a user writes into the app are trained as the app stores them (clean_text: stripped,
CRLF as LF) wherever the corpus takes them: a custom persona, the rehearsed person's fields, the companion's name,
and the rehearsal exchange the panel reads.

Was: the corpus cleaned the user's messages and the shared context, but put a custom persona, the rehearsal fields
and an after_rehearsal exchange into the prompt as written: a persona pasted with Windows line ends trained CRLF
where the app sends LF, and a person named "Dana " trained "Dana :" lines in the panel's message where the app
(which stores "Dana") sends "Dana:". Each test builds the app's own request for the same data with the app's
functions and compares the rendered text.
"""

from __future__ import annotations

from datetime import datetime

from hearth import prompts
from hearth.app import companions, simulation
from hearth.app.common import clean_text
from hearth.app.relationship import Standing
from hearth.envelope import AnalystReading, ChatReply, dumps
from hearth.train import corpus as C
from hearth.train.chat_format import render

T0 = datetime(2026, 11, 2, 21, 0)
PERSONA = "  You are Pip, a retired lighthouse keeper.\r\nYou speak slowly.\r\nYou love tea.  \r\n"
AGENT = {"name": " Dana ", "personality": "Direct.\r\nBusy, fair.  ", "backstory": "\r\nMy manager for two years.",
         "relationship": "my manager "}
CHAT = {"message": "Hello there.", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
        "suggested_actions": []}
READING = {"analyst": "mentor", "reading": "It is going fine.", "advice": "Ask for a date.", "risk": "low"}


def _agent_view() -> simulation.AgentView:
    return simulation.AgentView(id="a1", **{k: clean_text(v, k, 2000) for k, v in AGENT.items()})


def test_a_custom_persona_is_trained_as_the_app_stores_it():
    conv = {"id": "pip", "kind": "chat", "persona": PERSONA, "world_view": "grounded", "stage": "friend",
            "memories": [], "shared_context": "", "turns": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "envelope": CHAT}]}
    (example,) = C.conversation_examples(conv)
    standing = Standing(key="friend", label="friend", score=26, next_at=45)
    companion = companions.CompanionView(id="c1", name="Pip", persona=clean_text(PERSONA, "persona", 4000),
                                         world_view="grounded", share_context=True, affection=0, trust=0,
                                         standing=standing)
    ctx = companions.ChatContext(companion=companion, shared_context="", memories=[], recent=[])
    messages = companions.chat_messages(ctx, "hi", prompt_memories=30)
    want = render(messages[0]["content"], messages[1:] + [{"role": "assistant", "content": dumps(ChatReply(**CHAT))}])
    assert example.rendered.text == want.text


def test_a_rehearsal_is_trained_as_the_app_stores_the_person():
    conv = {"id": "reh", "kind": "chat", "prompt": "rehearsal", "rehearsal": AGENT, "companion": " Mina ",
            "memories": ["Ines has a sister."], "turns": [{"role": "user", "content": "Can we talk?"},
                                                          {"role": "assistant", "envelope": CHAT}]}
    (example,) = C.conversation_examples(conv)
    panel = prompts.panel_context("", companion="Mina", memories=["Ines has a sister."])  # simulation.panel_context
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=[], agent=_agent_view())
    messages = simulation.rehearsal_messages(view, panel, "Can we talk?", 20)
    want = render(messages[0]["content"], messages[1:] + [{"role": "assistant", "content": dumps(ChatReply(**CHAT))}])
    assert example.rendered.text == want.text


def test_the_panels_rehearsal_exchange_is_trained_as_the_app_writes_it():
    earlier = [{"role": "user", "content": "  Hi Dana.\r\nGot a minute?  "},
               {"role": "assistant", "envelope": {**CHAT, "message": "  Sure, quickly.  "}}]
    after = {"rehearsal": AGENT, "history": earlier, "text": " I'd like a raise.\r\nA real one. ",
             "reply": "  Not now.  "}
    conv = {"id": "panel", "kind": "analyst", "analyst": "mentor",
            "turns": [{"role": "user", "after_rehearsal": after}, {"role": "assistant", "envelope": READING}]}
    (example,) = C.conversation_examples(conv)
    # the app: the rehearsal's stored turns (clean_text; the reply's message as the envelope strips it)
    stored = [simulation.TurnView(id="u0", role="user", text=clean_text(earlier[0]["content"], "message", 4000),
                                  created_at=T0),
              simulation.TurnView(id="a0", role="agent", text="Sure, quickly.", created_at=T0)]
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=stored, agent=_agent_view())
    system = prompts.analyst_system_prompt("mentor", shared_context="")
    situation = simulation.exchange_for_panel(view, clean_text(after["text"], "message", 4000),
                                              ChatReply(**{**CHAT, "message": after["reply"]}).message, system)
    want = render(system, [{"role": "user", "content": situation},
                           {"role": "assistant", "content": dumps(AnalystReading(**READING))}])
    assert example.rendered.text == want.text
