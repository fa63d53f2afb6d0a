"""Defects found in a review of the fine-tune runner (resume, checkpoints, config errors), each pinned by a
test that failed before its fix. Tiny random Qwen3 on the CPU, plain transformers (--no-patch)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hearth.train import batches, finetune
from tests.train.tiny import run_config, write_corpus

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def cfg(corpus, base, out, **kw) -> finetune.FinetuneConfig:
    return run_config(corpus, base, out, **{"batch_tokens": 1024, **kw})


class _RecordingAdamW(torch.optim.AdamW):
    """AdamW that records the learning rate each optimizer step really used."""

    used: list[float] = []

    def step(self, closure=None):
        _RecordingAdamW.used.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_a_resume_that_restarts_adamw_keeps_the_schedules_learning_rate(tmp_path, corpus, base, monkeypatch):
    # An FSDP checkpoint resumed in one process (or on another world size) restarts AdamW's moments. The
    # scheduler's state was restored, but the fresh optimizer kept the lr LambdaLR set at construction
    # (step 0's: the first warm-up step), so the resumed steps trained at the wrong lr while metrics.jsonl
    # logged the right one.
    monkeypatch.setattr(torch.optim, "AdamW", _RecordingAdamW)
    kw = dict(max_steps=4, save_every=2, warmup_steps=2, lr_schedule="cosine")
    _RecordingAdamW.used = []
    finetune.train_model(cfg(corpus, base, tmp_path / "full", **kw))
    full = list(_RecordingAdamW.used)
    assert len(full) == 4 and full[0] == pytest.approx(0.5e-2) and full[2] != full[0]

    ckpt = tmp_path / "full" / "checkpoints" / "step-000002"
    state = json.loads((ckpt / "state.json").read_text())
    state.update(parallel="fsdp", world_size=2)  # as FSDP on two ranks writes it: a per-rank optimizer shard
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "optimizer.pt").rename(ckpt / "optimizer-rank-0.pt")
    _RecordingAdamW.used = []
    _, resumed = finetune.train_model(cfg(corpus, base, tmp_path / "full", resume=ckpt, **kw))
    assert resumed["optimizer_resume"].startswith("restarted")
    assert _RecordingAdamW.used == pytest.approx(full[2:], rel=1e-12)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx(full, rel=1e-12)


def test_a_target_module_the_model_lacks_is_a_config_error_before_loading(tmp_path, corpus, base, monkeypatch):
    # peft wraps the targets it finds and silently skips the others when at least one matched, so a typo
    # ("vproj") trained q_proj alone and said nothing
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the config error")

    monkeypatch.setattr(finetune, "load_model", no_load)
    with pytest.raises(ValueError, match=r"targets: .*'vproj'"):
        finetune.train_model(cfg(corpus, base, tmp_path / "o", max_steps=1, targets="q_proj,vproj"))
    assert not (tmp_path / "o").exists()
    monkeypatch.undo()
    # a dotted suffix, as peft matches it, is a valid target
    _, metrics = finetune.train_model(cfg(corpus, base, tmp_path / "ok", max_steps=1, targets="self_attn.q_proj,mlp.up_proj"))
    adapter = json.loads((tmp_path / "ok" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["mlp.up_proj", "self_attn.q_proj"]
    # and the LoRA size the budget check counts includes them: rank 4 on q (64 -> 64) and up (64 -> 96), 2 layers
    assert metrics["trainable_params"] == 2 * 4 * ((64 + 64) + (64 + 96))


def test_resume_skips_a_checkpoint_that_a_crash_left_half_written(tmp_path, corpus, base):
    # save_checkpoint writes step-N.tmp/ and renames it when complete; a crash while it wrote state.json (its
    # last file) left step-N.tmp/state.json, which `--resume OUT` took as the latest checkpoint ("step-*")
    kw = dict(max_steps=4, save_every=2)
    _, full = finetune.train_model(cfg(corpus, base, tmp_path / "r", **kw))
    checkpoints = tmp_path / "r" / "checkpoints"
    half = checkpoints / "step-000003.tmp"
    half.mkdir()
    (half / "state.json").write_text('{"step": 3, "epo')
    assert finetune.find_checkpoint(tmp_path / "r") == checkpoints / "step-000002"
    _, resumed = finetune.train_model(cfg(corpus, base, tmp_path / "r", resume=tmp_path / "r", **kw))
    assert resumed["resumed_from"].endswith("step-000002") and resumed["loss"] == full["loss"]
    # the latest by step number, not by name, past six digits
    for step in (999_999, 1_000_000):
        (checkpoints / f"step-{step:06d}").mkdir()
        (checkpoints / f"step-{step:06d}" / "state.json").write_text("{}")
    assert finetune.find_checkpoint(tmp_path / "r") == checkpoints / "step-1000000"


def test_resume_refuses_a_corpus_whose_contents_changed_under_the_same_path(tmp_path, tok, base):
    # the resume compared the corpus PATH only: a corpus rebuilt in place resumed the step plan's example
    # indices over other examples, training something else without a word
    corpus = write_corpus(tmp_path / "train.jsonl", tok, range(12))
    kw = dict(max_steps=4, save_every=2)
    finetune.train_model(cfg(corpus, base, tmp_path / "r", **kw))
    write_corpus(corpus, tok, range(3, 15))  # rebuilt: other conversations, same file name
    with pytest.raises(ValueError, match=r"resume: .*another corpus: .*changed since"):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", resume=tmp_path / "r", **kw))
    write_corpus(corpus, tok, range(12))  # the same rows again: the resume goes on
    _, resumed = finetune.train_model(cfg(corpus, base, tmp_path / "r", resume=tmp_path / "r", **kw))
    assert resumed["resumed_from"].endswith("step-000002")


def test_a_resume_that_does_not_match_is_refused_before_the_model_is_loaded(tmp_path, corpus, base, monkeypatch):
    # the key and data checks ran inside load_checkpoint, after the model (minutes for a 14B) had been loaded
    finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1))

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the config error")

    monkeypatch.setattr(finetune, "load_model", no_load)
    with pytest.raises(ValueError, match=r"resume: .* seed=0, this run has seed=1"):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1, seed=1, resume=tmp_path / "r"))
    state = tmp_path / "r" / "checkpoints" / "step-000001" / "state.json"
    state.write_text("{not json")
    with pytest.raises(ValueError, match=r"resume: .*state.json is not a checkpoint state"):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1, resume=state.parent))


def test_a_resume_with_another_weight_decay_is_refused(tmp_path, corpus, base):
    # AdamW's restored state carries its param groups' weight_decay, which replaced the run's own: a resume
    # given --weight-decay 0.1 over a 0.0 checkpoint accepted the flag and trained with 0.0
    finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1))
    with pytest.raises(ValueError, match=r"resume: .* weight_decay=0.0, this run has weight_decay=0.1"):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1, weight_decay=0.1,
                                 resume=tmp_path / "r"))


@pytest.mark.parametrize("field, bad", [("input_ids", "7"), ("input_ids", -3), ("labels", 2.5), ("labels", -7),
                                        ("turns", 10_000), ("turns", -1)])
def test_a_corpus_row_with_bad_token_ids_is_an_error_naming_its_line(tmp_path, corpus, base, field, bad):
    # a string, negative or float id got through load_examples: a TypeError / IndexError traceback from the
    # vocab check or the embedding, mid-start, not an error naming the corpus line (exit 2)
    from typer.testing import CliRunner

    from hearth.cli import app

    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    rows[1][field][2] = bad
    bad_corpus = tmp_path / "train.jsonl"
    bad_corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["train", "--corpus", str(bad_corpus), "--model", str(base), "--out",
                                      str(tmp_path / "o"), "--no-patch", "--max-steps", "1", "--rank", "2",
                                      "--seq-len", "512"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "corpus: line 2" in text and field in text, result.output


def test_eval_examples_that_cannot_fit_are_reported_with_their_line(tmp_path, corpus, base):
    # the train corpus's rejected examples are printed and listed in metrics.json; the eval corpus's were
    # only counted, so which validation conversations went missing was not said anywhere
    from typer.testing import CliRunner

    from hearth.cli import app

    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    fits = sorted(r["turns"][1] + len(r["input_ids"]) - r["turns"][-2] for r in rows)
    short = fits[6]  # about half the examples fit, even without their history
    val = tmp_path / "val.jsonl"
    val.write_text("".join(reversed(corpus.read_text().splitlines(keepends=True))))  # (a byte copy is refused)
    _, stats = batches.load_examples(val, short)
    want = stats["rejected"]
    assert want
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--eval-corpus", str(val), "--model", str(base),
                                      "--out", str(tmp_path / "o"), "--no-patch", "--max-steps", "1", "--rank", "2",
                                      "--seq-len", str(short)])
    assert result.exit_code == 0, result.output
    flat = "".join(result.output.split())  # rich wraps at the console's width, inside a long path too
    for rej in want:
        assert "".join(f"rejected {val} line {rej['line']} ({rej['id']}".split()) in flat, result.output
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert [r["line"] for r in metrics["data"]["eval"]["rejected"]] == [r["line"] for r in want]


def test_eval_every_without_eval_data_is_a_config_error(tmp_path, corpus, base):
    # eval_every with neither eval_fraction nor eval_corpus evaluated nothing, and said nothing
    with pytest.raises(ValueError, match=r"eval_every: .*eval_fraction or eval_corpus"):
        cfg(corpus, base, tmp_path / "o", eval_every=2).check()
    cfg(corpus, base, tmp_path / "o", eval_every=2, eval_fraction=0.25).check()
    held = tmp_path / "eval.jsonl"
    held.write_text("".join(reversed(corpus.read_text().splitlines(keepends=True))))  # (a byte copy is refused)
    cfg(corpus, base, tmp_path / "o", eval_every=2, eval_corpus=held).check()


def test_a_corpus_with_labels_shifted_already_is_refused(tmp_path, corpus):
    # labels copy input_ids on the trained tokens and the model shifts them by one itself; a corpus whose
    # labels were shifted already (labels[t] = input_ids[t + 1]) trained every reply token off by one, silently
    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    row = rows[4]
    ids, labels = row["input_ids"], row["labels"]
    row["labels"] = [ids[t + 1] if t + 1 < len(ids) and labels[t + 1] != -100 else -100 for t in range(len(ids))]
    bad = tmp_path / "train.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"corpus: line 5: labels\[\d+\] = \d+ is neither -100 nor input_ids"):
        batches.load_examples(bad, 512)
    assert len(batches.load_examples(corpus, 512)[0]) == 12  # hearth's own corpus passes


@pytest.mark.parametrize("key, value", [("dropout", 0.1), ("max_grad_norm", 0.5), ("lora_compute", "adapter")])
def test_a_resume_that_changes_the_step_math_is_refused(tmp_path, corpus, base, key, value):
    # these were not resume keys: a resume given another dropout, clipping norm or low-rank precision trained
    # another run under the checkpoint's name, and its losses could not equal the uninterrupted run's
    finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1))
    with pytest.raises(ValueError, match=rf"resume: .* {key}="):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=2, save_every=1, resume=tmp_path / "r",
                                 **{key: value}))


def test_fewer_micro_batches_than_ranks_is_refused_at_start_up(monkeypatch, corpus, base, tmp_path):
    # with grad_accum 1 on 2 ranks, rank 1 ran only zero-weight passes in every step: two GPUs at the speed of one
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"grad_accum: 1 micro-batch\(es\) per step on 2 ranks"):
        cfg(corpus, base, tmp_path / "r", parallel="ddp", grad_accum=1).check()
    cfg(corpus, base, tmp_path / "r", parallel="ddp", grad_accum=2).check()  # a multiple of the ranks: fine


def test_a_crash_while_saving_the_final_adapter_leaves_the_previous_one_whole(tmp_path, corpus, base, monkeypatch):
    # the final adapter was written straight into OUT: a crash mid-write (disk full, killed) left a half-written
    # adapter_model.safetensors in place of the one a previous run there had left
    from hearth.train import distributed as D

    finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=1))
    weights = tmp_path / "r" / "adapter_model.safetensors"
    before = weights.read_bytes()
    real = D.save_adapter

    def crash(model, d, path):
        real(model, d, path)
        (path / "adapter_model.safetensors").write_bytes(b"half")  # torn write...
        raise OSError("No space left on device")  # ...then the crash

    monkeypatch.setattr(D, "save_adapter", crash)
    with pytest.raises(OSError, match="No space"):
        finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=1, seed=1))
    # a fresh run moves the previous run's files into OUT/superseded-<time>/ before it writes (review 77): the
    # previous adapter is whole there, and the torn one never reached OUT
    aside = sorted((tmp_path / "r").glob("superseded-*"))
    assert len(aside) == 1 and (aside[0] / weights.name).read_bytes() == before
    assert not weights.exists()
    monkeypatch.setattr(D, "save_adapter", real)
    finetune.train_model(cfg(corpus, base, tmp_path / "r", max_steps=1, seed=1))  # a later run replaces it whole
    assert weights.read_bytes() != before and not (tmp_path / "r" / ".adapter.tmp").exists()


class _Killed(BaseException):
    """A kill at a chosen point (no except clause of the runner catches it)."""


def test_a_kill_at_any_rename_of_the_final_adapter_never_leaves_its_config_beside_other_weights(
        tmp_path, corpus, base, monkeypatch):
    # the final adapter was moved from OUT/.adapter.tmp into OUT one file per rename (README.md,
    # adapter_config.json, then adapter_model.safetensors): a kill between the last two left the new run's config
    # (alpha 16) beside the previous run's weights, an adapter that loads and applies the wrong scale. Killed at
    # each rename / delete of the save in turn, OUT must hold the old adapter whole, the new one whole, or no
    # adapter_config.json (which every loader refuses), and the next save must leave the new adapter whole
    import shutil

    from hearth.train import distributed as D

    names = ("adapter_config.json", "adapter_model.safetensors")

    def adapter(folder):
        return {n: (folder / n).read_bytes() for n in names} if (folder / "adapter_config.json").is_file() else None

    finetune.train_model(cfg(corpus, base, tmp_path / "old", max_steps=1))
    new_model, _ = finetune.train_model(cfg(corpus, base, tmp_path / "new", max_steps=1, seed=1, alpha=16))
    old, new = adapter(tmp_path / "old"), adapter(tmp_path / "new")
    assert old["adapter_config.json"] != new["adapter_config.json"]
    assert old["adapter_model.safetensors"] != new["adapter_model.safetensors"]

    killed_at = 0
    while True:
        killed_at += 1
        out = tmp_path / f"out-{killed_at}"
        shutil.copytree(tmp_path / "old", out)
        calls = 0
        with monkeypatch.context() as mp:
            for name in ("rename", "replace", "unlink", "rmdir"):
                def counting(*args, _real=getattr(os, name), **kwargs):
                    nonlocal calls
                    calls += 1
                    if calls == killed_at:
                        raise _Killed
                    return _real(*args, **kwargs)
                mp.setattr(os, name, counting)
            try:
                finetune._save_final_adapter(new_model, D.Dist(), out)
                finished = True
            except _Killed:
                finished = False
        assert adapter(out) in (old, new, None), f"killed at file operation {killed_at}: a mixed adapter"
        finetune._save_final_adapter(new_model, D.Dist(), out)  # the next save (a resume) completes it
        assert adapter(out) == new
        assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
        if finished:
            break
    assert killed_at > 5  # every step of the publish was killed once


def _tear_writes_of(mp, prefix: str) -> None:
    """Every write to a file whose name starts with ``prefix`` (opened for writing through Path.open) writes half
    its text, then fails as a full disk would."""
    from pathlib import Path

    real_open = Path.open

    class TornWrite:
        def __init__(self, fh):
            self.fh = fh

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    def torn_open(self, mode="r", *args, **kwargs):
        fh = real_open(self, mode, *args, **kwargs)
        return TornWrite(fh) if self.name.startswith(prefix) and "w" in mode else fh

    mp.setattr(Path, "open", torn_open)


def test_a_crash_while_a_run_writes_run_toml_keeps_the_one_before(tmp_path, corpus, base, monkeypatch):
    # every run start wrote OUT/run.toml in place: a crash in the write (a full disk, a kill) left it torn, and
    # `hearth train OUT/run.toml` (the way to repeat a run) could no longer read it
    from tests.train.finetune_spies import cut_after_checkpoint

    kw = dict(max_steps=4, save_every=2)
    out = tmp_path / "cut"
    cut_after_checkpoint(cfg(corpus, base, out, **kw))
    before = (out / "run.toml").read_bytes()
    with monkeypatch.context() as mp:
        _tear_writes_of(mp, "run.toml")
        with pytest.raises(OSError, match="No space"):
            finetune.train_model(cfg(corpus, base, out, resume=out, **kw))
    assert (out / "run.toml").read_bytes() == before


def test_a_crash_while_a_resume_rewrites_metrics_jsonl_keeps_the_earlier_rows(tmp_path, corpus, base, monkeypatch):
    # a resume rewrote metrics.jsonl in place with the rows up to its checkpoint (truncate, then write): a crash in
    # between (a full disk, a kill) left it empty or torn, the steps before the checkpoint lost from the record
    from tests.train.finetune_spies import cut_after_checkpoint

    kw = dict(max_steps=4, save_every=2)
    out = tmp_path / "cut"
    cut_after_checkpoint(cfg(corpus, base, out, **kw))
    log = out / "metrics.jsonl"
    before = log.read_bytes()
    assert [json.loads(x)["step"] for x in before.splitlines()] == [1, 2]
    with monkeypatch.context() as mp:
        _tear_writes_of(mp, "metrics.jsonl")
        with pytest.raises(OSError, match="No space"):
            finetune.train_model(cfg(corpus, base, out, resume=out, **kw))
    assert log.read_bytes() == before
    finetune.train_model(cfg(corpus, base, out, resume=out, **kw))
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3, 4]
    assert not (out / "metrics.jsonl.tmp").exists()
