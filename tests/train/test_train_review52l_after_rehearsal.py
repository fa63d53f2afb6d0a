"""Review 52l (train): only an analyst conversation may give a user turn as ``after_rehearsal``.

Was: conversation_examples wrote the panel's after-rehearsal message (hearth.prompts.rehearsal_exchange_for) for
any conversation, so a companion chat, a rehearsal or a feed comment with such a user turn trained a request the app
never sends: the app writes that message only for the five analysts after a rehearsal turn
(hearth.app.simulation.exchange_for_panel). docs/corpus.md gives it for an analyst only.
"""

from __future__ import annotations

import json

from hearth.train.corpus import TEMPLATE_PATH, read_corpus

LINES = (TEMPLATE_PATH.parent / "example_corpus.jsonl").read_text(encoding="utf-8").splitlines()
EXCHANGE = {"rehearsal": {"name": "Dana", "personality": "blunt", "backstory": "my manager",
                          "relationship": "manager"},
            "history": [], "text": "I'd like to talk about my raise.", "reply": "Now is not a good time."}


def test_after_rehearsal_outside_an_analyst_conversation_is_refused():
    kinds = {}
    for line in LINES:
        conv = json.loads(line)
        kinds.setdefault(conv.get("prompt") or conv["kind"], conv)
    assert {"chat", "rehearsal", "feed_comment", "analyst"} <= set(kinds)
    for name in ("chat", "rehearsal", "feed_comment"):
        conv = kinds[name]
        conv["turns"] = [{"role": "user", "after_rehearsal": EXCHANGE}, conv["turns"][1]]
        result = read_corpus([json.dumps(conv)])
        assert not result.examples, name
        assert result.rejected[0]["reason"].startswith("turns[0].after_rehearsal: "), result.rejected
    analyst = kinds["analyst"]
    analyst["turns"] = [{"role": "user", "after_rehearsal": EXCHANGE}, analyst["turns"][1]]
    assert len(read_corpus([json.dumps(analyst)]).examples) == 1
