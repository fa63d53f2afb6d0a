"""Review 61: the metrics files a run writes are on the disk before what relies on them (a checkpoint's name, the
metrics.json rename). Tiny random Qwen3 on the CPU, plain transformers (--no-patch)."""

from __future__ import annotations

import pytest

from hearth.train import finetune
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_metrics_rows_are_on_disk_before_the_checkpoint_of_their_step_is_named(tmp_path, corpus, base, monkeypatch,
                                                                               disk_events):
    # a checkpoint is fsynced before it takes its name, so it survives a power cut; metrics.jsonl's rows were only
    # flushed to the page cache. After a power cut, --resume OUT took step-N and kept the rows up to N that the file
    # still held: some or all of steps 1..N were missing from metrics.jsonl (and metrics.json's loss) for good
    events = disk_events
    real_save = finetune.save_checkpoint

    def recording_save(*args, **kwargs):
        events.append(("save", kwargs["step"]))
        return real_save(*args, **kwargs)

    monkeypatch.setattr(finetune, "save_checkpoint", recording_save)
    out = tmp_path / "r"
    finetune.train_model(run_config(corpus, base, out, batch_tokens=1024, max_steps=3, save_every=2))
    log = str(out / "metrics.jsonl")
    save = events.index(("save", 2))
    assert ("fsync", log) in events[:save], "metrics.jsonl was not fsynced before checkpoint step 2 was written"


def test_metrics_json_is_on_disk_before_it_takes_its_name(tmp_path, corpus, base, disk_events):
    # metrics.json was written to metrics.json.tmp and renamed over the previous one without an fsync: after a power
    # cut the rename could be on the disk and the data not, leaving an empty metrics.json (run.toml and metrics.jsonl
    # go through hearth.durable.write_text)
    out = tmp_path / "r"
    finetune.train_model(run_config(corpus, base, out, batch_tokens=1024, max_steps=1))
    assert ("fsync", str(out / "metrics.json.tmp")) in disk_events, "metrics.json.tmp was not fsynced before the rename"
