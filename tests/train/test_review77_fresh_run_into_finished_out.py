"""Review 77 (train): a fresh run into an OUT that holds an earlier, finished run left OUT mixed when it failed.

Was: a fresh run (no --resume) rewrote OUT/run.toml and metrics.jsonl at its start and the adapter only at its end.
Failed or killed part-way, OUT held the new run's run.toml / metrics.jsonl beside the OLD run's adapter, which a
user then took as the new result.

Now such a run first moves the earlier run's files (its adapter with peft's README.md, run.toml, metrics.jsonl,
metrics.json, loss.png) into OUT/superseded-<time>/ (renamed, never deleted) before it writes anything into OUT,
and says so. Tiny random Qwen3 on the CPU, plain transformers (--no-patch).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from hearth.train import finetune
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")

KW = dict(batch_tokens=1024, max_steps=2)
# what a finished run leaves at OUT's top level (loss.png when matplotlib is installed)
RUN_FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md", "run.toml", "metrics.jsonl",
             "metrics.json", "loss.png")


def files(folder):
    """{name: bytes} of the run files at ``folder``'s top level."""
    return {name: (folder / name).read_bytes() for name in RUN_FILES if (folder / name).is_file()}


def superseded(out):
    return sorted(p for p in out.iterdir() if p.name.startswith("superseded-"))


def finished_run(corpus, base, out, **kw):
    finetune.train_model(run_config(corpus, base, out, **{**KW, **kw}), console=Console(file=io.StringIO()))
    before = files(out)
    assert {"adapter_config.json", "adapter_model.safetensors", "run.toml", "metrics.jsonl", "metrics.json"} <= set(before)
    return before


def test_a_fresh_run_that_fails_leaves_no_earlier_adapter_beside_its_metrics(tmp_path, corpus, base, monkeypatch):
    out = tmp_path / "o"
    before = finished_run(corpus, base, out)

    def killed(*a, **k):  # the second run trains its steps (run.toml, metrics.jsonl written), then dies
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "_save_final_adapter", killed)
    said = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        # another setting, so the second run's run.toml differs from the first's
        finetune.train_model(run_config(corpus, base, out, **{**KW, "lr": 5e-3}), console=Console(file=said, width=400))
    # the second run did write its run.toml and metrics before it died...
    assert "lr = 0.005" in (out / "run.toml").read_text(encoding="utf-8")
    assert (out / "metrics.jsonl").read_bytes() != before["metrics.jsonl"]
    # ...and no adapter of the first run is beside them (nor its metrics.json / loss.png)
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "README.md", "metrics.json",
                 "loss.png"):
        assert not (out / name).exists(), f"{name} of the first run left in OUT beside the second run's run.toml"
    # the first run is whole, byte for byte, under OUT/superseded-*/
    aside = superseded(out)
    assert len(aside) == 1, list(out.iterdir())
    assert files(aside[0]) == before
    assert str(aside[0]) in said.getvalue() or aside[0].name in said.getvalue(), said.getvalue()
    # the folder is no run's checkpoints: --resume OUT finds nothing to take
    assert finetune.run_checkpoints(out) == []
    with pytest.raises(ValueError, match="resume"):
        finetune.find_checkpoint(out)


def test_a_fresh_run_that_succeeds_replaces_the_earlier_run_and_keeps_it_aside(tmp_path, corpus, base):
    out = tmp_path / "o"
    before = finished_run(corpus, base, out)
    said = io.StringIO()
    finetune.train_model(run_config(corpus, base, out, **{**KW, "lr": 5e-3}), console=Console(file=said, width=400))
    after = files(out)
    assert {"adapter_config.json", "adapter_model.safetensors", "run.toml", "metrics.jsonl", "metrics.json"} <= set(after)
    assert "lr = 0.005" in after["run.toml"].decode()
    assert after["adapter_model.safetensors"] != before["adapter_model.safetensors"]
    aside = superseded(out)
    assert len(aside) == 1, list(out.iterdir())
    assert files(aside[0]) == before
    assert "superseded-" in said.getvalue(), said.getvalue()


def test_a_fresh_run_into_an_empty_or_new_out_creates_no_superseded_folder(tmp_path, corpus, base):
    new = tmp_path / "new"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("mine\n", encoding="utf-8")  # not a run's file: left alone
    for out in (new, empty):
        said = io.StringIO()
        finetune.train_model(run_config(corpus, base, out, **KW), console=Console(file=said, width=400))
        assert superseded(out) == [], list(out.iterdir())
        assert "superseded" not in said.getvalue()
    assert (empty / "notes.txt").read_text(encoding="utf-8") == "mine\n"


def test_a_resume_into_out_moves_nothing(tmp_path, corpus, base):
    out = tmp_path / "o"
    finished_run(corpus, base, out, max_steps=4, save_every=2)
    listing = sorted(p.name for p in out.iterdir())
    said = io.StringIO()
    _, metrics = finetune.train_model(run_config(corpus, base, out, resume=out, max_steps=4, save_every=2,
                                                 batch_tokens=1024), console=Console(file=said, width=400))
    assert metrics["resumed_from"].endswith("step-000002")
    assert superseded(out) == [] and sorted(p.name for p in out.iterdir()) == listing
    assert "superseded" not in said.getvalue()


def test_repeating_a_run_from_its_own_run_toml_into_the_same_out(tmp_path, corpus, base):
    out = tmp_path / "o"
    before = finished_run(corpus, base, out)
    # `hearth train OUT/run.toml`: the config is read before the earlier run's run.toml is moved aside
    assert finetune.main(out / "run.toml") == 0
    assert (out / "run.toml").read_bytes() == before["run.toml"]  # the same config, written again
    assert {"adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "metrics.json"} <= set(files(out))
    aside = superseded(out)
    assert len(aside) == 1, list(out.iterdir())
    assert files(aside[0]) == before


def test_an_interrupted_adapter_publish_is_completed_before_the_move(tmp_path, corpus, base):
    """A run killed while publishing its adapter (OUT/.adapter.new committed, the old adapter still in OUT): the new
    adapter is completed first, so the set moved aside is that run's whole adapter."""
    import shutil

    out = tmp_path / "o"
    finished_run(corpus, base, out)
    # as _save_final_adapter leaves it killed right after the commit: a second, different adapter as .adapter.new
    other = tmp_path / "other"
    finished_run(corpus, base, other, lr=5e-3)
    shutil.copytree(other, out / ".adapter.new",
                    ignore=lambda d, names: [n for n in names if n not in finetune.ADAPTER.files])
    committed = {n: (out / ".adapter.new" / n).read_bytes() for n in ("adapter_config.json", "adapter_model.safetensors")}
    finetune.train_model(run_config(corpus, base, out, **KW), console=Console(file=io.StringIO()))
    aside = superseded(out)
    assert len(aside) == 1, list(out.iterdir())
    assert {n: (aside[0] / n).read_bytes() for n in committed} == committed
    assert not (out / ".adapter.new").exists() and not (aside[0] / ".adapter.new").exists()
