"""Review 74, `hearth train --out OUT` where OUT holds the user's own README.md: refused at start-up naming out.

The final adapter is published into OUT with peft's model card, README.md, as one of its files (durable.ADAPTER_FILES):
the previous set's files are moved aside and deleted. A README.md that no earlier adapter wrote (an existing project
folder given as OUT, `--out .` in a repository) was deleted and replaced by peft's card, exit 0, without a word.
An OUT whose README.md came with an earlier run's adapter (adapter_config.json beside it) is still written over.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from tests.train.tiny import run_config as cfg

pytest.importorskip("transformers")
pytest.importorskip("peft")

NOTES = "# my notes\n\nwhat this folder is for\n"


def test_a_run_into_a_folder_with_the_users_readme_is_refused_and_keeps_it(tmp_path, corpus, base):
    out = tmp_path / "project"
    out.mkdir()
    (out / "README.md").write_text(NOTES)
    result = CliRunner().invoke(app, ["train", "--corpus", str(corpus), "--model", str(base), "--out", str(out),
                                      "--max-steps", "1", "--no-patch", "--seq-len", "512", "--rank", "4"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "out:" in text and "README.md" in text, result.output
    assert (out / "README.md").read_text() == NOTES
    assert not (out / "adapter_config.json").exists()


def test_an_earlier_runs_readme_is_not_in_the_way(tmp_path, corpus, base):
    out = tmp_path / "run"
    out.mkdir()
    (out / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    (out / "adapter_config.json").write_text("{}\n")
    cfg(corpus, base, out, max_steps=1).check()
