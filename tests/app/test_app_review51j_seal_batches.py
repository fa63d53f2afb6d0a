"""Review 51j: the start-up sealing of plain comment tones goes a batch at a time.

Was: one SELECT of every old comment, all held in memory and sealed in one transaction (a large table's first
start after the upgrade). Now `batch` comments a transaction until none is left; each comment is sealed whole.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hearth.app import startup
from hearth.app.crypto import UserCipher
from hearth.app.feed import list_posts
from hearth.app.storage import create_database
from hearth.app.storage.models import Comment, User
from tests.app.app_client import signup
from tests.app.app_fakes import add_old_format_comments
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def test_plain_tones_are_sealed_a_batch_at_a_time(make_settings, sqlite_url, master_key, monkeypatch):
    settings = make_settings(sqlite_url)
    async with running_app(settings) as (_, client):
        await signup(client, "ann")
    db = create_database(sqlite_url)
    try:
        async with db.sessions() as s:
            async with s.begin():
                user = (await s.execute(User.__table__.select())).first()
            cipher = UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
            await add_old_format_comments(s, cipher, [(f"comment {i}", f"tone{i}") for i in range(5)])

        seen: list[int] = []
        execute = type(s).execute

        async def counting(self, statement, *a, **kw):
            result = await execute(self, statement, *a, **kw)
            if getattr(statement, "is_select", False) and "comments.tone" in str(statement):
                seen.append(len(result.all()))
                result = await execute(self, statement, *a, **kw)
            return result

        monkeypatch.setattr(type(s), "execute", counting)
        assert await startup._seal_plain_tones(db, master_key, batch=2) == 5
        monkeypatch.undo()
        assert seen == [2, 2, 1]  # three transactions of at most 2, not one of 5

        async with db.sessions() as s:
            async with s.begin():
                plain = (await s.execute(select(func.count()).select_from(Comment).where(Comment.tone != ""))).scalar_one()
            posts = await list_posts(s, cipher)
        assert plain == 0
        assert sorted((c.text, c.tone) for c in posts[0].comments) == [(f"comment {i}", f"tone{i}") for i in range(5)]
    finally:
        await db.dispose()
