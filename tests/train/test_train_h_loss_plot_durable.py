"""loss.png survives a power cut whole: its temporary is fsynced before the rename and OUT after, as metrics.json
(hearth.durable). Was: plot_losses renamed loss.png.tmp over loss.png with no fsync, so after a host crash the new
name could reach the disk before its data: a zero-length loss.png in place of the last good plot (a resumed run
rewrites it over its earlier run's)."""

from __future__ import annotations

import pytest

from hearth.train import finetune
from tests.train.test_train_review54_loss_plot import ROWS

pytest.importorskip("matplotlib")


def test_loss_png_is_flushed_before_its_rename_and_the_folder_after(tmp_path, disk_events):
    events = disk_events
    path = tmp_path / "loss.png"
    finetune.plot_losses(ROWS, path)
    rename = events.index(("replace", str(path.with_name("loss.png.tmp")), str(path)))
    assert ("fsync", str(path.with_name("loss.png.tmp"))) in events[:rename], "loss.png.tmp not fsynced before the rename"
    assert ("fsync", str(tmp_path)) in events[rename:], "the folder was not fsynced after the rename"
    assert path.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png"]
