"""Writes that survive a power cut: what hearth.train renames into place (a checkpoint, the final adapter, an export)
is flushed to the disk first, and the folder that holds the new name after.

A rename is atomic but not a flush: after a host crash the new name can be on the disk while the renamed files' data
is not, leaving a complete-looking folder of empty or partial files. So: write under a temporary name, fsync_tree()
it, rename, fsync() the parent folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# the single-file helpers (fsync, write_text, write_file) live one layer down, in hearth.durable: the bench harness,
# below hearth.train, writes its reports with them too
from hearth.durable import fsync


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


# the final adapter of a run lies in OUT itself, beside run.toml and the metrics (any peft / vLLM loader and `hearth
# export --adapter OUT` take the folder as it is), so no single rename can swap it: publish_adapter() makes the
# complete new one the adapter in a few renames ordered so that adapter_config.json, which every loader reads
# first, is in OUT only beside the files of its own adapter
ADAPTER_CONFIG = "adapter_config.json"
# what an adapter in OUT may hold besides what the new one brings (peft's model card and its older .bin weights)
ADAPTER_FILES = (ADAPTER_CONFIG, "adapter_model.safetensors", "adapter_model.bin", "README.md")
# OUT/.adapter.tmp: being written (a crash leaves no adapter of it); .adapter.new: complete and fsynced, the old
# adapter still in OUT; .adapter.in: the old adapter's files moved aside into .adapter.old, the new ones moving in
ADAPTER_TMP, ADAPTER_NEW, ADAPTER_IN, ADAPTER_OLD = ".adapter.tmp", ".adapter.new", ".adapter.in", ".adapter.old"

# `hearth corpus build`'s files lie in OUT_DIR itself too (`hearth train --corpus OUT_DIR/train.jsonl`, and the
# author may keep the conversations there), and are published the same way, train.jsonl (what hearth train reads)
# being the file that names the set: in OUT_DIR only beside the rejected.jsonl and stats.json of its own build
CORPUS_KEY = "train.jsonl"
CORPUS_FILES = (CORPUS_KEY, "rejected.jsonl", "stats.json")
CORPUS_TMP, CORPUS_NEW, CORPUS_IN, CORPUS_OLD = ".corpus.tmp", ".corpus.new", ".corpus.in", ".corpus.old"


@dataclass(frozen=True)
class FileSet:
    """Files published into a folder as one set (publish_set): ``key`` is the file every reader opens first (moved
    aside first, moved in last), ``files`` every name an older set in the folder may hold, and tmp / new / moving /
    old the folder's staging folders (being written; committed; old set aside, new one moving in; the old set)."""

    key: str
    files: tuple[str, ...]
    tmp: str
    new: str
    moving: str
    old: str


ADAPTER = FileSet(ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_TMP, ADAPTER_NEW, ADAPTER_IN, ADAPTER_OLD)
CORPUS = FileSet(CORPUS_KEY, CORPUS_FILES, CORPUS_TMP, CORPUS_NEW, CORPUS_IN, CORPUS_OLD)


def publish_set(tmp: Path, out: Path, kind: FileSet) -> None:
    """``tmp`` (a complete set of ``kind``'s files, fsync_tree'd, on OUT's file system) becomes the set in ``out``.
    Its rename to OUT/<kind.new> is the commit: from then on a crash (a kill, a power cut) leaves what finish_publish()
    completes into the new set, and before it the old set is untouched. In between OUT holds either the whole old
    set, or no ``kind.key`` (the old one is moved aside first, the new one moved in last: a reader refuses the folder
    rather than take the new key file beside the old set's other files or the reverse), or the whole new one."""
    tmp, out = Path(tmp), Path(out)
    finish_publish(out, kind)  # an earlier publish killed part-way: completed first, not mixed with this one
    tmp.rename(out / kind.new)
    fsync(out)
    finish_publish(out, kind)


def publish_pending(out: Path, kind: FileSet) -> bool:
    """Whether OUT holds a publish_set() of ``kind`` that a crash interrupted after its commit (finish_publish()
    completes it); read-only."""
    out = Path(out)
    return (out / kind.new).is_dir() or (out / kind.moving).is_dir()


def finish_publish(out: Path, kind: FileSet) -> bool:
    """Complete a publish_set() that a crash interrupted after its commit: the old set's files aside, the new one's
    in (``kind.key`` last), the leftovers deleted. Idempotent; every step is a rename in OUT, fsynced before the next
    depends on it. An uncommitted OUT/<kind.tmp> is not touched (the writer deletes it). Whether there was one to
    finish."""
    import shutil

    out = Path(out)
    new, moving, old = out / kind.new, out / kind.moving, out / kind.old
    found = new.is_dir() or moving.is_dir()
    if new.is_dir():
        # the old set aside, its key first: from that rename on OUT holds no set a reader takes. Every name in OUT
        # that the old set or the new one can hold is the old one's here (nothing new is in yet)
        names = list(dict.fromkeys([kind.key, *kind.files, *sorted(p.name for p in new.iterdir())]))
        old.mkdir(exist_ok=True)
        for name in names:
            if (out / name).exists() or (out / name).is_symlink():
                if (old / name).is_dir():  # left by an earlier publish killed while deleting <kind.old>
                    shutil.rmtree(old / name)
                os.replace(out / name, old / name)
                if name == kind.key:
                    fsync(out)  # the key gone before any other file of the old set
        fsync(out)
        new.rename(moving)  # the old set is all aside: what is in OUT from here on is the new one's
        fsync(out)
    if moving.is_dir():
        entries = sorted(moving.iterdir(), key=lambda p: (p.name == kind.key, p.name))
        for entry in entries:
            if entry.name == kind.key:
                fsync(out)  # every other file of the new set in OUT before its key names it a set
            os.replace(entry, out / entry.name)
        fsync(out)
        moving.rmdir()
        fsync(out)
    if old.exists():
        shutil.rmtree(old)
    return found


def publish_adapter(tmp: Path, out: Path) -> None:
    """``tmp`` (a complete adapter folder, fsync_tree'd, on OUT's file system) becomes the adapter in ``out``
    (publish_set with adapter_config.json as the key: OUT holds the whole old adapter, no adapter_config.json, or
    the whole new one; a loader refuses the folder rather than load the new config over the old weights or the
    reverse)."""
    publish_set(tmp, out, ADAPTER)


def finish_adapter_publish(out: Path) -> bool:
    """Complete a publish_adapter() that a crash interrupted after its commit (finish_publish). Whether there was one
    to finish."""
    return finish_publish(out, ADAPTER)


def publish_corpus(tmp: Path, out: Path) -> None:
    """``tmp`` (a complete `hearth corpus build` output, fsync_tree'd, on OUT's file system) becomes the corpus in
    ``out`` (publish_set with train.jsonl as the key: OUT holds the whole old set, no train.jsonl, or the whole new
    set; never a train.jsonl beside another build's rejected.jsonl / stats.json)."""
    publish_set(tmp, out, CORPUS)


def finish_corpus_publish(out: Path) -> bool:
    """Complete a publish_corpus() that a crash interrupted after its commit (finish_publish). Whether there was one
    to finish."""
    return finish_publish(out, CORPUS)
