"""`hearth gateway`'s process behaviour (review 50, the serve paths):

- one process starts (checks) its state store once: the chain's own start, before the port is bound; before, a
  separate probe connected first and the chain's start connected again; an unreachable store is still one line
  naming gateway.state_url, exit 2, before the port is bound;
- a --host that does not resolve is one line and exit 1, not a traceback;
- SIGTERM is a graceful stop: the request in flight is answered, the chain is closed, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from hearth.gateway.server import main
from tests.fakes.http_wait import wait_http_ok
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES

PROVIDER = '[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'


# `hearth` with RedisStore.start replaced by a no-op that answers (no Redis needed: nothing here touches the store
# after its start) and appends a line per call to $HEARTH_TEST_STORE_STARTS
COUNTED_STORE = """
import os

from hearth.gateway.state import RedisStore


async def start(self):
    with open(os.environ["HEARTH_TEST_STORE_STARTS"], "a") as fh:
        fh.write(self.url + "\\n")


RedisStore.start = start
from hearth.cli import app

app()
"""


def test_one_process_starts_its_state_store_once(tmp_path):
    starts, log, port = tmp_path / "starts", tmp_path / "gateway.log", free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text('[gateway]\nstate_url = "redis://127.0.0.1:9/0"\n' + PROVIDER)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", COUNTED_STORE, "gateway", "--config", str(cfg), "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "HEARTH_TEST_STORE_STARTS": str(starts)})
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc, 30, name="hearth gateway", details=log.read_text)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert starts.read_text().split() == ["redis://127.0.0.1:9/0"]  # before: twice (a probe, then the chain's start)
    assert code == 0, log.read_text()


def test_an_unreachable_state_store_is_one_line_exit_2_before_the_port_is_bound(tmp_path, capsys):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: connections are refused
    cfg = tmp_path / "dead.toml"
    cfg.write_text(f'[gateway]\nstate_url = "{dead}"\n' + PROVIDER)
    port = free_port()
    assert main(cfg, "127.0.0.1", port) == 2
    err = capsys.readouterr().err
    assert "configuration error: gateway.state_url" in err and "Traceback" not in err
    with socket.socket() as s:  # it never listened
        s.bind(("127.0.0.1", port))


def test_a_host_that_does_not_resolve_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    def no_such_host(host, *args, **kwargs):  # what the resolver says, without asking one
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    cfg = tmp_path / "g.toml"
    cfg.write_text(PROVIDER)
    assert main(cfg, "no-such-host.invalid", 8400) == 1  # before: socket.gaierror out of main()
    err = capsys.readouterr().err
    assert "cannot listen on no-such-host.invalid:8400: Name or service not known" in err


def test_sigterm_answers_the_request_in_flight_closes_the_chain_and_exits_0(tmp_path):
    arrived, release = threading.Event(), threading.Event()

    async def model(body):
        arrived.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        return Behavior.reply(CHAT_JSON)

    fake = FakeOpenAI(model).start_in_thread()
    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[gateway]\ndeadline_s = 60.0\n\n[[providers]]\nname = "a"\nbase_url = "{fake.base_url}"\n'
                   'model = "m"\ntimeouts = { connect_s = 2.0, first_token_s = 60.0, total_s = 60.0 }\n')
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hearth.cli", "gateway", "--config", str(cfg), "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    outcome = {}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", proc, 30, name="hearth gateway", details=log.read_text)

        def call():
            try:
                outcome["status"] = httpx.post(url + "/v1/chat/completions", json={"messages": MESSAGES},
                                               timeout=60).status_code
            except httpx.TransportError as exc:
                outcome["status"] = type(exc).__name__

        t = threading.Thread(target=call)
        t.start()
        assert arrived.wait(30), "the request never reached the provider"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while True:  # shutting down: the listener is closed while the request is still open
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(url + "/healthz", timeout=1.0)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        release.set()
        t.join(60)
        code = proc.wait(60)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        fake.stop()
    assert outcome.get("status") == 200, outcome
    assert code == 0, log.read_text()
    msgs = [json.loads(line)["msg"] for line in log.read_text().splitlines() if line.startswith("{")]
    assert "gateway stopped: chain closed" in msgs
