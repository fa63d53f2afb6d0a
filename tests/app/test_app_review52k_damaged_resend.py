"""Review 52k: a resend whose saved turn (situation, rehearsal turn) was damaged between the save and the resend.

Was: the resend look-ups read the saved rows strictly, so a sealed text that no longer opened raised DecryptError out
of the app (a 500 on the form path, "The reply failed" on the streamed one). Now, when the text the resend is compared
with does not open, it cannot be told from a reused id: a 409 (the form page with the text kept, the stream's
``error``), nothing saved. When that text opens and matches but the answer saved with it does not (the reply, a
reading), the resend is answered as replayed with the unreadable part as None (the pages say "could not be read").
Either way nothing is saved a second time and the stored rows are left as they were.
"""

from __future__ import annotations

import html
import json
import re
import uuid

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Agent, Message, Reading, RehearsalTurn, Situation
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app
from tests.app.test_app_review52e_damaged_lists import _damaged, _sealed

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}
TEXT = "about Friday's talk"
CANNOT_COMPARE = "can no longer be read"


def _events(body: str) -> list[tuple[str, dict]]:
    return [(m.group(1), json.loads(m.group(2))) for m in re.finditer(r"event: (\w+)\ndata: (.*)\n", body)]


async def _flip(db, model, where, column: str) -> None:
    async with db.sessions() as s, s.begin():
        row = (await s.execute(select(model).where(*where))).scalars().first()
        setattr(row, column, _damaged(getattr(row, column)))


async def _count(db, model) -> int:
    async with db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


async def _resend(client, url: str, data: dict, stream: bool):
    return await client.post(url, data=data, headers=STREAM if stream else {})


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
@pytest.mark.parametrize("damaged", ["reply", "mine"])
async def test_a_chat_resend_whose_saved_turn_does_not_open(make_settings, sqlite_url, stream, damaged):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        assert (await client.post(f"/companions/{cid}/messages", data=data)).status_code == 303
        db = app.state.hearth.db
        role = "companion" if damaged == "reply" else "user"
        await _flip(db, Message, (Message.role == role,), "body_ct")
        stored, asked = _sealed(sqlite_url), len(model.calls)
        r = await _resend(client, f"/companions/{cid}/messages", data, stream)  # before: DecryptError (a 500)
        page = html.unescape(r.text)
        if damaged == "reply":  # answered as replayed; the reply shown as unreadable
            if stream:
                events = _events(r.text)
                assert [e for e, _ in events] == ["done"], r.text
                assert events[0][1]["replayed"] is True and events[0][1]["message"] is None
            else:
                assert r.status_code == 303, page[-600:]
                shown = html.unescape((await client.get(f"/companions/{cid}")).text)
                assert shown.count("This message could not be read") == 1 and f"<p>{TEXT}</p>" in shown
        elif stream:  # the saved text cannot be compared with this one: refused, the page keeps the text
            assert [e for e, _ in _events(r.text)] == ["error"] and CANNOT_COMPARE in page, r.text
        else:
            assert r.status_code == 409, page[-600:]
            assert f"{TEXT}</textarea>" in page and CANNOT_COMPARE in page
        assert len(model.calls) == asked and await _count(db, Message) == 2
        assert _sealed(sqlite_url) == stored


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
@pytest.mark.parametrize("damaged", ["reading", "situation"])
async def test_a_situation_resend_whose_saved_situation_does_not_open(make_settings, sqlite_url, stream, damaged):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        data = {"situation": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        assert (await client.post(f"/companions/{cid}/situations", data=data)).status_code == 303
        db = app.state.hearth.db
        if damaged == "reading":
            await _flip(db, Reading, (Reading.analyst == "cynic",), "body_ct")
        else:
            await _flip(db, Situation, (), "text_ct")
        stored, asked = _sealed(sqlite_url), len(model.calls)
        r = await _resend(client, f"/companions/{cid}/situations", data, stream)  # before: DecryptError
        page = html.unescape(r.text)
        if damaged == "reading":
            if stream:
                (event, done), = _events(r.text)
                assert event == "done" and done["replayed"] is True, r.text
                unread = [x for x in done["readings"] if x["reading"] is None]
                assert [x["analyst"] for x in unread] == ["cynic"] and len(done["readings"]) == 5
            else:
                assert r.status_code == 303, page[-600:]
                shown = html.unescape((await client.get(f"/companions/{cid}/simulate")).text)
                assert shown.count("This reading could not be read") == 1
        elif stream:
            assert [e for e, _ in _events(r.text)] == ["error"] and CANNOT_COMPARE in page, r.text
        else:
            assert r.status_code == 409, page[-600:]
            assert f"{TEXT}</textarea>" in page and CANNOT_COMPARE in page
        assert len(model.calls) == asked and await _count(db, Situation) == 1 and await _count(db, Reading) == 5
        assert _sealed(sqlite_url) == stored


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
@pytest.mark.parametrize("damaged", ["agent", "user"])
async def test_a_rehearsal_resend_whose_saved_turn_does_not_open(make_settings, sqlite_url, stream, damaged):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "my brother",
                                               "relationship": "sibling", "companion_id": cid, "csrf": csrf})
        assert r.status_code == 303
        db = app.state.hearth.db
        async with db.sessions() as s:
            agent = (await s.execute(select(Agent.id))).scalar_one()
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent, "csrf": csrf})
        rid = r.headers["location"].rsplit("/", 1)[1]
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        assert (await client.post(f"/rehearsals/{rid}/turns", data=data)).status_code == 303
        await _flip(db, RehearsalTurn, (RehearsalTurn.role == damaged,), "body_ct")
        stored, asked = _sealed(sqlite_url), len(model.calls)
        r = await _resend(client, f"/rehearsals/{rid}/turns", data, stream)  # before: DecryptError
        page = html.unescape(r.text)
        if damaged == "agent":
            if stream:
                (event, done), = _events(r.text)
                assert event == "done" and done["replayed"] is True and done["message"] is None, r.text
            else:
                assert r.status_code == 303, page[-600:]
                shown = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
                assert shown.count("This turn could not be read") == 1
        elif stream:
            assert [e for e, _ in _events(r.text)] == ["error"] and CANNOT_COMPARE in page, r.text
        else:
            assert r.status_code == 409, page[-600:]
            assert f"{TEXT}</textarea>" in page and CANNOT_COMPARE in page
        assert len(model.calls) == asked and await _count(db, RehearsalTurn) == 2
        assert _sealed(sqlite_url) == stored
