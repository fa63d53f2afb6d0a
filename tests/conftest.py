"""Test-wide set-up. Without CUDA, Triton kernels run in the CPU interpreter: the variable
must be set before triton is first imported, hence here, before anything imports torch.

Timed tests: CI is a loaded 2-core machine that has stalled a process by about a second. A test tells right
from wrong by what happened (attempts, counts, labels, bytes), and where it needs the clock, the wrong
behaviour costs seconds (a long timeout, or an asyncio.Event the test sets) and a bound leaves at least
1.5 s of slack (tests/gateway/gateway_helpers.py: MARGIN_S, SLOW_S); a call that should succeed gets over a
second of room under its timeout. A port picked by free_port() for a child process is picked again when the
child reports it in use."""

import os
import shutil
import subprocess

if os.environ.get("TRITON_INTERPRET") is None:
    has_gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True
    ).returncode == 0
    if not has_gpu:
        os.environ["TRITON_INTERPRET"] = "1"


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """After each test on a GPU, hand this worker's cached blocks back to the driver: scripts/gpu/test.sh runs
    several pytest workers on one GPU, and a worker that keeps tens of GiB cached from an earlier test made a
    big test in another worker run out of memory."""
    yield
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _seed_torch():
    """Each test starts from torch's seed 0. A test that draws its inputs without seeding (many kernel tests do)
    otherwise got whatever the tests before it in its worker left (`--dist loadfile` hands the files to the workers
    in no fixed order), and a tolerance that most draws meet could fail on one. Tests that seed keep their seed.
    Only where torch is already imported: the gateway's and the app's workers need not load it."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)
    yield


@pytest.fixture
def disk_events(monkeypatch):
    """What a crash-safe write sends to the disk, in call order, for the tests of hearth's durable writes:
    ("fsync", the path of the file or folder), ("replace", src, dst) for os.replace and ("rename", src, dst) for
    os.rename (Path.rename calls it). Each real call is still made; a test may append events of its own."""
    events: list[tuple] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", os.fspath(src), os.fspath(dst)))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return events


def pytest_addoption(parser):
    parser.addoption(
        "--gpu-big", choices=("with", "skip", "only"), default="with",
        help="the tests marked xdist_group('gpu_big') (big fp32/fp64 references on the GPU): run them with the rest "
             "(default), leave them out, or run only them. scripts/gpu/test.sh runs the suite in two passes, the "
             "workers without them, then them alone: beside 13 other workers on an 80 GB H100 five of them ran out "
             "of memory (2026-12-06).")


def _is_gpu_big(item) -> bool:
    return any((m.args[:1] or (m.kwargs.get("name"),))[0] == "gpu_big" for m in item.iter_markers("xdist_group"))


def pytest_collection_modifyitems(config, items):
    choice = config.getoption("--gpu-big")
    if choice == "with":
        return
    keep, dropped = [], []
    for it in items:
        (keep if _is_gpu_big(it) == (choice == "only") else dropped).append(it)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
