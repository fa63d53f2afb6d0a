"""Review 52b: one user's damaged row does not stop the app from starting for everyone.

Was: a user whose wrapped data key does not open (a damaged row, a row moved to another user id), or an old comment
whose sealed body does not open, raised out of prepare() while the plain comment tones were sealed; the key check
refused the start when the one user it happened to open was that user; a rotation over such a row raised a bare
DecryptError. Now the start goes on, those rows are left exactly as they were with a warning naming the user id (no
key material), every other comment is sealed, and the next start tries again; a rotation is refused naming the users.
"""

from __future__ import annotations

import logging
import sqlite3

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import startup
from hearth.app.crypto import UserCipher, new_master_key_text
from hearth.app.feed import list_posts
from hearth.app.settings import load_settings
from hearth.app.startup import StartupError, prepare
from hearth.app.storage import create_database
from hearth.app.storage.models import Comment, User
from tests.app.app_client import signup
from tests.app.app_fakes import add_old_format_comments
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


def _damaged(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 1])  # the GCM tag no longer matches


async def _users(db) -> dict[str, tuple[str, bytes]]:
    """username: (id, wrapped data key)"""
    async with db.sessions() as s, s.begin():
        return {u.username: (u.id, u.wrapped_key) for u in (await s.execute(select(User))).scalars()}


async def _damage_key(db, user_id: str, wrapped: bytes) -> None:
    async with db.sessions() as s, s.begin():
        await s.execute(update(User).where(User.id == user_id).values(wrapped_key=_damaged(wrapped)))


def _comment_rows(sqlite_url: str) -> dict[str, tuple[str, str, bytes]]:
    con = sqlite3.connect(sqlite_url.split("///", 1)[1])
    try:
        return {i: (u, t, b) for i, u, t, b in con.execute("select id, user_id, tone, body_ct from comments")}
    finally:
        con.close()


async def _two_users_with_old_comments(make_settings, sqlite_url, master_key):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (_, client):
        await signup(client, "ann")
        await signup(client, "bob")
    db = create_database(sqlite_url)
    users = await _users(db)
    ciphers = {name: UserCipher.from_wrapped(master_key, wrapped, uid) for name, (uid, wrapped) in users.items()}
    async with db.sessions() as s:
        await add_old_format_comments(s, ciphers["ann"], [(f"ann {i}", f"tone{i}") for i in range(3)])
        await add_old_format_comments(s, ciphers["bob"], [(f"bob {i}", f"tone{i}") for i in range(2)])
    return settings, db, users, ciphers


@pytest.mark.parametrize("damaged", ["ann", "bob"])  # whichever user the key check opens first
async def test_a_user_whose_data_key_does_not_open_does_not_stop_the_start(make_settings, sqlite_url, master_key,
                                                                            master_key_text, damaged, caplog):
    settings, db, users, ciphers = await _two_users_with_old_comments(make_settings, sqlite_url, master_key)
    other = "bob" if damaged == "ann" else "ann"
    try:
        await _damage_key(db, *users[damaged])
        before = _comment_rows(sqlite_url)
        caplog.set_level(logging.WARNING, logger="hearth.app")
        for _ in range(2):  # the next start tries again, and leaves them again
            caplog.clear()
            await prepare(settings, db)  # before: DecryptError, or the key check's StartupError
            warned = [r.getMessage() for r in caplog.records if users[damaged][0] in r.getMessage()]
            assert any(f"{3 if damaged == 'ann' else 2} comments" in m for m in warned), caplog.text
            assert master_key_text not in caplog.text and _damaged(users[damaged][1]).hex() not in caplog.text
        after = _comment_rows(sqlite_url)
        mine = {i: row for i, row in before.items() if row[0] == users[damaged][0]}
        assert mine and all(after[i] == row for i, row in mine.items())  # plain tone and body untouched
        assert {row[1] for row in after.values() if row[0] == users[other][0]} == {""}
        async with db.sessions() as s:
            posts = await list_posts(s, ciphers[other])
        n = 3 if other == "ann" else 2
        assert sorted((c.text, c.tone) for c in posts[0].comments) == [(f"{other} {i}", f"tone{i}") for i in range(n)]
    finally:
        await db.dispose()


async def test_skipped_comments_do_not_hold_the_batches_up(make_settings, sqlite_url, master_key, monkeypatch):
    # the damaged user's comments come first and fill whole batches: before the fix a skip that did not move past
    # them read the same batch forever, or stopped at a batch of skipped rows leaving the rest unsealed
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (_, client):
        await signup(client, "ann")
        await signup(client, "bob")
    db = create_database(sqlite_url)
    try:
        users = await _users(db)
        ciphers = {name: UserCipher.from_wrapped(master_key, wrapped, uid) for name, (uid, wrapped) in users.items()}
        async with db.sessions() as s:
            await add_old_format_comments(s, ciphers["ann"], [(f"ann {i}", "sad") for i in range(4)],
                                          ids=[f"{i:032x}" for i in range(4)])
            await add_old_format_comments(s, ciphers["bob"], [(f"bob {i}", "glad") for i in range(3)],
                                          ids=[f"{0xf0 + i:032x}" for i in range(3)])
        await _damage_key(db, *users["ann"])
        reads, execute = [], AsyncSession.execute

        async def bounded(self, statement, *a, **kw):  # a loop that reads the same batch again fails, not hangs
            if getattr(statement, "is_select", False) and "comments.tone" in str(statement):
                reads.append(statement)
                assert len(reads) <= 10, "the batches do not move past the comments left"
            return await execute(self, statement, *a, **kw)

        monkeypatch.setattr(AsyncSession, "execute", bounded)
        assert await startup._seal_plain_tones(db, master_key, batch=2) == 3
        monkeypatch.undo()
        assert len(reads) == 4  # 2 + 2 left, 2 + 1 sealed
        rows = _comment_rows(sqlite_url)
        assert sorted(t for u, t, _ in rows.values() if u == users["ann"][0]) == ["sad"] * 4
        assert [t for u, t, _ in rows.values() if u == users["bob"][0]] == [""] * 3
    finally:
        await db.dispose()


async def test_a_comment_whose_body_does_not_open_is_left_as_it_was(make_settings, sqlite_url, master_key, caplog):
    settings, db, users, ciphers = await _two_users_with_old_comments(make_settings, sqlite_url, master_key)
    try:
        async with db.sessions() as s, s.begin():
            hurt = (await s.execute(select(Comment).where(Comment.user_id == users["ann"][0])
                                    .order_by(Comment.id).limit(1))).scalar_one()
            hurt.body_ct = _damaged(hurt.body_ct)
        before = _comment_rows(sqlite_url)
        caplog.set_level(logging.WARNING, logger="hearth.app")
        await prepare(settings, db)  # before: DecryptError out of prepare
        assert any(users["ann"][0] in r.getMessage() and "1 comments" in r.getMessage() for r in caplog.records), \
            caplog.text
        after = _comment_rows(sqlite_url)
        assert after[hurt.id] == before[hurt.id]
        assert [i for i, (_, tone, _) in after.items() if tone] == [hurt.id]  # every other comment sealed
    finally:
        await db.dispose()


async def test_a_key_check_where_no_data_key_opens_still_refuses(make_settings, sqlite_url, master_key):
    settings, db, users, _ = await _two_users_with_old_comments(make_settings, sqlite_url, master_key)
    try:
        for user_id, wrapped in users.values():
            await _damage_key(db, user_id, wrapped)
        before = _comment_rows(sqlite_url)
        with pytest.raises(StartupError, match="does not open the data key"):
            await prepare(settings, db)
        assert _comment_rows(sqlite_url) == before
    finally:
        await db.dispose()


async def test_a_rotation_over_a_damaged_row_is_refused_naming_the_user(make_settings, sqlite_url, master_key,
                                                                        master_key_text):
    settings, db, users, _ = await _two_users_with_old_comments(make_settings, sqlite_url, master_key)
    try:
        await _damage_key(db, *users["bob"])
        new = new_master_key_text()
        rotated = load_settings(None, env={"HEARTH_MASTER_KEY": new, "HEARTH_PREVIOUS_MASTER_KEY": master_key_text},
                                overrides={"var_dir": str(settings.var_dir), "database_url": sqlite_url})
        with pytest.raises(StartupError) as info:  # before: a bare DecryptError ("blob: authentication failed")
            await prepare(rotated, db)
        msg = str(info.value)
        assert users["bob"][0] in msg and users["ann"][0] not in msg and "Nothing was changed" in msg
        assert master_key_text not in msg and new not in msg
        assert await _users(db) == {"ann": users["ann"], "bob": (users["bob"][0], _damaged(users["bob"][1]))}
    finally:
        await db.dispose()
