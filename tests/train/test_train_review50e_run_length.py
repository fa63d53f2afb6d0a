"""A run-length flag replaces the run file's run length (--max-steps over epochs, --epochs over max_steps); both in
the file, or both as flags, stay an error naming them."""

import pytest

from hearth.train.finetune import resolve


def _toml(tmp_path, body: str):
    path = tmp_path / "run.toml"
    path.write_text('corpus = "c.jsonl"\nmodel = "m"\nout = "o"\n' + body)
    return path


def test_max_steps_flag_replaces_the_files_epochs(tmp_path):
    cfg = resolve(_toml(tmp_path, "epochs = 2\n"), {"max_steps": 10, "epochs": None})
    assert cfg.max_steps == 10 and cfg.epochs == 1


def test_epochs_flag_replaces_the_files_max_steps(tmp_path):
    cfg = resolve(_toml(tmp_path, "max_steps = 10\n"), {"epochs": 3, "max_steps": None})
    assert cfg.max_steps is None and cfg.epochs == 3


def test_both_in_the_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="epochs and max_steps"):
        resolve(_toml(tmp_path, "epochs = 2\nmax_steps = 10\n"), {}).check()


def test_both_as_flags_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="epochs and max_steps"):
        resolve(_toml(tmp_path, ""), {"epochs": 2, "max_steps": 10}).check()
