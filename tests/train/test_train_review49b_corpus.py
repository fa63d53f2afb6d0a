"""Review 49b, `hearth corpus build --tokenizer`: the trained reply ends with <|im_end|>, the token a server stops on,
so a tokenizer that cannot encode it as one token is refused (exit 2 naming tokenizer) instead of building a corpus
that trains the model to spell "<|im_end|>" out and never stop, or crashing with a bare StopIteration."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from hearth.cli import app
from hearth.train.corpus import TEMPLATE_PATH, read_corpus
from tests.train.tiny import save_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"


def _texts():
    return [e.rendered.text for e in read_corpus(EXAMPLE.read_text(encoding="utf-8").splitlines()).examples]


def _plain_bpe(out_dir: Path) -> Path:
    """A fast byte-level BPE tokenizer with the Qwen3 no-think chat template but WITHOUT Qwen's control tokens: its
    template renders hearth's text exactly (chat_template_matches: true), yet <|im_end|> is several plain tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(_texts(), trainer=trainers.BpeTrainer(
        vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=TEMPLATE_PATH.read_text(encoding="utf-8")).save_pretrained(str(out_dir))
    return out_dir


def build(tmp_path, tokenizer):
    return CliRunner().invoke(app, ["corpus", "build", str(EXAMPLE), str(tmp_path / "out"), "--tokenizer", str(tokenizer)])


def test_a_tokenizer_that_splits_im_end_is_refused(tmp_path):
    from transformers import AutoTokenizer

    tok_dir = _plain_bpe(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    assert len(tok("<|im_end|>", add_special_tokens=False)["input_ids"]) > 1  # the premise
    result = build(tmp_path, tok_dir)
    assert result.exit_code == 2, result.output
    assert "tokenizer:" in result.output and "<|im_end|>" in result.output
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_a_model_folder_without_tokenizer_files_exits_2_naming_tokenizer(tmp_path):
    """transformers 5 loads such a folder as an empty tokenizer (every text encodes to nothing): the build died in
    tokenize_row with a bare StopIteration traceback."""
    folder = save_tiny_model(tmp_path / "model", 300)
    result = build(tmp_path, folder)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "tokenizer:" in result.output


def test_a_qwen_like_tokenizer_still_builds(tmp_path):
    from tests.train.envelope_tokenizer import build_tokenizer

    result = build(tmp_path, build_tokenizer(tmp_path / "tok", _texts()))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["chat_template_matches"] is True
