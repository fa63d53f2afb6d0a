"""Two deletions of one account at the same moment (two tabs, a double submit past the page's guard): the second
request passes the login check, then finds the account already gone. It answered 500 (its error page read the
viewer's rows, which its rolled-back transaction had expired); it now answers as the first one did: the account is
gone, the session cookie cleared, on to /signup. The race is made deterministic: the password check of the second
request deletes the account in another session (the first request winning) before it answers."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, select

from hearth.app import account as svc
from hearth.app.deps import SESSION_COOKIE
from hearth.app.storage import models
from tests.app.app_client import PASSWORD, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def test_a_second_deletion_racing_the_first_ends_like_it(make_settings, sqlite_url, monkeypatch):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "dana")
        real = svc._password_ok

        async def other_request_won(user, password):
            ok = await real(user, password)
            async with app.state.hearth.db.sessions() as s, s.begin():
                await s.execute(delete(models.User).where(models.User.id == user.id))
            return ok

        monkeypatch.setattr(svc, "_password_ok", other_request_won)
        r = await client.post("/account/delete", data={"csrf": csrf, "password": PASSWORD})
        assert r.status_code == 303 and r.headers["location"] == "/signup", (r.status_code, r.text[:300])
        assert f"{SESSION_COOKIE}=" in r.headers.get("set-cookie", "")  # cleared, as the first request's answer does
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(models.User).where(models.User.username == "dana"))).first() is None
        assert (await client.get("/")).status_code == 303  # logged out
