"""A login that fails on something other than the password (its database read raising: a lock, a dropped connection)
took a unit of the address's failed-login budget and counted an attempt in the (account, client) bucket, and gave
neither back: a few transient database errors locked the account's owner out as wrong passwords would. Now only a
wrong password keeps them; an unexpected error gives both back and propagates."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts, throttle
from tests.app.app_client import PASSWORD, login, signup
from tests.app.conftest import running_app
from tests.app.test_app_review50e_throttle import POLICY, _row  # free=2, base 10 s

pytestmark = pytest.mark.anyio


def _login_read_fails_once(monkeypatch) -> list[int]:
    """The next read of a whole users row (accounts.login's look-up of the account) raises OperationalError once."""
    real = AsyncSession.execute
    left = [1]

    async def execute(self, statement, *args, **kwargs):
        if left[0] and getattr(statement, "is_select", False) and "users.wrapped_key" in str(statement):
            left[0] -= 1
            raise OperationalError(str(statement), {}, Exception("database is locked"))
        return await real(self, statement, *args, **kwargs)

    monkeypatch.setattr(AsyncSession, "execute", execute)
    return left


async def test_a_login_whose_database_read_raises_gives_its_allowance_back(make_settings, database_url, monkeypatch):
    monkeypatch.setattr(accounts, "_hasher", accounts.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))
    # one failed login per address, and a backoff from the first counted attempt on: any allowance kept blocks
    settings = make_settings(database_url, login_free_attempts=1, login_backoff_base_s=600.0,
                             login_address_failures=1)
    async with running_app(settings) as (_, client):
        await signup(client, "alice")
        client.cookies.clear()  # no device cookie: the address budget and the (account, address) bucket both count
        left = _login_read_fails_once(monkeypatch)
        with pytest.raises(OperationalError):
            await login(client, "alice")
        assert left == [0]
        r = await login(client, "alice")
        assert r.status_code == 303, (r.status_code, r.text[:300])  # before: 429, locked out for 600 s
        # a wrong password still keeps what it took
        client.cookies.clear()
        assert (await login(client, "alice", "not the password")).status_code == 401
        assert (await login(client, "alice", PASSWORD)).status_code == 429


async def test_uncount_gives_back_only_the_last_attempt(db):

    async with db.sessions() as s:
        for at in (100.0, 101.0):  # the second is counted with a 10 s delay
            assert await throttle.attempt(s, "b", POLICY, now=at) == 0.0
        assert await _row(s) == (2, 111.0)
        await throttle.uncount(s, "b", 101.0)
        assert await _row(s) == (1, 101.0)  # one attempt, and nothing blocks the next
        assert await throttle.attempt(s, "b", POLICY, now=103.0) == 0.0
        assert await throttle.attempt(s, "b", POLICY, now=103.5) > 0  # blocked until 113
        await throttle.uncount(s, "b", 101.0)  # no longer the last attempt: nothing given back
        assert await _row(s) == (2, 113.0)
        await throttle.forget(s, "b")
        await throttle.uncount(s, "b", 103.0)  # a vanished row: nothing made up
        assert await _row(s) is None
