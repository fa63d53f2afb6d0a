"""Review 52k: a resend that lost the race to save, and found nothing when it read the winner back.

Two submissions of one turn (same id, same text) both pass the look-up and both ask the model; the first saves, the
second's save is refused by the unique index, rolls back and reads the first's turn back (common.once_per_submission).
Was: when the chat was cleared (or the companion deleted) in the gap between that rollback and the read-back, nothing
was found and the IntegrityError went up: the form path answered a 500 (the text in the box lost), the streamed path
"The reply failed ... Nothing was saved.", as if the model had failed. Now the loser answers what happened: the chat
was cleared (the 409 chat page with the text kept / the stream's ``error`` with the words) or the companion is gone
(the 404 of a turn whose companion was deleted); nothing is saved twice. Each step is gated with events.
"""

from __future__ import annotations

import asyncio
import html
import uuid

import pytest
from sqlalchemy import func, select

from hearth.app import companions, simulation
from hearth.app.storage.models import Companion, Message, Rehearsal, RehearsalTurn, Situation
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}
TEXT = "about Friday's talk"


class HeldModel(FakeModel):
    """Holds the first ``n`` calls of ``kind`` (the resend that is to lose) until ``release``; every other call
    answers."""

    def __init__(self, kind: str = "chat", n: int = 1) -> None:
        super().__init__()
        self.kind, self.n, self.arrived = kind, n, 0
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def complete(self, messages, *, kind, **kw):
        if kind == self.kind and self.arrived < self.n:
            self.arrived += 1
            if self.arrived == self.n:
                self.held.set()
            await self.release.wait()
        return await super().complete(messages, kind=kind, **kw)


def gap_in_read_back(monkeypatch, model: HeldModel, module=companions,
                     name: str = "_turn_with_id") -> tuple[asyncio.Event, asyncio.Event]:
    """(in_gap, go): the first look-up of a saved turn after the held calls are released is the loser's read-back;
    it waits for ``go`` (the test clears or deletes meanwhile) before reading."""
    in_gap, go, original = asyncio.Event(), asyncio.Event(), getattr(module, name)

    async def find(*args):
        if model.release.is_set() and not in_gap.is_set():
            in_gap.set()
            await go.wait()
        return await original(*args)

    monkeypatch.setattr(module, name, find)
    return in_gap, go


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
@pytest.mark.parametrize("gone", ["cleared", "deleted"])
async def test_a_losing_resend_whose_winner_was_cleared_in_the_gap(make_settings, sqlite_url, monkeypatch, stream,
                                                                    gone):
    model = HeldModel()
    in_gap, go = gap_in_read_back(monkeypatch, model)
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        sid = uuid.uuid4().hex
        data = {"message": TEXT, "csrf": csrf, "submission_id": sid}
        loser = asyncio.create_task(client.post(f"/companions/{cid}/messages", data=data,
                                                headers=STREAM if stream else {}))
        await model.held.wait()
        first = await client.post(f"/companions/{cid}/messages", data=data)  # the winner: saved
        assert first.status_code == 303, first.text
        model.release.set()
        await in_gap.wait()  # the loser's save was refused and rolled back
        r = await client.post(f"/companions/{cid}/{'clear' if gone == 'cleared' else 'delete'}", data={"csrf": csrf})
        assert r.status_code == 303
        go.set()
        answer = await loser  # before: IntegrityError out of the app (form), "The reply failed" (stream)
        page = html.unescape(answer.text)
        if stream:
            assert answer.status_code == 200 and "event: error" in page and "event: done" not in page, page
            assert "The reply failed" not in page
            assert ("was cleared" in page) if gone == "cleared" else ("companion" in page and "deleted" in page)
        elif gone == "cleared":  # the chat page, the text kept in the box under a new id
            assert answer.status_code == 409, page[-600:]
            assert f"{TEXT}</textarea>" in page and "was cleared" in page
            assert f'value="{sid}"' not in page
        else:  # the companion is gone, as for a turn whose companion was deleted while the model answered
            assert answer.status_code == 404, page[-600:]
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(func.count()).select_from(Message))).scalar_one() == 0
            left = (await s.execute(select(func.count()).select_from(Companion))).scalar_one()
            assert left == (1 if gone == "cleared" else 0)
        if gone == "cleared":  # the page still works; the same text under a new id is a new turn
            again = await client.post(f"/companions/{cid}/messages",
                                      data={**data, "submission_id": uuid.uuid4().hex})
            assert again.status_code == 303


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
@pytest.mark.parametrize("gone", ["situation", "companion"])
async def test_a_losing_situation_resend_whose_winner_was_deleted_in_the_gap(make_settings, sqlite_url, monkeypatch,
                                                                             stream, gone):
    model = HeldModel("analyst", n=5)
    in_gap, go = gap_in_read_back(monkeypatch, model, simulation, "_situation_with_id")
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        data = {"situation": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        loser = asyncio.create_task(client.post(f"/companions/{cid}/situations", data=data,
                                                headers=STREAM if stream else {}))
        await model.held.wait()
        first = await client.post(f"/companions/{cid}/situations", data=data)
        assert first.status_code == 303, first.text
        model.release.set()
        await in_gap.wait()
        if gone == "situation":
            sit = first.headers["location"].rsplit("#s-", 1)[1]
            r = await client.post(f"/situations/{sit}/delete", data={"csrf": csrf, "companion_id": cid})
        else:
            r = await client.post(f"/companions/{cid}/delete", data={"csrf": csrf})
        assert r.status_code == 303
        go.set()
        answer = await loser  # before: IntegrityError out of the app (form), "could not be saved" (stream)
        page = html.unescape(answer.text)
        if stream:
            assert answer.status_code == 200 and "event: error" in page and "event: done" not in page, page
            assert "could not be saved" not in page and "deleted" in page, page
        elif gone == "situation":  # the Simulation page, the text kept in the box
            assert answer.status_code == 409, page[-600:]
            assert f"{TEXT}</textarea>" in page and "deleted" in page
        else:
            assert answer.status_code == 404, page[-600:]
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(func.count()).select_from(Situation))).scalar_one() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["form", "stream"])
async def test_a_losing_rehearsal_resend_whose_rehearsal_was_deleted_in_the_gap(make_settings, sqlite_url,
                                                                                monkeypatch, stream):
    model = HeldModel("chat")
    in_gap, go = gap_in_read_back(monkeypatch, model, simulation, "_rehearsal_turn_with_id")
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "my brother",
                                               "relationship": "sibling", "companion_id": cid, "csrf": csrf})
        assert r.status_code == 303
        async with app.state.hearth.db.sessions() as s:
            from hearth.app.storage.models import Agent
            agent = (await s.execute(select(Agent.id))).scalar_one()
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent, "csrf": csrf})
        rid = r.headers["location"].rsplit("/", 1)[1]
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        loser = asyncio.create_task(client.post(f"/rehearsals/{rid}/turns", data=data,
                                                headers=STREAM if stream else {}))
        await model.held.wait()
        first = await client.post(f"/rehearsals/{rid}/turns", data=data)
        assert first.status_code == 303, first.text
        model.release.set()
        await in_gap.wait()
        assert (await client.post(f"/rehearsals/{rid}/delete", data={"csrf": csrf})).status_code == 303
        go.set()
        answer = await loser  # before: IntegrityError out of the app (form), "The reply failed" (stream)
        page = html.unescape(answer.text)
        if stream:
            assert answer.status_code == 200 and "event: error" in page and "event: done" not in page, page
            assert "The reply failed" not in page and "deleted" in page, page
        else:  # the rehearsal is gone, as for a turn whose rehearsal was deleted while the model answered
            assert answer.status_code == 404, page[-600:]
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(func.count()).select_from(Rehearsal))).scalar_one() == 0
            assert (await s.execute(select(func.count()).select_from(RehearsalTurn))).scalar_one() == 0
