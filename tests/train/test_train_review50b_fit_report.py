"""Review 50b (train): what fitting the corpus into seq_len cost is reported at start-up and in metrics.json.

Was: batches.load_examples counted the examples whose oldest history turns were dropped to fit seq_len
(`truncated`, `history_turns_dropped` in metrics.json -> data), but the start-up log said nothing, the counts were
over the whole file (the held-out examples too), and the longest example (the seq_len that would keep every example
whole) was nowhere. The app's largest prompt is about 5.6k-6.5k Qwen3 tokens against the default seq_len of 4096
(docs/training.md, "Sequence length and the app's prompts"): a run that trains most long chats on a few of their 20
earlier turns should say so when it starts."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from hearth.train import finetune
from hearth.train.batches import load_examples
from tests.train.tiny import run_config

pytest.importorskip("transformers")
pytest.importorskip("peft")


def lengths(corpus) -> list[int]:
    return [len(json.loads(line)["input_ids"]) for line in corpus.read_text(encoding="utf-8").splitlines() if line]


def test_load_examples_reports_the_longest_example_as_built_and_as_fitted(corpus):
    built = lengths(corpus)
    seq_len = max(built) - 1
    examples, stats = load_examples(corpus, seq_len)
    assert stats["longest_tokens"] == max(built)  # as the corpus holds it, before any history is dropped
    assert stats["longest_fitted_tokens"] == max(len(e) for e in examples) <= seq_len
    assert stats["truncated"] == sum(n > seq_len for n in built) >= 1
    whole, stats = load_examples(corpus, max(built))
    assert stats["truncated"] == 0 and stats["longest_tokens"] == stats["longest_fitted_tokens"] == max(built)


def test_the_runner_says_at_start_up_how_many_training_examples_lost_history(tmp_path, corpus, base):
    built = lengths(corpus)
    seq_len = sorted(built)[-3] - 1  # the three longest lose history (each has earlier turns: tiny.conversation)
    expected = sum(n > seq_len for n in built)
    out = io.StringIO()
    _, metrics = finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=1, seq_len=seq_len),
                                      console=Console(file=out, width=400))
    log = " ".join(out.getvalue().split())
    assert f"{expected} of 12 training examples had history dropped to fit seq_len={seq_len}" in log, log
    assert f"longest example {max(built)} tokens" in log, log
    data = metrics["data"]
    assert data["train_truncated"] == expected and data["longest_tokens"] == max(built)
    assert data["train_history_dropped"] == sum(e.dropped_turns for e in load_examples(corpus, seq_len)[0])
    saved = json.loads((tmp_path / "o" / "metrics.json").read_text(encoding="utf-8"))
    assert saved["data"]["train_truncated"] == expected and saved["data"]["longest_tokens"] == max(built)


def test_only_the_training_split_is_counted_as_training_examples(tmp_path, corpus, base):
    built = lengths(corpus)
    seq_len = sorted(built)[-3] - 1
    out = io.StringIO()
    _, metrics = finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=1, seq_len=seq_len,
                                                 eval_fraction=0.25), console=Console(file=out, width=400))
    data = metrics["data"]
    examples, _ = load_examples(corpus, seq_len)
    train, held = finetune.split_eval(examples, 0.25, 0)
    assert data["train_truncated"] == sum(1 for e in train if e.dropped_turns)
    assert data["eval_truncated"] == sum(1 for e in held if e.dropped_turns)
    log = " ".join(out.getvalue().split())
    assert f"{data['train_truncated']} of {len(train)} training examples had history dropped" in log, log


def test_a_corpus_that_fits_says_so(tmp_path, corpus, base):
    out = io.StringIO()
    finetune.train_model(run_config(corpus, base, tmp_path / "o", max_steps=1), console=Console(file=out, width=400))
    log = " ".join(out.getvalue().split())
    assert f"every example fits seq_len=512 whole (longest example {max(lengths(corpus))} tokens)" in log, log
