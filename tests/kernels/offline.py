"""Offline sm_90 builds for the kernel tests: the interpreter never type-checks a kernel, so the tests compile
the real kernels for the H200 with Triton's bundled ptxas (no GPU needed). That must run in a subprocess:
TRITON_INTERPRET=1 (set for the CPU tests) replaces @triton.jit functions in this process."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

_SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def run_offline(script: str, *arg_sets: tuple[str, ...], timeout: float = 600):
    """Run `script` (Python source that prints one JSON value on its last line) without the interpreter, with
    this checkout's src first on the path; once per arg set (argv after the script), two at a time (CI has two
    cores), or once with no arguments. Returns the parsed values in arg-set order (the one value when no arg
    sets are given). Skips the test when Triton's bundled ptxas is missing; any other failure fails it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([_SRC, env.get("PYTHONPATH", "")])

    def run(args):
        return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                              timeout=timeout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, arg_sets or [()]))
    values = []
    for res in results:
        if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr:
            pytest.skip("Triton's bundled ptxas is missing")
        assert res.returncode == 0, res.stderr[-3000:]
        values.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return values if arg_sets else values[0]
