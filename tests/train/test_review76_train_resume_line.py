"""Review 76 (train): `--resume OUT` took a checkpoint of an abandoned line of training.

Was: a run of 8 steps with a checkpoint every 2 steps, resumed explicitly from checkpoints/step-000002 (a new line of
training from step 2: metrics.jsonl was cut back to steps 1-2), crashed at step 4. `--resume OUT` then took the FIRST
run's step-000006, a checkpoint of the line the user had abandoned (made with whatever setting they changed since),
and metrics.jsonl ended with steps [1, 2, 3, (4,) 7, 8]: the rows of steps 5-6 (or 4-6) were gone from metrics.json
and loss.png.

Now a run that resumes from step N moves the checkpoints later than N aside into checkpoints/superseded-<time>/ (with
the metrics of the abandoned line), says so, and `--resume OUT` skips a checkpoint that metrics.jsonl does not lead
to (an OUT left so by an earlier hearth).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hearth.train import finetune
from tests.train.tiny import run_config, save_tiny_model, tiny_tokenizer, write_corpus

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

KW = dict(max_steps=8, save_every=2, batch_tokens=1024)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))),
                                                     local_files_only=True)
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / "train.jsonl", tok, range(12))
    return corpus, save_tiny_model(tmp_path_factory.mktemp("model"), len(tok))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, parts):
    """OUT after a whole first run: checkpoints at steps 2, 4, 6 and the rows of steps 1-8."""
    corpus, base = parts
    out = tmp_path_factory.mktemp("first") / "o"
    finetune.train_model(run_config(corpus, base, out, **KW), console=Console(file=io.StringIO()))
    return out


def copy_run(first_run, tmp_path):
    import shutil

    out = tmp_path / "o"
    shutil.copytree(first_run, out)
    return out


def steps_logged(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def names(out):
    return [p.name for p in finetune.run_checkpoints(out)]


@pytest.mark.parametrize("crash_after_save", [True, False])
def test_resume_latest_after_a_resume_from_an_earlier_step_continues_the_new_line(tmp_path, parts, first_run,
                                                                                 monkeypatch, crash_after_save):
    corpus, base = parts
    out = copy_run(first_run, tmp_path)
    first_step6 = json.loads((out / "checkpoints" / "step-000006" / "state.json").read_text(encoding="utf-8"))
    real = finetune.save_checkpoint

    def crash_at_4(*a, step, **k):
        if step == 4 and not crash_after_save:
            raise KeyboardInterrupt
        path = real(*a, step=step, **k)
        if step == 4:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(finetune, "save_checkpoint", crash_at_4)
    said = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        finetune.train_model(run_config(corpus, base, out, resume=out / "checkpoints" / "step-000002", **KW),
                             console=Console(file=said, width=400))
    monkeypatch.setattr(finetune, "save_checkpoint", real)
    # the first run's later checkpoints are moved aside, never deleted, and the run says so
    assert "step-000006" not in names(out), names(out)
    aside = [p for p in (out / "checkpoints").iterdir() if p.name.startswith("superseded-")]
    assert len(aside) == 1, list((out / "checkpoints").iterdir())
    kept = json.loads((aside[0] / "step-000006" / "state.json").read_text(encoding="utf-8"))
    assert kept["step"] == first_step6["step"] == 6
    assert (aside[0] / "step-000004").is_dir()
    assert "superseded-" in said.getvalue() and "step-000006" in said.getvalue(), said.getvalue()
    # (the abandoned line's rows are kept beside its checkpoints)
    assert [json.loads(line)["step"] for line in (aside[0] / "metrics.jsonl").read_text().splitlines()] == list(range(1, 9))

    expected = "step-000004" if crash_after_save else "step-000002"
    assert finetune.find_checkpoint(out).name == expected
    _, metrics = finetune.train_model(run_config(corpus, base, out, resume=out, **KW),
                                      console=Console(file=io.StringIO()))
    assert metrics["resumed_from"].endswith(expected)
    assert steps_logged(out) == list(range(1, 9))
    assert len(metrics["loss"]) == 8


def test_resume_latest_skips_a_checkpoint_the_metrics_do_not_lead_to(tmp_path, parts, first_run):
    """An OUT an earlier hearth left: the new line's rows end at step 4, the abandoned line's step-000006 is still
    there. `--resume OUT` takes step 4 (and the resumed run moves step-000006 aside)."""
    corpus, base = parts
    out = copy_run(first_run, tmp_path)
    log = out / "metrics.jsonl"
    rows = log.read_text(encoding="utf-8").splitlines()
    log.write_text("\n".join(rows[:4]) + "\n", encoding="utf-8")
    assert finetune.find_checkpoint(out).name == "step-000004"
    # a row of another line at step 4 (another loss than the checkpoint's): step 2 is the latest of this line
    row4 = json.loads(rows[3])
    row4["loss"] += 0.5
    log.write_text("\n".join(rows[:3] + [json.dumps(row4)]) + "\n", encoding="utf-8")
    assert finetune.find_checkpoint(out).name == "step-000002"
    # an explicit checkpoint folder is the user's choice
    assert finetune.find_checkpoint(out / "checkpoints" / "step-000006").name == "step-000006"
    _, metrics = finetune.train_model(run_config(corpus, base, out, resume=out, **KW),
                                      console=Console(file=io.StringIO()))
    assert metrics["resumed_from"].endswith("step-000002")
    assert steps_logged(out) == list(range(1, 9))
    assert names(out) == ["step-000002", "step-000004", "step-000006"]  # the new line's own


def test_a_crash_while_moving_aside_keeps_the_resumed_checkpoint(tmp_path, parts, first_run, monkeypatch):
    """Killed after the first move: the checkpoint being resumed is untouched, metrics.jsonl still the first run's
    (rewritten only after the move), so OUT is still one line; the same resume then completes the move."""
    from pathlib import Path

    corpus, base = parts
    out = copy_run(first_run, tmp_path)
    real = Path.rename
    moves = []

    def killed_after_one(self, target):
        if Path(target).parent.name.startswith("superseded-"):
            if moves:
                raise KeyboardInterrupt
            moves.append(self.name)
        return real(self, target)

    monkeypatch.setattr(Path, "rename", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        finetune.train_model(run_config(corpus, base, out, resume=out / "checkpoints" / "step-000002", **KW),
                             console=Console(file=io.StringIO()))
    monkeypatch.setattr(Path, "rename", real)
    assert len(moves) == 1
    assert finetune._whole_checkpoint(out / "checkpoints" / "step-000002")
    assert steps_logged(out) == list(range(1, 9))  # the first line, whole: what is left of it is consistent
    _, metrics = finetune.train_model(run_config(corpus, base, out, resume=out / "checkpoints" / "step-000002", **KW),
                                      console=Console(file=io.StringIO()))
    assert steps_logged(out) == list(range(1, 9))
    aside = sorted(p.name for d in (out / "checkpoints").glob("superseded-*") for p in d.glob("step-*"))
    assert aside == ["step-000004", "step-000006"]


def test_a_superseded_checkpoint_resumes_with_its_own_line_s_rows(tmp_path, parts, first_run):
    """Going back to the abandoned line by its path: its rows come from the metrics.jsonl set aside with it, and the
    line being left (now the other one) is set aside in turn from its step 6 on."""
    corpus, base = parts
    out = copy_run(first_run, tmp_path)
    first_rows = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    finetune.train_model(run_config(corpus, base, out, resume=out / "checkpoints" / "step-000002", **KW),
                         console=Console(file=io.StringIO()))
    (aside,) = (out / "checkpoints").glob("superseded-*")
    _, metrics = finetune.train_model(run_config(corpus, base, out, resume=aside / "step-000006", **KW),
                                      console=Console(file=io.StringIO()))
    assert metrics["resumed_from"] == str(aside / "step-000006")
    rows = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert rows[:6] == first_rows[:6] and steps_logged(out) == list(range(1, 9))  # (their step_s: the first run's)
    assert len(list((out / "checkpoints").glob("superseded-*"))) == 2
    assert names(out) == ["step-000002", "step-000004"]
