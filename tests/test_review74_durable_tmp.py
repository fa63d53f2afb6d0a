"""hearth.durable.write_text: a write that fails (a text the encoding cannot hold, a full disk) leaves the previous
file as it was and no PATH.tmp beside it, as write_file does."""

import os

import pytest

from hearth import durable


def test_write_text_unencodable_leaves_no_tmp(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old\n", encoding="utf-8")
    with pytest.raises(UnicodeEncodeError):
        durable.write_text(target, "half \ud800 a character")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_write_text_failed_flush_leaves_no_tmp(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    real = os.fsync

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable.os, "fsync", full_disk)
    with pytest.raises(OSError):
        durable.write_text(target, "{}\n")
    monkeypatch.setattr(durable.os, "fsync", real)
    assert list(tmp_path.iterdir()) == []


def test_write_text_still_writes(tmp_path):
    target = tmp_path / "a.txt"
    durable.write_text(target, "x\n")
    durable.write_text(target, "y\n")
    assert target.read_text(encoding="utf-8") == "y\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
