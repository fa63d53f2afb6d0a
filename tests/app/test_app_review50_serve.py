"""`hearth serve`'s process behaviour, against the real command on loopback:

- the start-up check (hearth.app.startup.prepare: migrations, key rotation, the master-key check, writing a new
  development key) runs ONCE per `hearth serve`, before the port is served: not again in the app's lifespan,
  nor in each worker of --workers N; a bad config still exits 2 before anything is served;
- SIGTERM (how a container runtime or systemd stops it) is a graceful stop: the request in flight is answered,
  the lifespan's shutdown runs, and the exit status is 0 (it was 143: killed by the re-raised signal);
- a port in use is refused with one line, exit 1, before the database or a development key is created;
- with --workers N, a worker that cannot start makes `hearth serve` exit nonzero (it exited 0).

Processes have no event to await from here: readiness is a poll of /healthz (or of the log), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from hearth.app.crypto import new_master_key_text
from tests.app.app_fakes import openai_handler
from tests.app.app_server import hearth_serve, port_clash, write_config
from tests.fakes.http_wait import wait_http_ok
from tests.fakes.openai_server import PORT_TRIES, FakeOpenAI, free_port

_CSRF = __import__("re").compile(r'name="csrf" value="([^"]+)"')
PASSWORD = "correct horse battery"

# `hearth` with hearth.app.main.prepare counted (one line per call, with the pid, in $HEARTH_TEST_PREPARE_COUNT).
# A worker of --workers N is a spawned interpreter that imports this file as __mp_main__, so it is counted too.
# HEARTH_TEST_BREAK_WORKERS=1: a worker's lifespan fails where it starts the model chain, after the place where it
# ran the check (fault injection; `hearth serve` itself is untouched: the variable that marks a worker is set only
# once the workers are started).
WRAPPER = '''
import os

import hearth.app.main as m

_prepare = m.prepare


async def counted(*args, **kwargs):
    with open(os.environ["HEARTH_TEST_PREPARE_COUNT"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    return await _prepare(*args, **kwargs)


m.prepare = counted
if os.environ.get("HEARTH_TEST_BREAK_WORKERS") and os.environ.get(m.SERVE_ARGS_ENV):
    class Broken:
        async def start(self):
            raise RuntimeError("injected: this worker cannot start its model chain")

    m.build_backend = lambda config_path: Broken()

if __name__ == "__main__":
    from hearth.cli import app

    app()
'''


def _env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HEARTH_ENV": "", "HEARTH_DATABASE_URL": "", **extra}
    env.pop("HEARTH_SERVE_ARGS", None)
    return env


def _wrapper(tmp_path: Path) -> Path:
    path = tmp_path / "hearth_counted.py"
    path.write_text(WRAPPER)
    return path


def _calls(count_file: Path) -> list[str]:
    return count_file.read_text().split() if count_file.exists() else []


def _poll(done, proc: subprocess.Popen, timeout_s: float, what: str, log: Path) -> None:
    """Until done() (a readiness poll of another process's log: it has no event to await)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, f"exited with {proc.returncode} before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s:\n{log.read_text()}"
        time.sleep(0.05)


def test_the_start_up_check_runs_once_per_serve(tmp_path):
    """It ran in the CLI's pre-flight and again in the lifespan: migrations twice, a key rotation's "re-wrapped N
    users" twice. (With --workers N it also ran once more in every worker: the next test.)"""
    workers = 1
    for attempt in range(1, PORT_TRIES + 1):  # a fresh port (and count file) if the one picked was taken meanwhile
        count, log, port = tmp_path / f"prepare-{attempt}.calls", tmp_path / f"serve-{attempt}.log", free_port()
        cmd = [sys.executable, str(_wrapper(tmp_path)), "serve", "--port", str(port), "--workers", str(workers),
               "--database-url", f"sqlite:///{tmp_path / f'h-{attempt}.sqlite3'}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                    env=_env(HEARTH_MASTER_KEY=new_master_key_text(),
                                             HEARTH_TEST_PREPARE_COUNT=str(count)))
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc, 60, name="hearth serve", details=log.read_text)
            break
        except RuntimeError:
            proc.kill()
            proc.wait(30)
            if attempt == PORT_TRIES or not port_clash(log.read_text()):
                raise
    try:
        _poll(lambda: log.read_text().count("Application startup complete.") >= workers, proc, 60,
              f"{workers} started worker(s)", log)
        assert len(_calls(count)) == 1, f"prepare ran in processes {_calls(count)}"
        assert _calls(count) == [str(proc.pid)]  # in `hearth serve` itself, before it served anything
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert len(_calls(count)) == 1


def test_a_bad_config_still_exits_2_naming_the_setting_before_the_check_or_serving(tmp_path):
    count = tmp_path / "prepare.calls"
    (tmp_path / "hearth.toml").write_text("[app]\nmax_body_bytes = 2048\n")
    proc = subprocess.run([sys.executable, str(_wrapper(tmp_path)), "serve", "--config", "hearth.toml",
                           "--port", str(free_port())], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=_env(HEARTH_MASTER_KEY=new_master_key_text(), HEARTH_TEST_PREPARE_COUNT=str(count)))
    assert proc.returncode == 2, proc.stderr
    assert "configuration error: max_body_bytes" in proc.stderr and "Traceback" not in proc.stderr
    assert "serving on" not in proc.stdout and _calls(count) == []
    assert not (tmp_path / "var").exists()  # no database, no key


def _csrf(html: str) -> str:
    return _CSRF.search(html).group(1)


def test_sigterm_answers_the_request_in_flight_runs_shutdown_and_exits_0(tmp_path):
    hold, arrived, release = threading.Event(), threading.Event(), threading.Event()

    async def model(body):  # while `hold` is set a model call waits for `release` (the turn is in flight)
        if hold.is_set():
            arrived.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return openai_handler(body)

    fake = FakeOpenAI(model).start_in_thread()
    db_file = tmp_path / "h.sqlite3"
    try:
        cfg = write_config(tmp_path / "hearth.toml", fake.base_url)
        with hearth_serve(tmp_path, "--config", str(cfg), "--database-url", f"sqlite:///{db_file}",
                          env={"HEARTH_MASTER_KEY": new_master_key_text()}) as server:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                r = client.post("/signup", data={"username": "dana", "password": PASSWORD,
                                                 "csrf": _csrf(client.get("/signup").text)})
                assert r.status_code == 303, r.text
                csrf = _csrf(client.get("/").text)
                r = client.post("/companions", data={"persona": "wren", "world_view": "grounded", "csrf": csrf})
                cid = r.headers["location"].rsplit("/", 1)[1]

                hold.set()
                outcome = {}

                def turn():
                    try:
                        outcome["status"] = client.post(f"/companions/{cid}/messages",
                                                        data={"message": "in flight", "csrf": csrf}).status_code
                    except httpx.TransportError as exc:
                        outcome["status"] = type(exc).__name__

                t = threading.Thread(target=turn)
                t.start()
                assert arrived.wait(30), "the turn never reached the model"
                server.proc.send_signal(signal.SIGTERM)
                # shutting down: the listener is closed (new connections refused) while the turn is still open
                deadline = time.monotonic() + 30
                while True:
                    assert server.proc.poll() is None, server.output()
                    try:
                        httpx.get(server.url + "/healthz", timeout=1.0)
                    except httpx.TransportError:
                        break
                    assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
                    time.sleep(0.05)
                release.set()
                t.join(60)
            code = server.proc.wait(60)
            log = server.output()
    finally:
        release.set()
        fake.stop()
    assert outcome.get("status") == 303, outcome  # the turn in flight was answered
    assert code == 0, f"exit {code}\n{log}"
    assert "Application shutdown complete." in log  # the lifespan's shutdown ran (chain and engine closed)
    con = sqlite3.connect(db_file)
    try:
        roles = dict(con.execute("select role, count(*) from messages group by role").fetchall())
    finally:
        con.close()
    assert roles == {"user": 1, "companion": 1}  # and it was committed


def test_a_port_in_use_is_refused_in_one_line_before_the_database_or_a_key_is_created(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "hearth.cli", "serve", "--port", str(port)], cwd=tmp_path,
                              env=_env(HEARTH_MASTER_KEY=""), capture_output=True, text=True, timeout=60)
    # before: "hearth: serving on ..." was printed, the database migrated and a development key written, then
    # uvicorn's bind error and exit 3
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"hearth serve: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr and "serving on" not in proc.stdout
    assert not (tmp_path / "var").exists()


def test_with_workers_the_check_runs_once_and_a_worker_that_cannot_start_makes_serve_exit_1(tmp_path):
    for attempt in range(1, PORT_TRIES + 1):  # a fresh port (and count file) if the one picked was taken meanwhile
        count = tmp_path / f"prepare-{attempt}.calls"
        proc = subprocess.Popen([sys.executable, str(_wrapper(tmp_path)), "serve", "--port", str(free_port()),
                                 "--workers", "2", "--database-url", f"sqlite:///{tmp_path / f'h-{attempt}.sqlite3'}"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env(HEARTH_MASTER_KEY=new_master_key_text(), HEARTH_TEST_PREPARE_COUNT=str(count),
                                         HEARTH_TEST_BREAK_WORKERS="1"))
        _, err = proc.communicate(timeout=120)
        if attempt == PORT_TRIES or not port_clash(err):
            break
    # before: the check ran in `hearth serve` and again in each worker (3 calls, the workers racing each other
    # through the migrations), and after the workers failed uvicorn's process manager stopped and serve exited 0
    assert _calls(count) == [str(proc.pid)], f"prepare ran in processes {_calls(count)}"
    assert "injected: this worker cannot start its model chain" in err
    assert proc.returncode == 1, err
    assert "hearth serve: a worker failed to start" in err


@pytest.mark.anyio
@pytest.mark.parametrize("same", [True, False], ids=["settings-checked", "settings-changed"])
async def test_a_worker_skips_the_check_only_for_the_settings_serve_checked(tmp_path, monkeypatch, same):
    """Workers skip the check `hearth serve` ran, but only for the settings it ran it on: a worker started (or
    restarted by uvicorn) after the key or the database changed under it checks for itself."""
    import hearth.app.main as m
    from hearth.app.settings import load_settings

    calls = []
    real = m.prepare

    async def counted(settings, db):
        calls.append(settings.database_url)
        return await real(settings, db)

    monkeypatch.setattr(m, "prepare", counted)
    monkeypatch.setattr(m, "_exit_with_parent", lambda supervisor: None)
    monkeypatch.chdir(tmp_path)
    key = new_master_key_text()
    monkeypatch.setenv("HEARTH_MASTER_KEY", key)
    for var in ("HEARTH_ENV", "HEARTH_DATABASE_URL", "HEARTH_PREVIOUS_MASTER_KEY", "HEARTH_MASTER_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    checked = load_settings(None, database_url=url, host="127.0.0.1", port=8000)
    args = m.worker_args(checked, config=None, database_url=url, host="127.0.0.1", port=8000)
    if not same:
        monkeypatch.setenv("HEARTH_MASTER_KEY", new_master_key_text())  # the key changed after serve's check
    monkeypatch.setenv(m.SERVE_ARGS_ENV, json.dumps(args))
    app = m.worker_app()
    async with app.router.lifespan_context(app):
        pass
    assert calls == ([] if same else [url])
