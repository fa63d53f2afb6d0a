"""Review 55 (train): a step whose gradient is not finite stops the run (RunError, exit 1) before the optimizer
applies it, as a non-finite loss does.

Was: only the loss was checked, and only after optimizer.step(). A finite loss with a NaN / inf gradient (an overflow
in the backward) went through clip_grad_norm_ (a NaN norm scales every gradient by NaN) into AdamW, and every LoRA
weight became NaN. On the run's last step the NaN adapter was then saved into OUT and the run exited 0; on a
save_every step the NaN checkpoint became the latest, the one `--resume OUT` takes."""

from __future__ import annotations

import math

import pytest
from safetensors.torch import load_file

from hearth.train import finetune
from tests.train.tiny import run_config as cfg


def _nan_gradient_at(monkeypatch, bad_step: int) -> None:
    """Every trainable parameter's gradient NaN in the backward of optimizer step ``bad_step`` (1-based), the loss
    itself untouched."""
    real_add_lora = finetune.add_lora
    calls = {"backward": 0}

    def add_lora(*args, **kwargs):
        model = real_add_lora(*args, **kwargs)
        params = [p for p in model.parameters() if p.requires_grad]

        def hook(grad):
            calls["backward"] += 1
            step = (calls["backward"] - 1) // len(params) + 1  # grad_accum 1: one backward per step
            return grad * float("nan") if step == bad_step else grad

        for p in params:
            p.register_hook(hook)
        return model

    monkeypatch.setattr(finetune, "add_lora", add_lora)


def test_a_non_finite_gradient_on_the_last_step_saves_no_nan_adapter(tmp_path, corpus, base, monkeypatch):
    _nan_gradient_at(monkeypatch, bad_step=2)
    out = tmp_path / "o"
    with pytest.raises(finetune.RunError, match=r"gradient norm became nan at step 2"):
        finetune.run(cfg(corpus, base, out, max_steps=2))
    assert not (out / "adapter_model.safetensors").exists()


def test_a_non_finite_gradient_writes_no_checkpoint(tmp_path, corpus, base, monkeypatch):
    _nan_gradient_at(monkeypatch, bad_step=2)
    out = tmp_path / "o"
    with pytest.raises(finetune.RunError, match=r"gradient norm became nan at step 2"):
        finetune.run(cfg(corpus, base, out, max_steps=4, save_every=2))
    assert not (out / "checkpoints" / "step-000002").exists()
    assert finetune.run_checkpoints(out) == []


def test_finite_gradients_train_as_before(tmp_path, corpus, base):
    out = tmp_path / "o"
    metrics = finetune.run(cfg(corpus, base, out, max_steps=2))
    weights = load_file(str(out / "adapter_model.safetensors"))
    assert all(bool(t.isfinite().all()) for t in weights.values()) and all(math.isfinite(x) for x in metrics["loss"])
