"""The analysts suite scores the panel after a rehearsal turn, built as the app builds it (review 50c).

Was: after each rehearsal turn the app asks all five analysts to read the exchange, with a user message the app
wrote itself (simulation.exchange_for_panel); every analysts case was a typed situation, so the eval never sent
that message and the corpus could not train it. Now hearth.prompts.rehearsal_exchange writes it for the app, and
analysts-16 (the mentor reading Ines's rehearsal with Dana, companion-15's turn) is built through it at production
size. It replaced analysts-13 (Arlo's situation read by the mentor): a first-turn situation at the small context
size, and the mentor before a hard conversation, which analysts-16 now covers at the largest panel prompt.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from functools import partial

from hearth import prompts
from hearth.app import simulation
from hearth.app.settings import AppSettings
from hearth.evals.suites import load_suite
from tests.app.app_fakes import FakeModel

MEMORIES = AppSettings.model_fields["prompt_memories"].default
MAX_CONTEXT_CAP = 0.97
T0 = datetime(2026, 11, 6, 9, 0)


def _after_rehearsal_case():
    cases = [c for c in load_suite("analysts") if "after_rehearsal" in c.spec]
    assert len(cases) == 1, [c.id for c in cases]
    return cases[0]


def test_the_panel_after_companion_15s_turn_is_an_analysts_case_as_the_app_sends_it():
    case = _after_rehearsal_case()
    rehearsal = next(c for c in load_suite("companion") if c.id == "companion-15")
    after = case.spec["after_rehearsal"]
    # the same rehearsal: its person, all its earlier turns and its new line; the panel gets the rehearsal's context
    assert after["rehearsal"] == rehearsal.spec["rehearsal"] and after["text"] == rehearsal.user
    assert [t.get("content") for t in after["history"] if t["role"] == "user"] == [
        t["content"] for t in rehearsal.history if t["role"] == "user"]
    for key in ("shared_context", "companion", "memories"):
        assert case.spec[key] == rehearsal.spec[key], key

    # what the app does after that turn: rehearsal_context's panel context, exchange_for_panel over the stored turns,
    # then run_panel: the messages this analyst gets are the case's, byte for byte
    turns = [simulation.TurnView(id=f"t{i}", role="user" if t["role"] == "user" else "agent", text=t["content"],
                                 created_at=T0 + timedelta(minutes=i)) for i, t in enumerate(rehearsal.history)]
    view = simulation.RehearsalView(id="r1", companion_id="c1", turns=turns,
                                    agent=simulation.AgentView(id="a1", **rehearsal.spec["rehearsal"]))
    shared = prompts.panel_context(case.spec["shared_context"], companion=case.spec["companion"],
                                   memories=case.spec["memories"][-MEMORIES:])
    situation = partial(simulation.exchange_for_panel, view, rehearsal.user, after["reply"])  # as the app passes it
    assert situation(case.system_prompt()) == case.user  # within the default budget: nothing left out
    model = FakeModel()
    results = asyncio.run(simulation.run_panel(model, shared, situation, timeout_s=5))
    assert all(r.ok for r in results)
    sent = {kind_messages[1][0]["content"]: kind_messages[1] for kind_messages in model.calls}
    assert sent[case.system_prompt()] == case.messages()
    assert case.expect == {"analyst": "mentor"}


def test_the_case_is_at_production_size():
    """The largest panel the app sends for this user: context at the cap, the companion's 30 memories, a 20-turn
    rehearsal of which the panel reads the last PANEL_EXCHANGE_TURNS."""
    from hearth.app.companions import MAX_CONTEXT

    case = _after_rehearsal_case()
    assert len(case.spec["memories"]) == MEMORIES
    assert MAX_CONTEXT_CAP * MAX_CONTEXT <= len(case.spec["shared_context"]) <= MAX_CONTEXT
    history = case.spec["after_rehearsal"]["history"]
    assert len(history) == 2 * AppSettings.model_fields["chat_context_turns"].default > prompts.PANEL_EXCHANGE_TURNS
    assert case.user.count("\nMe: ") + case.user.count("\nDana: ") == prompts.PANEL_EXCHANGE_TURNS + 2


def test_the_suite_keeps_fifteen_cases_and_every_analyst_three_times():
    cases = load_suite("analysts")
    assert len(cases) == 15 and "analysts-13" not in {c.id for c in cases}
    assert Counter(c.expect["analyst"] for c in cases) == {a: 3 for a in prompts.ANALYSTS}
