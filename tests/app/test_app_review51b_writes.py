"""The app's write paths lose nothing the user wrote, against a real SQLite file:

- a form sent without the page's script (plain POST) whose turn cannot be answered, because no model is configured
  or the chat was cleared while the reply was written, comes back with the text in the box (a bare error page
  dropped it; only the model's own failures kept it) and saves nothing;
- the text boxes take what the server takes ([app] max_text_chars), so a browser does not cut a longer paste;
- the tone of feed comments that an older version kept in a plain column is sealed at start-up.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from hearth.app.common import unseal_json
from hearth.app.crypto import UserCipher
from hearth.app.feed import list_posts
from hearth.app.startup import prepare
from hearth.app.storage import create_database
from hearth.app.storage.models import Comment, User
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel, add_old_format_comments
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

TEXT = "I finally told my sister about the move"


def _rows(sqlite_url: str, table: str) -> int:
    con = sqlite3.connect(sqlite_url.split("///", 1)[1])
    try:
        return con.execute(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()


def _in_the_box(html: str, text: str) -> bool:
    return f">{text}</textarea>" in html


async def test_with_no_model_a_plain_form_keeps_the_text_in_the_box(make_settings, sqlite_url):
    # before: the 503 error page ("No model is configured ... Nothing was saved."), the text gone
    async with running_app(make_settings(sqlite_url), model=None) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": TEXT, "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 503 and _in_the_box(r.text, TEXT), r.text[:300]
        assert "No model is configured" in r.text

        r = await client.post(f"/companions/{cid}/situations", data={"situation": TEXT, "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 503 and _in_the_box(r.text, TEXT), r.text[:300]

        r = await client.post("/agents", data={"name": "Mum", "personality": "warm", "backstory": "b",
                                               "relationship": "mother", "companion_id": cid, "csrf": csrf})
        assert r.status_code == 303
        agents = await client.get(f"/companions/{cid}/simulate")
        agent_id = agents.text.split('<select name="agent_id"><option value="', 1)[1].split('"', 1)[0]
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
        assert r.status_code == 303, r.text
        rid = r.headers["location"].rsplit("/", 1)[-1]
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": TEXT, "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 503 and _in_the_box(r.text, TEXT), r.text[:300]

        # the streamed situation keeps its JSON error for the page's script (which keeps the text itself)
        r = await client.post(f"/companions/{cid}/situations", data={"situation": TEXT},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert r.status_code == 503 and r.json()["error"] == "No model is configured"
    for table in ("messages", "situations", "rehearsal_turns"):
        assert _rows(sqlite_url, table) == 0, table


async def test_a_chat_cleared_while_the_reply_was_written_gives_the_message_back(make_settings, sqlite_url):
    # before: the bare 409 page ("The chat was cleared ..."), the message gone
    model = FakeModel()
    entered, release = asyncio.Event(), asyncio.Event()
    answer = model.complete

    async def held(messages, **kw):
        entered.set()
        await release.wait()
        return await answer(messages, **kw)

    model.complete = held
    async with running_app(make_settings(sqlite_url), model=model) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        send = asyncio.create_task(client.post(f"/companions/{cid}/messages", data={"message": TEXT, "csrf": csrf},
                                               headers={"accept": "text/html"}))
        await entered.wait()
        assert (await client.post(f"/companions/{cid}/clear", data={"csrf": csrf})).status_code == 303
        release.set()
        r = await send
        assert r.status_code == 409 and _in_the_box(r.text, TEXT), r.text[:300]
        assert "The chat was cleared" in r.text
    assert _rows(sqlite_url, "messages") == 0


async def test_the_text_boxes_take_as_much_as_the_server(make_settings, sqlite_url):
    # before: maxlength="4000" whatever max_text_chars said; a browser cuts a longer paste without a word
    settings = make_settings(sqlite_url, max_text_chars=6000, max_body_bytes=12 * 8000 + 1024,
                             max_prompt_chars=40000)  # the budget must hold one 6,000-character message
    async with running_app(settings) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        for page, name in ((f"/companions/{cid}", "message"), ("/feed", "post"),
                           (f"/companions/{cid}/simulate", "situation")):
            html = (await client.get(page)).text
            box = html.split(f'<textarea name="{name}"', 1)[1].split(">", 1)[0]
            assert 'maxlength="6000"' in box, (page, box)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "x" * 6000, "csrf": csrf})
        assert r.status_code == 303
    assert _rows(sqlite_url, "messages") == 2


async def test_plain_comment_tones_left_by_an_older_version_are_sealed_at_start_up(make_settings, sqlite_url,
                                                                                      master_key):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (_, client):
        await signup(client, "ann")
    db = create_database(sqlite_url)
    try:
        async with db.sessions() as s:
            async with s.begin():
                user = (await s.execute(User.__table__.select())).first()
            cipher = UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
            await add_old_format_comments(s, cipher, [("I am so sorry", "grieving")])

        await prepare(settings, db)
        await prepare(settings, db)  # a second start finds nothing to do

        path = Path(sqlite_url.split("///", 1)[1])
        con = sqlite3.connect(path)
        try:
            assert con.execute("select tone from comments").fetchall() == [("",)]  # before: [("grieving",)]
        finally:
            con.close()
        assert b"grieving" not in path.read_bytes()
        async with db.sessions() as s:
            async with s.begin():
                row = (await s.execute(Comment.__table__.select())).first()
            sealed = unseal_json(cipher, Comment(id=row.id, body_ct=row.body_ct), "body_ct")
            assert sealed == {"comment": "I am so sorry", "tone": "grieving"}
            posts = await list_posts(s, cipher)
        assert [(c.text, c.tone) for c in posts[0].comments] == [("I am so sorry", "grieving")]
    finally:
        await db.dispose()
