"""Review 51c: step settings that review 50 began to refuse (warmup_steps not shorter than the run, eval_every longer,
save_every not shorter) against checkpoints written before. warmup_steps is a resume key, so check() refused the
run as it was saved and check_resume() refused any other value: such a checkpoint could not be resumed at all. A
resume now keeps the values its checkpoint was saved with; a new run, or a value changed for the resume, is still
refused at start-up naming the key. Tiny random Qwen3 on the CPU, plain transformers."""

from __future__ import annotations

import json

import pytest
import torch

from hearth.train import finetune
from tests.train.finetune_spies import cut_after_checkpoint
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")

RUN = dict(batch_tokens=1024, warmup_steps=4, save_every=2)


def _unchecked(monkeypatch):
    """As `hearth train` was before review 50: no step settings checked against the run's length."""
    real = finetune.FinetuneConfig.check_steps
    monkeypatch.setattr(finetune.FinetuneConfig, "check_steps", lambda self, total, **kw: None)
    return lambda: monkeypatch.setattr(finetune.FinetuneConfig, "check_steps", real)


def _adapter(out):
    from safetensors.torch import load_file

    return load_file(str(out / "adapter_model.safetensors"))


# the run's length given as max_steps (check() refused it), or as epochs (the runner refused it once the step plan
# was known: the 12 examples at batch_tokens 1024 make 5 steps an epoch)
@pytest.mark.parametrize("length", [{"max_steps": 4, "warmup_steps": 4}, {"epochs": 1, "warmup_steps": 5}],
                         ids=["max_steps", "epochs"])
def test_a_checkpoint_saved_with_warmup_as_long_as_the_run_resumes_exactly(tmp_path, corpus, base, monkeypatch, length):
    kw = {**RUN, **length}
    checked = _unchecked(monkeypatch)
    _, straight = finetune.train_model(run_config(corpus, base, tmp_path / "straight", **kw))
    assert len(straight["loss"]) == kw["warmup_steps"]
    cut_after_checkpoint(run_config(corpus, base, tmp_path / "cut", **kw))
    checked()

    ckpt = tmp_path / "cut" / "checkpoints" / "step-000002"
    assert json.loads((ckpt / "state.json").read_text())["config"]["warmup_steps"] == kw["warmup_steps"]
    _, resumed = finetune.train_model(run_config(corpus, base, tmp_path / "cut", resume=tmp_path / "cut", **kw))
    assert resumed["loss"] == straight["loss"]
    a, b = _adapter(tmp_path / "straight"), _adapter(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_new_run_with_warmup_as_long_as_the_run_is_still_refused(tmp_path, corpus, base):
    with pytest.raises(ValueError, match="^warmup_steps: 4 is not shorter than the run's 4 optimizer steps"):
        run_config(corpus, base, tmp_path / "o", max_steps=4, warmup_steps=4).check()
    with pytest.raises(ValueError, match="^warmup_steps: 5 is not shorter than the run's 5 optimizer steps"):
        finetune.train_model(run_config(corpus, base, tmp_path / "o", epochs=1, warmup_steps=5, batch_tokens=1024))
    assert not (tmp_path / "o").exists()  # refused before anything was written


def _old_checkpoint(tmp_path, corpus, base, **saved) -> tuple:
    """A checkpoint folder whose state.json holds ``saved`` over the tiny run's config (no model is trained)."""
    ckpt = tmp_path / "o" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    config = {**run_config(corpus, base, tmp_path / "o", max_steps=4, **RUN).as_dict(), **saved}
    (ckpt / "state.json").write_text(json.dumps({"step": 2, "config": config}), encoding="utf-8")
    return ckpt


def test_a_resume_may_keep_the_saved_eval_every_but_not_change_it_to_one_that_does_not_fit(tmp_path, corpus, base):
    ckpt = _old_checkpoint(tmp_path, corpus, base, eval_every=9, eval_fraction=0.25)
    kw = dict(max_steps=4, batch_tokens=1024, warmup_steps=4, save_every=2, eval_fraction=0.25, resume=ckpt)
    run_config(corpus, base, tmp_path / "o", eval_every=9, **kw).check()  # as saved
    with pytest.raises(ValueError, match="^eval_every: 7 is longer than the run's 4 optimizer steps"):
        run_config(corpus, base, tmp_path / "o", eval_every=7, **kw).check()


def test_a_resume_that_changes_the_runs_length_is_refused_naming_it(tmp_path, corpus, base):
    ckpt = _old_checkpoint(tmp_path, corpus, base)
    cfg = run_config(corpus, base, tmp_path / "o", max_steps=3, batch_tokens=1024, warmup_steps=4, save_every=2,
                     resume=ckpt)
    cfg.check()  # warmup_steps is the checkpoint's: what changed is max_steps, which check_resume names
    with pytest.raises(ValueError, match="^resume: .* was made with max_steps=4, this run has max_steps=3"):
        finetune.check_resume(ckpt, cfg, data={})
