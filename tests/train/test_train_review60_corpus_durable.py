"""Review 60 (train): `hearth corpus build`'s files are on the disk before they take their names.

Was: train.jsonl, rejected.jsonl and stats.json were written to NAME.tmp and renamed with no fsync. A rename is
atomic but not a flush: after a host crash or power cut the new name can be on the disk while the data is not, so
a build that had "finished" left an empty or partial train.jsonl in place of the last good one (docs/corpus.md
promises that an interrupted build never leaves a half-written train.jsonl; hearth train's own files are fsynced,
hearth.train.durable).
"""

from __future__ import annotations

from hearth.train.corpus import TEMPLATE_PATH, build


def test_the_built_files_are_flushed_before_the_rename_and_the_folder_after(tmp_path, disk_events):
    out = tmp_path / "out"
    build(TEMPLATE_PATH.parent / "example_corpus.jsonl", out)
    events = [("replace", e[2]) if e[0] == "replace" else e for e in disk_events]  # a replace by its new name
    for name in ("train.jsonl", "rejected.jsonl", "stats.json"):
        final = str(out / name)
        assert ("replace", final) in events, (name, events)
        renamed = events.index(("replace", final))
        # its data, under the temporary name (since the build publishes its files as one set: in OUT/.corpus.tmp,
        # tests/train/test_train_corpus_publish_crash.py)
        assert ("fsync", str(out / ".corpus.tmp" / name)) in events[:renamed], (name, events)
        assert ("fsync", str(out)) in events[renamed:], (name, events)  # the rename itself
    assert (out / "train.jsonl").stat().st_size > 0 and not list(out.glob("*.tmp"))
