"""Files written whole or not at all, also after a power cut: the stdlib-only helpers every layer may use (the
bench harness's reports, hearth.train's checkpoints, adapters and corpus files through hearth.train.durable).

A rename is atomic but not a flush: after a host crash the new name can be on the disk while the renamed file's data
is not. So: write under a temporary name beside the target, flush it, rename it over the target, flush the folder.
This module imports nothing of hearth, so the lower layers (bench) can use it as well as train and above.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to the disk (OSError from a folder on a file system that cannot
    sync one is ignored; a file's is not)."""
    path = Path(path)
    folder = path.is_dir()
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not folder:
            raise


def folder_problem(path: Path, within: Path | None = None) -> str | None:
    """Why the folder ``path`` (or, with ``within``, something built in ``within``: a sibling temporary) cannot be
    created and written, judged at the nearest existing folder among ``within`` (default ``path``) and its parents:
    it is a file, or this process cannot write in it. None when nothing stands in the way. For start-up checks: the
    first write of a long run met these only after its work, with a bare FileExistsError / PermissionError."""
    path = Path(path)
    start = path if within is None else Path(within)
    for folder in (start, *start.parents):
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder" + (f" (so {path} cannot be created)" if folder != path else "")
            if not os.access(folder, os.W_OK | os.X_OK):
                return f"cannot write in {folder} (permission denied)" + (
                    f", where {path} is built" if folder != path else "")
            return None
    return None


def write_text(path: Path, text: str) -> None:
    """``path`` holding ``text``, whole or not at all, also after a power cut: written to PATH.tmp beside it and
    flushed, renamed over it, the folder flushed. Writing in place (truncate, then write) left it empty or torn after
    a crash in between (a kill, a full disk); a rename alone is not a flush (the new name could reach the disk before
    its data). A write that fails (a text UTF-8 cannot hold, a full disk) leaves the previous ``path`` as it was, and no
    PATH.tmp."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)


def write_file(path: Path, write, *, tmp: Path | None = None) -> None:
    """``path`` made whole or not at all by ``write(tmp)``, a callable that writes the complete file at the path it is
    given (a matplotlib savefig, say): run on PATH.tmp beside it, flushed, renamed over it, the folder flushed. A
    ``write`` that raises leaves the previous ``path`` as it was, and no PATH.tmp. ``tmp``: another temporary in the
    same folder (one of the caller's own, where two processes may write one ``path``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else Path(tmp)
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync(path.parent)
