"""The corpus builds each example's prompt within the app's prompt budget (max_prompt_chars), as the app does.

Was: the app sent every earlier turn of its window however long; now it leaves out the oldest exchanges to fit
max_prompt_chars (hearth.companion_rules.fit_history), and an example built without it would train on requests
production never sends. The builder calls the same function with the same default.
"""

from __future__ import annotations

import json

from hearth import prompts
from hearth.app import simulation
from hearth.companion_rules import MAX_PROMPT_CHARS, prompt_chars
from hearth.train import corpus as C
from hearth.train.corpus import _messages_from_text
from tests.train.test_train_review50b_corpus import MAX_TEXT, app_chat_texts, chat_conversation
from tests.train.test_train_review54_corpus_clean import T0


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


def test_an_analyst_reading_a_long_rehearsal_is_built_as_the_app_sends_it():
    """The panel's message after a rehearsal turn (rehearsal_exchange) fits the budget as the app's does: its oldest
    earlier lines left out, the analyst's system prompt and the new exchange whole."""
    long, budget = 10000, 40000  # a deployment's max_text_chars, and a budget its six earlier lines outgrow
    line = [f"Line {i}: " + "z" * (long - 10) for i in range(4)]
    reply = {"message": "Go on.", "mood": "calm", "memories": [], "affection": 0, "trust": 0, "suggested_actions": []}
    history = [t for text in line[:3] for t in ({"role": "user", "content": text},
                                                 {"role": "assistant", "envelope": reply})]
    after = {"rehearsal": {"name": "Dana", "personality": "Direct.", "backstory": "My manager.",
                           "relationship": "my manager"}, "history": history, "text": line[3], "reply": "Not now."}
    conv = {"id": "panel", "kind": "analyst", "analyst": "mentor", "memories": ["Ines has a sister."],
            "turns": [{"role": "user", "after_rehearsal": after},
                      {"role": "assistant", "envelope": {"analyst": "mentor", "reading": "Fine.", "advice": "Wait.",
                                                         "risk": "low"}}]}
    (example,) = C.conversation_examples(conv, max_text_chars=long, max_prompt_chars=budget)
    prompt = _messages_from_text(example.rendered.text)[:-1]
    assert prompt_chars(prompt) <= budget
    user = prompt[1]["content"]
    assert "Line 0:" not in user and f"Me: {line[2]}\nDana: Go on.\nMe: {line[3]}\nDana: Not now." in user
    # the app's request for the same rehearsal (simulation.exchange_for_panel; tests/train/test_train_review54 too)
    turns = [simulation.TurnView(id=f"t{i}", role="user" if t["role"] == "user" else "agent",
                                 text=t.get("content", "Go on."), created_at=T0) for i, t in enumerate(history)]
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=turns, agent=simulation.AgentView(
        id="a1", **after["rehearsal"]))
    system = prompt[0]["content"]
    assert system == prompts.analyst_system_prompt("mentor", shared_context=prompts.panel_context(
        "", memories=["Ines has a sister."]))
    assert user == simulation.exchange_for_panel(view, line[3], "Not now.", system, budget)


# ------------------------------------------------------------------------------------------------ the flags together
def _cli_build(tmp_path, conv: dict, *flags: str):
    from typer.testing import CliRunner

    from hearth.cli import app

    src, out = tmp_path / "in.jsonl", tmp_path / "out"
    src.write_text(json.dumps(conv) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["corpus", "build", str(src), str(out), *flags])
    stats = json.loads((out / "stats.json").read_text()) if (out / "stats.json").is_file() else None
    return result, stats


def test_a_budget_the_app_refuses_at_start_up_is_refused_naming_the_flag(tmp_path):
    """`hearth corpus build` checks its flags as the app checks its settings, so a corpus is never built for a
    configuration the app refuses to start with: the budget must hold the largest system prompt and one
    max_text_chars message (hearth.app.settings' start-up check). Was: --max-text-chars 50000 alone (a
    configuration the app refuses since max_prompt_chars) built, and its chat examples with a long message carried
    prompts over the budget (fit_history never cuts the new message): requests production never sends."""
    from hearth.prompt_budget import largest_system_prompt

    _, system = largest_system_prompt(30)
    conv = chat_conversation(exchanges=1, memories=5)
    conv["turns"][0]["content"] = "x" * 40000
    result, stats = _cli_build(tmp_path, conv, "--max-text-chars", "50000")
    out = " ".join(result.output.split())
    assert result.exit_code == 2 and stats is None, result.output
    assert "--max-prompt-chars" in out and str(system + 50000) in out and "max_text_chars" in out, out
    result, stats = _cli_build(tmp_path, conv, "--max-prompt-chars", str(system + 4000 - 1))
    assert result.exit_code == 2 and stats is None and "--max-prompt-chars" in result.output, result.output
    result, stats = _cli_build(tmp_path, conv, "--prompt-memories", "100")  # more memories than the default holds
    assert result.exit_code == 2 and stats is None and "--max-prompt-chars" in result.output, result.output
    result, stats = _cli_build(tmp_path, conv, "--max-text-chars", "50000", "--max-prompt-chars", str(system + 50000))
    assert result.exit_code == 0 and stats["max_prompt_chars"] == system + 50000, result.output
