"""Crash safety of the real server: `hearth serve` is killed with SIGKILL while a chat turn is in
flight (the fake model hangs); after a restart every acknowledged turn is there, the unacknowledged
one is not there at all (no user message without its reply), and the app keeps working.

Also: `hearth serve` with no arguments starts on a fresh machine (SQLite, dev key created) and
prints its URL."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sqlite3
import threading
import time

import httpx
import pytest
from sqlalchemy import select

from hearth.app import companions
from hearth.app.crypto import UserCipher, new_master_key_text, parse_master_key
from hearth.app.storage import create_database
from hearth.app.storage.models import User
from tests.app.app_fakes import openai_handler
from tests.app.app_server import hearth_serve, write_config
from tests.fakes.openai_server import Behavior, FakeOpenAI

_CSRF = __import__("re").compile(r'name="csrf" value="([^"]+)"')
PASSWORD = "correct horse battery"


def _csrf(html: str) -> str:
    return _CSRF.search(html).group(1)


def _signup(client: httpx.Client, name: str) -> str:
    r = client.post("/signup", data={"username": name, "password": PASSWORD, "csrf": _csrf(client.get("/signup").text)})
    assert r.status_code == 303, r.text
    return _csrf(client.get("/").text)


def _login(client: httpx.Client, name: str) -> str:
    r = client.post("/login", data={"username": name, "password": PASSWORD, "csrf": _csrf(client.get("/login").text)})
    assert r.status_code == 303, r.text
    return _csrf(client.get("/").text)


def _stream_turn(client: httpx.Client, cid: str, csrf: str, text: str) -> dict:
    r = client.post(f"/companions/{cid}/messages", data={"message": text},
                    headers={"accept": "text/event-stream", "x-csrf-token": csrf})
    last = r.text.strip().split("\n\n")[-1].splitlines()
    assert last[0] == "event: done", r.text
    return json.loads(last[1].removeprefix("data: "))


def test_kill_9_mid_request_loses_no_acknowledged_turn_and_leaves_no_half_row(tmp_path):
    state = {"hang": False}

    def handler(body):
        return Behavior.hang() if state["hang"] else openai_handler(body)

    key = new_master_key_text()
    env = {"HEARTH_MASTER_KEY": key}
    db_file = tmp_path / "crash.sqlite3"
    fake = FakeOpenAI(handler).start_in_thread()
    try:
        cfg = write_config(tmp_path / "hearth.toml", fake.base_url)
        args = ("--config", str(cfg), "--database-url", f"sqlite:///{db_file}")
        acked = []
        with hearth_serve(tmp_path, *args, env=env) as server:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                csrf = _signup(client, "dana")
                r = client.post("/companions", data={"persona": "wren", "world_view": "grounded", "csrf": csrf})
                cid = r.headers["location"].rsplit("/", 1)[1]
                for i in range(3):  # plain form turns: the 303 is the acknowledgement
                    r = client.post(f"/companions/{cid}/messages", data={"message": f"turn {i}", "csrf": csrf})
                    assert r.status_code == 303
                    acked.append(f"turn {i}")
                _stream_turn(client, cid, csrf, "turn streamed")  # the "done" event is the acknowledgement
                acked.append("turn streamed")

                state["hang"] = True
                seen = len(fake.requests)
                outcome = {}

                def doomed():
                    try:
                        client.post(f"/companions/{cid}/messages", data={"message": "turn doomed", "csrf": csrf})
                        outcome["status"] = "answered"
                    except httpx.TransportError as exc:
                        outcome["status"] = type(exc).__name__

                t = threading.Thread(target=doomed)
                t.start()
                deadline = time.monotonic() + 20
                while len(fake.requests) == seen:  # the request reached the model: it is mid-turn
                    assert time.monotonic() < deadline, "the turn never reached the model"
                    time.sleep(0.05)
                server.proc.send_signal(signal.SIGKILL)
                server.proc.wait(10)
                t.join(20)
                assert outcome["status"] != "answered"

        # the database file is consistent and holds exactly the acknowledged turns
        con = sqlite3.connect(db_file)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            roles = dict(con.execute("select role, count(*) from messages group by role").fetchall())
        finally:
            con.close()
        assert roles == {"user": len(acked), "companion": len(acked)}

        state["hang"] = False
        with hearth_serve(tmp_path, *args, env=env) as server:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                csrf = _login(client, "dana")
                page = client.get(f"/companions/{cid}").text
                for text in acked:
                    assert f"Echo: {text}" in page
                assert "turn doomed" not in page
                _stream_turn(client, cid, csrf, "after restart")

        async def decrypt_all():  # every stored row still decrypts under the user's key
            db = create_database(f"sqlite:///{db_file}")
            try:
                async with db.sessions() as s:
                    user = (await s.execute(select(User))).scalar_one()
                cipher = UserCipher.from_wrapped(parse_master_key(key), user.wrapped_key, user.id)
                async with db.sessions() as s:
                    return [m.text for m in await companions.history(s, cipher, cid)]
            finally:
                await db.dispose()

        texts = asyncio.run(decrypt_all())
        assert [t for t in texts if not t.startswith("Echo: ")] == acked + ["after restart"]
    finally:
        fake.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_serve_with_no_arguments_on_a_fresh_machine(tmp_path):
    if not _port_free(8000):
        pytest.skip("port 8000 is taken on this machine; `hearth serve` with no arguments binds it")
    env = {"HEARTH_MASTER_KEY": "", "HEARTH_DATABASE_URL": "", "HEARTH_ENV": ""}
    with hearth_serve(tmp_path, pass_port=False, env=env) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            _signup(client, "erin")
            home = client.get("/").text
            assert "No model endpoint yet" in home and "[[providers]]" in home
        out = server.output()
    assert "http://127.0.0.1:8000/" in out
    assert (tmp_path / "var" / "master.key").exists() and (tmp_path / "var" / "hearth.sqlite3").exists()
    assert "master.key" in out


@pytest.mark.postgres
def test_serve_on_postgresql_by_url(tmp_path):
    import uuid

    from sqlalchemy.engine import make_url

    from tests.app.conftest import _pg_admin, pg_base_url

    base = pg_base_url()
    name = f"hearth_serve_{uuid.uuid4().hex[:10]}"
    asyncio.run(_pg_admin(base, f'CREATE DATABASE "{name}"'))
    plain_url = make_url(base).set(drivername="postgresql", database=name).render_as_string(hide_password=False)
    fake = FakeOpenAI(openai_handler).start_in_thread()
    try:
        cfg = write_config(tmp_path / "hearth.toml", fake.base_url)
        env = {"HEARTH_MASTER_KEY": new_master_key_text()}
        with hearth_serve(tmp_path, "--config", str(cfg), "--database-url", plain_url, env=env) as server:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                csrf = _signup(client, "gale")
                r = client.post("/companions", data={"persona": "sol", "world_view": "stoic", "csrf": csrf})
                cid = r.headers["location"].rsplit("/", 1)[1]
                assert _stream_turn(client, cid, csrf, "hello postgres")["message"] == "Echo: hello postgres"
        assert not list(tmp_path.glob("var/*.sqlite3"))  # nothing went to a SQLite file
    finally:
        fake.stop()
        asyncio.run(_pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
