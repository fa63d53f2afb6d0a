"""`hearth export` as the export tests call it: the command run in-process on string arguments, and a folder's
files read whole, to tell an export left untouched (byte for byte) from one written over."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from hearth.cli import app


def export(*args):
    """The result of `hearth export ARGS` (paths given as Path are passed as strings)."""
    return CliRunner().invoke(app, ["export", *map(str, args)])


def snapshot(folder: Path) -> dict:
    """{file name: its bytes} for every file in ``folder``."""
    return {p.name: p.read_bytes() for p in folder.iterdir()}
