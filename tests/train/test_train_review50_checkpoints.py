"""Review 50, checkpoints: replacing a checkpoint of the same step is atomic (a crash part-way through deleting the old
one must not leave a step folder that `--resume OUT` takes as complete), a fresh run and `--resume OUT` agree on what
a checkpoint is, and a checkpoint's CUDA RNG state resumes on a machine that shows fewer GPUs. Tiny random Qwen3 on
the CPU, plain transformers."""

from __future__ import annotations

import shutil

import pytest
import torch

from hearth.train import distributed as D
from hearth.train import finetune
from tests.train.tiny import run_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def cfg(corpus, base, out, **kw) -> finetune.FinetuneConfig:
    return run_config(corpus, base, out, **{"batch_tokens": 1024, **kw})


def test_a_crash_while_replacing_a_checkpoint_leaves_a_whole_one(tmp_path, corpus, base, monkeypatch):
    """A resume from an earlier checkpoint replays the later steps and saves them again over the earlier run's. The
    old folder was deleted in place (shutil.rmtree) and the new one renamed after: killed part-way through the delete,
    step-N kept its state.json with its adapter gone, and `--resume OUT` took it as the latest checkpoint and failed
    (no adapter_model.safetensors) instead of resuming."""
    kw = dict(max_steps=3, save_every=1)
    out = tmp_path / "r"
    finetune.train_model(cfg(corpus, base, out, **kw))
    step2 = out / "checkpoints" / "step-000002"
    assert (step2 / "state.json").is_file()
    real = shutil.rmtree

    def killed_midway(path, *a, **k):
        path = type(step2)(path)
        if path.name.startswith("step-000002"):  # the old step-2 folder: its weights go first, then the kill
            (path / "adapter_model.safetensors").unlink()
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    # (a resume from an earlier step now moves the later checkpoints aside first (review 76), so no step-N is left to
    # replace; kept in place here, the re-save of step 2 replaces the old one as it did)
    set_aside = finetune.set_aside_later
    monkeypatch.setattr(finetune, "set_aside_later", lambda *a, **k: (None, []))
    with pytest.raises(KeyboardInterrupt):
        finetune.train_model(cfg(corpus, base, out, resume=out / "checkpoints" / "step-000001", **kw))
    monkeypatch.setattr(shutil, "rmtree", real)
    monkeypatch.setattr(finetune, "set_aside_later", set_aside)
    found = finetune.find_checkpoint(out)
    assert (found / "adapter_model.safetensors").is_file() and (found / "state.json").is_file(), found
    # and the run resumes from it
    _, metrics = finetune.train_model(cfg(corpus, base, out, resume=out, **kw))
    assert len(metrics["loss"]) == 3
    # (the half-deleted old folder, step-000002.old, is no checkpoint; the next save of step 2 removes it)
    assert [p.name for p in finetune.run_checkpoints(out)] == ["step-000001", "step-000002"]


def test_a_fresh_run_and_resume_agree_on_what_a_checkpoint_is(tmp_path, corpus, base):
    """A save killed after state.json was written but before the rename leaves step-N.tmp/state.json. A fresh run into
    that OUT was refused as holding "checkpoints of an earlier run" and told to `--resume OUT`, which found no
    checkpoint there (find_checkpoint skips step-N.tmp)."""
    out = tmp_path / "p"
    for name in ("step-000004.tmp", "step-000002.old"):
        (out / "checkpoints" / name).mkdir(parents=True)
        (out / "checkpoints" / name / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="resume: .* is not a checkpoint folder"):
        finetune.find_checkpoint(out)
    cfg(corpus, base, out, max_steps=1).check()  # nothing to resume: a fresh run may start


# ------------------------------------------------------------------------------------------- CUDA RNG
class FakeGPUs:
    """torch.cuda's RNG functions on a CPU-only torch, over ``n`` stand-in generators (CPU ones): torch.cuda.random's
    own get_rng_state / set_rng_state code runs, indexing torch.cuda.default_generators as it does on a GPU
    machine, where an index past the visible devices raises IndexError."""

    def __init__(self, monkeypatch, n: int, seed: int):
        self.gens = tuple(torch.Generator().manual_seed(seed + i) for i in range(n))
        import torch.cuda.random as cr

        for mod in (torch.cuda, cr):
            monkeypatch.setattr(mod, "is_initialized", lambda: True)
            monkeypatch.setattr(mod, "device_count", lambda: n)
            monkeypatch.setattr(mod, "current_device", lambda: 0)
        monkeypatch.setattr(cr, "_lazy_init", lambda: None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "default_generators", self.gens)


def _tiny_state(corpus, base, out):
    c = cfg(corpus, base, out)
    model = finetune.add_lora(transformers.AutoModelForCausalLM.from_pretrained(str(base)), rank=4, alpha=8.0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return c, model, opt, sched


def test_a_checkpoint_from_a_two_gpu_machine_resumes_on_one_gpu(tmp_path, corpus, base, monkeypatch):
    """save_checkpoint kept torch.cuda.get_rng_state_all() (one state per VISIBLE GPU) and load_checkpoint put every
    one back with set_rng_state_all: a checkpoint written where 2 GPUs were visible (one process on a 2-GPU box, or a
    rank of a 2-GPU node) raised IndexError on resume where 1 is (CUDA_VISIBLE_DEVICES=0, a smaller node) -- a
    traceback after the model had loaded. A rank's dropout draws from the GPU it trains on: that stream is saved and
    put back on the resuming rank's GPU."""
    c, model, opt, sched = _tiny_state(corpus, base, tmp_path / "r")
    cuda0 = torch.device("cuda", 0)
    with monkeypatch.context() as m:
        two = FakeGPUs(m, 2, seed=10)
        two.gens[0].manual_seed(1234)
        torch.rand(3, generator=two.gens[0])  # the stream the run's dropout drew from, advanced
        saved = two.gens[0].get_state()
        ckpt = finetune.save_checkpoint(c.out, model=model, optimizer=opt, scheduler=sched, step=1, position=(0, 1),
                                        cfg=c, dist=D.Dist(device=cuda0), data={})
    with monkeypatch.context() as m:
        one = FakeGPUs(m, 1, seed=99)
        finetune.load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, cfg=c,
                                 dist=D.Dist(device=cuda0), data={})
        assert torch.equal(one.gens[0].get_state(), saved)


def test_each_rank_gets_its_own_gpu_s_stream_back(tmp_path, corpus, base, monkeypatch):
    """Rank 1 of a 2-rank node trains on cuda:1: its rng-rank-1.pt must give cuda:1 the stream rank 1 drew from."""
    c, model, opt, sched = _tiny_state(corpus, base, tmp_path / "r")
    cuda1 = torch.device("cuda", 1)
    with monkeypatch.context() as m:
        gpus = FakeGPUs(m, 2, seed=10)
        torch.rand(5, generator=gpus.gens[1])
        saved = gpus.gens[1].get_state()
        d = D.Dist("ddp", 1, 2, 1, cuda1)
        m.setattr(D, "save_adapter", lambda model, dist, path: path.mkdir(parents=True, exist_ok=True))
        m.setattr(D, "barrier", lambda dist: None)  # the two ranks' saves run one after the other here
        finetune.save_checkpoint(c.out, model=model, optimizer=opt, scheduler=sched, step=1, position=(0, 1), cfg=c,
                                 dist=d, data={})  # rank 1 writes its RNG state into step-000001.tmp
        (c.out / "checkpoints" / "step-000001.tmp" / "rng-rank-1.pt").rename(tmp_path / "rng-rank-1.pt")
        ckpt = finetune.save_checkpoint(c.out, model=model, optimizer=opt, scheduler=sched, step=1, position=(0, 1),
                                        cfg=c, dist=D.Dist("ddp", 0, 2, 0, torch.device("cuda", 0)), data={})
    (tmp_path / "rng-rank-1.pt").rename(ckpt / "rng-rank-1.pt")
    with monkeypatch.context() as m:
        gpus = FakeGPUs(m, 2, seed=99)
        m.setattr(D, "load_adapter", lambda model, dist, tensors: None)
        m.setattr(finetune, "check_resume", lambda path, cfg, data=None: {"parallel": "ddp", "world_size": 2})
        m.setattr("safetensors.torch.load_file", lambda *a, **k: {})
        finetune.load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, cfg=c, dist=d, data={})
        assert torch.equal(gpus.gens[1].get_state(), saved)
