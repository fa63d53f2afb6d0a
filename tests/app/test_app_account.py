"""Account control: password change (other sessions end), a decrypted export of the user's own data,
and account deletion (every row and the data key gone; on SQLite not left in the files either)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from hearth.app.storage import models
from tests.app.app_client import PASSWORD, login, signup
from tests.app.conftest import running_app
from tests.app.test_app_security import MARKER, _bob_world

pytestmark = pytest.mark.anyio
NEW_PASSWORD = "a brand new passphrase"


async def _rows_of(app, user_id: str) -> dict[str, int]:
    out = {}
    async with app.state.hearth.db.sessions() as s:
        for table in models.Base.metadata.sorted_tables:
            col = table.c.get("user_id") if table.name != "users" else table.c.id
            if col is not None:
                out[table.name] = (await s.execute(select(func.count()).select_from(table).where(col == user_id))).scalar_one()
    return out


async def _user(app, username: str):
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(models.User).where(models.User.username == username))).scalar_one_or_none()


async def test_password_change_needs_the_current_one_and_ends_other_sessions(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        other = dict(client.cookies)  # a second browser, logged in before the change
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": "wrong one!!",
                                                         "new_password": NEW_PASSWORD})
        assert r.status_code == 400 and "current_password" in r.text
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": "short"})
        assert r.status_code == 400 and "new_password: must be 10-256 characters" in r.text
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": NEW_PASSWORD})
        assert r.status_code == 303
        assert "every other session" in (await client.get(r.headers["location"])).text  # this browser stays in
        client.cookies.clear()
        client.cookies.update(other)
        assert (await client.get("/")).status_code == 303  # the other browser was logged out
        client.cookies.clear()
        assert (await login(client, "alice")).status_code == 401
        assert (await login(client, "alice", NEW_PASSWORD)).status_code == 303


async def test_export_holds_all_of_the_users_data_decrypted_and_nobody_elses(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        await signup(client, "carol")
        client.cookies.clear()
        csrf = await signup(client, "bob")
        await _bob_world(client, csrf)
        r = await client.get("/account/export")
        assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
        assert r.headers["cache-control"] == "no-store"
        data = json.loads(r.text)
        assert data["username"] == "bob"
        (companion,) = data["companions"]
        assert f"bob {MARKER} chat" in [m["text"] for m in companion["messages"]]
        assert companion["situations"][0]["text"] == f"bob {MARKER} situation"
        assert len(companion["situations"][0]["panel"]) == 5
        assert f"bob {MARKER} rehearsal" in [t["text"] for t in companion["rehearsals"][0]["turns"]]
        assert data["agents"][0]["name"] == "Dana"
        assert data["posts"][0]["text"] == f"bob {MARKER} post" and data["posts"][0]["comments"]
        assert "carol" not in r.text


async def test_deleting_the_account_removes_every_row_and_key(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, client):
        await signup(client, "carol")  # a bystander whose data must stay
        client.cookies.clear()
        csrf = await signup(client, "bob")
        await _bob_world(client, csrf)
        bob = await _user(app, "bob")
        before = await _rows_of(app, bob.id)
        assert all(before[t] >= 1 for t in ("users", "companions", "messages", "readings", "rehearsal_turns",
                                            "posts", "comments", "agents", "situations", "sessions")), before
        carol_rows = await _rows_of(app, (await _user(app, "carol")).id)
        r = await client.post("/account/delete", data={"csrf": csrf, "password": "not it at all"})
        assert r.status_code == 400 and await _user(app, "bob") is not None
        r = await client.post("/account/delete", data={"csrf": csrf, "password": PASSWORD})
        assert r.status_code == 303
        assert set((await _rows_of(app, bob.id)).values()) == {0}
        assert await _rows_of(app, (await _user(app, "carol")).id) == carol_rows  # nobody else's data
        assert (await client.get("/")).status_code == 303
        assert (await login(client, "bob")).status_code == 401
        if database_url.startswith("sqlite"):
            db_file = Path(database_url.split("///", 1)[1])
            raw = b"".join(p.read_bytes() for p in db_file.parent.iterdir() if p.name.startswith(db_file.name))
            assert bob.wrapped_key not in raw, "the deleted user's wrapped data key is still in the SQLite files"
        else:  # PostgreSQL: the rows are dead tuples until VACUUM (docs/app.md says what is left where)
            async with app.state.hearth.db.sessions() as s, s.begin():
                assert (await s.execute(text("select count(*) from users where username = 'bob'"))).scalar_one() == 0
