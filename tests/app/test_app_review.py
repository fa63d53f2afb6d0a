"""Defects found by a correctness review of the app's write and error paths (one test per defect; each
failed before its fix)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def _count(app, model) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


class _ChatFails(FakeModel):
    async def complete(self, messages, *, kind, **kw):
        if kind == "chat":
            from hearth.gateway.errors import AllProvidersFailed, Timeout
            raise AllProvidersFailed("all failed", [Timeout("fake", "total", 30.0)])
        return await super().complete(messages, kind=kind, **kw)


async def test_without_javascript_a_failed_chat_reply_keeps_the_message_in_the_box(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=_ChatFails()) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "It was a hard day at work", "csrf": csrf},
                              headers={"accept": "text/html"})
        # before: a bare 502 error page; the message the user typed was gone
        assert r.status_code == 502
        assert 'id="chat-form"' in r.text and ">It was a hard day at work</textarea>" in r.text
        assert "The model took too long to answer." in r.text and "Nothing was saved" in r.text
        assert "AllProvidersFailed" not in r.text
        assert await _count(app, Message) == 0


def test_hearth_serve_reports_an_unreachable_gateway_state_store_at_start_up(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from hearth.app.crypto import new_master_key_text

    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        (tmp_path / "hearth.toml").write_text(
            f'[gateway]\nstate_url = "redis://127.0.0.1:{port}/0"\n\n'
            '[[providers]]\nname = "local"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n')
        env = {**os.environ, "HEARTH_MASTER_KEY": new_master_key_text(), "HEARTH_ENV": "", "HEARTH_DATABASE_URL": ""}
        proc = subprocess.run([sys.executable, "-m", "hearth.cli", "serve", "--config", "hearth.toml", "--port", "1",
                               "--database-url", f"sqlite:///{tmp_path / 'h.sqlite3'}"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    # before: "serving on ..." was printed, then the lifespan's traceback, exit 3
    assert proc.returncode == 2, proc.stderr
    assert "configuration error: gateway.state_url" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr and "serving on" not in proc.stdout


@pytest.mark.parametrize("field", ["login_backoff_max_s", "reply_deadline_s", "analyst_timeout_s"])
def test_an_infinite_duration_in_the_app_settings_is_refused_at_start_up(tmp_path, field):
    from hearth.app.crypto import new_master_key_text
    from hearth.app.settings import SettingsError, load_settings

    cfg = tmp_path / "hearth.toml"
    # TOML has inf: before, it was accepted; login_backoff_max_s = inf (with the window) then hung the event loop
    # at the first login (the backoff tiers never reach an infinite cap), a deadline of inf is none at all
    extra = "login_window_s = inf\n" if field == "login_backoff_max_s" else ""
    cfg.write_text(f"[app]\n{field} = inf\n{extra}")
    with pytest.raises(SettingsError) as info:
        load_settings(cfg, env={"HEARTH_MASTER_KEY": new_master_key_text()}, overrides={"var_dir": str(tmp_path / "v")})
    assert info.value.field == field


def test_a_throttle_policy_with_an_infinite_cap_is_refused():
    from hearth.app.throttle import Policy

    with pytest.raises(ValueError, match="finite"):  # before: accepted, and delay_sql() never returned
        Policy(free=5, base_s=1.0, max_s=float("inf"), window_s=float("inf"))


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_companion_deleted_while_a_post_is_saved_does_not_lose_the_post(make_settings, database_url):
    """PostgreSQL (read committed): the feed checked which companions were alive, then inserted their comments.
    A companion deleted between the two (another tab) made the comment's foreign key fail and the whole
    transaction, the user's post with it, roll back (a 500). On SQLite the post's insert already holds the
    write lock, so no delete can come between."""
    import asyncio
    import re

    import asyncpg
    from sqlalchemy import event
    from sqlalchemy.util import await_only

    from hearth.app.storage.models import Comment, Post
    from tests.app.conftest import _pg_connect_args

    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        keep = await create_companion(client, csrf, persona="wren")
        gone = await create_companion(client, csrf, persona="wren", name="Gone")
        other = await asyncpg.connect(**_pg_connect_args(database_url))
        watcher = await asyncpg.connect(**_pg_connect_args(database_url))
        race: dict = {}

        async def delete_gone():
            await other.execute("DELETE FROM companions WHERE id = $1", gone)

        async def start_the_delete():
            task = asyncio.ensure_future(delete_gone())
            for _ in range(500):  # until it committed, or waits for a lock this transaction holds
                if task.done():
                    break
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'DELETE FROM companions%'")
                if waiting:
                    break
                await asyncio.sleep(0.01)
            race["task"] = task

        alive_check = re.compile(r"^SELECT companions\.id\s+FROM companions\s+WHERE companions\.user_id")

        def after(conn, cursor, statement, params, context, executemany):
            if "task" not in race and alive_check.match(statement):
                await_only(start_the_delete())

        engine = app.state.hearth.db.engine.sync_engine
        event.listen(engine, "after_cursor_execute", after)
        try:
            r = await client.post("/feed/posts", data={"post": "Finished the quilt", "csrf": csrf})
        finally:
            event.remove(engine, "after_cursor_execute", after)
            if "task" in race:
                await asyncio.wait_for(race["task"], 10)
            await other.close()
            await watcher.close()
        assert "task" in race, "the alive check did not run"
        assert r.status_code == 303  # before: IntegrityError (comment -> deleted companion), post rolled back
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(func.count()).select_from(Post))).scalar_one() == 1
            companions = (await s.execute(select(Comment.companion_id))).scalars().all()
        assert companions == [keep]  # the deleted companion's comment went with it


def test_an_unreadable_config_or_key_file_is_a_settings_error_naming_it(tmp_path):
    from hearth.app.crypto import new_master_key_text
    from hearth.app.settings import SettingsError, load_settings

    folder = tmp_path / "a-folder"
    folder.mkdir(mode=0o700)
    # before: IsADirectoryError escaped (a traceback from `hearth serve`) instead of an error naming the setting
    with pytest.raises(SettingsError) as info:
        load_settings(folder, env={"HEARTH_MASTER_KEY": new_master_key_text()})
    assert info.value.field == "config" and str(folder) in str(info.value)
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={"HEARTH_MASTER_KEY_FILE": str(folder)}, overrides={"var_dir": str(tmp_path / "v")})
    assert info.value.field == "master_key_file" and str(folder) in str(info.value)
