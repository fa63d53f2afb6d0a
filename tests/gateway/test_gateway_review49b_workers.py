"""Review 49b of `hearth gateway --workers N`: how the supervisor and its workers stop (each test seen failing
before its fix). Real processes on a real port, sharing a real Redis."""

import os
import select
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.fakes.openai_server import Behavior, FakeOpenAI, free_port
from tests.gateway.gateway_helpers import CHAT_JSON, needs_redis, shared_state
from tests.gateway.test_gateway_workers import _toml

pytestmark = [needs_redis, pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")]


def _start(tmp_path, good, workers: int = 2) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(_toml(shared_state(), [{"name": "b", "base_url": good.base_url, "model": "m"}]))
    proc = subprocess.Popen([sys.executable, "-m", "hearth.cli", "gateway", "--config", str(cfg), "--port", str(port),
                             "--workers", str(workers)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)   # its own process group, as systemd / a container gives it
    return proc, port


def _worker_pids(proc: subprocess.Popen, port: int, workers: int) -> set[int]:
    """The pids of all `workers`, once each answered /healthz (child processes have no event to wait on)."""
    deadline = time.monotonic() + 30
    pids: set[int] = set()
    while len(pids) < workers:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, f"only {len(pids)} of {workers} workers answered"
        try:
            pids.add(httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Connection": "close"},
                               timeout=0.5).json()["pid"])
            continue
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    return pids


def _wait_exited(pids: set[int], timeout_s: float) -> set[int]:
    """Wait (on pidfds: an event, not polling) until every pid exited; return those still running."""
    fds = {os.pidfd_open(pid): pid for pid in pids}
    try:
        deadline = time.monotonic() + timeout_s
        left = dict(fds)
        while left and (wait := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(left), [], [], wait)
            for fd in ready:
                del left[fd]
        return set(left.values())
    finally:
        for fd in fds:
            os.close(fd)


def test_sigterm_to_the_whole_process_group_exits_0_even_when_workers_stop_first(tmp_path):
    good = FakeOpenAI(Behavior.reply(CHAT_JSON)).start_in_thread()
    proc, port = _start(tmp_path, good)
    try:
        workers = _worker_pids(proc, port, 2)
        # systemd (KillMode=control-group), `docker stop` and Ctrl-C signal every process at once. Hold the
        # supervisor until its workers are gone, so it sees their exits together with its own signal: the
        # order a busy machine produced in 2 of 8 runs before
        os.kill(proc.pid, signal.SIGSTOP)
        os.killpg(proc.pid, signal.SIGTERM)
        assert _wait_exited(workers, 30) == set()
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        good.stop()
    # before: exit 1 with "worker ... exited with 0; stopping the others" (a failed unit on every such stop)
    assert proc.returncode == 0, err.decode()[-800:]
    assert "stopping the others" not in err.decode()


def test_workers_stop_when_the_supervisor_is_killed(tmp_path):
    good = FakeOpenAI(Behavior.reply(CHAT_JSON)).start_in_thread()
    proc, port = _start(tmp_path, good)
    workers: set[int] = set()
    try:
        workers = _worker_pids(proc, port, 2)
        proc.kill()        # SIGKILL (the OOM killer): no handler runs in the supervisor
        proc.wait()        # (not communicate(): orphaned workers would hold its pipes open)
        # before: the orphaned workers kept serving, and held the port against a restarted gateway
        assert _wait_exited(workers, 15) == set()
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        proc.stderr.close()
        good.stop()
