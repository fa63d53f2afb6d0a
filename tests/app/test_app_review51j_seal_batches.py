"""Review 51j: the start-up sealing of plain comment tones goes a batch at a time.

Was: one SELECT of every old comment, all held in memory and sealed in one transaction (a large table's first
start after the upgrade). Now `batch` comments a transaction until none is left; each comment is sealed whole.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hearth.app import companions as companions_svc
from hearth.app import startup
from hearth.app.common import seal
from hearth.app.crypto import UserCipher
from hearth.app.feed import list_posts
from hearth.app.storage import create_database
from hearth.app.storage.models import Comment, Post, User, new_id, utcnow
from tests.app.app_client import signup
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
            companion = await companions_svc.create_companion(s, cipher, persona="wren")
            post = Post(id=new_id(), user_id=user.id, created_at=utcnow())
            post.body_ct = seal(cipher, post, "body_ct", "my cat died")
            async with s.begin():
                s.add(post)
                await s.flush()
                for i in range(5):  # as the version before the sealed tone wrote them
                    comment = Comment(id=new_id(), user_id=user.id, post_id=post.id, companion_id=companion.id,
                                      tone=f"tone{i}", created_at=utcnow())
                    comment.body_ct = seal(cipher, comment, "body_ct", f"comment {i}")
                    s.add(comment)

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
