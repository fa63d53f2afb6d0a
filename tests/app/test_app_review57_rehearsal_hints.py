"""Review 57: a rehearsal reply's mood and coaching hints are kept and shown.

Was: the rehearsal prompt tells the model that its mood is shown as the rehearsed person's and that its suggested
actions are coaching hints for the user's next line, but a rehearsal turn stored only the reply's text
(rehearsal_turns had no meta_ct): the hints the model wrote were thrown away. Now the agent's turn keeps them sealed
in meta_ct (schema 0007), as a chat reply does; the page shows the mood under the person's message and the hints as
coaching for the user's next line, the stream's ``reply`` event (and a replayed ``done``) carries them, and the
export has them. A turn saved before 0007 (no meta_ct), or whose meta_ct does not open, shows neither.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from sqlalchemy import inspect, select, text, update

from hearth.app.storage.models import RehearsalTurn
from hearth.envelope import dumps, parse_envelope
from tests.app.app_client import create_companion, signup, sse_events, start_rehearsal
from tests.app.app_fakes import FakeModel
from tests.app.app_schema import HEAD, database_at, downgrade, insert_companion, scalars, upgrade_and_compare
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}
TEXT = "I need Friday off"
MOOD = "guarded"
HINTS = ["Say why Friday matters to you", "Offer to swap a shift"]
COACHING = "Coaching for your next line:"


class HintModel(FakeModel):
    """FakeModel whose chat replies carry a distinctive mood and two suggested actions (the coaching hints)."""

    async def complete(self, messages, *, kind, **kw):
        result = await super().complete(messages, kind=kind, **kw)
        if kind != "chat":
            return result
        data = json.loads(result.text)
        data.update(mood=MOOD, suggested_actions=HINTS)
        text_ = dumps(parse_envelope(json.dumps(data), "chat"))
        return SimpleNamespace(envelope=parse_envelope(text_, "chat"), text=text_, provider="fake")


async def _setup(client) -> tuple[str, str]:
    csrf = await signup(client, "alice")
    cid = await create_companion(client, csrf)
    return csrf, await start_rehearsal(client, csrf, cid)


def _coaching(page: str) -> list[str]:
    """The hints the page shows as coaching (the items of each .coaching block), in order."""
    blocks = re.findall(r'<div class="coaching">(.*?)</div>', page, re.S)
    return [h for b in blocks for h in re.findall(r"<li>(.*?)</li>", b, re.S)]


def _moods(page: str) -> list[str]:
    return re.findall(r'<span class="mood">(.*?)</span>', page)


async def test_a_streamed_turn_s_reply_event_and_the_page_after_it_carry_the_mood_and_the_coaching_hints(
        make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=HintModel()) as (app, client):
        csrf, rid = await _setup(client)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        events = sse_events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=STREAM)).text)
        reply = [d for e, d in events if e == "reply"]
        assert reply == [{"message": f"Echo: {TEXT}", "mood": MOOD, "suggested_actions": HINTS}], events
        assert events[-1][0] == "done" and not events[-1][1]["replayed"]

        page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
        assert f"<p>Echo: {TEXT}</p>" in page
        assert _moods(page) == [MOOD]
        assert page.count(COACHING) == 1 and _coaching(page) == HINTS
        # under the agent's message (after it, in its item), not the user's
        mine, theirs = page.index(f"<p>{TEXT}</p>"), page.index(f"<p>Echo: {TEXT}</p>")
        assert mine < theirs < page.index(f'<span class="mood">{MOOD}</span>') < page.index(COACHING)
        assert page.index(COACHING) < page.index("</li>", theirs)

        # a resend of the same submission gets the saved turn back with its mood and hints
        resent = sse_events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=STREAM)).text)
        assert [e for e, _ in resent] == ["done"]
        assert resent[0][1]["replayed"] and resent[0][1]["mood"] == MOOD
        assert resent[0][1]["suggested_actions"] == HINTS
        assert await count_rows(app, RehearsalTurn) == 2


async def test_a_form_turn_shows_the_mood_and_the_coaching_hints(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=HintModel()) as (app, client):
        csrf, rid = await _setup(client)
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": TEXT, "csrf": csrf,
                                                                 "submission_id": uuid.uuid4().hex})
        assert r.status_code == 303, r.text
        page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
        assert f"<p>Echo: {TEXT}</p>" in page
        assert _moods(page) == [MOOD] and _coaching(page) == HINTS and COACHING in page
        # only the agent's turn has them stored
        async with app.state.hearth.db.sessions() as s:
            rows = {t.role: t for t in (await s.execute(select(RehearsalTurn))).scalars()}
        assert rows["agent"].meta_ct is not None and rows["user"].meta_ct is None


async def test_a_turn_without_meta_or_with_one_that_does_not_open_shows_neither_and_does_not_crash(
        make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=HintModel()) as (app, client):
        csrf, rid = await _setup(client)
        for said in ("first", "second"):
            r = await client.post(f"/rehearsals/{rid}/turns", data={"message": said, "csrf": csrf})
            assert r.status_code == 303, r.text
        async with app.state.hearth.db.sessions() as s, s.begin():
            agents = (await s.execute(select(RehearsalTurn).where(RehearsalTurn.role == "agent")
                                      .order_by(RehearsalTurn.created_at))).scalars().all()
            # the first as saved before schema 0007 (no meta), the second damaged (a meta that does not open)
            await s.execute(update(RehearsalTurn).where(RehearsalTurn.id == agents[0].id).values(meta_ct=None))
            await s.execute(update(RehearsalTurn).where(RehearsalTurn.id == agents[1].id)
                            .values(meta_ct=b"\x00" * 40))
        r = await client.get(f"/rehearsals/{rid}")
        assert r.status_code == 200
        page = html.unescape(r.text)
        assert "<p>Echo: first</p>" in page and "<p>Echo: second</p>" in page
        assert _moods(page) == [] and _coaching(page) == [] and COACHING not in page
        assert "could not be read" not in page  # the message itself opens: only the hints are left out
        export = (await client.get("/account/export")).json()
        turns = export["companions"][0]["rehearsals"][0]["turns"]
        assert [(t["role"], t.get("mood"), t.get("suggested_actions")) for t in turns] == [
            ("user", None, None), ("agent", None, []), ("user", None, None), ("agent", None, [])]


async def test_the_export_has_each_agent_turn_s_mood_and_suggested_actions(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=HintModel()) as (app, client):
        csrf, rid = await _setup(client)
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": TEXT, "csrf": csrf}, headers=STREAM)
        assert sse_events(r.text)[-1][0] == "done"
        export = (await client.get("/account/export")).json()
        (rehearsal,) = export["companions"][0]["rehearsals"]
        user, agent = rehearsal["turns"]
        assert (user["role"], agent["role"]) == ("user", "agent")
        assert agent["text"] == f"Echo: {TEXT}"
        assert agent["mood"] == MOOD and agent["suggested_actions"] == HINTS
        assert len(agent["panel"]) == 5


async def test_schema_0007_upgrades_a_0006_database_keeping_its_rehearsal_turns_and_downgrades(
        database_url, master_key):
    async with database_at(database_url, "0006", master_key) as (database, user_id, cipher):
        now = datetime.now(timezone.utc)
        c, a, r = "c" * 32, "a" * 32, "r" * 32
        async with database.engine.begin() as conn:  # a rehearsal with an exchange and a reading saved at 0006
            await insert_companion(conn, user_id, c, now)
            await conn.execute(text("INSERT INTO agents (id, user_id, name_ct, personality_ct, backstory_ct, "
                                    "relationship_ct, created_at) VALUES (:a, :u, :b, :b, :b, :b, :now)"),
                               dict(a=a, u=user_id, b=b"x", now=now))
            await conn.execute(text("INSERT INTO rehearsals (id, user_id, companion_id, agent_id, created_at) "
                                    "VALUES (:r, :u, :c, :a, :now)"), dict(r=r, u=user_id, c=c, a=a, now=now))
            for i, role in enumerate(("user", "agent")):
                await conn.execute(text("INSERT INTO rehearsal_turns (id, user_id, rehearsal_id, role, body_ct, "
                                        "created_at) VALUES (:id, :u, :r, :role, :b, :now)"),
                                   dict(id=str(i) * 32, u=user_id, r=r, role=role, b=b"x", now=now))
            await conn.execute(text("INSERT INTO readings (id, user_id, turn_id, analyst, status, body_ct, "
                                    "created_at) VALUES (:id, :u, :t, 'cynic', 'ok', :b, :now)"),
                               dict(id="6" * 32, u=user_id, t="1" * 32, b=b"x", now=now))
        diff, version = await upgrade_and_compare(database)
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == HEAD
        assert await scalars(database, "select count(*) from rehearsal_turns where meta_ct is null",
                             "select count(*) from readings") == [2, 1]
        async with database.engine.begin() as conn:
            await conn.execute(text("UPDATE rehearsal_turns SET meta_ct = :m WHERE role = 'agent'"), dict(m=b"y"))
        await downgrade(database, "0006")
        assert await scalars(database, "select count(*) from rehearsal_turns",
                             "select count(*) from readings") == [2, 1]  # no copy-and-drop cascaded
        async with database.engine.connect() as conn:
            cols = await conn.run_sync(lambda sc: [col["name"] for col in inspect(sc).get_columns("rehearsal_turns")])
        assert "meta_ct" not in cols
        await upgrade_and_compare(database)
        assert await scalars(database, "select count(*) from rehearsal_turns where meta_ct is null") == [2]
        assert await scalars(database, "select count(*) from readings") == [1]
