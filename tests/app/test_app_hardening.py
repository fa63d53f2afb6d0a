"""Defects found by a security review: cached decrypted pages, NUL bytes reaching PostgreSQL, a spoofable
feed alert, a clear that an in-flight reply could undo."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Memory, Message, Rehearsal
from tests.app.app_client import create_companion, csrf_of, login, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def _count(app, model) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


async def test_no_page_may_be_stored_by_the_browser_or_a_proxy(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        responses = [await client.get(p) for p in ("/", f"/companions/{cid}", f"/companions/{cid}/simulate",
                                                    "/feed", "/login", "/companions/" + "0" * 32)]
        responses.append(await client.post(f"/companions/{cid}/messages", data={"message": "hi"},
                                           headers={"accept": "text/event-stream", "x-csrf-token": csrf}))
        for r in responses:
            assert r.headers.get("cache-control") == "no-store", (r.request.url, r.headers.get("cache-control"))
        assert "no-store" not in (await client.get("/static/app.css")).headers.get("cache-control", "")


async def test_nul_bytes_in_plain_columns_are_refused_not_a_500(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": "ab\x00cd", "csrf": csrf})
        assert r.status_code == 422 and "agent_id" in r.text
        assert await _count(app, Rehearsal) == 0
        client.cookies.clear()
        for name in ("ali\x00ce", "\x00"):
            assert (await login(client, name)).status_code == 401
        page = await client.get("/signup")
        r = await client.post("/signup", data={"username": "bo\x00b", "password": "correct horse battery",
                                               "csrf": csrf_of(page.text)})
        assert r.status_code == 400 and "username" in r.text


async def test_the_feed_alert_shows_a_count_never_text_from_the_link(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        await signup(client, "alice")
        spoof = "Your account is suspended. Call +1 555 0100"
        page = (await client.get("/feed", params={"failed": spoof})).text
        assert spoof not in page and "comments-failed" not in page
        for junk in ("-1", "999999", "２", "1e3"):
            assert "comments-failed" not in (await client.get("/feed", params={"failed": junk})).text
        page = (await client.get("/feed", params={"failed": "2"})).text
        assert "2 companion comments did not arrive" in page


class _GatedModel(FakeModel):
    """Holds every chat reply until ``release`` is set (the turn is in flight meanwhile)."""

    def __init__(self):
        super().__init__()
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def complete(self, messages, *, kind, **kw):
        if kind == "chat":
            self.started.set()
            await self.release.wait()
        return await super().complete(messages, kind=kind, **kw)


@pytest.mark.parametrize("streamed", [True, False])
async def test_clearing_a_chat_while_a_reply_is_in_flight_wins(make_settings, database_url, streamed):
    model = _GatedModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        model.release.set()
        await client.post(f"/companions/{cid}/messages", data={"message": "my name is Ada", "csrf": csrf})
        assert await _count(app, Message) == 2 and await _count(app, Memory) == 1
        model.release.clear()
        model.started.clear()  # else the first turn's signal lets the clear run before this turn is in flight
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf} if streamed else {"accept": "text/html"}
        turn = asyncio.create_task(client.post(f"/companions/{cid}/messages", headers=headers,
                                               data={"message": "my name is Bea", "csrf": csrf}))
        await asyncio.wait_for(model.started.wait(), 10)
        r = await client.post(f"/companions/{cid}/clear", data={"csrf": csrf})
        assert r.status_code == 303
        model.release.set()
        r = await asyncio.wait_for(turn, 10)
        # before: the in-flight turn (message, reply, memory) was saved after the clear
        assert await _count(app, Message) == 0 and await _count(app, Memory) == 0
        if streamed:
            assert "event: error" in r.text and "cleared" in r.text and "event: done" not in r.text
        else:
            assert r.status_code == 409 and "cleared" in r.text


class _FailingChat(FakeModel):
    async def complete(self, messages, *, kind, **kw):
        if kind == "chat" and self.fail_chat:
            from hearth.gateway.errors import AllProvidersFailed, UpstreamStatus
            raise AllProvidersFailed("all failed", [UpstreamStatus("fake", 503, body="upstream text")])
        return await super().complete(messages, kind=kind, **kw)

    fail_chat = False


async def test_without_javascript_failures_keep_the_text_and_save_nothing(make_settings, sqlite_url):
    from hearth import prompts
    from hearth.app.storage.models import RehearsalTurn, Situation

    model = _FailingChat(fail=set(prompts.ANALYSTS))
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        # every analyst fails: before, the empty panel was saved and the situation text lost
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "The landlord called", "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 502 and "None of the five analysts could answer" in r.text
        assert ">The landlord called</textarea>" in r.text
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "Again", "csrf": csrf},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "event: done" not in r.text
        assert await _count(app, Situation) == 0
        # a rehearsal reply that fails: the rehearsal page, with the text, not a bare 502 page
        model.fail = set()
        await client.post("/agents", data={"name": "Lee", "personality": "p", "backstory": "b", "relationship": "r",
                                           "companion_id": cid, "csrf": csrf})
        page = (await client.get(f"/companions/{cid}/simulate")).text
        import re
        agent_id = re.search(r'name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
        rid = (await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
               ).headers["location"].rsplit("/", 1)[1]
        model.fail_chat = True
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "Hello Lee", "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 502 and 'id="rehearsal-form"' in r.text and ">Hello Lee</textarea>" in r.text
        assert "The model service reported an error." in r.text and "UpstreamStatus" not in r.text
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "Hello Lee"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "upstream text" not in r.text
        assert await _count(app, RehearsalTurn) == 0
        model.fail_chat = False
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "Hello Lee"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        events = [b.split("\n", 1)[0] for b in r.text.strip().split("\n\n")]
        assert events[0] == "event: delta" and "event: reply" in events and events.count("event: reading") == 5
        assert events[-1] == "event: done" and await _count(app, RehearsalTurn) == 2
