"""Stand-in commands for tests of shell scripts: an executable script under a bin folder put first on PATH (a fake
`python3`, `ncu`), so a script's calls reach it instead of the real program."""

from __future__ import annotations

import os
from pathlib import Path


def fake_command(bin_dir: Path, name: str, text: str) -> Path:
    """bin_dir/name holding `text` (a script with its #! line), executable; bin_dir is created when missing."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def path_with(bin_dir: Path) -> str:
    """PATH with bin_dir first, then this process's own PATH."""
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
