"""The corpus refuses the rehearsed person the app would refuse to store.

Was: the corpus put a rehearsal's person (name, personality, backstory, relationship) into the prompt whatever its
length; the app stores a name of at most 60 characters and each other field of at most 2000, once cleaned, and
refuses an empty one (hearth.app.simulation.create_agent), so the corpus trained rehearsal prompts, and panel
messages after a rehearsal turn, that the app never sends. A companion's name (the panel context's) over the app's
limit too. The limits are the app's constants (hearth.app.textlimits); the end-to-end test asks the app's
create_agent the same question.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hearth.app import simulation
from hearth.app.common import InputError
from hearth.app.textlimits import AGENT_FIELD_LIMITS, MAX_AGENT_FIELD, MAX_AGENT_NAME, MAX_NAME
from hearth.train import corpus as C
from tests.app.app_users import sqlite_user

AGENT = {"name": "Dana", "personality": "Direct, busy, fair.", "backstory": "My manager for two years.",
         "relationship": "my manager"}
CHAT = {"message": "Go on.", "mood": "calm", "memories": [], "affection": 0, "trust": 0, "suggested_actions": []}
READING = {"analyst": "mentor", "reading": "It is going fine.", "advice": "Ask for a date.", "risk": "low"}


def rehearsal(person: dict, **more) -> dict:
    return {"id": "reh-dana", "kind": "chat", "prompt": "rehearsal", "rehearsal": person, "companion": "Mina",
            "memories": [], "turns": [{"role": "user", "content": "Can we talk?"},
                                      {"role": "assistant", "envelope": CHAT}], **more}


def after_rehearsal(person: dict) -> dict:
    after = {"rehearsal": person, "history": [], "text": "Can we talk?", "reply": "Sure, five minutes."}
    return {"id": "panel-dana", "kind": "analyst", "analyst": "mentor", "companion": "Mina", "memories": [],
            "turns": [{"role": "user", "after_rehearsal": after}, {"role": "assistant", "envelope": READING}]}


def at(limit: int, extra: int = 0) -> str:
    """A text of ``limit + extra`` characters once cleaned as the app cleans it (stripped, CRLF as LF), longer raw."""
    return "  " + "a" * (limit + extra - 2) + "\r\nb \r\n"


FIELDS = list(AGENT_FIELD_LIMITS)


@pytest.mark.parametrize("field", FIELDS)
def test_a_field_at_the_app_s_limit_is_accepted_and_one_over_refused_naming_it(field):
    limit = AGENT_FIELD_LIMITS[field]
    (example,) = C.conversation_examples(rehearsal({**AGENT, field: at(limit)}))
    assert "a" * (limit - 2) + "\nb" in example.rendered.text
    over = json.dumps(rehearsal({**AGENT, field: at(limit, 1)}))
    result = C.read_corpus([json.dumps(rehearsal(AGENT)), over])
    assert len(result.examples) == 1
    assert result.rejected == [{"line": 2, "id": "reh-dana", "reason": f"rehearsal.{field}: {limit + 1} characters, "
                                f"over the app's {limit} for the rehearsed person's {field} (the app stores no longer "
                                "one)"}]


@pytest.mark.parametrize("field", FIELDS)
def test_an_empty_field_is_refused_naming_it(field):
    with pytest.raises(C.CorpusError, match=rf"^rehearsal\.{field}: must not be empty"):
        C.conversation_examples(rehearsal({**AGENT, field: " \r\n "}))


@pytest.mark.parametrize("field", ["name", "personality", "relationship", "backstory"])
def test_the_person_after_a_rehearsal_turn_has_the_same_limits(field):
    limit = AGENT_FIELD_LIMITS[field]
    assert len(C.conversation_examples(after_rehearsal({**AGENT, field: at(limit)}))) == 1
    with pytest.raises(C.CorpusError) as info:
        C.conversation_examples(after_rehearsal({**AGENT, field: at(limit, 1)}))
    assert info.value.reason.startswith(f"turns[0].after_rehearsal.rehearsal.{field}: {limit + 1} characters, over "
                                        f"the app's {limit}")


@pytest.mark.parametrize("make", [rehearsal, after_rehearsal])
def test_the_companion_s_name_has_the_app_s_limit(make):
    assert C.conversation_examples({**make(AGENT), "companion": at(MAX_NAME)})
    with pytest.raises(C.CorpusError, match=rf"^companion: {MAX_NAME + 1} characters, over the app's {MAX_NAME}"):
        C.conversation_examples({**make(AGENT), "companion": at(MAX_NAME, 1)})


async def _app_stores(tmp_path, person: dict) -> bool:
    """Whether the app's create_agent stores this person (False: InputError), on a fresh SQLite database."""
    async with sqlite_user(tmp_path, "ines") as (db, cipher), db.sessions() as s:
        try:
            await simulation.create_agent(s, cipher, **person)
        except InputError:
            return False
        return True


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("extra", [0, 1])
def test_the_corpus_refuses_exactly_what_the_app_refuses(tmp_path, field, extra):
    person = {**AGENT, field: at(AGENT_FIELD_LIMITS[field], extra)}
    try:
        C.conversation_examples(rehearsal(person))
        corpus_takes = True
    except C.CorpusError:
        corpus_takes = False
    assert corpus_takes == asyncio.run(_app_stores(tmp_path, person)) == (extra == 0)


def test_the_docs_give_the_app_s_limits():
    doc = (Path(__file__).parents[2] / "docs" / "corpus.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `rehearsal` |"))
    assert f"a name of at most {MAX_AGENT_NAME} characters and each other field at most {MAX_AGENT_FIELD:,}" in row
    assert f"the companion's name (at most {MAX_NAME} characters, the app's `MAX_NAME`)" in doc
