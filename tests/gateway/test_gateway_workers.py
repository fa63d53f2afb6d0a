"""`hearth gateway --workers 2`: two processes on one port sharing breaker, cooldown and warm state
through a real Redis (issue 13 item 8); start-up refusals with a clear message and no traceback."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from hearth.gateway.server import main
from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import MESSAGES, CHAT_JSON, needs_redis, shared_state

GOOD = Behavior.reply(CHAT_JSON)


def _toml(gateway: dict, providers: list[dict]) -> str:
    def value(v):
        return json.dumps(v) if not isinstance(v, dict) else "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"

    lines = ["[gateway]"] + [f"{k} = {value(v)}" for k, v in gateway.items()]
    for p in providers:
        lines += ["", "[[providers]]"] + [f"{k} = {value(v)}" for k, v in p.items()]
    return "\n".join(lines) + "\n"


def _wait_healthy(proc: subprocess.Popen, port: int, workers: int = 1) -> None:
    """Until `workers` distinct processes answered /healthz (each call a new connection)."""
    deadline = time.monotonic() + 30
    pids = set()
    while len(pids) < workers:  # child processes have no event to wait on: poll the liveness route
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, f"gateway did not start ({len(pids)} of {workers} workers answered)"
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
            if r.status_code == 200:
                pids.add(r.json()["pid"])
                continue
        except httpx.TransportError:
            pass
        time.sleep(0.05)


@needs_redis
def test_two_workers_share_one_port_cooldowns_and_one_warmup(tmp_path):
    port = free_port()
    ft_port = free_port()                      # the fine-tune is down: cold, its warm-up keeps knocking
    failing = FakeOpenAI(Behavior.status(500)).start_in_thread()
    good = FakeOpenAI(GOOD).start_in_thread()
    cfg = tmp_path / "g.toml"
    cfg.write_text(_toml({"breaker_failures": 1, "cooldown_s": 60.0, **shared_state()}, [
        {"name": "ft", "base_url": f"http://127.0.0.1:{ft_port}/v1", "model": "lora", "scale_to_zero": True,
         "health_url": f"http://127.0.0.1:{ft_port}/health",
         "warm": {"probe_timeout_s": 0.2, "ttl_s": 60.0, "warmup_budget_s": 60.0, "warmup_poll_s": 0.5}},
        {"name": "a", "base_url": failing.base_url, "model": "m"},
        {"name": "b", "base_url": good.base_url, "model": "m"}]))
    proc = subprocess.Popen([sys.executable, "-m", "hearth.cli", "gateway", "--config", str(cfg), "--port", str(port),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_healthy(proc, port, workers=2)
        replies = []
        for i in range(24):   # a new connection each time: SO_REUSEPORT spreads them over both workers
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": MESSAGES},
                           headers={"X-Request-ID": f"w-{i}", "Connection": "close"})
            replies.append((r.status_code, r.json()["hearth"]["attempts"]))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        failing.stop()
        good.stop()
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    served_by = {l["pid"] for l in lines if str(l.get("request_id", "")).startswith("w-") and l.get("status") == 200}
    assert len(served_by) == 2, f"requests were served by {served_by} only"
    assert replies[0] == (200, [["ft", "cold"], ["a", "status_500"], ["b", "ok"]])
    assert all(r == (200, [["ft", "cold"], ["a", "cooldown"], ["b", "ok"]]) for r in replies[1:]), replies  # chain order
    assert len(failing.requests) == 1                                  # worker B never retried what A cooled down
    assert sum("starting warm-up" in l["msg"] for l in lines) == 1     # one warm-up for both workers
    assert proc.returncode == 0


def test_second_gateway_on_a_taken_port_says_so_without_a_traceback(tmp_path, capsys):
    cfg = tmp_path / "g.toml"
    cfg.write_text('[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = main(cfg, "127.0.0.1", taken.getsockname()[1])
    err = capsys.readouterr().err
    assert code == 1 and "cannot listen on 127.0.0.1" in err and "Traceback" not in err


def test_workers_need_shared_state_and_a_reachable_one(tmp_path, capsys):
    base = '[[providers]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    assert main(plain, "127.0.0.1", free_port(), workers=2) == 2
    assert "needs [gateway] state_url" in capsys.readouterr().err
    dead = tmp_path / "dead.toml"
    dead.write_text(f'[gateway]\nstate_url = "redis://127.0.0.1:{free_port()}/0"\n' + base)
    assert main(dead, "127.0.0.1", free_port()) == 2
    err = capsys.readouterr().err
    assert "gateway.state_url" in err and "Traceback" not in err
    assert main(plain, "127.0.0.1", free_port(), workers=0) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


@needs_redis
def test_a_worker_that_dies_stops_the_others_and_the_supervisor_exits_1(tmp_path):
    port = free_port()
    good = FakeOpenAI(GOOD).start_in_thread()
    cfg = tmp_path / "g.toml"
    cfg.write_text(_toml(shared_state(), [{"name": "b", "base_url": good.base_url, "model": "m"}]))
    proc = subprocess.Popen([sys.executable, "-m", "hearth.cli", "gateway", "--config", str(cfg), "--port", str(port),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_healthy(proc, port, workers=2)
        victim = httpx.get(f"http://127.0.0.1:{port}/healthz").json()["pid"]
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        good.stop()
    assert proc.returncode == 1
    assert f"(pid {victim}) exited with -9; stopping the others" in err.decode()
    with socket.socket() as s:   # the other worker is gone too: nothing listens on the port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # (TIME_WAIT connections do not count)
        s.bind(("127.0.0.1", port))
        s.listen()
