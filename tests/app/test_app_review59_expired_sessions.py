"""Review 59: expired sessions of a user who never comes back were kept for ever (a login deleted only its own user's
expired sessions). Every new session (a login's, a signup's) now deletes up to a batch of expired sessions of any
user (accounts.sweep_expired_sessions); live sessions are kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from hearth.app import accounts
from hearth.app.storage.models import Session, utcnow
from tests.app.app_users import PASSWORD, signed_up

pytestmark = pytest.mark.anyio


async def _expire(db, user_id: str) -> None:
    async with db.sessions() as s, s.begin():
        await s.execute(update(Session).where(Session.user_id == user_id)
                        .values(expires_at=utcnow() - timedelta(hours=1)))


async def _sessions(db, user_id: str, *, expired: bool) -> int:
    now = utcnow()
    async with db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(Session).where(
            Session.user_id == user_id, Session.expires_at <= now if expired else Session.expires_at > now))
        ).scalar_one()


async def test_a_login_deletes_the_expired_sessions_of_a_user_who_never_came_back(db, master_key):
    bob, _ = await signed_up(db, master_key, "bob")
    async with db.sessions() as s:  # a second device of bob's
        assert await accounts.login(s, username="bob", password=PASSWORD, ttl_s=3600) is not None
    await _expire(db, bob.id)  # bob never comes back
    carol, _ = await signed_up(db, master_key, "carol")  # carol's session is live
    async with db.sessions() as s:  # signing carol up swept bob's two expired sessions
        assert await accounts.sweep_expired_sessions(s) == 0
    assert await _sessions(db, bob.id, expired=True) == 0
    await _expire(db, carol.id)
    alice, _ = await signed_up(db, master_key, "alice")
    await _expire(db, alice.id)  # the login's own user's: deleted with its new session, as before
    async with db.sessions() as s:
        assert await accounts.login(s, username="alice", password=PASSWORD, ttl_s=3600) is not None
    assert await _sessions(db, carol.id, expired=True) == 0
    assert (await _sessions(db, alice.id, expired=True), await _sessions(db, alice.id, expired=False)) == (0, 1)


async def test_a_sweep_deletes_a_bounded_batch_of_expired_sessions_and_no_live_one(db, master_key, monkeypatch):
    bob, _ = await signed_up(db, master_key, "bob")  # his signup's session is live
    async with db.sessions() as s, s.begin():
        s.add_all([accounts._session_row(bob.id, ttl_s=-60)[0] for _ in range(5)])
    monkeypatch.setattr(accounts, "SESSION_SWEEP_BATCH", 2)
    counts = []
    for _ in range(4):
        async with db.sessions() as s:
            counts.append(await accounts.sweep_expired_sessions(s))
    assert counts == [2, 2, 1, 0]
    assert (await _sessions(db, bob.id, expired=True), await _sessions(db, bob.id, expired=False)) == (0, 1)


async def test_the_sweep_finds_expired_sessions_through_an_index(db):
    """The sweep runs after every signup and login: without an index on sessions.expires_at (schema 0008) its
    search read the whole sessions table each time."""
    from sqlalchemy import text

    if db.engine.dialect.name != "sqlite":
        pytest.skip("the query plan is read with SQLite's EXPLAIN QUERY PLAN")
    async with db.engine.connect() as conn:
        plan = (await conn.execute(text("EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE expires_at <= :now LIMIT 500"),
                                   dict(now=utcnow()))).all()
    details = " ".join(str(row[-1]) for row in plan)
    assert "ix_sessions_expires_at" in details, details
