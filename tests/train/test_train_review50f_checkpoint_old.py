"""Review 50f: a re-save of step-N renames the old step-N aside (step-N.old), renames the new one in, then deletes
the .old. Killed between the two renames, only step-N.old is left: `--resume` then took step N-1 (a step lost). On
discovery a whole step-N.old with no step-N is put back under its name first (as export.py does for an export).
Tiny random Qwen3 on the CPU, plain transformers."""

from __future__ import annotations

import json

import pytest

from hearth.train import finetune
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")


def cfg(corpus, base, out, **kw) -> finetune.FinetuneConfig:
    return run_config(corpus, base, out, **{"batch_tokens": 1024, **kw})


def _killed_between_the_renames(out, step: int):
    """The disk as a save of `step` killed after `step-N -> step-N.old` and before `step-N.tmp -> step-N` leaves it."""
    final = out / "checkpoints" / f"step-{step:06d}"
    old = final.with_name(final.name + ".old")
    final.rename(old)
    return final, old


def test_resume_takes_a_checkpoint_a_kill_left_only_under_its_old_name(tmp_path, corpus, base):
    kw = dict(max_steps=3, save_every=1)
    out = tmp_path / "r"
    finetune.train_model(cfg(corpus, base, out, **kw))
    final, old = _killed_between_the_renames(out, 2)  # the last step writes the adapter, not a checkpoint

    # before: step-000002.old was no checkpoint, so --resume OUT took step 1 (a step lost)
    found = finetune.find_checkpoint(out)
    assert found == final and (found / "adapter_model.safetensors").is_file() and not old.exists()
    assert json.loads((found / "state.json").read_text())["step"] == 2
    assert [p.name for p in finetune.run_checkpoints(out)] == ["step-000001", "step-000002"]

    # and the run resumes from it
    _, metrics = finetune.train_model(cfg(corpus, base, out, resume=out, **kw))
    assert metrics["resumed_from"] == str(final) and len(metrics["loss"]) == 3


def test_a_resume_naming_the_step_folder_finds_it_under_its_old_name(tmp_path, corpus, base):
    kw = dict(max_steps=3, save_every=1)
    out = tmp_path / "s"
    finetune.train_model(cfg(corpus, base, out, **kw))
    final, old = _killed_between_the_renames(out, 2)
    assert finetune.find_checkpoint(final) == final and not old.exists()


def test_a_fresh_run_sees_the_restored_checkpoint(tmp_path, corpus, base):
    kw = dict(max_steps=2, save_every=1)
    out = tmp_path / "f"
    finetune.train_model(cfg(corpus, base, out, **kw))
    final, old = _killed_between_the_renames(out, 1)
    # before: with only step-000001.old, a fresh run was let in and its first save deleted the earlier run's step
    with pytest.raises(ValueError, match="already holds checkpoints of an earlier run"):
        cfg(corpus, base, out, max_steps=1).check()
    assert (final / "state.json").is_file() and not old.exists()


def test_a_partly_deleted_old_folder_is_not_put_back(tmp_path, corpus, base):
    """An .old whose delete was cut short (its adapter gone) is no checkpoint, with or without a step-N."""
    out = tmp_path / "p"
    old = out / "checkpoints" / "step-000002.old"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="resume: .* is not a checkpoint folder"):
        finetune.find_checkpoint(out)
    assert old.is_dir() and not (out / "checkpoints" / "step-000002").exists()
