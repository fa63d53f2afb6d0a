"""Start-up: the master key must open the users' data keys (else refuse, saying which key and how to
fix it; never create a key while users exist), and the data folder / database files are private."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hearth.app.crypto import master_key_id, new_master_key_text, parse_master_key
from hearth.app.settings import load_settings
from hearth.app.startup import StartupError
from tests.app.app_client import login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
SRC = Path(__file__).resolve().parents[2] / "src"  # `hearth serve` below runs this checkout's code, as the test does


def _dev_settings(var_dir, url, **env):
    return load_settings(None, env=env, overrides={"var_dir": str(var_dir), "database_url": url})


async def test_a_lost_development_key_is_never_replaced_while_users_exist(tmp_path, database_url):
    var = tmp_path / "var"
    async with running_app(_dev_settings(var, database_url)) as (app, client):
        await signup(client, "alice")
    key_file = var / "master.key"
    assert key_file.exists()
    key_file.rename(tmp_path / "moved.key")
    # before: a new key was created silently and every existing user got a bare 500 after login
    with pytest.raises(StartupError) as info:
        async with running_app(_dev_settings(var, database_url)):
            pass
    msg = str(info.value)
    assert str(key_file) in msg and "NOT created" in msg and "1 user" in msg
    assert not key_file.exists(), "a stray key was created while users exist"
    (tmp_path / "moved.key").rename(key_file)  # the fix the message names works
    async with running_app(_dev_settings(var, database_url)) as (app, client):
        assert (await login(client, "alice")).status_code == 303
        assert (await client.get("/")).status_code == 200


async def test_a_different_production_key_refuses_to_start_naming_both_keys(make_settings, database_url):
    first, other = new_master_key_text(), new_master_key_text()
    settings = lambda key, **env: load_settings(  # noqa: E731
        None, env={"HEARTH_MASTER_KEY": key, **env}, overrides={"database_url": database_url, "environment": "production",
                                                                 "host": "0.0.0.0"})
    async with running_app(settings(first), base_url="https://testserver") as (app, client):
        await signup(client, "alice")
    with pytest.raises(StartupError) as info:
        async with running_app(settings(other)):
            pass
    msg = str(info.value)
    assert master_key_id(parse_master_key(other)) in msg and master_key_id(parse_master_key(first)) in msg
    assert "HEARTH_MASTER_KEY" in msg and "HEARTH_PREVIOUS_MASTER_KEY" in msg
    # rotating with the old key named as previous is the documented fix
    async with running_app(settings(other, HEARTH_PREVIOUS_MASTER_KEY=first), base_url="https://testserver") as (app, c):
        assert (await login(c, "alice")).status_code == 303


async def test_a_plain_restart_after_rotating_away_from_the_dev_key_is_refused(tmp_path, sqlite_url):
    var = tmp_path / "var"
    async with running_app(_dev_settings(var, sqlite_url)) as (app, client):
        await signup(client, "alice")
    dev_key = (var / "master.key").read_text().splitlines()[-1]
    new = new_master_key_text()
    async with running_app(_dev_settings(var, sqlite_url, HEARTH_MASTER_KEY=new, HEARTH_PREVIOUS_MASTER_KEY=dev_key)):
        pass
    with pytest.raises(StartupError, match="cannot open the data keys of 1 user"):
        async with running_app(_dev_settings(var, sqlite_url)):  # HEARTH_MASTER_KEY forgotten
            pass


def test_hearth_serve_prints_the_reason_and_exits_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    env = {**os.environ, "HEARTH_MASTER_KEY": new_master_key_text(), "HEARTH_ENV": "", "HEARTH_DATABASE_URL": "",
           # not a relative PYTHONPATH (it runs in tmp_path) nor another checkout's install: its migrations must be
           # those that made the database
           "PYTHONPATH": os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH", ""))))}
    import asyncio

    async def make_user():
        settings = load_settings(None, env={"HEARTH_MASTER_KEY": env["HEARTH_MASTER_KEY"]},
                                 overrides={"database_url": url, "var_dir": str(tmp_path / "var")})
        async with running_app(settings) as (app, client):
            await signup(client, "alice")

    asyncio.run(make_user())
    env["HEARTH_MASTER_KEY"] = new_master_key_text()
    proc = subprocess.run([sys.executable, "-m", "hearth.cli", "serve", "--database-url", url, "--port", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start" in proc.stderr and "HEARTH_PREVIOUS_MASTER_KEY" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_the_data_folder_is_0700_and_the_database_files_0600(make_settings, tmp_path):
    db_file = tmp_path / "data" / "hearth.sqlite3"
    async with running_app(make_settings(f"sqlite+aiosqlite:///{db_file}")) as (app, client):
        await signup(client, "alice")
        files = [p for p in db_file.parent.iterdir() if p.name.startswith("hearth.sqlite3")]
        assert {p.name for p in files} >= {"hearth.sqlite3", "hearth.sqlite3-wal"}
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, f"{p.name} is {oct(p.stat().st_mode)}"
    assert stat.S_IMODE(db_file.parent.stat().st_mode) == 0o700
    # a file left readable by an older version is tightened at start-up
    os.chmod(db_file, 0o644)
    async with running_app(make_settings(f"sqlite+aiosqlite:///{db_file}")):
        pass
    assert stat.S_IMODE(db_file.stat().st_mode) == 0o600
