"""Review 51c: settings that passed start-up and failed only once the run had trained, losing the steps (or the
whole run) before them. Each is now found before the model loads. Tiny random Qwen3 on the CPU, plain
transformers."""

from __future__ import annotations

import io
import json
import sys

import pytest

from hearth.train import finetune
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")


def _never_load(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded: the setting was not refused at start-up")

    monkeypatch.setattr(finetune, "load_model", no_model)


def test_a_file_where_the_checkpoints_go_is_refused_before_training(tmp_path, corpus, base, monkeypatch):
    # save_every wrote its first checkpoint into OUT/checkpoints after save_every steps: a file there failed the run
    # then (NotADirectoryError, exit 1), the steps before it lost
    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder\n")
    _never_load(monkeypatch)
    with pytest.raises(ValueError, match=r"^out: .*checkpoints is a file.*save_every"):
        finetune.train_model(run_config(corpus, base, out, max_steps=4, save_every=2, batch_tokens=1024))
    assert (out / "checkpoints").read_text() == "not a folder\n"  # nothing of the user's is touched


@pytest.mark.parametrize("name", ["loss.png", "metrics.json", "adapter_model.safetensors"])
def test_a_folder_where_the_run_writes_a_file_is_refused_before_training(tmp_path, corpus, base, monkeypatch, name):
    # the plot, the summary and the adapter are written after the last step: a folder by one of those names failed
    # the run at its end (IsADirectoryError), with metrics.json never written
    out = tmp_path / "o"
    (out / name).mkdir(parents=True)
    (out / name / "keep.txt").write_text("mine\n")
    _never_load(monkeypatch)
    with pytest.raises(ValueError, match=rf"^out: .*{name} is a folder"):
        finetune.train_model(run_config(corpus, base, out, max_steps=2, batch_tokens=1024))
    assert (out / name / "keep.txt").read_text() == "mine\n"


def test_a_run_without_matplotlib_still_writes_its_metrics(tmp_path, corpus, base, monkeypatch):
    # an install without matplotlib (hearth[train] and hearth[kernels] bring it; a bare transformers + peft does not)
    # trained the whole run, then stopped at the plot with ModuleNotFoundError, before metrics.json was written.
    # The plot is drawn from metrics.jsonl, so its absence is said at start-up and the run goes on without it.
    from rich.console import Console

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    console = Console(file=io.StringIO(), width=400)
    _, metrics = finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=2, batch_tokens=1024),
                                      console=console)
    lines = console.file.getvalue().splitlines()
    assert len(metrics["loss"]) == 2
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["loss"] == metrics["loss"]
    assert not (tmp_path / "o" / "loss.png").exists()
    said = [line for line in lines if "matplotlib" in line]
    assert said and "loss.png" in said[0]
    assert lines.index(said[0]) < next(i for i, line in enumerate(lines) if line.startswith("checkpointing"))
