"""Review 76 (train): the start-up data line counts the examples seq_len rejected.

Was: an example that does not fit seq_len even with no history turn (a one-exchange chat under a long system
prompt: the app's largest prompts are longer than the default seq_len) is rejected by batches.load_examples, and
the runner printed one "rejected" line per example -- then a summary that left them out: with no example
truncated it read "every example fits seq_len=141 whole (longest example 143 tokens)" over a corpus that lost 2
of its 3 examples, and the hint naming the seq_len that keeps every example whole was only given for truncation.
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


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer(tmp_path_factory.mktemp("tok"))),
                                                     local_files_only=True)
    # examples 0, 4 and 8 have no history turn: too long for seq_len means rejected, never truncated
    corpus = write_corpus(tmp_path_factory.mktemp("corpus") / "train.jsonl", tok, [0, 4, 8])
    return corpus, save_tiny_model(tmp_path_factory.mktemp("model"), len(tok))


def test_rejected_examples_are_counted_in_the_start_up_summary(tmp_path, parts):
    corpus, base = parts
    built = sorted(len(json.loads(line)["input_ids"]) for line in corpus.read_text(encoding="utf-8").splitlines())
    seq_len = built[0]  # the shortest fits, the longer ones cannot (no history to drop)
    rejected = sum(n > seq_len for n in built)
    assert rejected >= 1
    out = io.StringIO()
    finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=1, seq_len=seq_len),
                         console=Console(file=out, width=400))
    summary = next(line for line in out.getvalue().splitlines() if line.startswith("data:"))
    assert "every example fits" not in summary, summary
    assert f"{rejected} of {len(built)} examples" in summary and "rejected" in summary, summary
    assert f"seq_len={max(built)} would train every example whole" in summary, summary
