"""Wait for a child process's HTTP server to answer (tests and benchmarks/gateway start servers as processes)."""

from __future__ import annotations

import subprocess
import time
from typing import Callable

import httpx


def wait_http_ok(url: str, proc: subprocess.Popen, timeout_s: float, *, name: str, details: Callable[[], str],
                 poll_s: float = 0.05) -> None:
    """Return once GET `url` answers 200. RuntimeError naming `name`, with details() (its log, say), when `proc`
    exits first or `timeout_s` passes. Another process has no event to await: this polls every `poll_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {details()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not ready after {timeout_s} s: {details()}")
        time.sleep(poll_s)
