"""`hearth train` on two processes (torchrun, gloo, loopback) with parallel = ddp and fsdp: the same losses and
adapter as one process on the same global batch; rank 0 alone writes; the gathered adapter checkpoint resumes
in one process. Tiny random Qwen3 on the CPU, plain transformers.

Tolerance: rel 1e-5 on losses (and atol 1e-5 on the adapter). Both sides compute in fp32; what differs is the
order of the gradient sums (two ranks' partial sums all-reduced, or FSDP's reduce-scatter, against one running
sum over the micro-batches), about one fp32 ulp (6e-8 relative) per step; three AdamW steps at lr 1e-2 keep
that far below 1e-5. A wrong sharding (a micro-batch dropped or counted twice, the ranks' mean taken where the
sum is due, a missing x world) moves the losses by 1e-3 or more from the first or second step on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hearth.train import distributed as D
from hearth.train import finetune
from tests.fakes.openai_server import free_port
from tests.train import launch
from tests.train.launch import failure, tiny_run, torchrun

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
# grad_accum 3: two ranks take 2 and 1 micro-batches of each step (the second also runs a zero-weight pass)
RUN = {**launch.RUN, "grad_accum": 3}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    return (d, *tiny_run(d, RUN))


@pytest.fixture(scope="module")
def single(files):
    d, corpus, base, _ = files
    _, metrics = finetune.train_model(finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "one", **RUN))
    return metrics


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_ranks_train_like_one_process(files, single, parallel):
    d, _, base, run_toml = files
    out = d / parallel
    proc = torchrun(run_toml, out, parallel)
    assert proc.returncode == 0, failure(proc)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["parallel"] == {"mode": parallel, "world_size": 2, "backend": "gloo", "mixed_precision": None}
    assert len(single["loss"]) == 3 and single["loss"][-1] < single["loss"][0]
    assert metrics["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert [r["eval_loss"] for r in metrics["eval_loss"]] == pytest.approx(
        [r["eval_loss"] for r in single["eval_loss"]], rel=1e-5)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # one writer: rank 0
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in
                                           map(json.loads, (d / "one" / "metrics.jsonl").read_text().splitlines())]
    assert "parallel: " + parallel + " on 2 rank(s), cpu (gloo)" in " ".join(proc.stdout.split())

    # the adapter is peft's format, whole (FSDP's shards gathered), equal to the one-process adapter
    from safetensors.torch import load_file

    mine, ref = (load_file(str(p / "adapter_model.safetensors")) for p in (out, d / "one"))
    assert mine.keys() == ref.keys() and mine
    for k in ref:
        torch.testing.assert_close(mine[k], ref[k], rtol=1e-4, atol=1e-5)
    ckpt = out / "checkpoints" / "step-000002"
    names = {p.name for p in ckpt.iterdir()}
    assert names >= {"adapter_model.safetensors", "adapter_config.json", "scheduler.pt", "state.json"}
    assert names >= ({"optimizer-rank-0.pt", "optimizer-rank-1.pt"} if parallel == "fsdp" else {"optimizer.pt"})

    from peft import PeftModel

    model = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(str(base)), str(ckpt))
    assert sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n) > 0  # trained, loaded

    # one process resumes the 2-rank checkpoint: its step 3 starts from the step-2 adapter, so its loss is the
    # one-process run's step-3 loss; AdamW's state is carried over from DDP, restarted from FSDP's shards
    _, resumed = finetune.train_model(finetune.FinetuneConfig(corpus=files[1], model=base, out=d / f"resume-{parallel}",
                                                              resume=ckpt, **RUN))
    assert resumed["loss"][0] == pytest.approx(single["loss"][2], rel=1e-5)
    assert resumed["optimizer_resume"] == ("restored" if parallel == "ddp" else
                                           "restarted (saved by fsdp on 2 rank(s); this run is none on 1)")
    if parallel == "ddp":  # the whole state came back: the run ends where the uninterrupted one did
        assert resumed["eval_loss"][-1]["eval_loss"] == pytest.approx(single["eval_loss"][-1]["eval_loss"], rel=1e-5)


def test_micro_batches_are_dealt_round_robin_and_padded():
    mbs = [[0], [1, 2], [3], [4]]
    two = [D.my_micro_batches(mbs[:3], D.Dist("ddp", r, 2)) for r in range(2)]
    assert two == [[([0], True), ([3], True)], [([1, 2], True), ([0], False)]]
    assert D.my_micro_batches(mbs, D.Dist()) == [(mb, True) for mb in mbs]
    assert D.my_micro_batches(mbs[:1], D.Dist("fsdp", 1, 2)) == [([0], False)]


def test_launch_mismatches_are_refused_naming_parallel(monkeypatch, files):
    d, corpus, base, _ = files
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    cfg = finetune.FinetuneConfig(corpus=corpus, model=base, out=d / "x", **{**RUN, "parallel": "fsdp"})
    with pytest.raises(ValueError, match="parallel: 'fsdp' needs a torchrun launch"):
        finetune.train_model(cfg)
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg.parallel = "none"
    with pytest.raises(ValueError, match="parallel: this process is one of 2 started by torchrun"):
        finetune.train_model(cfg)
    cfg.parallel = "zero3"
    with pytest.raises(ValueError, match="parallel must be one of none, ddp, fsdp"):
        cfg.check()
    assert not (d / "x").exists()


def test_ddp_resume_with_dropout_gives_each_rank_its_own_rng_back(files):
    """With LoRA dropout every rank draws its own masks, and the ranks' RNG streams part (their micro-batches
    differ in size). A 2-rank resume must hand each rank the RNG state IT saved: with rank 0's state on every
    rank, rank 1's step-3 masks (and so the step-3 loss) differ from the uninterrupted run's."""
    d, _, _, run_toml = files
    extra = ("--dropout", "0.3", "--max-steps", "3", "--save-every", "2", "--eval-fraction", "0", "--eval-every", "0")
    whole = torchrun(run_toml, d / "drop-whole", "ddp", *extra)
    assert whole.returncode == 0, failure(whole)
    ckpt = d / "drop-whole" / "checkpoints" / "step-000002"
    assert {"rng-rank-0.pt", "rng-rank-1.pt"} <= {p.name for p in ckpt.iterdir()}
    resumed = torchrun(run_toml, d / "drop-resumed", "ddp", *extra, "--resume", str(ckpt))
    assert resumed.returncode == 0, failure(resumed)
    want = json.loads((d / "drop-whole" / "metrics.json").read_text())["loss"]
    got = json.loads((d / "drop-resumed" / "metrics.json").read_text())["loss"]
    assert len(want) == 3 and len(got) == 1
    assert got[0] == pytest.approx(want[2], rel=1e-5)


def test_every_rank_is_done_before_any_tears_down(monkeypatch):
    """train_model meets the other ranks at a barrier after its work and before destroy_process_group (rank 0
    writes the plot and metrics after the others return; a rank that exits while a peer's gloo group is live can
    abort that peer), and skips that barrier when its work raised (a peer may be in another collective)."""
    calls = []
    d = D.Dist(mode="ddp", rank=1, world=2, initialized=True)
    monkeypatch.setattr(D, "setup", lambda mode: d)
    monkeypatch.setattr(D, "barrier", lambda dist: calls.append(("barrier", dist.rank)))
    monkeypatch.setattr(D, "teardown", lambda dist: calls.append(("teardown", dist.rank)))
    cfg = finetune.FinetuneConfig(corpus=Path("c.jsonl"), model="m", out=Path("o"))
    monkeypatch.setattr(finetune.FinetuneConfig, "check", lambda self: None)
    monkeypatch.setattr(finetune, "_train", lambda cfg, dist, console: calls.append(("train", dist.rank)) or ("m", {}))
    assert finetune.train_model(cfg) == ("m", {})
    assert calls == [("train", 1), ("barrier", 1), ("teardown", 1)]

    def broken(cfg, dist, console):
        calls.append(("train", dist.rank))
        raise RuntimeError("out of memory")

    calls.clear()
    monkeypatch.setattr(finetune, "_train", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        finetune.train_model(cfg)
    assert calls == [("train", 1), ("teardown", 1)]


def test_more_ranks_than_gpus_is_refused_naming_parallel(monkeypatch):
    """torchrun --nproc-per-node 4 on a 2-GPU node: ranks 2 and 3 have no GPU of their own. Refused before any CUDA
    call or rendezvous, naming parallel and the fix (not 'CUDA error: invalid device ordinal' from set_device)."""
    import torch.distributed as dist

    env = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def not_reached(*a, **k):
        raise AssertionError("must be refused before this")

    monkeypatch.setattr(torch.cuda, "set_device", not_reached)
    monkeypatch.setattr(dist, "init_process_group", not_reached)
    with pytest.raises(ValueError, match=r"parallel: this rank has LOCAL_RANK 3 but 2 CUDA device\(s\) are visible.*"
                                         r"--nproc-per-node 2"):
        D.setup("ddp")
