"""A checkpoint resumes on more ranks than its grad_accum. A fresh run with grad_accum below the rank count is
refused (some ranks would get no data in any step), but a resume cannot change grad_accum (RESUME_KEYS: it is the
data plan): the refusal told the user to raise grad_accum, and the resume then refused the new grad_accum. So a
one-process run with the default grad_accum = 1 could never be continued on two ranks, though the docs promise
"--resume continues it on any rank count". The ranks short of a micro-batch run zero-weight passes (as on a
step's last, short micro-batch count), so the resumed steps are the one-process steps.

Same tiny model, corpus and tolerance as tests/train/test_distributed.py (rel 1e-5: the order of the gradient
sums is all that differs)."""

from __future__ import annotations

import json

import pytest

from hearth.train import finetune
from tests.train import launch
from tests.train.launch import failure, tiny_run, torchrun

pytest.importorskip("transformers")
pytest.importorskip("peft")
# grad_accum 1: the default; two ranks resume it, rank 1 runs only zero-weight passes
RUN = {**launch.RUN, "grad_accum": 1}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One process, 3 steps, a checkpoint at step 2: (folder, corpus, base, run.toml, the run's metrics)."""
    d = tmp_path_factory.mktemp("more-ranks")
    corpus, base, run_toml = tiny_run(d, RUN)
    _, metrics = finetune.train_model(finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "one", **RUN))
    return d, corpus, base, run_toml, metrics


def test_check_lets_a_resume_keep_its_grad_accum_on_more_ranks(monkeypatch, saved):
    d, corpus, base, _, _ = saved
    monkeypatch.setenv("WORLD_SIZE", "2")
    ckpt = d / "one" / "checkpoints" / "step-000002"
    finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "r", resume=ckpt, parallel="ddp", **RUN).check()
    # a fresh run with grad_accum below the ranks is still refused, naming grad_accum
    with pytest.raises(ValueError, match="grad_accum: 1 micro-batch"):
        finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "r", parallel="ddp", **RUN).check()
    # and so is a resume whose grad_accum is not the checkpoint's (the same refusal as before: raising it to the
    # ranks is refused by the resume itself, naming grad_accum and the checkpoint's value)
    with pytest.raises(ValueError, match="grad_accum: 1 micro-batch"):
        finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "r", resume=d / "nowhere", parallel="ddp",
                                **RUN).check()


def test_one_process_checkpoint_resumes_on_two_ranks(saved):
    d, _, _, run_toml, single = saved
    out = d / "two"
    proc = torchrun(run_toml, out, "ddp", "--resume", str(d / "one" / "checkpoints" / "step-000002"))
    assert proc.returncode == 0, failure(proc)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["parallel"]["world_size"] == 2 and metrics["optimizer_resume"] == "restored"
    # the data position continues (step 3 of the same plan) and the whole state came back: step 3's loss and the
    # last eval loss are the uninterrupted one-process run's
    assert len(single["loss"]) == 3 and metrics["loss"] == pytest.approx(single["loss"][2:], rel=1e-5)
    assert metrics["eval_loss"][-1]["eval_loss"] == pytest.approx(single["eval_loss"][-1]["eval_loss"], rel=1e-5)
    assert "grad_accum = 1 (the checkpoint's) on 2 ranks" in " ".join(proc.stdout.split())
