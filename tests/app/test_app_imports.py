"""The app installs lean (`pip install -e '.[app]'`): `hearth serve` and every app module must import
nothing from torch, triton, transformers or hearth's kernels / training / benchmark code."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "triton", "transformers", "peft", "numpy", "matplotlib", "playwright")
OWN = ("hearth.kernels", "hearth.nn", "hearth.patch", "hearth.train", "hearth.bench", "hearth.inspect")

PROBE = f"""
import pkgutil, sys, importlib
from typer.testing import CliRunner
import hearth.app, hearth.cli
assert CliRunner().invoke(hearth.cli.app, ["serve", "--help"]).exit_code == 0
for mod in pkgutil.walk_packages(hearth.app.__path__, "hearth.app."):
    if not mod.name.startswith("hearth.app.storage.migrations"):  # alembic loads those itself
        importlib.import_module(mod.name)
from hearth.app.crypto import new_master_key_text
from hearth.app.main import create_app
from hearth.app.settings import load_settings
create_app(load_settings(None, env={{"HEARTH_MASTER_KEY": new_master_key_text()}},
                         overrides={{"database_url": "sqlite:///unused.sqlite3"}}))
bad = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r} or m.startswith({OWN!r}))
print("HEAVY:", bad)
"""


def test_hearth_serve_and_the_app_import_no_training_stack(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY: []" in out.stdout, out.stdout
