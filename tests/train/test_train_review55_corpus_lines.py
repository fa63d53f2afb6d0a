"""Review 55 (train): a corpus line that cannot be an example row is a ValueError naming the corpus and the line
(`hearth train` exit 2 with the message), as a line that is not JSON already was.

Was: a line holding JSON that is not an object (``[1, 2]``, ``"text"``) stopped the run with AttributeError
('list' object has no attribute 'get'), a traceback naming nothing; a line that is not UTF-8 exited 2 with the codec's
message alone ("'utf-8' codec can't decode byte 0xff in position 9"), naming neither the file nor the line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hearth.cli import app
from hearth.train import batches


@pytest.mark.parametrize("line", ["[1, 2]", '"a string"', "3", "null"])
def test_a_json_line_that_is_not_an_object_names_its_line(tmp_path, corpus, line):
    bad = tmp_path / "train.jsonl"
    bad.write_text(corpus.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus: line 13 is not a JSON object"):
        batches.load_examples(bad, 512)


def test_hearth_train_exits_2_on_such_a_line_before_the_model(tmp_path, corpus, base):
    bad = tmp_path / "train.jsonl"
    bad.write_text("[1, 2]\n" + corpus.read_text(encoding="utf-8"), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", "--corpus", str(bad), "--model", str(base), "--out",
                                      str(tmp_path / "out"), "--no-patch"])
    assert result.exit_code == 2, result.output
    assert "line 1 is not a JSON object" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_a_line_that_is_not_utf8_names_the_corpus_and_its_line(tmp_path, corpus):
    # was: "'utf-8' codec can't decode byte 0xff in position ...": neither the file (corpus or eval_corpus) nor the line
    bad = tmp_path / "eval.jsonl"
    bad.write_bytes(corpus.read_bytes() + b'{"id": "x\xff"}\n')
    with pytest.raises(ValueError, match=r"^eval_corpus: line 13 is not UTF-8"):
        batches.load_examples(bad, 512, name="eval_corpus")
