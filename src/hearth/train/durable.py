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


def replace_dir(tmp: Path, final: Path, aside: Path) -> None:
    """``tmp`` (complete and fsync_tree'd) takes ``final``'s name. A previous ``final`` is renamed to ``aside`` first
    and deleted only once ``tmp`` has the name, so no moment leaves a half-deleted ``final`` under its name; if that
    rename fails, the previous one is put back under its name (and the error raised). The folder holding them is
    synced after the renames. A process killed between the two renames leaves the previous folder only under
    ``aside``: ``restore_aside`` puts it back."""
    import shutil

    if final.exists():
        final.rename(aside)
    try:
        tmp.rename(final)
    except BaseException:
        if aside.exists() and not final.exists():
            aside.rename(final)
        raise
    fsync(final.parent)  # the renames themselves on the disk
    if aside.exists():
        shutil.rmtree(aside)


def restore_aside(final: Path, aside: Path) -> bool:
    """After a ``replace_dir`` killed between its renames (``final`` missing, the previous folder, whole since it was on
    the disk before it first took its name, only under ``aside``): rename it back and sync the parent. Whether it
    did."""
    if final.exists() or not aside.is_dir():
        return False
    aside.rename(final)
    fsync(final.parent)
    return True
