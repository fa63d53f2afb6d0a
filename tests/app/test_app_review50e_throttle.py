"""Review 50e: a throttle row deleted by another worker in the middle of ``attempt`` / ``spend``.

Both run an INSERT ... ON CONFLICT DO NOTHING, then an UPDATE ... RETURNING and, when that matched nothing, a
SELECT of ``blocked_until``. Another worker's ``sweep`` (idle rows) or ``forget`` (a right password) may delete
the row between them (PostgreSQL, READ COMMITTED: the insert that hit the conflict does not lock the row). Before,
the update then matched nothing, was read as "blocked", and the SELECT's ``scalar_one()`` raised NoResultFound:
the login got a 500. A vanished row is a fresh bucket. The other worker's delete is interleaved here
deterministically: a hook on the session's ``execute`` runs it right after the chosen statement.
"""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts, throttle
from hearth.app.storage.models import AuthThrottle
from tests.app.app_client import csrf_of, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

T = 1_000_000.0
POLICY = throttle.Policy(free=2, base_s=10.0, max_s=100.0, window_s=1000.0)
BUDGET = throttle.Budget(failures=2, window_s=100.0)


def _vanish_after(monkeypatch, kind: str, times: int = 1, session: AsyncSession | None = None):
    """After the next ``times`` INSERTs (kind "insert") or UPDATEs ("update") on the throttle table, delete the
    row they touched, as another worker's committed sweep would. On ``session``, or every session."""
    real = AsyncSession.execute
    left = [times]

    async def execute(self, statement, *args, **kwargs):
        result = await real(self, statement, *args, **kwargs)
        if (left[0] > 0 and (session is None or self is session)
                and getattr(statement, f"is_{kind}", False) and getattr(statement.table, "name", None) == AuthThrottle.__tablename__):
            left[0] -= 1
            await real(self, delete(AuthThrottle))
        return result

    monkeypatch.setattr(AsyncSession, "execute", execute)
    return left


async def _row(s):
    async with s.begin():
        return (await s.execute(select(AuthThrottle.attempts, AuthThrottle.blocked_until))).one_or_none()


async def test_attempt_whose_row_vanishes_after_the_insert_counts_in_a_fresh_bucket(db, monkeypatch):
    async with db.sessions() as s:
        assert await throttle.attempt(s, "a", POLICY, now=T) == 0  # the row is there before
        left = _vanish_after(monkeypatch, "insert", session=s)
        assert await throttle.attempt(s, "a", POLICY, now=T + 1) == 0  # before: NoResultFound
        assert left == [0]
        assert (await _row(s)).attempts == 1  # counted, in a fresh bucket


async def test_attempt_whose_blocked_row_vanishes_before_the_select_is_a_fresh_bucket(db, monkeypatch):
    async with db.sessions() as s:
        for _ in range(3):
            await throttle.attempt(s, "a", POLICY, now=T)
        assert await throttle.attempt(s, "a", POLICY, now=T) > 0  # blocked
        left = _vanish_after(monkeypatch, "update", session=s)  # the refused update, then the row goes
        assert await throttle.attempt(s, "a", POLICY, now=T) == 0  # before: NoResultFound
        assert left == [0]
        assert (await _row(s)).attempts == 1


async def test_spend_whose_row_vanishes_is_a_fresh_budget(db, monkeypatch):
    async with db.sessions() as s:
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0
        _vanish_after(monkeypatch, "insert", session=s)
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0  # before: NoResultFound
        assert (await _row(s)).attempts == 1
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0
        assert await throttle.spend(s, "ip", BUDGET, now=T) == pytest.approx(50)  # spent out
        _vanish_after(monkeypatch, "update", session=s)
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0  # before: NoResultFound
        assert (await _row(s)).attempts == 1


async def test_a_row_that_keeps_vanishing_is_no_error(db, monkeypatch):
    async with db.sessions() as s:
        _vanish_after(monkeypatch, "insert", times=100, session=s)
        assert await throttle.attempt(s, "a", POLICY, now=T) == 0
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0


async def test_a_still_blocked_row_is_still_reported_blocked(db):
    async with db.sessions() as s:
        for _ in range(2):
            assert await throttle.spend(s, "ip", BUDGET, now=T) == 0
        assert await throttle.spend(s, "ip", BUDGET, now=T) == pytest.approx(50)
        for _ in range(3):
            await throttle.attempt(s, "a", POLICY, now=T)
        assert await throttle.attempt(s, "a", POLICY, now=T) == pytest.approx(10)


async def test_refund_of_a_vanished_row_is_a_no_op(db):
    async with db.sessions() as s:
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0
        await throttle.forget(s, "ip")  # gone (sweep, or another worker)
        await throttle.refund(s, "ip", BUDGET)
        assert await _row(s) is None  # no error, and no row made up


async def test_a_login_racing_a_sweep_gets_no_500(make_settings, sqlite_url, monkeypatch):
    monkeypatch.setattr(accounts, "_hasher", accounts.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))
    async with running_app(make_settings(sqlite_url)) as (app, client):
        await signup(client, "alice")
        client.cookies.clear()
        page = await client.get("/login")
        # every throttle row the login inserts (the address's budget, then the (account, client) bucket) is
        # deleted right after, as a sweep in another worker could
        left = _vanish_after(monkeypatch, "insert", times=2)
        r = await client.post("/login", data={"username": "alice", "password": "wrong password!",
                                              "csrf": csrf_of(page.text)})
        assert left == [0]
        assert r.status_code == 401, r.status_code  # a wrong password; before: NoResultFound, a 500


async def test_another_connections_committed_delete_between_the_statements(db, monkeypatch):
    """The real interleaving (PostgreSQL only: on SQLite the first write statement takes the database's write
    lock, so another connection's delete would wait for this transaction): another worker commits its delete of
    the row (``forget``, a right password; ``sweep`` deletes the same way) right after this transaction's
    INSERT ... ON CONFLICT DO NOTHING, which took no lock on it."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers: the race needs PostgreSQL")
    async with db.sessions() as s:
        assert await throttle.spend(s, "ip", BUDGET, now=T) == 0
        assert await throttle.attempt(s, "a", POLICY, now=T) == 0
    real, left = AsyncSession.execute, ["a", "ip"]

    async def execute(self, statement, *args, **kwargs):
        result = await real(self, statement, *args, **kwargs)
        if left and getattr(statement, "is_insert", False):
            async with db.sessions() as other:  # the other worker: its own connection and transaction
                await throttle.forget(other, left.pop())
        return result

    monkeypatch.setattr(AsyncSession, "execute", execute)
    async with db.sessions() as s:
        assert await throttle.spend(s, "ip", BUDGET, now=T + 10_000) == 0  # before: NoResultFound
        assert await throttle.attempt(s, "a", POLICY, now=T + 10_000) == 0
    assert left == []
    monkeypatch.undo()
    async with db.sessions() as s, s.begin():
        assert sorted((await s.execute(select(AuthThrottle.attempts))).scalars()) == [1, 1]
