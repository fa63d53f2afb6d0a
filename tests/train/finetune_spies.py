"""Stand-ins the runner tests put in place of pieces of hearth.train.finetune: a save that kills the run right after
a checkpoint (as a crash or a pre-empted job would, so that the resume has something to start from), and a planner
that records what it was asked. One copy, so every resume test cuts its run the same way."""

from __future__ import annotations

import pytest

from hearth.train import finetune


def cut_after_checkpoint(cfg, step: int | None = None) -> None:
    """Run ``cfg`` and kill it (KeyboardInterrupt) right after its first checkpoint is written, or after the one of
    ``step``. The real save_checkpoint is back in place on return, whatever happened."""
    real_save = finetune.save_checkpoint

    def save_then_die(*args, **kwargs):
        path = real_save(*args, **kwargs)
        if step is None or kwargs["step"] == step:
            raise KeyboardInterrupt
        return path

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finetune, "save_checkpoint", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            finetune.train_model(cfg)


def spy_on_planner(monkeypatch) -> list:
    """Put a recording finetune.plan_checkpointing in place (for the rest of the test); returns the list each call's
    keyword arguments are appended to, in order (a test may append its own records to it too)."""
    calls: list = []
    real = finetune.plan_checkpointing

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(finetune, "plan_checkpointing", spy)
    return calls
