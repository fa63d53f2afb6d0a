"""`hearth serve --workers 2` on PostgreSQL: two worker processes share the login throttle through the
database (before, each process kept its own counts, so N workers allowed N times the guesses)."""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid

import httpx
import pytest
from sqlalchemy.engine import make_url

from hearth.app.crypto import new_master_key_text
from tests.app.app_client import PASSWORD
from tests.app.app_server import hearth_serve
from tests.app.conftest import _pg_admin, pg_base_url

pytestmark = pytest.mark.postgres
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _post_form(url: str, path: str, data: dict) -> httpx.Response:
    """GET the form then POST it, on a NEW connection (so the kernel may hand it to either worker)."""
    with httpx.Client(base_url=url, timeout=30) as c:
        token = _CSRF.search(c.get(path).text).group(1)
        return c.post(path, data={**data, "csrf": token})


def test_two_workers_share_the_login_throttle_through_postgresql(tmp_path):
    base = pg_base_url()
    name = f"hearth_workers_{uuid.uuid4().hex[:10]}"
    asyncio.run(_pg_admin(base, f'CREATE DATABASE "{name}"'))
    url = make_url(base).set(drivername="postgresql", database=name).render_as_string(hide_password=False)
    cfg = tmp_path / "hearth.toml"
    cfg.write_text("[app]\nlogin_free_attempts = 3\nlogin_backoff_base_s = 120.0\n")
    try:
        env = {"HEARTH_MASTER_KEY": new_master_key_text()}
        with hearth_serve(tmp_path, "--config", str(cfg), "--database-url", url, "--workers", "2", env=env) as server:
            # new connections until both workers have answered: /healthz answered once ONE worker was up, and the
            # other may still be importing the app on a loaded machine, so the bound is a deadline (60 s), not a
            # number of requests (400 of them took ~1 s here: too short for a slow second worker's start-up)
            pids, deadline = set(), time.monotonic() + 60
            while len(pids) < 2 and time.monotonic() < deadline:
                pids.add(httpx.get(server.url + "/healthz", timeout=10).json()["worker"])
                if len(pids) < 2:
                    time.sleep(0.01)
            assert len(pids) == 2, f"only {pids} answered in 60 s: not two workers\n{server.output()}"
            assert server.proc.pid not in pids  # the workers are processes of their own

            assert _post_form(server.url, "/signup", {"username": "alice", "password": PASSWORD}).status_code == 303
            codes = [_post_form(server.url, "/login", {"username": "alice", "password": "wrong guess!!"}).status_code
                     for _ in range(3)]
            assert codes == [401, 401, 401]
            # whichever worker takes them, the next attempts wait (the right password included)
            codes = [_post_form(server.url, "/login", {"username": "alice", "password": PASSWORD}).status_code
                     for _ in range(8)]
            assert codes == [429] * 8, codes
        assert "2 workers" in server.output()
        # the server was killed with SIGKILL on leaving the block: its workers must not live on (holding the port)
        for pid in pids:
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(pid), f"worker {pid} outlived the server"
    finally:
        asyncio.run(_pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
