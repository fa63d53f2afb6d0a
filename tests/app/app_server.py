"""Run the real `hearth serve` as a subprocess on loopback, pointed at a FakeOpenAI server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import hearth
from tests.fakes.http_wait import wait_http_ok
from tests.fakes.openai_server import PORT_TRIES, FakeOpenAI, free_port, port_taken

# where the imported hearth package lives (src/ under PYTHONPATH=src): `hearth serve` runs in another directory, where
# a relative PYTHONPATH would find another checkout's installed hearth
_HEARTH_ROOT = str(Path(hearth.__file__).resolve().parents[1])


def write_config(path: Path, base_url: str, *, total_s: float = 60.0, gateway: str = "") -> Path:
    """A TOML with one provider at ``base_url``; ``gateway``: extra lines for the [gateway] table."""
    path.write_text(f"""
[gateway]
deadline_s = {total_s}
{gateway}

[[providers]]
name = "fake"
base_url = "{base_url}"
model = "fake-model"
json_schema = true
[providers.timeouts]
connect_s = 2.0
first_token_s = {total_s}
total_s = {total_s}

[app]
analyst_timeout_s = 20.0
""")
    return path


class ServeProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def port_clash(output: str) -> bool:
    """Whether `hearth serve`'s output says that its port was taken: its own check ('cannot listen on'), or
    uvicorn's bind after the check (port_taken)."""
    return "cannot listen on" in output.lower() or port_taken(output)


def _stop(proc: subprocess.Popen, stop_signal: int) -> None:
    if proc.poll() is None:
        proc.send_signal(stop_signal)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def hearth_serve(cwd: Path, *args: str, port: int | None = None, env: dict | None = None, ready_s: float = 60.0,
                 pass_port: bool = True, stop_signal: int = signal.SIGKILL):
    """Start `python -m hearth.cli serve ARGS [--port PORT]` in ``cwd``; yields once /healthz answers.

    pass_port=False runs it with exactly ARGS (the default port 8000 is then expected).
    The process is sent ``stop_signal`` (default SIGKILL) on exit if it is still running; SIGTERM stops
    a multi-worker server with its workers (then SIGKILL after 15 s).
    A port picked here (free_port: free when picked, but another process may bind it before the server does,
    the other xdist worker's servers included) that turns out taken is picked again, up to PORT_TRIES times.
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if "PYTHONPATH" not in (env or {}):  # the server runs the hearth these tests import (_HEARTH_ROOT)
        inherited = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        full_env["PYTHONPATH"] = os.pathsep.join([_HEARTH_ROOT, *inherited])
    for attempt in range(1, PORT_TRIES + 1):
        this_port = port or (free_port() if pass_port else 8000)
        cmd = [sys.executable, "-m", "hearth.cli", "serve", *args] + (["--port", str(this_port)] if pass_port else [])
        log = cwd / f"serve-{this_port}-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        server = ServeProcess(proc, f"http://127.0.0.1:{this_port}", log)
        try:
            wait_http_ok(server.url + "/healthz", proc, ready_s, name="hearth serve",
                         details=lambda: "\n" + server.output(), poll_s=0.1)
            break
        except RuntimeError:
            _stop(proc, stop_signal)
            if port is None and pass_port and attempt < PORT_TRIES and port_clash(server.output()):
                continue  # the picked port was taken meanwhile: another one
            raise
    try:
        yield server
    finally:
        _stop(proc, stop_signal)


@contextmanager
def hearth_serve_on_fake_openai(cwd: Path, *, gateway: str = "", handler=None):
    """The browser tests' server: a FakeOpenAI answering with ``handler`` (app_fakes.openai_handler, the app's fake
    replies, by default) and `hearth serve` in ``cwd`` pointed at it (write_config's TOML with ``gateway``; no master
    key, so the SQLite file is cwd/var/hearth.sqlite3). Yields the ServeProcess; both are stopped on exit."""
    from tests.app.app_fakes import openai_handler  # here: tests/train/test_stack.py serves with this module too

    fake = FakeOpenAI(handler or openai_handler).start_in_thread()
    try:
        cfg = write_config(cwd / "hearth.toml", fake.base_url, gateway=gateway)
        with hearth_serve(cwd, "--config", str(cfg), env={"HEARTH_MASTER_KEY": ""}) as server:
            yield server
    finally:
        fake.stop()
