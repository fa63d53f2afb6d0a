"""Review 75: a situation's submission id sent again after the situation was deleted.

Was: post a situation with submission id X, delete it, post the same text with X again (the no-script form posted
again, an "Ask the panel again" form, the page's script resending after a lost stream): the five analysts were asked
again and the situation saved again, because a resend was recognised only by the rows saved with its id and the
delete took them. Now the delete spends the id in the same transaction (spent_situation_submissions, schema 0009: the
companion, the user and the id, no text; gone with the companion or the account), and a resend of a spent id asks
nothing and saves nothing: the form gets the Simulation page again (409) with the text kept in the box and the words,
the stream an ``error`` event, as a chat turn sent from a page loaded before a clear does. A resend that passed the
look-up before the delete and saves after it is refused at the save. Both backends (PostgreSQL with
HEARTH_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import html
import re
import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from hearth.app import simulation
from hearth.app.common import InputError
from hearth.app.storage import upgrade
from hearth.app.storage.models import Reading, Situation
from tests.app.app_client import create_companion, signup, sse_events
from tests.app.app_fakes import FakeModel
from tests.app.app_schema import HEAD, database_at, downgrade, insert_companion, scalars, upgrade_and_compare
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}
TEXT = "Priya ignored my email."
_SID = re.compile(r'name="submission_id" value="([0-9a-f]{32})"')


def _analyst_calls(model) -> int:
    return len([c for c in model.calls if c[0] == "analyst"])


async def _spent(app) -> int:
    from hearth.app.storage.models import SpentSituationSubmission

    return await count_rows(app, SpentSituationSubmission)


async def _saved_then_deleted(client, cid: str, csrf: str, sid: str) -> None:
    r = await client.post(f"/companions/{cid}/situations", data={"situation": TEXT, "csrf": csrf, "submission_id": sid})
    assert r.status_code == 303, r.text
    situation_id = r.headers["location"].rsplit("#s-", 1)[1]
    r = await client.post(f"/situations/{situation_id}/delete", data={"csrf": csrf, "companion_id": cid})
    assert r.status_code == 303, r.text


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
async def test_a_resend_of_a_deleted_situation_asks_nothing_and_saves_nothing(make_settings, database_url, stream):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        await _saved_then_deleted(client, cid, csrf, sid)
        assert _analyst_calls(model) == 5 and await count_rows(app, Situation) == 0
        if stream:
            r = await client.post(f"/companions/{cid}/situations", data={"situation": TEXT, "submission_id": sid},
                                  headers={**STREAM, "x-csrf-token": csrf})
            events = sse_events(r.text)
            assert [e for e, _ in events] == ["error"], r.text  # before: five readings, then "done"
            assert "deleted" in events[0][1]["message"]
        else:
            r = await client.post(f"/companions/{cid}/situations",
                                  data={"situation": TEXT, "csrf": csrf, "submission_id": sid})
            page = html.unescape(r.text)
            assert r.status_code == 409, page[-600:]  # before: 303, the situation saved again
            assert f"{TEXT}</textarea>" in page and "deleted" in page
            assert _SID.search(page).group(1) != sid  # sent again from that page, it is a new situation
        assert _analyst_calls(model) == 5  # before: 10
        assert await count_rows(app, Situation) == 0 and await count_rows(app, Reading) == 0
        # the same text under a new id is a new situation
        r = await client.post(f"/companions/{cid}/situations",
                              data={"situation": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex})
        assert r.status_code == 303 and await count_rows(app, Situation) == 1


async def test_a_resend_past_the_look_up_before_the_delete_is_not_saved_after_it(make_settings, database_url,
                                                                                 master_key):
    # store_situation is what a resend that found nothing saved runs once the panel has read: here the first
    # submission's situation is saved and deleted while that panel reads (the save has no look-up before it)
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        await _saved_then_deleted(client, cid, csrf, sid)
        viewer_cipher = await _cipher(app, "alice", master_key)
        results = await simulation.run_panel(FakeModel(), "", TEXT, 5.0)
        async with app.state.hearth.db.sessions() as s:
            with pytest.raises(InputError, match="deleted"):
                await simulation.store_situation(s, viewer_cipher, cid, TEXT, results, sid)
            with pytest.raises(InputError, match="deleted"):
                await simulation.saved_situation(s, viewer_cipher, cid, sid, TEXT)
        assert await count_rows(app, Situation) == 0 and await count_rows(app, Reading) == 0
        assert await _spent(app) == 1


async def _cipher(app, username: str, master_key: bytes):
    from sqlalchemy import select

    from hearth.app import crypto
    from hearth.app.storage.models import User

    async with app.state.hearth.db.sessions() as s:
        user = (await s.execute(select(User).where(User.username == username))).scalar_one()
    return crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)


async def test_the_spent_id_is_the_companions_and_the_users_only(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid, other = await create_companion(client, csrf), await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        await _saved_then_deleted(client, cid, csrf, sid)
        # the same id beside another companion is that companion's own
        r = await client.post(f"/companions/{other}/situations",
                              data={"situation": TEXT, "csrf": csrf, "submission_id": sid})
        assert r.status_code == 303
        alice_cookies = dict(client.cookies)
        client.cookies.clear()
        mallory = await signup(client, "mallory")
        r = await client.post(f"/companions/{cid}/situations", data={"situation": TEXT, "csrf": mallory,
                                                                     "submission_id": sid})
        assert r.status_code == 404 and "deleted" not in r.text  # not alice's deletes, told
        client.cookies.clear()
        client.cookies.update(alice_cookies)
        assert await _spent(app) == 1
        r = await client.post(f"/companions/{cid}/delete", data={"csrf": csrf})
        assert r.status_code == 303
        assert await _spent(app) == 0  # gone with its companion


async def test_the_spent_ids_go_with_the_account(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        await _saved_then_deleted(client, cid, csrf, uuid.uuid4().hex)
        assert await _spent(app) == 1
        r = await client.post("/account/delete", data={"csrf": csrf, "password": "correct horse battery"})
        assert r.status_code in (200, 303), r.text[-400:]
        assert await _spent(app) == 0


async def test_schema_0009_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    async with database_at(database_url, "0008", master_key) as (database, user_id, cipher):
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:
            await insert_companion(conn, user_id, "c" * 32, now)
            await conn.execute(text("INSERT INTO situations (id, user_id, companion_id, text_ct, created_at, "
                                    "submission_id) VALUES (:id, :u, :c, :b, :now, :sid)"),
                               dict(id="5" * 32, u=user_id, c="c" * 32, b=b"x", now=now, sid="a" * 32))
        diff, version = await upgrade_and_compare(database)
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == HEAD
        async with database.sessions() as s:
            await simulation.delete_situation(s, user_id, "5" * 32)
        assert await scalars(database, "select count(*) from spent_situation_submissions",
                             "select count(*) from situations") == [1, 0]
        await downgrade(database, "0008")
        assert await scalars(database, "select count(*) from companions") == [1]
        await upgrade(database.engine)
        assert await scalars(database, "select count(*) from spent_situation_submissions") == [0]
