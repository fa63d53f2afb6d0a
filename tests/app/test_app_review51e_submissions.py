"""Review 51e: a resent chat or rehearsal turn is saved once.

Was: when the connection dropped after a streamed turn was saved and the user sent the text again, the message
and a second reply were saved twice (the page only warned them to reload first). Now each send carries a
submission id (the page's script makes one per message, the no-script form gets one with the page), stored on the
turn's rows under a unique index per chat (per rehearsal); a resend with a saved id gets the saved turn back, and
two resends racing store one turn (the index decides, not a check before the insert). Clients without an id work
as before. Both backends (PostgreSQL with HEARTH_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import select, text

from hearth.app import companions, simulation
from hearth.app.storage import upgrade
from hearth.app.storage.migrate import alembic_config
from hearth.app.storage.models import Companion, Message, Reading, RehearsalTurn
from tests.app.app_client import create_companion, signup, sse_events, start_rehearsal, streams_racing
from tests.app.app_fakes import FakeModel, GatedModel
from tests.app.app_schema import HEAD, database_at, downgrade, insert_companion, scalars, upgrade_and_compare
from tests.app.conftest import count_rows, running_app, save_rehearsal_turn

pytestmark = pytest.mark.anyio
_SID = re.compile(r'name="submission_id" value="([0-9a-f]{32})"')


async def _companion(app, cid):
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(Companion).where(Companion.id == cid))).scalar_one()


# ------------------------------------------------------------------------------ the chat
async def test_a_resent_streamed_message_is_saved_once_and_gets_the_saved_turn(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        sid = uuid.uuid4().hex
        first = sse_events((await client.post(f"/companions/{cid}/messages", headers=headers,
                                           data={"message": "my name is Robin", "submission_id": sid})).text)[-1]
        # the page never got that "done" (the connection dropped) and sends the same text again
        again = sse_events((await client.post(f"/companions/{cid}/messages", headers=headers,
                                           data={"message": "my name is Robin", "submission_id": sid})).text)
        assert [e for e, _ in again] == ["done"]  # no deltas: nothing asked of the model
        done = again[0][1]
        assert done["replayed"] is True and first[1]["replayed"] is False
        for key in ("user_message_id", "reply_id", "message", "mood", "suggested_actions", "stage", "affection"):
            assert done[key] == first[1][key], key
        assert done["memories"] == []  # they were new the first time only
        assert await count_rows(app, Message) == 2  # before: 4, the message and a reply saved twice
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
        assert await count_rows(app, Message) == 2
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
        assert sse_events(r.text)[-1][0] == "done"
        assert await count_rows(app, Message) == 6  # three turns: the same text sent without an id is a new turn
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
        assert sse_events(r.text)[-1][0] == "error"
        assert await count_rows(app, Message) == 2


async def test_two_resends_racing_store_one_turn(make_settings, database_url):
    model = GatedModel(2)  # both requests are past the look-up for a saved turn when the model answers
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        dones = await streams_racing(client, f"/companions/{cid}/messages", {"message": "are you there?"}, csrf)
        assert sorted(d["replayed"] for d in dones) == [False, True]
        assert dones[0]["reply_id"] == dones[1]["reply_id"]
        assert await count_rows(app, Message) == 2
        row = await _companion(app, cid)
        assert (row.affection, row.trust) == (1, 1)  # the loser's UPDATE rolled back with its insert


# ------------------------------------------------------------------------------ rehearsals
async def test_a_resent_rehearsal_turn_is_saved_once_and_replayed(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await start_rehearsal(client, csrf, cid)
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        data = {"message": "about Friday", "submission_id": uuid.uuid4().hex}
        first = sse_events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers)).text)
        again = sse_events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers)).text)
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
        assert await count_rows(app, RehearsalTurn) == 4  # before: 8
        assert await count_rows(app, Reading) == 10
        assert len([c for c in model.calls if c[0] == "chat"]) == 2


async def test_two_rehearsal_resends_racing_store_one_turn(make_settings, database_url):
    model = GatedModel(2)
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await start_rehearsal(client, csrf, cid)
        dones = await streams_racing(client, f"/rehearsals/{rid}/turns", {"message": "about Friday"}, csrf)
        assert sorted(d["replayed"] for d in dones) == [False, True]
        assert dones[0]["turn_id"] == dones[1]["turn_id"]
        # the loser raced the winner to the save of the exchange (phase 1), before the winner's panel had read it:
        # it gets the readings saved so far, which one transaction commits (review 56), so none or all five
        assert len(next(d for d in dones if d["replayed"])["readings"]) in (0, 5)
        assert await count_rows(app, RehearsalTurn) == 2 and await count_rows(app, Reading) == 5


# ------------------------------------------------------------------------------ the schema
async def test_schema_0004_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    async with database_at(database_url, "0003", master_key) as (database, user_id, cipher):
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:  # a turn saved before 0004 (raw SQL: the model has the column)
            await insert_companion(conn, user_id, "c" * 32, now)
            for i, role in enumerate(("user", "companion")):
                await conn.execute(text("INSERT INTO messages (id, user_id, companion_id, role, body_ct, created_at) "
                                        "VALUES (:id, :u, :c, :r, :b, :now)"),
                                   dict(id=str(i) * 32, u=user_id, c="c" * 32, r=role, b=b"x", now=now))
        diff, version = await upgrade_and_compare(database)
        assert await scalars(database, "select count(*) from messages where submission_id is null") == [2]
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD

        async with database.sessions() as s:  # a rehearsal turn with readings, saved with an id
            comp = await companions.create_companion(s, cipher, persona="wren")
            agent = await simulation.create_agent(s, cipher, name="Sam", personality="p", backstory="b",
                                                  relationship="r")
            rid = await simulation.start_rehearsal(s, cipher, comp.id, agent.id)
            results = await simulation.run_panel(FakeModel(), "", "x", 5.0)
            await save_rehearsal_turn(s, cipher, rid, "hi", "hello", results, uuid.uuid4().hex)
        await downgrade(database, "0003")
        counts = await scalars(database, *(f"select count(*) from {t}"
                                           for t in ("messages", "rehearsal_turns", "readings")))
        assert counts == [2, 2, 5]  # no copy-and-drop cascaded to the readings or messages
        await upgrade(database.engine)
