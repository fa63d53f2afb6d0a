"""Review 51c: a resumed run is the uninterrupted run. N steps straight against N/2 (or any cut) + --resume + the
rest, compared bit for bit: the final adapter, and at every step after the cut the whole training state the
checkpoint holds (AdamW's moments and step counts, the schedule's step and lr, the RNG that draws the dropout
masks), over gradient accumulation, packing, dropout, weight decay, clipping, evaluation and an epoch boundary.

On the CPU the resumed run is bit-identical. On a GPU it is bit-identical only where the uninterrupted run itself
repeats its bits (docs/training.md, "Checkpoints and resume"): the CUDA test below checks what a resume controls
there, that the restored AdamW state sits where the uninterrupted run keeps it."""

from __future__ import annotations

import pytest
import torch

from hearth.train import finetune
from tests.train.finetune_spies import cut_after_checkpoint
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")

# 12 examples: grad_accum 2 at batch_tokens 1024 makes 3 steps an epoch (the third of one micro-batch); packed, the
# 9 left after the eval split make 3 one-row steps an epoch. Step 4 is the second epoch's first
ACCUMULATED = dict(max_steps=4, grad_accum=2, batch_tokens=1024, dropout=0.1, weight_decay=0.01, warmup_steps=1,
                   max_grad_norm=0.5, save_every=1)
PACKED = dict(max_steps=4, pack=True, batch_tokens=1024, dropout=0.1, eval_fraction=0.25, eval_every=2,
              lr_schedule="linear", warmup_steps=1, save_every=1)


def _same(a, b, where: str) -> None:
    """a == b exactly: tensors bit for bit (dtype and device too), containers element by element."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and a.device == b.device, where
        assert torch.equal(a, b), f"{where}: differs by {(a.double() - b.double()).abs().max().item()}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _state(folder):
    """What a run leaves in a checkpoint or its OUT folder, loaded (the files a resume reads)."""
    from safetensors.torch import load_file

    out = {"adapter": load_file(str(folder / "adapter_model.safetensors"))}
    for name in ("optimizer", "scheduler", "rng"):
        if (folder / f"{name}.pt").is_file():
            out[name] = torch.load(folder / f"{name}.pt", weights_only=True)
    return out


@pytest.mark.parametrize(("kw", "cut"), [(ACCUMULATED, 2), (ACCUMULATED, 3), (PACKED, 2)],
                         ids=["accumulated-mid-epoch", "accumulated-epoch-boundary", "packed-eval"])
def test_a_resumed_run_is_bit_identical_to_the_uninterrupted_one(tmp_path, corpus, base, kw, cut):
    _, straight = finetune.train_model(run_config(corpus, base, tmp_path / "straight", **kw))
    total = len(straight["loss"])
    assert total == 4

    cut_after_checkpoint(run_config(corpus, base, tmp_path / "cut", **kw), cut)
    _, resumed = finetune.train_model(run_config(corpus, base, tmp_path / "cut", resume=tmp_path / "cut", **kw))
    assert resumed["resumed_from"].endswith(f"step-{cut:06d}") and resumed["optimizer_resume"] == "restored"
    assert resumed["loss"] == straight["loss"] and resumed["eval_loss"] == straight["eval_loss"]
    for step in range(cut + 1, total):  # every state the resumed run reached, against the uninterrupted one's
        name = f"step-{step:06d}"
        _same(_state(tmp_path / "straight" / "checkpoints" / name), _state(tmp_path / "cut" / "checkpoints" / name),
              name)
    _same(_state(tmp_path / "straight")["adapter"], _state(tmp_path / "cut")["adapter"], "final adapter")


class _KeptAdamW(torch.optim.AdamW):
    """AdamW that keeps its last instance, to read its state once the run is over."""

    last = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _KeptAdamW.last = self


def _layout(optimizer) -> list:
    return [(k, v.device.type, v.dtype) for p in optimizer.param_groups[0]["params"]
            for k, v in sorted(optimizer.state[p].items())]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the state is loaded onto the GPU)")
def test_a_resume_on_the_gpu_keeps_adamws_step_counts_where_the_uninterrupted_run_does(tmp_path, corpus, base,
                                                                                      monkeypatch):
    # torch.load(map_location=GPU) put the step counts on the GPU, and load_state_dict leaves them there: every
    # resumed step then read each LoRA tensor's count back with a host sync, and the state differed from the run's
    monkeypatch.setattr(torch.optim, "AdamW", _KeptAdamW)
    kw = dict(max_steps=4, save_every=2, batch_tokens=1024)
    _, straight = finetune.train_model(run_config(corpus, base, tmp_path / "straight", **kw))
    want = _layout(_KeptAdamW.last)
    assert ("step", "cpu", torch.float32) in want and ("exp_avg", "cuda", torch.float32) in want
    cut_after_checkpoint(run_config(corpus, base, tmp_path / "cut", **kw), 2)
    _, resumed = finetune.train_model(run_config(corpus, base, tmp_path / "cut", resume=tmp_path / "cut", **kw))
    assert resumed["optimizer_resume"] == "restored"
    assert _layout(_KeptAdamW.last) == want
