"""An FSDP resume restores AdamW's shards on every rank or on none. load_checkpoint asked each rank about its
own optimizer-rank-R.pt only: with one shard gone (deleted, a partial copy of the run folder) rank 0 restored its
moments and rank 1 restarted its own -- neither the uninterrupted run nor a clean restart -- and metrics.json
(rank 0's view) said "restored"."""

from __future__ import annotations

import pytest
import torch

from hearth.train import distributed as D
from hearth.train import finetune
from tests.train.tiny import run_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_a_missing_shard_restarts_adam_on_every_rank_and_says_which(tmp_path, corpus, base, monkeypatch):
    c = run_config(corpus, base, tmp_path / "r", batch_tokens=1024)
    model = finetune.add_lora(transformers.AutoModelForCausalLM.from_pretrained(str(base)), rank=4, alpha=8.0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = finetune.save_checkpoint(c.out, model=model, optimizer=opt, scheduler=sched, step=1, position=(0, 1),
                                    cfg=c, data={})
    # the layout a 2-rank FSDP save leaves, with rank 1's shard gone
    (ckpt / "optimizer.pt").rename(ckpt / "optimizer-rank-0.pt")
    monkeypatch.setattr(finetune, "check_resume", lambda path, cfg, data=None: {"parallel": "fsdp", "world_size": 2})
    monkeypatch.setattr(D, "load_adapter", lambda model, dist, tensors: None)  # the ranks' DTensors: not here
    said = {}
    for rank in (0, 1):
        d = D.Dist("fsdp", rank, 2, rank, torch.device("cpu"))
        said[rank] = finetune.load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, cfg=c, dist=d,
                                              data={})["optimizer"]
    assert said[0] == said[1]
    assert said[0].startswith("restarted") and "optimizer-rank-1.pt" in said[0]
