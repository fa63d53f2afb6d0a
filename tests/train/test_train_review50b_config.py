"""Review 50b (train), config errors at start-up: the project's rule is that an invalid setting (or combination) is
refused when the run starts, naming the setting (exit 2), not at the first step, mid-run, or never.

Gaps found: warmup_steps / eval_every / save_every longer than the run (accepted: the peak lr never reached, no
intermediate eval, no checkpoint written), non-finite lr / alpha / max_grad_norm / weight_decay / memory_budget_gib,
booleans read as numbers (weight_decay = true was 1.0), epochs beside max_steps (epochs silently ignored), a seed the
shuffle cannot take (an unnamed "Overflow when unpacking long long"), a seq_len letting examples longer than the model's
max_position_embeddings, out = the model folder; and the over-budget message under parallel = "fsdp" / "ddp"
suggested --qlora, which either refuses."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import distributed as D
from hearth.train import finetune
from hearth.train.batches import load_examples
from tests.train.tiny import run_config, tiny_config

pytest.importorskip("transformers")
pytest.importorskip("peft")


def epoch_steps(corpus, **kw) -> int:
    """Optimizer steps of one epoch of the shared 12-example corpus under run_config's settings."""
    c = run_config(corpus, corpus, corpus, **kw)
    examples, _ = load_examples(corpus, c.seq_len)
    return len(finetune.step_plan(examples, c))


@pytest.fixture
def no_model_load(monkeypatch):
    """A config error must stop the run before the model is loaded."""
    def refuse(*a, **kw):
        raise AssertionError("the model was loaded: the config error was not reported at start-up")

    monkeypatch.setattr(finetune, "load_model", refuse)


# ------------------------------------------------------------------------------ steps: warm-up, eval, checkpoints
@pytest.mark.parametrize("key, value, needle", [
    ("warmup_steps", 4, "warmup_steps: 4 .* 3 optimizer steps"),
    ("warmup_steps", 3, "warmup_steps: 3 .* 3 optimizer steps"),  # the peak lr only at the last step, no decay
    ("eval_every", 4, "eval_every: 4 .* 3 optimizer steps"),
    ("save_every", 3, "save_every: 3 .* 3 optimizer steps"),  # the last step writes the adapter, no checkpoint
    ("save_every", 7, "save_every: 7 .* 3 optimizer steps"),
])
def test_step_settings_longer_than_max_steps_are_refused_by_check(tmp_path, corpus, base, key, value, needle):
    extra = {"eval_fraction": 0.25} if key == "eval_every" else {}
    with pytest.raises(ValueError, match=needle):
        run_config(corpus, base, tmp_path / "o", max_steps=3, **{key: value}, **extra).check()


def test_step_settings_within_the_run_are_accepted(tmp_path, corpus, base):
    run_config(corpus, base, tmp_path / "o", max_steps=3, warmup_steps=2, eval_every=3, save_every=2,
               eval_fraction=0.25).check()


@pytest.mark.parametrize("key", ["warmup_steps", "eval_every", "save_every"])
def test_step_settings_longer_than_an_epoch_run_are_refused_before_the_model_loads(tmp_path, corpus, base, key,
                                                                                 no_model_load):
    total = epoch_steps(corpus)
    extra = {"eval_fraction": 0.25} if key == "eval_every" else {}
    if key == "eval_every":  # the held-out quarter shortens the run
        examples, _ = load_examples(corpus, 512)
        train, _ = finetune.split_eval(examples, 0.25, 0)
        total = len(finetune.step_plan(train, run_config(corpus, corpus, corpus)))
    c = run_config(corpus, base, tmp_path / "o", epochs=1, **{key: total + 1}, **extra)
    with pytest.raises(ValueError, match=f"{key}: {total + 1} .* {total} optimizer steps"):
        finetune.train_model(c)
    assert not (tmp_path / "o").exists()


def test_warmup_longer_than_the_run_exits_2_naming_it(tmp_path, corpus, base):
    total = epoch_steps(corpus)
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out",
                                      str(tmp_path / "o"), "--no-patch", "--seq-len", "512",
                                      "--warmup-steps", str(total + 5)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "warmup_steps" in text and f"{total} optimizer steps" in text, text


# ------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize("key, value", [
    ("lr", math.inf), ("alpha", math.inf), ("max_grad_norm", math.inf), ("weight_decay", math.inf),
    ("weight_decay", math.nan), ("weight_decay", True), ("dropout", False), ("eval_fraction", False),
    ("memory_budget_gib", math.inf),
])
def test_non_finite_numbers_and_booleans_are_refused_naming_the_key(tmp_path, corpus, base, key, value):
    with pytest.raises(ValueError, match=f"^{key}"):
        run_config(corpus, base, tmp_path / "o", max_steps=1, **{key: value}).check()


def test_an_inf_lr_in_a_run_file_exits_2(tmp_path, corpus, base):
    run_toml = tmp_path / "run.toml"
    run_toml.write_text("lr = inf\n")
    result = CliRunner().invoke(app, ["train", str(run_toml), "--corpus", str(corpus), "--model", str(base),
                                      "--out", str(tmp_path / "o"), "--no-patch", "--max-steps", "1"])
    assert result.exit_code == 2 and "lr must be a finite number" in " ".join(result.output.split()), result.output


def test_a_seed_the_shuffle_cannot_take_is_refused_naming_seed(tmp_path, corpus, base):
    with pytest.raises(ValueError, match="^seed"):
        run_config(corpus, base, tmp_path / "o", max_steps=1, seed=2**62).check()
    run_config(corpus, base, tmp_path / "o", max_steps=1, seed=2**32 - 1).check()


def test_epochs_beside_max_steps_is_refused(tmp_path, corpus, base):
    # max_steps runs exactly that many steps, passes repeating: epochs = 3 was ignored without a word
    with pytest.raises(ValueError, match="epochs and max_steps"):
        run_config(corpus, base, tmp_path / "o", max_steps=2, epochs=3).check()
    run_config(corpus, base, tmp_path / "o", max_steps=2, epochs=1).check()  # the default, as run.toml writes it


# ------------------------------------------------------------------------------ the model
def short_model(tmp_path, vocab: int, positions: int):
    """A tiny Qwen3 shape (a random-init config JSON) with only ``positions`` positions."""
    model = tmp_path / "shape.json"
    model.write_text(json.dumps({**tiny_config(vocab), "max_position_embeddings": positions}))
    return model


def test_examples_beyond_the_model_s_positions_are_refused_naming_seq_len(tmp_path, corpus, tok, no_model_load):
    longest = max(len(json.loads(x)["input_ids"]) for x in corpus.read_text(encoding="utf-8").splitlines() if x)
    c = run_config(corpus, short_model(tmp_path, len(tok), 200), tmp_path / "o", max_steps=1, seq_len=512,
                   random_init=True)
    with pytest.raises(ValueError, match=rf"^seq_len: 512 lets examples of up to {longest} tokens through, longer "
                                         r"than the model's max_position_embeddings = 200"):
        finetune.train_model(c)
    assert not (tmp_path / "o").exists()


def test_a_seq_len_above_the_positions_over_short_examples_trains(tmp_path, corpus, tok):
    # the examples decide: a seq_len of 4096 over a corpus of short examples trains nothing past the positions
    # (tests/train/test_runner.py runs the default seq_len on a 512-position model)
    model = short_model(tmp_path, len(tok), 400)
    finetune.train_model(run_config(corpus, model, tmp_path / "o", max_steps=1, seq_len=4096, random_init=True))


def test_out_must_not_be_the_model_folder(tmp_path, corpus, base):
    with pytest.raises(ValueError, match="^out: .* is the model folder"):
        run_config(corpus, base, base, max_steps=1).check()


# ------------------------------------------------------------------------------ over budget under parallel
def test_the_over_budget_message_under_fsdp_does_not_suggest_qlora():
    gib = finetune.GIB
    with pytest.raises(finetune.RunError) as err:
        finetune.refuse_over_budget(20 * gib // 2, 0, 8.0, qlora=False, qlora_weights_bytes=6 * gib,
                                    parallel="fsdp", world=2)
    text = str(err.value)
    assert "--qlora" not in text.replace("--qlora cannot", "") and "ranks" in text and "at least 3" in text, text
    with pytest.raises(finetune.RunError) as err:
        finetune.refuse_over_budget(20 * gib, 0, 8.0, qlora=False, qlora_weights_bytes=6 * gib, parallel="ddp", world=2)
    text = str(err.value)
    assert "use --qlora" not in text and "fsdp" in text, text
    with pytest.raises(finetune.RunError, match="--qlora"):  # one process: QLoRA is still the answer
        finetune.refuse_over_budget(20 * gib, 0, 8.0, qlora=False, qlora_weights_bytes=6 * gib)


def test_hearth_train_under_fsdp_over_budget_names_ranks_not_qlora(tmp_path, corpus, base, monkeypatch):
    monkeypatch.setattr(D, "setup", lambda mode: D.Dist(mode, 0, 2, 0, torch.device("cpu"), False))
    c = run_config(corpus, base, tmp_path / "o", max_steps=1, memory_budget_gib=0.00001, parallel="fsdp",
                   grad_accum=2)
    with pytest.raises(finetune.RunError) as err:
        finetune.train_model(c)
    text = str(err.value)
    assert "memory_budget_gib" in text and "use --qlora" not in text and "ranks" in text, text
