"""The account page's current-password check (change the password, delete the account) was throttled per ACCOUNT:
every session of the account counted into one bucket. Whoever held one session of it (a cookie copied off a shared
computer, a phone left logged in) could send a wrong current password each time the backoff let one through and so
keep the account's owner, in their own session, from ever changing the password (429 "Too many password attempts")
- and changing it is the one way to log that other session out. The check is now throttled per session: a session
still cannot be used to guess the password behind it (the login policy holds it, as before), and guesses made in
another session are not charged to the owner's."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Session
from tests.app.app_client import PASSWORD, csrf_of, login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
NEW_PASSWORD = "a brand new passphrase"


async def test_guesses_in_another_session_do_not_block_the_owners_password_change(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, owner):
        owner_csrf = await signup(owner, "alice")
        async with httpx.AsyncClient(transport=owner._transport, base_url="http://testserver",
                                     follow_redirects=False) as other:
            assert (await login(other, "alice")).status_code == 303  # the session someone else holds
            other_csrf = csrf_of((await other.get("/")).text)
            free = app.state.hearth.settings.login_free_attempts
            for _ in range(free + 1):  # past the free attempts: the backoff holds the guessing session
                await other.post("/account/password", data={"csrf": other_csrf, "current_password": "a wrong guess",
                                                            "new_password": NEW_PASSWORD})
            r = await other.post("/account/password", data={"csrf": other_csrf, "current_password": PASSWORD,
                                                             "new_password": NEW_PASSWORD})
            assert r.status_code == 429, "the guessing session is still throttled"
            # the owner changes the password from their own session, which logs the other one out
            r = await owner.post("/account/password", data={"csrf": owner_csrf, "current_password": PASSWORD,
                                                            "new_password": NEW_PASSWORD})
            assert r.status_code == 303, (r.status_code, r.text[-300:])
            async with app.state.hearth.db.sessions() as s:
                assert (await s.execute(select(func.count()).select_from(Session))).scalar_one() == 1
            assert (await other.get("/")).status_code == 303  # back to the login page


async def test_the_owner_can_still_delete_the_account(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, owner):
        owner_csrf = await signup(owner, "alice")
        async with httpx.AsyncClient(transport=owner._transport, base_url="http://testserver",
                                     follow_redirects=False) as other:
            assert (await login(other, "alice")).status_code == 303
            other_csrf = csrf_of((await other.get("/")).text)
            for _ in range(app.state.hearth.settings.login_free_attempts + 1):
                await other.post("/account/delete", data={"csrf": other_csrf, "password": "a wrong guess"})
            r = await owner.post("/account/delete", data={"csrf": owner_csrf, "password": PASSWORD})
            assert r.status_code == 303 and r.headers["location"] == "/signup", (r.status_code, r.text[-300:])
