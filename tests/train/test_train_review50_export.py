"""Review 50, `hearth export` durability: the merged folder is on the disk before it takes its name (files and the
folder fsynced before the rename, the parent folder after it), and no crash between the two renames of a re-export
can leave --out without the previous export."""

from __future__ import annotations

import json
import os

import pytest

from tests.train.exporting import export, snapshot

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def test_the_export_is_on_the_disk_before_it_takes_its_name(tmp_path, export_parts, disk_events):
    """export() renamed .OUT.export-tmp to OUT with no fsync: a rename is not a flush, so after a power cut OUT could
    exist with empty or partial files (a zero-length model.safetensors), which a server then fails to load or, worse,
    the next re-export takes as a complete earlier export."""
    tok_dir, bare, adapter = export_parts
    out = tmp_path / "merged"
    events = disk_events
    assert export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", tok_dir).exit_code == 0
    tmp = str(tmp_path / ".merged.export-tmp")
    named = events.index(("rename", tmp, str(out)))
    synced_before = {e[1] for e in events[:named] if e[0] == "fsync"}
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in files and "export.json" in files and "tokenizer.json" in files
    want = {os.path.join(tmp, name) for name in files} | {tmp}  # every file under its temporary name, and the folder
    assert want <= synced_before, sorted(want - synced_before)
    # the folder holding the new name, after the rename: the rename itself on the disk
    assert ("fsync", str(tmp_path)) in events[named + 1:]


def test_a_failed_final_rename_puts_the_previous_export_back(tmp_path, export_parts, monkeypatch):
    """A re-export moved OUT aside (.OUT.export-old) and then renamed the new folder into place; when that second rename
    failed, OUT was left missing and the previous export only under the hidden name (which the next export deletes)."""
    tok_dir, bare, adapter = export_parts
    out = tmp_path / "merged"
    assert export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", tok_dir).exit_code == 0
    before = snapshot(out)
    real_rename = os.rename

    def failing_rename(src, dst, *a, **k):
        if str(src).endswith(".export-tmp"):
            raise OSError(5, "Input/output error")
        return real_rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", failing_rename)
    result = export("--adapter", adapter, "--model", bare, "--out", out, "--dtype", "float16")
    assert result.exit_code == 1 and "Input/output error" in result.output, result.output
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_a_crash_between_the_renames_does_not_lose_the_previous_export(tmp_path, export_parts, monkeypatch):
    """A process killed between `OUT -> .OUT.export-old` and `.OUT.export-tmp -> OUT` leaves the previous export only
    under the hidden name. The next export deleted it as a leftover before writing: if that export failed too (a full
    disk), nothing was left of either."""
    tok_dir, bare, adapter = export_parts
    out = tmp_path / "merged"
    assert export("--adapter", adapter, "--model", bare, "--out", out, "--tokenizer", tok_dir).exit_code == 0
    before = snapshot(out)
    out.rename(tmp_path / ".merged.export-old")  # the state a kill between the two renames leaves
    real = transformers.PreTrainedModel.save_pretrained

    def full_disk(self, path, *a, **k):
        real(self, path, *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full_disk)
    result = export("--adapter", adapter, "--model", bare, "--out", out)
    assert result.exit_code == 1 and "No space left" in result.output, result.output
    assert out.is_dir() and snapshot(out) == before
    assert json.loads((out / "export.json").read_text())["tokenizer"] == str(tok_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_an_adapter_whose_publish_a_crash_interrupted_is_completed_and_exported(tmp_path, export_parts):
    """`hearth train` publishes its final adapter into OUT in a few renames (hearth.train.durable.publish_adapter); a
    kill after the commit leaves the new adapter's files partly under OUT/.adapter.in and no adapter_config.json in
    OUT. export refused that folder ("has no adapter_config.json") though the adapter in it was complete; it now
    completes the publish first, as the next run into OUT does."""
    import shutil

    tok_dir, bare, adapter = export_parts
    run = tmp_path / "run"
    shutil.copytree(adapter, run)
    moving = run / ".adapter.in"
    moving.mkdir()
    (run / "adapter_config.json").rename(moving / "adapter_config.json")  # moved in last: still in .adapter.in
    out = tmp_path / "merged"
    result = export("--adapter", run, "--model", bare, "--out", out, "--tokenizer", tok_dir)
    assert result.exit_code == 0, result.output
    assert (run / "adapter_config.json").is_file() and not moving.exists()
    assert json.loads((out / "export.json").read_text())["adapter_config"] == \
        json.loads((adapter / "adapter_config.json").read_text())
