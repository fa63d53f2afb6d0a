"""Review 52d: a damaged row (its sealed bytes no longer open) seen by the user it belongs to.

Was: start-up tolerates such rows (52b), but a user whose wrapped data key does not open logged in (a session was
written) and then met a bare 500 on every page, even the logout; one post or comment whose sealed text does not open
made that user's whole feed page (and the export) a 500, hiding every other post. Now the login is refused with a
503 that says the account's data cannot be opened and to contact the operator (logged once, naming the user id, no
session written), a session that predates the damage gets the same answer as a page or JSON and can still log out;
the feed shows every other post and comment and the unreadable one as an explicit placeholder, the export gives it
as null; the stored rows are not touched.
"""

from __future__ import annotations

import html
import json
import logging
import re
import sqlite3

import pytest
from sqlalchemy import select, update

from hearth.app.crypto import UserCipher
from hearth.app.feed import list_posts
from hearth.app.storage.models import Comment, Post, Session, User
from tests.app.app_client import create_companion, login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
HTML = {"accept": "text/html"}


def _damaged(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 1])  # the GCM tag no longer matches


def _rows(sqlite_url: str, table: str) -> dict[str, bytes]:
    con = sqlite3.connect(sqlite_url.split("///", 1)[1])
    try:
        return dict(con.execute(f"select id, body_ct from {table}"))
    finally:
        con.close()


async def _user(db, name: str) -> User:
    async with db.sessions() as s, s.begin():
        return (await s.execute(select(User).where(User.username == name))).scalar_one()


async def _sessions(db, user_id: str) -> int:
    async with db.sessions() as s, s.begin():
        return len((await s.execute(select(Session.id).where(Session.user_id == user_id))).all())


async def _damage_key(db, user: User) -> None:
    async with db.sessions() as s, s.begin():
        await s.execute(update(User).where(User.id == user.id).values(wrapped_key=_damaged(user.wrapped_key)))


async def test_login_of_a_user_whose_data_key_does_not_open_is_refused_clearly(make_settings, sqlite_url,
                                                                             master_key_text, caplog):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (app, client):
        await signup(client, "ann")
        await signup(client, "bob")
        client.cookies.clear()
        db = app.state.hearth.db
        ann = await _user(db, "ann")
        await _damage_key(db, ann)
        sessions = await _sessions(db, ann.id)
        caplog.set_level(logging.WARNING, logger="hearth.app")
        r = await login(client, "ann")
        # before: 303 to / (a session written), then a 500 on every page
        assert r.status_code == 503, r.text
        assert "cannot be opened" in r.text and "operator" in r.text
        assert "hearth_session" not in r.headers.get("set-cookie", "")
        assert await _sessions(db, ann.id) == sessions  # nothing written for the refused login
        warned = [rec for rec in caplog.records if ann.id in rec.getMessage()]
        assert len(warned) == 1 and not warned[0].exc_info, caplog.text
        for secret in (master_key_text, ann.wrapped_key.hex(), _damaged(ann.wrapped_key).hex()):
            assert secret not in caplog.text and secret not in r.text
        # a wrong password says nothing about the key
        r = await login(client, "ann", "not the password at all")
        assert r.status_code == 401 and "cannot be opened" not in r.text
        # everyone else goes on as before
        r = await login(client, "bob")
        assert r.status_code == 303
        assert (await client.get("/", headers=HTML)).status_code == 200
        assert (await client.get("/feed", headers=HTML)).status_code == 200


async def test_a_session_whose_data_key_stopped_opening_gets_a_clear_answer(make_settings, sqlite_url, caplog):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (app, client):
        csrf = await signup(client, "ann")
        db = app.state.hearth.db
        ann = await _user(db, "ann")
        await _damage_key(db, ann)
        caplog.set_level(logging.WARNING, logger="hearth.app")
        page = await client.get("/feed", headers=HTML)  # before: DecryptError out of the app (a 500)
        assert page.status_code == 503 and "cannot be opened" in page.text and "operator" in page.text
        r = await client.get("/feed", headers={"accept": "application/json"})
        assert r.status_code == 503 and "cannot be opened" in r.json()["detail"]
        assert [rec.exc_info for rec in caplog.records if ann.id in rec.getMessage()] == [None, None]
        # the logout needs only the session: the user is not stuck with it
        r = await client.post("/logout", data={"csrf": csrf})
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert await _sessions(db, ann.id) == 0
        async with db.sessions() as s, s.begin():  # the damaged key itself is left as it was
            assert (await s.execute(select(User.wrapped_key).where(User.id == ann.id))).scalar_one() == \
                _damaged(ann.wrapped_key)


async def test_one_unreadable_post_or_comment_does_not_hide_the_rest_of_the_feed(make_settings, sqlite_url,
                                                                               master_key, caplog):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (app, client):
        csrf = await signup(client, "ann")
        await create_companion(client, csrf, "wren")
        await create_companion(client, csrf, "juno")
        for text in ("first post", "second post", "third post"):
            r = await client.post("/feed/posts", data={"post": text, "csrf": csrf})
            assert r.status_code == 303, r.text
        db = app.state.hearth.db
        ann = await _user(db, "ann")
        cipher = UserCipher.from_wrapped(master_key, ann.wrapped_key, ann.id)
        async with db.sessions() as s:
            posts = await list_posts(s, cipher)
        assert [p.text for p in posts] == ["third post", "second post", "first post"]
        assert [len(p.comments) for p in posts] == [2, 2, 2]
        hurt_post = posts[1].id
        async with db.sessions() as s, s.begin():
            post = await s.get(Post, hurt_post)
            post.body_ct = _damaged(post.body_ct)
            comment = (await s.execute(select(Comment).where(Comment.post_id == posts[0].id)
                                       .order_by(Comment.created_at).limit(1))).scalar_one()
            comment.body_ct = _damaged(comment.body_ct)
        stored = _rows(sqlite_url, "posts"), _rows(sqlite_url, "comments")
        caplog.set_level(logging.WARNING, logger="hearth.app")

        page = await client.get("/feed", headers=HTML)  # before: DecryptError out of the app (a 500)
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        assert "<p>third post</p>" in text and "<p>first post</p>" in text and "<p>second post</p>" not in text
        assert text.count("This post could not be read") == 1
        assert text.count("This comment could not be read") == 1
        assert len(re.findall(r'<li class="comment', page.text)) == 6  # nothing dropped: 5 comments and 1 placeholder
        assert text.count("Proud of you for: third post") == 1 and text.count("Proud of you for: first post") == 2
        assert text.count("Proud of you for: second post") == 2  # the post is unreadable, its comments are not
        assert f'id="p-{hurt_post}"' in page.text  # still there, and can be deleted
        assert any(ann.id in rec.getMessage() and "2 sealed texts" in rec.getMessage() for rec in caplog.records), \
            caplog.text

        r = await client.get("/account/export")  # before: DecryptError as well
        assert r.status_code == 200
        exported = json.loads(r.text)["posts"]
        assert [p["text"] for p in exported] == ["third post", None, "first post"]
        assert [c["text"] for c in exported[0]["comments"]] == [None, "Proud of you for: third post"]
        assert (_rows(sqlite_url, "posts"), _rows(sqlite_url, "comments")) == stored  # nothing rewritten

        r = await client.post(f"/posts/{hurt_post}/delete", data={"csrf": csrf})
        assert r.status_code == 303
        assert hurt_post not in _rows(sqlite_url, "posts")
