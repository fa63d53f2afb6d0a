"""Two throttle leftovers.

1. The account page's current-password check (change the password, delete the account) counted an attempt in the
   session's bucket and kept it when the change or the deletion then failed on a database error (a lock, a dropped
   connection), where a login gives the attempt back in that case: a few transient errors held the owner's own
   session off changing the password or deleting the account, as wrong guesses would. Now the attempt is given back
   and the error propagates; a wrong password still keeps it.
2. Login throttle buckets are keyed by the username and outlived the account's deletion: an account signed up again
   under the same name inherited the old one's blocked login until the window ran out. Deleting the account now
   deletes every login bucket of its name, in the deletion's transaction.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts, throttle
from hearth.app.storage.models import AuthThrottle
from tests.app.app_client import PASSWORD, csrf_of, login, signup
from tests.app.app_schema import HEAD, database_at, downgrade, scalars, upgrade_and_compare
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
NEW_PASSWORD = "a brand new passphrase"


@pytest.fixture(autouse=True)
def fast_hasher(monkeypatch):
    monkeypatch.setattr(accounts, "_hasher", accounts.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1))


def _users_write_fails_once(monkeypatch, kind: str) -> list[int]:
    """The next UPDATE (kind "update") or DELETE ("delete") of the users table raises OperationalError once."""
    real = AsyncSession.execute
    left = [1]

    async def execute(self, statement, *args, **kwargs):
        if (left[0] and getattr(statement, f"is_{kind}", False)
                and getattr(getattr(statement, "table", None), "name", None) == "users"):
            left[0] -= 1
            raise OperationalError(str(statement), {}, Exception("database is locked"))
        return await real(self, statement, *args, **kwargs)

    monkeypatch.setattr(AsyncSession, "execute", execute)
    return left


# one counted check, then a 600 s backoff: any attempt kept blocks the next
STRICT = dict(login_free_attempts=1, login_backoff_base_s=600.0, login_backoff_max_s=600.0)


async def test_a_password_change_that_fails_on_a_database_error_gives_its_attempt_back(make_settings, database_url,
                                                                                       monkeypatch):
    async with running_app(make_settings(database_url, **STRICT)) as (_, client):
        csrf = await signup(client, "alice")
        left = _users_write_fails_once(monkeypatch, "update")
        with pytest.raises(OperationalError):
            await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                          "new_password": NEW_PASSWORD})
        assert left == [0]
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": NEW_PASSWORD})
        assert r.status_code == 303, (r.status_code, r.text[-300:])  # before: 429 for 600 s
        # a wrong current password still keeps its attempt
        csrf = csrf_of((await client.get("/account")).text)
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": "a wrong guess",
                                                         "new_password": PASSWORD})
        assert r.status_code == 400
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": NEW_PASSWORD,
                                                         "new_password": PASSWORD})
        assert r.status_code == 429


async def test_an_account_deletion_that_fails_on_a_database_error_gives_its_attempt_back(make_settings, database_url,
                                                                                        monkeypatch):
    async with running_app(make_settings(database_url, **STRICT)) as (_, client):
        csrf = await signup(client, "alice")
        left = _users_write_fails_once(monkeypatch, "delete")
        with pytest.raises(OperationalError):
            await client.post("/account/delete", data={"csrf": csrf, "password": PASSWORD})
        assert left == [0]
        r = await client.post("/account/delete", data={"csrf": csrf, "password": PASSWORD})
        assert r.status_code == 303 and r.headers["location"] == "/signup", (r.status_code, r.text[-300:])


async def _throttle_rows(app) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(AuthThrottle))).scalar_one()


async def test_an_account_signed_up_again_under_a_deleted_name_does_not_inherit_its_blocked_login(make_settings,
                                                                                                 database_url):
    async with running_app(make_settings(database_url, **STRICT)) as (app, owner):
        owner_csrf = await signup(owner, "alice")
        async with httpx.AsyncClient(transport=owner._transport, base_url="http://testserver",
                                     follow_redirects=False) as other:
            await signup(other, "bob")
            other.cookies.clear()  # no device cookie: the (name, address) buckets count
            for name in ("alice", "bob"):  # someone guesses both names' passwords: both are held off
                assert (await login(other, name, "a wrong guess")).status_code == 401
                assert (await login(other, name)).status_code == 429
            rows = await _throttle_rows(app)
            r = await owner.post("/account/delete", data={"csrf": owner_csrf, "password": PASSWORD})
            assert r.status_code == 303 and r.headers["location"] == "/signup"
            after = await _throttle_rows(app)
            await signup(other, "alice")  # a new account under the freed name
            other.cookies.clear()
            r = await login(other, "alice")
            assert r.status_code == 303, (r.status_code, r.text[-300:])  # before: 429 for 600 s
            assert (await login(other, "bob")).status_code == 429
        # alice's login bucket went with her account; bob's, and the address's failed-login budget, stayed
        assert after == rows - 1


async def test_schema_0010_matches_the_models_and_upgrades_and_downgrades_keeping_rows(database_url, master_key):
    policy = throttle.Policy(free=1, base_s=600.0, max_s=600.0, window_s=3600.0)
    async with database_at(database_url, "0009", master_key) as (database, _, _):
        async with database.engine.begin() as conn:  # a login bucket counted before 0010 (no account column yet)
            await conn.execute(text("INSERT INTO auth_throttle (key, attempts, last_at, blocked_until) "
                                    "VALUES (:k, 1, 100.0, 0.0)"), dict(k=throttle.bucket_hash("login|alice|ip:x")))
        diff, version = await upgrade_and_compare(database)
        assert diff == [], f"migrations and models disagree: {diff}"
        assert version == HEAD == "0010"
        assert await scalars(database, "select count(*) from auth_throttle where account is null") == [1]
        async with database.sessions() as s:  # its next counted attempt records the name; another client's too
            assert await throttle.attempt(s, "login|alice|ip:x", policy, now=200.0, account="alice") == 0.0
            assert await throttle.attempt(s, "login|alice|ip:y", policy, now=200.0, account="alice") == 0.0
            assert await throttle.attempt(s, "login|bob|ip:x", policy, now=200.0, account="bob") == 0.0
        assert await scalars(database, "select count(*) from auth_throttle where account is null") == [0]
        async with database.sessions() as s, s.begin():
            await throttle.forget_account(s, "alice")
        assert await scalars(database, "select count(*) from auth_throttle") == [1]  # bob's
        await downgrade(database, "0009")
        assert await scalars(database, "select count(*) from auth_throttle") == [1]
