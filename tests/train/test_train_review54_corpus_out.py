"""Review 54 (train): `hearth corpus build IN OUT_DIR` with an OUT_DIR it cannot write names OUT_DIR.

Was: an OUT_DIR that is a file (or lies under one) failed in mkdir after the whole input was read, with a Python
traceback (FileExistsError / NotADirectoryError) instead of the command's "error: ..." line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import corpus as C

EXAMPLE = Path(C.TEMPLATE_PATH).with_name("example_corpus.jsonl")


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_out_dir_that_cannot_be_a_folder_is_refused_naming_it(tmp_path, where):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder\n", encoding="utf-8")
    out = blocker if where == "file" else blocker / "out"
    with pytest.raises(ValueError, match=r"^out_dir: "):
        C.build(EXAMPLE, out)
    result = CliRunner().invoke(app, ["corpus", "build", str(EXAMPLE), str(out)])
    assert result.exit_code == 2, result.output
    assert "out_dir" in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert blocker.read_text(encoding="utf-8") == "not a folder\n"


@pytest.mark.parametrize("name", ["train.jsonl", "stats.json"])
def test_an_input_that_the_build_would_write_over_is_refused_and_kept(tmp_path, name):
    """`hearth corpus build OUT/train.jsonl OUT` read the conversations, then replaced the file with the built
    examples: the author's conversations were gone (exit 0)."""
    out = tmp_path / "out"
    out.mkdir()
    conversations = out / name
    conversations.write_bytes(EXAMPLE.read_bytes())
    result = CliRunner().invoke(app, ["corpus", "build", str(conversations), str(out)])
    assert result.exit_code == 2, result.output
    assert "input" in result.output and "Traceback" not in result.output
    assert conversations.read_bytes() == EXAMPLE.read_bytes()
