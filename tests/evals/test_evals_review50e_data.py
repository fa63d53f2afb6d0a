"""Review 50e (eval data): the confidant case remembers what a confidant-level chat would, and no post shows a
photo the app cannot carry.

Was: companion-05, the only case at the app's top stage (confidant: affection + trust >= 90 and trust >= 40,
hearth.app.relationship), sent 8 memories, as many as a first-week friend case; a companion that far up the ladder
has had many conversations, and the app sends its latest ``prompt_memories`` (30) memories, so the case scored a
smaller prompt than the one a confidant chat sends. And three feed posts (feed-01, feed-05, feed-09) carried
"[photo: ...]" markers: the app's posts are text only (hearth.app.feed stores and sends a post's text), so the eval
measured a request no user can make, with a model reading a photo it was never given. The example corpus had one
such post too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hearth import prompts
from hearth.app.settings import AppSettings
from hearth.evals.suites import HERE, SUITES, load_suite, memory_lists

MEMORIES = AppSettings.model_fields["prompt_memories"].default
NEAR_THE_CAP = MEMORIES - 4  # a confidant's chat has filled (nearly) all the memory slots its prompt carries
EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"
MEDIA = re.compile(r"\[\s*(photo|image|picture|pic|video|gif|attachment)\b", re.IGNORECASE)


def _raw(suite: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / SUITES[suite]).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_confidant_case_sends_memories_near_the_apps_cap_from_a_named_list():
    confidants = [c for c in load_suite("companion") if c.spec.get("stage") == "confidant"]
    assert confidants, "the companion suite spans every stage, confidant included"
    raw = {c["id"]: c for c in _raw("companion")}
    for case in confidants:
        memories = case.spec["memories"]
        assert NEAR_THE_CAP <= len(memories) <= MEMORIES, (case.id, len(memories))
        assert isinstance(raw[case.id]["memories"], str), case.id  # a named memories.json entry, as the long cases
        assert memory_lists()[raw[case.id]["memories"]] == memories
        assert all(0 < len(m) <= 300 and m == m.strip() for m in memories)  # ChatReply.memories items
        assert len({m.casefold() for m in memories}) == len(memories)  # the app stores each once
        assert len(memories) > 8  # more than a friend-stage case's list
        # the system prompt carries all of them, as the app's chat_messages sends its latest prompt_memories
        assert all(f"- {m}" in case.system_prompt() for m in memories)


def test_a_confidant_companion_remembers_more_than_any_lower_stage_case_of_the_same_user():
    cases = [c for c in load_suite("companion") if c.spec.get("prompt", "companion") == "companion" and not c.history]
    for top in (c for c in cases if c.spec["stage"] == "confidant"):
        lower = [c for c in cases if c.spec["shared_context"] == top.spec["shared_context"] and c is not top]
        assert all(len(c.spec["memories"]) < len(top.spec["memories"]) for c in lower), top.id


def test_no_eval_text_describes_a_photo_or_other_media():
    """The app's posts and messages are text: no user turn, history turn or memory may present media."""
    for suite in SUITES:
        for case in load_suite(suite):
            texts = [case.user, *(t["content"] for t in case.history), *case.spec.get("memories", [])]
            for text in texts:
                assert not MEDIA.search(text), (case.id, text)
    for name, turns in json.loads((HERE / "histories.json").read_text(encoding="utf-8")).items():
        for turn in turns:
            assert not MEDIA.search(turn.get("content", "")), (name, turn)


def test_no_example_corpus_post_describes_a_photo():
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        conv = json.loads(line)
        for turn in conv["turns"]:
            if turn["role"] == "user" and isinstance(turn.get("content"), str):
                assert not MEDIA.search(turn["content"]), (conv["id"], turn["content"])


def test_every_suite_keeps_fifteen_cases():
    assert {name: len(load_suite(name)) for name in SUITES} == {name: 15 for name in SUITES}
    assert prompts.STAGES  # the stages the confidant case uses come from hearth.prompts
