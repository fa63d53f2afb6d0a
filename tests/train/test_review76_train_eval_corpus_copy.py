"""Review 76 (train): an eval_corpus that is a copy of the training corpus is refused.

Was: eval_corpus was refused only when it named the corpus file itself (or a link to it); a copy of train.jsonl
under another name (`cp train.jsonl eval.jsonl`, or the same build written twice) was taken without a word, and the
eval loss was measured on the examples trained on and read as held-out loss. Now the files' sha256 are compared too.
"""

from __future__ import annotations

import shutil

import pytest

from hearth.train import finetune
from tests.train.tiny import run_config, save_tiny_model, tiny_tokenizer, write_corpus

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))),
                                                     local_files_only=True)
    folder = tmp_path_factory.mktemp("corpus")
    return (tok, write_corpus(folder / "train.jsonl", tok, range(8)),
            save_tiny_model(tmp_path_factory.mktemp("model"), len(tok)))


def test_an_eval_corpus_with_the_training_corpus_contents_is_refused(tmp_path, parts):
    _, corpus, base = parts
    copy = tmp_path / "eval.jsonl"
    shutil.copyfile(corpus, copy)
    with pytest.raises(ValueError, match=r"^eval_corpus: .*eval\.jsonl.* same contents as the training corpus"):
        run_config(corpus, base, tmp_path / "o", eval_corpus=copy, max_steps=1).check()


def test_a_held_out_eval_corpus_is_taken(tmp_path, parts):
    tok, corpus, base = parts
    held = write_corpus(tmp_path / "eval.jsonl", tok, range(8, 12))
    run_config(corpus, base, tmp_path / "o", eval_corpus=held, max_steps=1).check()
