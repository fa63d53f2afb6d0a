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

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import accounts
from tests.app.app_client import PASSWORD, csrf_of, login, signup
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
