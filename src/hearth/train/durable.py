"""Writes that survive a power cut: what hearth.train renames into place (a checkpoint, the final adapter, an export)
is flushed to the disk first, and the folder that holds the new name after.

A rename is atomic but not a flush: after a host crash the new name can be on the disk while the renamed files' data
is not, leaving a complete-looking folder of empty or partial files. So: write under a temporary name, fsync_tree()
it, rename, fsync() the parent folder.
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


def fsync_tree(folder: Path) -> None:
    """Everything under ``folder`` and the folder itself on the disk, before it is renamed into place: a rename is
    not a flush, and after a host crash or power cut a renamed folder could otherwise hold empty files."""
    folder = Path(folder)
    for entry in sorted(folder.rglob("*"), key=lambda p: (-len(p.parts), p)):  # the files, then their folders
        fsync(entry)
    fsync(folder)
