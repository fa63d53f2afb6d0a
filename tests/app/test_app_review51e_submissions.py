"""Review 51e: a resent chat or rehearsal turn is saved once.

Was: when the connection dropped after a streamed turn was saved and the user sent the text again, the message
and a second reply were saved twice (the page only warned them to reload first). Now each send carries a
submission id (the page's script makes one per message, the no-script form gets one with the page), stored on the
turn's rows under a unique index per chat (per rehearsal); a resend with a saved id gets the saved turn back, and
two resends racing store one turn (the index decides, not a check before the insert). Clients without an id work
as before. Both backends (PostgreSQL with HEARTH_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, select, text

from hearth.app import accounts, companions, crypto, simulation
from hearth.app.storage import create_database, upgrade
from hearth.app.storage.migrate import alembic_config
from hearth.app.storage.models import Base, Companion, Message, Reading, RehearsalTurn, User
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel, GatedModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
_SID = re.compile(r'name="submission_id" value="([0-9a-f]{32})"')


def _events(body: str) -> list[tuple[str, dict]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def _count(app, model, *where) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model).where(*where))).scalar_one()


async def _companion(app, cid):
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(Companion).where(Companion.id == cid))).scalar_one()


async def _rehearsal(client, csrf, cid) -> str:
    r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "a colleague",
                                           "relationship": "coworker", "companion_id": cid, "csrf": csrf})
    assert r.status_code == 303, r.text
    page = (await client.get(f"/companions/{cid}/simulate")).text
    agent_id = re.search(r'<select name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
    return r.headers["location"].rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------ the chat
async def test_a_resent_streamed_message_is_saved_once_and_gets_the_saved_turn(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        sid = uuid.uuid4().hex
        first = _events((await client.post(f"/companions/{cid}/messages", headers=headers,
                                           data={"message": "my name is Robin", "submission_id": sid})).text)[-1]
        # the page never got that "done" (the connection dropped) and sends the same text again
        again = _events((await client.post(f"/companions/{cid}/messages", headers=headers,
                                           data={"message": "my name is Robin", "submission_id": sid})).text)
        assert [e for e, _ in again] == ["done"]  # no deltas: nothing asked of the model
        done = again[0][1]
        assert done["replayed"] is True and first[1]["replayed"] is False
        for key in ("user_message_id", "reply_id", "message", "mood", "suggested_actions", "stage", "affection"):
            assert done[key] == first[1][key], key
        assert done["memories"] == []  # they were new the first time only
        assert await _count(app, Message) == 2  # before: 4, the message and a reply saved twice
        assert len([c for c in model.calls if c[0] == "chat"]) == 1
        row = await _companion(app, cid)
        assert (row.affection, row.trust) == (1, 1)


async def test_the_no_script_form_carries_an_id_and_a_resubmission_is_saved_once(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        page = (await client.get(f"/companions/{cid}")).text
        sid = _SID.search(page).group(1)  # before: no such field in the form
        form = {"message": "hello", "csrf": csrf, "submission_id": sid}
        for _ in range(2):  # the browser posts the form again (the first answer was lost)
            r = await client.post(f"/companions/{cid}/messages", data=form)
            assert r.status_code == 303 and r.headers["location"] == f"/companions/{cid}#bottom"
        assert await _count(app, Message) == 2
        page = (await client.get(f"/companions/{cid}")).text
        assert page.count("Echo: hello") == 1
        assert _SID.search(page).group(1) != sid  # the next message gets a new id


async def test_clients_without_an_id_work_as_before(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        for data in ({"message": "hi", "csrf": csrf}, {"message": "hi", "csrf": csrf, "submission_id": ""}):
            assert (await client.post(f"/companions/{cid}/messages", data=data)).status_code == 303
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hi"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert _events(r.text)[-1][0] == "done"
        assert await _count(app, Message) == 6  # three turns: the same text sent without an id is a new turn
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hi", "csrf": csrf,
                                                                   "submission_id": "not-an-id"})
        assert r.status_code == 400 and "submission_id" in r.text


async def test_an_id_reused_for_another_message_keeps_that_message(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        assert (await client.post(f"/companions/{cid}/messages", data={"message": "first", "csrf": csrf,
                                                                       "submission_id": sid})).status_code == 303
        r = await client.post(f"/companions/{cid}/messages", data={"message": "second", "csrf": csrf,
                                                                   "submission_id": sid})
        assert r.status_code == 409 and "second</textarea>" in r.text and "submission_id" in r.text
        r = await client.post(f"/companions/{cid}/messages", data={"message": "second", "submission_id": sid},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert _events(r.text)[-1][0] == "error"
        assert await _count(app, Message) == 2


async def test_two_resends_racing_store_one_turn(make_settings, database_url):
    model = GatedModel(2)  # both requests are past the look-up for a saved turn when the model answers
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        data = {"message": "are you there?", "submission_id": uuid.uuid4().hex}
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        answers = await asyncio.gather(*(client.post(f"/companions/{cid}/messages", data=data, headers=headers)
                                         for _ in range(2)))
        dones = [_events(r.text)[-1] for r in answers]
        assert [e for e, _ in dones] == ["done", "done"], [r.text for r in answers]
        assert sorted(d["replayed"] for _, d in dones) == [False, True]
        assert dones[0][1]["reply_id"] == dones[1][1]["reply_id"]
        assert await _count(app, Message) == 2
        row = await _companion(app, cid)
        assert (row.affection, row.trust) == (1, 1)  # the loser's UPDATE rolled back with its insert


# ------------------------------------------------------------------------------ rehearsals
async def test_a_resent_rehearsal_turn_is_saved_once_and_replayed(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await _rehearsal(client, csrf, cid)
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        data = {"message": "about Friday", "submission_id": uuid.uuid4().hex}
        first = _events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers)).text)
        again = _events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers)).text)
        assert [e for e, _ in again] == ["done"]
        done = again[0][1]
        assert done["replayed"] is True and done["turn_id"] == first[-1][1]["turn_id"]
        assert done["message"] == dict(first)["reply"]["message"]
        assert sorted(r["analyst"] for r in done["readings"]) == sorted(d["analyst"] for e, d in first if e == "reading")
        # and the no-script form, posted twice with the page's id
        page = (await client.get(f"/rehearsals/{rid}")).text
        form = {"message": "about Monday", "csrf": csrf, "submission_id": _SID.search(page).group(1)}
        for _ in range(2):
            assert (await client.post(f"/rehearsals/{rid}/turns", data=form)).status_code == 303
        assert await _count(app, RehearsalTurn) == 4  # before: 8
        assert await _count(app, Reading) == 10
        assert len([c for c in model.calls if c[0] == "chat"]) == 2


async def test_two_rehearsal_resends_racing_store_one_turn(make_settings, database_url):
    model = GatedModel(2)
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await _rehearsal(client, csrf, cid)
        data = {"message": "about Friday", "submission_id": uuid.uuid4().hex}
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        answers = await asyncio.gather(*(client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers)
                                         for _ in range(2)))
        dones = [_events(r.text)[-1] for r in answers]
        assert [e for e, _ in dones] == ["done", "done"], [r.text for r in answers]
        assert sorted(d["replayed"] for _, d in dones) == [False, True]
        assert dones[0][1]["turn_id"] == dones[1][1]["turn_id"]
        assert len(next(d for _, d in dones if d["replayed"])["readings"]) == 5
        assert await _count(app, RehearsalTurn) == 2 and await _count(app, Reading) == 5


# ------------------------------------------------------------------------------ the schema
async def test_schema_0004_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    database = create_database(database_url)
    try:
        await upgrade(database.engine, "0003")
        async with database.sessions() as s:
            new = await accounts.signup(s, username="alice", password="correct horse battery",
                                        master_key=master_key, ttl_s=60)
        async with database.sessions() as s:
            user = (await s.execute(select(User).where(User.id == new.user_id))).scalar_one()
        cipher = crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:  # a turn saved before 0004 (raw SQL: the model has the column)
            await conn.execute(text("INSERT INTO companions (id, user_id, name_ct, persona_ct, world_view, share_context,"
                                    " affection, trust, chat_epoch, created_at) VALUES (:c, :u, :b, :b, 'grounded',"
                                    " true, 0, 0, 0, :now)"), dict(c="c" * 32, u=user.id, b=b"x", now=now))
            for i, role in enumerate(("user", "companion")):
                await conn.execute(text("INSERT INTO messages (id, user_id, companion_id, role, body_ct, created_at) "
                                        "VALUES (:id, :u, :c, :r, :b, :now)"),
                                   dict(id=str(i) * 32, u=user.id, c="c" * 32, r=role, b=b"x", now=now))
        await upgrade(database.engine)
        async with database.engine.connect() as conn:
            diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
            version = (await conn.execute(text("select version_num from alembic_version"))).scalar_one()
            assert (await conn.execute(text("select count(*) from messages where submission_id is null"))
                    ).scalar_one() == 2
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == ScriptDirectory.from_config(alembic_config()).get_current_head() == "0005"

        async with database.sessions() as s:  # a rehearsal turn with readings, saved with an id
            comp = await companions.create_companion(s, cipher, persona="wren")
            agent = await simulation.create_agent(s, cipher, name="Sam", personality="p", backstory="b",
                                                  relationship="r")
            rid = await simulation.start_rehearsal(s, cipher, comp.id, agent.id)
            results = await simulation.run_panel(FakeModel(), "", "x", 5.0)
            await simulation.save_rehearsal_turn(s, cipher, rid, "hi", "hello", results, uuid.uuid4().hex)
        async with database.engine.begin() as conn:
            await conn.run_sync(lambda c: command.downgrade(alembic_config(c), "0003"))
        async with database.engine.connect() as conn:  # no copy-and-drop cascaded to the readings or messages
            counts = [(await conn.execute(text(f"select count(*) from {t}"))).scalar_one()
                      for t in ("messages", "rehearsal_turns", "readings")]
        assert counts == [2, 2, 5]
        await upgrade(database.engine)
    finally:
        await database.dispose()
