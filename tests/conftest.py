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
