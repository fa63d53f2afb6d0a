"""Review 73 (train): the panel's after-rehearsal message is trained as the app writes it, the person's replies
included as their envelopes hold them.

Was: conversation_examples cleaned the whole panel message once written (clean: CRLF as LF), as it cleans a text
the user typed. The app cleans the user's lines (clean_text, when stored) but not the rehearsed person's replies,
which are the model's envelope messages (only stripped), nor the message the app itself writes from them
(simulation.exchange_for_panel). A reply holding a CRLF (a JSON "\\r\\n" in the model's envelope) reached the
analysts as CRLF in the app and was trained as LF.
"""

from __future__ import annotations

from datetime import datetime

from hearth import prompts
from hearth.app import simulation
from hearth.envelope import AnalystReading, ChatReply, dumps
from hearth.train import corpus as C
from hearth.train.chat_format import render

T0 = datetime(2026, 11, 2, 21, 0)
AGENT = {"name": "Dana", "personality": "Direct.", "backstory": "My manager for two years.",
         "relationship": "my manager"}
CHAT = {"message": "Hello there.", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
        "suggested_actions": []}
READING = {"analyst": "mentor", "reading": "It is going fine.", "advice": "Ask for a date.", "risk": "low"}


def test_a_reply_with_a_crlf_reaches_the_panel_as_the_app_sends_it():
    earlier_reply = ChatReply(**{**CHAT, "message": "Sure.\r\nQuickly, though."}).message
    reply = ChatReply(**{**CHAT, "message": "Not now.\r\nMaybe Friday."}).message
    after = {"rehearsal": AGENT, "history": [{"role": "user", "content": "Got a minute?"},
                                             {"role": "assistant", "envelope": {**CHAT, "message": earlier_reply}}],
             "text": "I'd like a raise.", "reply": reply}
    conv = {"id": "panel", "kind": "analyst", "analyst": "mentor",
            "turns": [{"role": "user", "after_rehearsal": after}, {"role": "assistant", "envelope": READING}]}
    (example,) = C.conversation_examples(conv)
    # the app: the stored turns (the person's as its envelope's message), then exchange_for_panel
    stored = [simulation.TurnView(id="u0", role="user", text="Got a minute?", created_at=T0),
              simulation.TurnView(id="a0", role="agent", text=earlier_reply, created_at=T0)]
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=stored,
                                    agent=simulation.AgentView(id="a1", **AGENT))
    system = prompts.analyst_system_prompt("mentor", shared_context="")
    situation = simulation.exchange_for_panel(view, "I'd like a raise.", reply, system)
    assert "\r\n" in situation
    want = render(system, [{"role": "user", "content": situation},
                           {"role": "assistant", "content": dumps(AnalystReading(**READING))}])
    assert example.rendered.text == want.text
