"""Review 51g: a situation resent to the panel is saved once.

Was: when the connection dropped after the panel's situation and readings were saved and the user asked the panel
again, the five analysts were asked again and the situation was saved twice with its readings (the page only told
them to reload first); the form without the script, posted again, did the same. Now each send carries a submission
id (the page's script makes one per situation, the no-script form gets one with the page), stored on the situation
under a unique index per companion (schema 0005); a resend with a saved id gets the saved situation back, and two
resends racing store one situation (the index decides). Clients without an id work as before. Both backends
(PostgreSQL with HEARTH_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import select, text

from hearth import prompts
from hearth.app import simulation
from hearth.app.storage import upgrade
from hearth.app.storage.models import Reading, Situation
from tests.app.app_client import create_companion, forms_racing, signup, sse_events, start_rehearsal, streams_racing
from tests.app.app_fakes import FakeModel, GatedModel
from tests.app.app_schema import HEAD, database_at, downgrade, insert_companion, scalars, upgrade_and_compare
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
_SID = re.compile(r'name="submission_id" value="([0-9a-f]{32})"')
_STREAM = {"accept": "text/event-stream"}


def _analyst_calls(model) -> int:
    return len([c for c in model.calls if c[0] != "chat"])


async def test_a_resent_streamed_situation_is_saved_once_and_gets_the_saved_panel(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        headers = {**_STREAM, "x-csrf-token": csrf}
        data = {"situation": "Priya ignored my email.", "submission_id": uuid.uuid4().hex}
        first = sse_events((await client.post(f"/companions/{cid}/situations", data=data, headers=headers)).text)
        assert first[-1][0] == "done" and "replayed" not in first[-1][1]
        # the page never got that "done" (the connection dropped) and asks the panel again with the same text
        again = sse_events((await client.post(f"/companions/{cid}/situations", data=data, headers=headers)).text)
        assert [e for e, _ in again] == ["done"]  # no readings streamed: no analyst asked again
        done = again[0][1]
        assert done["replayed"] is True and done["situation_id"] == first[-1][1]["situation_id"]
        assert done["failed"] == 0
        assert done["readings"] == sorted((d for e, d in first if e == "reading"),
                                          key=lambda r: prompts.ANALYSTS.index(r["analyst"]))
        assert await count_rows(app, Situation) == 1  # before: 2, and 10 readings
        assert await count_rows(app, Reading) == 5
        assert _analyst_calls(model) == 5


async def test_the_no_script_form_carries_an_id_and_a_resubmission_is_saved_once(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        page = (await client.get(f"/companions/{cid}/simulate")).text
        sid = _SID.search(page).group(1)  # before: no such field in the form
        form = {"situation": "My sister cancelled again.", "csrf": csrf, "submission_id": sid}
        locations = set()
        for _ in range(2):  # the browser posts the form again (the first answer was lost)
            r = await client.post(f"/companions/{cid}/situations", data=form)
            assert r.status_code == 303, r.text
            locations.add(r.headers["location"])
        assert await count_rows(app, Situation) == 1 and await count_rows(app, Reading) == 5
        assert _analyst_calls(model) == 5
        (saved_id,) = [row for row in (await _situation_ids(app))]
        assert locations == {f"/companions/{cid}/simulate#s-{saved_id}"}
        page = (await client.get(f"/companions/{cid}/simulate")).text
        assert page.count('<p class="quote">My sister cancelled again.</p>') == 1
        assert _SID.search(page).group(1) != sid  # the next situation gets a new id


async def _situation_ids(app) -> list[str]:
    async with app.state.hearth.db.sessions() as s:
        return list((await s.execute(select(Situation.id))).scalars())


async def test_ask_the_panel_again_is_a_new_situation_with_its_own_id(make_settings, sqlite_url):
    model = FakeModel(fail={"cynic"})  # a failed reading: the situation offers "Ask the panel again"
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        for text_ in ("first", "second"):
            assert (await client.post(f"/companions/{cid}/situations",
                                      data={"situation": text_, "csrf": csrf})).status_code == 303
        page = (await client.get(f"/companions/{cid}/simulate")).text
        forms = re.findall(r'<form[^>]*class="inline retry-situation">(.*?)</form>', page, re.S)
        ids = [_SID.search(f).group(1) for f in forms]
        assert len(ids) == 2 and len({*ids, _SID.search(page).group(1)}) == 3
        form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', forms[0]))
        for _ in range(2):  # posted twice: one new situation, and the first is kept
            assert (await client.post(f"/companions/{cid}/situations", data=form)).status_code == 303
        assert await count_rows(app, Situation) == 3


async def test_clients_without_an_id_work_as_before(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        for data in ({"situation": "hi", "csrf": csrf}, {"situation": "hi", "csrf": csrf, "submission_id": ""}):
            assert (await client.post(f"/companions/{cid}/situations", data=data)).status_code == 303
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "hi"},
                              headers={**_STREAM, "x-csrf-token": csrf})
        assert sse_events(r.text)[-1][0] == "done"
        assert await count_rows(app, Situation) == 3  # the same text sent without an id is a new situation
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "hi", "csrf": csrf,
                                                                     "submission_id": "not-an-id"})
        assert r.status_code == 400 and "submission_id" in r.text
        assert await count_rows(app, Situation) == 3


async def test_an_id_reused_for_another_situation_keeps_that_situation(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        assert (await client.post(f"/companions/{cid}/situations", data={"situation": "first", "csrf": csrf,
                                                                         "submission_id": sid})).status_code == 303
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "second", "csrf": csrf,
                                                                     "submission_id": sid})
        assert r.status_code == 409 and "second</textarea>" in r.text and "submission_id" in r.text
        assert _SID.search(r.text).group(1) != sid  # sent again from that page, it goes under a new id
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "second", "submission_id": sid},
                              headers={**_STREAM, "x-csrf-token": csrf})
        assert [e for e, _ in sse_events(r.text)] == ["error"] and "submission_id" in r.text
        assert await count_rows(app, Situation) == 1 and _analyst_calls(model) == 5


async def test_another_users_companion_is_not_found_whatever_the_id(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        assert (await client.post(f"/companions/{cid}/situations", data={"situation": "mine", "csrf": csrf,
                                                                         "submission_id": sid})).status_code == 303
        client.cookies.clear()
        csrf = await signup(client, "mallory")
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "mine", "csrf": csrf,
                                                                     "submission_id": sid})
        assert r.status_code == 404  # not alice's situation, replayed
        assert await count_rows(app, Situation) == 1


async def test_two_resends_racing_store_one_situation(make_settings, database_url):
    model = GatedModel(10, kind="analyst")  # both panels are past the look-up for a saved situation when the analysts answer
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        dones = await streams_racing(client, f"/companions/{cid}/situations", {"situation": "Priya ignored my email."},
                                     csrf)
        assert sorted(d.get("replayed", False) for d in dones) == [False, True]
        assert dones[0]["situation_id"] == dones[1]["situation_id"]
        assert len(next(d for d in dones if d.get("replayed"))["readings"]) == 5
        assert await count_rows(app, Situation) == 1 and await count_rows(app, Reading) == 5


async def test_two_form_resends_racing_store_one_situation(make_settings, database_url):
    model = GatedModel(10, kind="analyst")
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        data = {"situation": "Priya ignored my email.", "csrf": csrf, "submission_id": uuid.uuid4().hex}
        answers = await asyncio.gather(*(client.post(f"/companions/{cid}/situations", data=data)
                                         for _ in range(2)))
        assert [r.status_code for r in answers] == [303, 303], [r.text for r in answers]
        assert answers[0].headers["location"] == answers[1].headers["location"]
        assert await count_rows(app, Situation) == 1 and await count_rows(app, Reading) == 5


async def test_schema_0005_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    async with database_at(database_url, "0004", master_key) as (database, user_id, cipher):
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:  # a situation saved before 0005 (raw SQL: the model has the column)
            await insert_companion(conn, user_id, "c" * 32, now)
            await conn.execute(text("INSERT INTO situations (id, user_id, companion_id, text_ct, created_at) "
                                    "VALUES (:id, :u, :c, :b, :now)"), dict(id="5" * 32, u=user_id, c="c" * 32,
                                                                            b=b"x", now=now))
            await conn.execute(text("INSERT INTO readings (id, user_id, situation_id, analyst, status, body_ct, "
                                    "created_at) VALUES (:id, :u, :s, 'cynic', 'ok', :b, :now)"),
                               dict(id="6" * 32, u=user_id, s="5" * 32, b=b"x", now=now))
        diff, version = await upgrade_and_compare(database)
        assert await scalars(database, "select count(*) from situations where submission_id is null") == [1]
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == HEAD

        async with database.sessions() as s:  # two situations with an id, one without, in the same chat
            results = await simulation.run_panel(FakeModel(), "", "x", 5.0)
            for sid in (uuid.uuid4().hex, uuid.uuid4().hex, None):
                await simulation.store_situation(s, cipher, "c" * 32, "x", results, sid)
        await downgrade(database, "0004")
        counts = await scalars(database, *(f"select count(*) from {t}" for t in ("situations", "readings")))
        assert counts == [4, 16]  # no copy-and-drop cascaded to the readings
        await upgrade(database.engine)


async def test_two_forms_racing_with_one_id_and_two_texts_keep_the_second_text(make_settings, database_url):
    model = GatedModel(10, kind="analyst")  # both are past the look-up when they save: the index refuses the second, read back
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        refused = await forms_racing(client, f"/companions/{cid}/situations", "situation", ("first", "second"), csrf)
        kept = "second" if "second</textarea>" in refused.text else "first"
        assert f"{kept}</textarea>" in refused.text and "submission_id" in refused.text
        assert await count_rows(app, Situation) == 1 and await count_rows(app, Reading) == 5


async def test_two_rehearsal_forms_racing_with_one_id_and_two_texts_keep_the_second_text(make_settings, database_url):
    # was: the refused one's page read the viewer's rows its rollback had expired (MissingGreenlet, a 500)
    async with running_app(make_settings(database_url), model=GatedModel(2)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await start_rehearsal(client, csrf, cid)
        refused = await forms_racing(client, f"/rehearsals/{rid}/turns", "message", ("about Friday", "about Monday"),
                                     csrf)
        assert re.search(r"about (Friday|Monday)</textarea>", refused.text) and "submission_id" in refused.text
        assert await count_rows(app, Reading) == 5
