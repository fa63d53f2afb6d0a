"""The corpus builds each example's prompt within the app's prompt budget (max_prompt_chars), as the app does.

Was: the app sent every earlier turn of its window however long; now it leaves out the oldest exchanges to fit
max_prompt_chars (hearth.companion_rules.fit_history), and an example built without it would train on requests
production never sends. The builder calls the same function with the same default.
"""

from __future__ import annotations

import json

from hearth.companion_rules import MAX_PROMPT_CHARS, prompt_chars
from hearth.train import corpus as C
from hearth.train.corpus import _messages_from_text
from tests.train.test_train_review50b_corpus import MAX_TEXT, app_chat_texts, chat_conversation


def long_chat(exchanges: int) -> dict:
    conv = chat_conversation(exchanges=exchanges, memories=5)
    for i in range(0, len(conv["turns"]), 2):
        conv["turns"][i]["content"] = f"Message {i // 2}: " + "x" * (MAX_TEXT - 20)
    return conv


def test_a_chat_over_the_budget_is_built_as_the_app_sends_it():
    conv = long_chat(12)
    examples = C.conversation_examples(json.loads(json.dumps(conv)))
    want = app_chat_texts(conv)
    assert [e.rendered.text for e in examples] == want
    last = _messages_from_text(examples[-1].rendered.text)[:-1]  # the prompt, without the trained reply
    assert prompt_chars(last) <= MAX_PROMPT_CHARS and "Message 0:" not in examples[-1].rendered.text
    assert last[1]["role"] == "user" and last[-1]["content"].startswith("Message 11:")


def test_a_deployment_s_budget_builds_its_requests(tmp_path):
    conv = long_chat(6)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(conv) + "\n", encoding="utf-8")
    stats = C.build(src, tmp_path / "out", max_prompt_chars=10**6)  # room for every turn
    rows = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    assert "Message 0:" in rows[-1]["text"] and stats["max_prompt_chars"] == 10**6
    assert C.app_setting("--max-prompt-chars", None) == MAX_PROMPT_CHARS
