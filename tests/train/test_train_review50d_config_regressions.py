"""Review 50d: config checks added in review 50 that refuse configs earlier versions trained (and checkpointed).

- seed: the shuffle seeds torch.Generator with seed x 100003 + epoch, which takes any value up to 2**64 - 1; a seed
  of 2**32 trained before and was refused as one "the shuffle's generator could not take".
- epochs beside max_steps: refused now (epochs is ignored under max_steps), but a checkpoint written before holds
  both, and epochs is a resume key: with epochs = 2 check() refuses the run, with epochs = 1 check_resume() refused
  "made with epochs=2", so the run could not be resumed at all.
"""

from __future__ import annotations

import json

import pytest

from hearth.train import finetune
from hearth.train.batches import epoch_order
from tests.train.tiny import run_config

pytest.importorskip("transformers")


def test_a_seed_over_2_32_that_the_shuffle_takes_is_accepted(tmp_path, corpus, base):
    seed = 2**32
    assert len(epoch_order(5, 3, seed, True)) == 5  # the generator takes it
    run_config(corpus, base, tmp_path / "o", max_steps=1, seed=seed).check()
    with pytest.raises(ValueError, match="^seed"):  # one whose shuffle seed overflows 64 bits is still refused
        run_config(corpus, base, tmp_path / "o", max_steps=1, seed=2**62).check()


def test_largest_accepted_seed_shuffles(tmp_path, corpus, base):
    run_config(corpus, base, tmp_path / "o", max_steps=1, seed=finetune.SEED_MAX).check()
    assert len(epoch_order(5, 10_000, finetune.SEED_MAX, True)) == 5


def test_a_checkpoint_with_epochs_beside_max_steps_can_be_resumed(tmp_path, corpus, base):
    ckpt = tmp_path / "o" / "checkpoints" / "step-000002"
    cfg = run_config(corpus, base, tmp_path / "o", max_steps=4, resume=ckpt)
    saved = {**cfg.as_dict(), "epochs": 2}  # written before review 50 refused the pair (epochs was ignored)
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 2, "config": saved}), encoding="utf-8")
    cfg.check()  # the resumed run drops epochs, as check() asks
    finetune.check_resume(ckpt, cfg, data={})
    # a real change is still refused
    other = run_config(corpus, base, tmp_path / "o", max_steps=5, resume=ckpt)
    with pytest.raises(ValueError, match="^resume: .* was made with"):
        finetune.check_resume(ckpt, other, data={})
    # without max_steps, epochs is the run's length and must match
    no_max = {**saved, "max_steps": None}
    (ckpt / "state.json").write_text(json.dumps({"step": 2, "config": no_max}), encoding="utf-8")
    plain = run_config(corpus, base, tmp_path / "o", epochs=1, resume=ckpt)
    with pytest.raises(ValueError, match="epochs"):
        finetune.check_resume(ckpt, plain, data={})
