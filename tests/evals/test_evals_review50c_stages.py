"""The eval and the example corpus use only relationship stages the app can produce (review 50c).

Was: companion-05 scored the "confidant" prompt, which the app's ladder never reached (it stopped at
close_friend): the eval measured a prompt production never sends. A stage may also be given as a free description
(hearth.prompts accepts one), which the app never sends either.
"""

from __future__ import annotations

import json
from pathlib import Path

from hearth import prompts
from hearth.app.relationship import STAGES as APP_STAGES
from hearth.evals.suites import SUITES, load_suite

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"
APP_KEYS = [key for key, *_ in APP_STAGES]


def test_every_companion_case_uses_a_stage_the_app_reaches():
    used = set()
    for name in SUITES:
        for case in load_suite(name):
            if case.spec.get("prompt", prompts.DEFAULT_PROMPT[case.kind]) == "companion":
                assert case.spec["stage"] in APP_KEYS, (case.id, case.spec["stage"])
                used.add(case.spec["stage"])
    assert used == set(APP_KEYS)  # the docs say the companion suite spans every stage


def test_every_example_corpus_conversation_uses_a_stage_the_app_reaches():
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        conv = json.loads(line)
        if conv.get("prompt", prompts.DEFAULT_PROMPT.get(conv.get("kind"), "")) == "companion":
            assert conv.get("stage") in APP_KEYS, (conv.get("id"), conv.get("stage"))
