"""Test-wide set-up. Without CUDA, Triton kernels run in the CPU interpreter: the variable
must be set before triton is first imported, hence here, before anything imports torch."""

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
