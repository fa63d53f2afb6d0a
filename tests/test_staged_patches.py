"""The kernel changes waiting under scripts/gpu/staged/ (their GPU suite not yet run) still apply to main, in order.

A staged patch lands with `git am` in a later session with device time; a change on main that breaks its context
should fail here, on the CPU, rather than in that session's first minutes. The check applies the patches, in file
name order, to a scratch index read from HEAD (`git apply --cached` against GIT_INDEX_FILE), so neither the work
tree nor the repository's index is touched."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGED = ROOT / "scripts" / "gpu" / "staged"


def _git(args, env=None):
    return subprocess.run(["git", *args], cwd=ROOT, env=env, capture_output=True, text=True)


def _staged_patches():
    return sorted(STAGED.glob("*.patch"))


def test_staged_patches_apply_in_order(tmp_path):
    patches = _staged_patches()
    if not patches:
        pytest.skip("nothing staged")
    if shutil.which("git") is None or _git(["rev-parse", "--verify", "HEAD"]).returncode != 0:
        pytest.skip("needs git and a checkout with a HEAD commit")
    env = dict(os.environ, GIT_INDEX_FILE=str(tmp_path / "index"))
    read = _git(["read-tree", "HEAD"], env)
    assert read.returncode == 0, read.stderr
    for patch in patches:
        applied = _git(["apply", "--cached", str(patch)], env)
        assert applied.returncode == 0, f"{patch.name} no longer applies after those before it: {applied.stderr}"


def test_staged_readme_names_every_waiting_patch():
    """Each staged patch has its row in the staged README (what it is, what is known of it on the GPU)."""
    readme = (STAGED / "README.md").read_text()
    missing = [p.name for p in _staged_patches() if f"`{p.name}`" not in readme]
    assert not missing, f"staged patches without a README row: {missing}"
