"""Defects found in review 49 of the fine-tune runner (config types, the run folder, checkpoint durability, a
torn metrics.jsonl on resume), each pinned by a test that failed before its fix. Tiny random Qwen3 on the CPU,
plain transformers (--no-patch)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import finetune
from tests.train.finetune_spies import cut_after_checkpoint
from tests.train.tiny import run_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")


def cfg(corpus, base, out, **kw) -> finetune.FinetuneConfig:
    return run_config(corpus, base, out, **{"batch_tokens": 1024, **kw})


def _no_load(*a, **k):
    raise AssertionError("the model was loaded before the config error")


# ------------------------------------------------------------------------------------------- config types
@pytest.mark.parametrize("line, key", [
    # a TOML string is truthy: pack = "false" trained packed rows, qlora = "no" loaded a 4-bit base
    ('pack = "false"', "pack"),
    ('qlora = "no"', "qlora"),
    ('shuffle = 0', "shuffle"),
    ('patch = "off"', "patch"),
    ('random_init = 1', "random_init"),
    # a string budget raised TypeError from the comparison: a traceback, not exit 2 naming the key
    ('memory_budget_gib = "80"', "memory_budget_gib"),
    ('memory_budget_gib = true', "memory_budget_gib"),
    # Path(3) / tuple(5) raised TypeError in __post_init__: "config: expected str..." named no key
    ('eval_corpus = 3', "eval_corpus"),
    ('targets = 5', "targets"),
])
def test_a_run_file_value_of_the_wrong_type_exits_2_naming_its_key(tmp_path, line, key):
    corpus = tmp_path / "train.jsonl"
    corpus.write_text("{}\n")
    (tmp_path / "model").mkdir()
    run_toml = tmp_path / "run.toml"
    run_toml.write_text(f'corpus = "{corpus}"\nmodel = "{tmp_path / "model"}"\nout = "{tmp_path / "o"}"\n{line}\n')
    result = CliRunner().invoke(app, ["train", str(run_toml)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert f"error: {key}" in output, output


def test_booleans_and_a_number_budget_of_the_right_type_are_accepted(tmp_path, corpus, base):
    c = cfg(corpus, base, tmp_path / "o", pack=False, shuffle=True, qlora=False, random_init=False,
            memory_budget_gib=80)
    c.check()
    held = tmp_path / "eval.jsonl"
    held.write_text("".join(reversed(corpus.read_text().splitlines(keepends=True))))  # (a byte copy is refused)
    c = cfg(corpus, base, tmp_path / "o", memory_budget_gib=22.5, targets=["q_proj"], eval_corpus=str(held))
    c.check()
    assert c.eval_corpus == held and c.targets == ("q_proj",)


def test_an_eval_corpus_that_is_the_training_corpus_is_refused_at_start_up(tmp_path, corpus, base):
    """eval_corpus naming the corpus file itself (or a link to it) was taken: the eval loss was then measured on the
    examples the run trains on, and read as held-out loss."""
    link = tmp_path / "eval-link.jsonl"
    link.symlink_to(corpus)
    for same in (corpus, link):
        with pytest.raises(ValueError, match=r"^eval_corpus: .* is the training corpus"):
            cfg(corpus, base, tmp_path / "o", eval_corpus=str(same)).check()


# ------------------------------------------------------------------------------------------- the run folder
def test_an_out_that_is_a_file_is_a_config_error_before_the_model_loads(tmp_path, corpus, base, monkeypatch):
    # OUT was first created after the model had loaded (cfg.out.mkdir): a file there (or above it) failed then,
    # as an OSError (exit 1), after the most expensive part of the start-up
    monkeypatch.setattr(finetune, "load_model", _no_load)
    taken = tmp_path / "runs"
    taken.write_text("not a folder")
    for out in (taken, taken / "r1"):
        with pytest.raises(ValueError, match=r"^out: "):
            finetune.train_model(cfg(corpus, base, out, max_steps=1))
    assert taken.read_text() == "not a folder"


def test_a_fresh_run_into_an_out_with_an_earlier_runs_checkpoints_is_refused_at_start_up(tmp_path, corpus, base,
                                                                                         monkeypatch):
    # it used to start and overwrite only the steps it reached: after a crash, `--resume OUT` took the earlier run's
    # later checkpoint and continued that run (or refused it, naming some key the two runs set apart)
    out = tmp_path / "o"
    old = out / "checkpoints" / "step-000060"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    (out / "checkpoints" / "step-000070.tmp").mkdir()  # an interrupted save is not a checkpoint
    monkeypatch.setattr(finetune, "load_model", _no_load)
    with pytest.raises(ValueError, match=r"^out: .*step-000060, 1 in all.*--resume"):
        finetune.train_model(cfg(corpus, base, out, max_steps=1))
    assert (old / "state.json").read_text() == "{}"
    # with no complete checkpoint there (a run that crashed before its first save) a fresh run may start
    fresh = tmp_path / "p"
    (fresh / "checkpoints" / "step-000010.tmp").mkdir(parents=True)
    cfg(corpus, base, fresh, max_steps=1).check()


# ------------------------------------------------------------------------------------------- durability
def test_checkpoints_and_the_adapter_are_on_disk_before_they_are_named(tmp_path, corpus, base, disk_events):
    # save_checkpoint wrote step-N.tmp/ and renamed it without an fsync: after a host crash or power loss the
    # rename can be on disk while the files' data is not, so `--resume OUT` found a latest checkpoint of empty
    # files (state.json "", a zero-length adapter) and failed instead of resuming. The same held for the final
    # adapter's files moved over the previous ones.
    out = tmp_path / "r"
    finetune.train_model(cfg(corpus, base, out, max_steps=3, save_every=2))
    synced = [e[1] for e in disk_events if e[0] == "fsync"]
    ckpt = out / "checkpoints" / "step-000002"
    tmp = str(ckpt) + ".tmp"
    # every file of the checkpoint and the folder itself, under the temporary name (before the rename) ...
    want = {os.path.join(tmp, p.name) for p in ckpt.iterdir()} | {tmp}
    assert want <= set(synced), sorted(want - set(synced))
    # ... and the folder holding the new name after it
    assert str(out / "checkpoints") in synced[synced.index(tmp):]
    adapter_tmp = str(out / ".adapter.tmp")
    assert {os.path.join(adapter_tmp, n) for n in ("adapter_model.safetensors", "adapter_config.json")} <= set(synced)
    assert str(out) in synced[synced.index(adapter_tmp):]


# ------------------------------------------------------------------------------------------- resume
def test_a_torn_last_row_of_metrics_jsonl_does_not_block_the_resume(tmp_path, corpus, base):
    # a run that died while writing a metrics row (a full disk, a power cut) left half a JSON line; the resume
    # json-decoded every row after loading the model and stopped with "Expecting ',' delimiter" (exit 2, naming
    # nothing): the run could not be resumed until the file was mended by hand
    kw = dict(max_steps=4, save_every=2)
    _, full = finetune.train_model(cfg(corpus, base, tmp_path / "full", **kw))
    cut_after_checkpoint(cfg(corpus, base, tmp_path / "cut", **kw))
    log = tmp_path / "cut" / "metrics.jsonl"
    row3 = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[2]
    log.write_text(log.read_text() + row3[: len(row3) // 2])  # step 3's row, cut mid-write
    _, resumed = finetune.train_model(cfg(corpus, base, tmp_path / "cut", resume=tmp_path / "cut", **kw))
    assert resumed["loss"] == full["loss"]
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
