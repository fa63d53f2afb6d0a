"""Review 56: a rehearsal exchange is saved before the panel reads it.

Was: the user's turn, the agent's turn and the panel's readings were saved together once the panel had finished (up to
analyst_timeout_s after the reply). A user who tapped "Talk to <companion>" while the panel read and came back before
it finished found the exchange they had seen missing from the page, with no sign it was still being saved; saying it
again (a new submission id with the page) made a second turn. Now the two turns are committed as soon as the reply is
final, and the readings in a transaction of their own when the panel finishes; the page shows an agent turn without
readings as still being read (or, once older than the panel can take, as read without its readings saved). The
analysts are held with events, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy import text as sql_text

from hearth.app.storage.models import Reading, Rehearsal, RehearsalTurn
from tests.app.app_client import create_companion, signup, sse_events, start_rehearsal
from tests.app.app_fakes import FakeModel
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
STREAM = {"accept": "text/event-stream"}
TEXT = "I need Friday off"
PENDING = "The panel is still reading this exchange"
NOT_SAVED = "readings of this exchange were not saved"


class PanelHeld(FakeModel):
    """Answers the agent at once; holds every analyst until ``release`` (``reading`` is set once all five are
    asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked, self.reading, self.release = 0, asyncio.Event(), asyncio.Event()

    async def complete(self, messages, *, kind, **kw):
        if kind == "analyst":
            self.asked += 1
            if self.asked == 5:
                self.reading.set()
            await self.release.wait()
        return await super().complete(messages, kind=kind, **kw)


async def _setup(client) -> tuple[str, str]:
    csrf = await signup(client, "alice")
    cid = await create_companion(client, csrf)
    return csrf, await start_rehearsal(client, csrf, cid)


async def _wait(task: asyncio.Task, event: asyncio.Event) -> None:
    """Until ``event`` is set; fails at once when ``task`` (the turn) ended first."""
    waiter = asyncio.create_task(event.wait())
    await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert event.is_set(), (task.result().text[-600:] if task.done() else "the panel was never asked")
    waiter.cancel()


@contextlib.asynccontextmanager
async def _panel_reading(client, model: PanelHeld, rid: str, data: dict, headers: dict | None = None):
    """A turn posted and held while the panel reads it (all five analysts asked): yields the turn's task; on the way
    out, whatever happened inside, the analysts are released (the caller awaits the task)."""
    turn = asyncio.create_task(client.post(f"/rehearsals/{rid}/turns", data=data, headers=headers or {}))
    try:
        await _wait(turn, model.reading)
        yield turn
    finally:
        model.release.set()


async def test_while_the_panel_reads_the_page_shows_the_exchange_pending_and_a_resend_saves_no_second_turn(
        make_settings, sqlite_url):
    model = PanelHeld()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf, rid = await _setup(client)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        async with _panel_reading(client, model, rid, data, STREAM) as turn:
            # the user went to the companion and came back: the exchange is there, marked as still being read
            page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
            assert f"<p>{TEXT}</p>" in page and f"<p>Echo: {TEXT}</p>" in page, page[-1500:]
            assert PENDING in page and NOT_SAVED not in page
            assert 'class="reading' not in page
            # the same submission again (the page's script resends a turn it never heard back about): the saved
            # turn comes back, nothing saved twice, the model not asked again
            chats = sum(kind == "chat" for kind, _ in model.calls)
            resent = await client.post(f"/rehearsals/{rid}/turns", data=data, headers=STREAM)
            events = sse_events(resent.text)
            assert [e for e, _ in events] == ["done"], resent.text
            assert events[0][1]["replayed"] and events[0][1]["message"] == f"Echo: {TEXT}"
            assert events[0][1]["readings"] == []
            assert sum(kind == "chat" for kind, _ in model.calls) == chats
            assert await count_rows(app, RehearsalTurn) == 2
            assert await count_rows(app, Reading) == 0
        events = sse_events((await turn).text)
        assert [e for e, _ in events if e != "delta"] == ["reply"] + ["reading"] * 5 + ["done"]
        assert not events[-1][1]["replayed"] and events[-1][1]["total"] == 5
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 5)


async def test_once_the_panel_has_read_the_page_shows_the_readings_and_no_pending_note(make_settings, sqlite_url):
    model = PanelHeld()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf, rid = await _setup(client)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        async with _panel_reading(client, model, rid, data, STREAM) as turn:
            assert PENDING in (await client.get(f"/rehearsals/{rid}")).text
        done = sse_events((await turn).text)[-1]
        assert done[0] == "done" and done[1]["ok"] == 5
        page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
        assert page.count('class="reading ok"') == 5 and "Panel (5/5)" in page
        assert PENDING not in page and NOT_SAVED not in page
        # a resend now gets the readings with the turn
        resent = sse_events((await client.post(f"/rehearsals/{rid}/turns", data=data, headers=STREAM)).text)
        assert resent[0][1]["replayed"] and len(resent[0][1]["readings"]) == 5
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 5)


async def test_an_exchange_older_than_the_panel_can_take_without_readings_says_they_were_not_saved(
        make_settings, sqlite_url):
    """The process stopped while the panel read: the exchange stays, its readings never come."""
    model = PanelHeld()
    settings = make_settings(sqlite_url)
    async with running_app(settings, model=model) as (app, client):
        csrf, rid = await _setup(client)
        async with _panel_reading(client, model, rid, {"message": TEXT, "csrf": csrf}, STREAM) as turn:
            async with app.state.hearth.db.sessions() as s, s.begin():  # as if it was said long ago
                old = timedelta(seconds=settings.analyst_timeout_s + 120)
                for row in (await s.execute(select(RehearsalTurn))).scalars():
                    await s.execute(update(RehearsalTurn).where(RehearsalTurn.id == row.id)
                                    .values(created_at=row.created_at - old))
            page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
            assert f"<p>Echo: {TEXT}</p>" in page and NOT_SAVED in page and PENDING not in page
        await turn


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "form"])
async def test_a_rehearsal_deleted_while_the_panel_reads_leaves_no_readings_and_no_orphans(make_settings, sqlite_url,
                                                                                          stream):
    model = PanelHeld()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf, rid = await _setup(client)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        async with _panel_reading(client, model, rid, data, STREAM if stream else {}) as turn:
            assert await count_rows(app, RehearsalTurn) == 2
            assert (await client.post(f"/rehearsals/{rid}/delete", data={"csrf": csrf})).status_code == 303
        answer = await turn
        if stream:  # the panel's readings still reach the page, then "done": nothing failed for the user
            events = sse_events(answer.text)
            assert [e for e, _ in events if e != "delta"] == ["reply"] + ["reading"] * 5 + ["done"], answer.text
        else:
            assert answer.status_code == 303, answer.text[-600:]
            assert (await client.get(answer.headers["location"])).status_code == 404
        assert await count_rows(app, Rehearsal) == 0
        assert await count_rows(app, RehearsalTurn) == 0
        assert await count_rows(app, Reading) == 0
        async with app.state.hearth.db.sessions() as s:  # no reading without a parent
            assert (await s.execute(select(func.count()).select_from(Reading)
                                    .where(Reading.turn_id.is_(None),
                                           Reading.situation_id.is_(None)))).scalar_one() == 0


async def test_the_form_path_saves_the_exchange_and_its_readings(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=FakeModel()) as (app, client):
        csrf, rid = await _setup(client)
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        r = await client.post(f"/rehearsals/{rid}/turns", data=data)
        assert r.status_code == 303 and r.headers["location"] == f"/rehearsals/{rid}#bottom"
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 5)
        page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
        assert f"<p>{TEXT}</p>" in page and f"<p>Echo: {TEXT}</p>" in page
        assert page.count('class="reading ok"') == 5 and PENDING not in page and NOT_SAVED not in page
        again = await client.post(f"/rehearsals/{rid}/turns", data=data)  # the form resent: the same turn
        assert again.status_code == 303
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 5)


async def test_the_form_path_saves_the_exchange_before_the_panel_reads(make_settings, sqlite_url):
    model = PanelHeld()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf, rid = await _setup(client)
        async with _panel_reading(client, model, rid, {"message": TEXT, "csrf": csrf}) as turn:
            page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
            assert f"<p>Echo: {TEXT}</p>" in page and PENDING in page
        assert (await turn).status_code == 303
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 5)


async def test_readings_that_cannot_be_saved_leave_the_exchange_saved_and_the_stream_says_so(make_settings, sqlite_url,
                                                                                            monkeypatch):
    from hearth.app import simulation

    async def broken(*args, **kw):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(simulation, "save_turn_readings", broken)
    async with running_app(make_settings(sqlite_url), model=FakeModel()) as (app, client):
        csrf, rid = await _setup(client)
        answer = await client.post(f"/rehearsals/{rid}/turns", data={"message": TEXT, "csrf": csrf}, headers=STREAM)
        events = sse_events(answer.text)
        assert [e for e, _ in events if e != "delta"] == ["reply"] + ["reading"] * 5 + ["error"], answer.text
        message = events[-1][1]["message"]
        assert "could not be saved" in message and "exchange itself is saved" in message
        assert "Nothing was saved" not in message
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 0)
        page = html.unescape((await client.get(f"/rehearsals/{rid}")).text)
        assert f"<p>Echo: {TEXT}</p>" in page and PENDING in page


async def test_readings_the_database_refuses_leave_the_exchange_saved_and_the_form_page_says_so(make_settings,
                                                                                                sqlite_url):
    """Review 59: the no-script form's turn answered 500 when the readings could not be saved, though the exchange
    was; it now shows the rehearsal page with the exchange and says that only its readings are not saved, as the
    stream does (simulation.readings_or_kept_exchange), the box empty."""
    async with running_app(make_settings(sqlite_url), model=FakeModel()) as (app, client):
        csrf, rid = await _setup(client)
        async with app.state.hearth.db.sessions() as s, s.begin():  # the database refuses the readings
            await s.execute(sql_text("CREATE TRIGGER readings_refused BEFORE INSERT ON readings "
                                     "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"))
        data = {"message": TEXT, "csrf": csrf, "submission_id": uuid.uuid4().hex}
        answer = await client.post(f"/rehearsals/{rid}/turns", data=data)
        assert answer.status_code == 200, answer.text[-600:]
        page = html.unescape(answer.text)
        assert f"<p>{TEXT}</p>" in page and f"<p>Echo: {TEXT}</p>" in page
        assert "readings of this exchange could not be saved" in page and "exchange itself is saved" in page
        assert "Nothing was saved" not in page
        assert NOT_SAVED in page and PENDING not in page  # the turn's note agrees with the error
        assert re.search(r"<textarea[^>]*></textarea>", page), "the text is saved: it is not put back in the box"
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 0)
        again = await client.post(f"/rehearsals/{rid}/turns", data=data)  # the form resent: the saved turn
        assert again.status_code == 303
        assert (await count_rows(app, RehearsalTurn), await count_rows(app, Reading)) == (2, 0)
