"""A small Qwen3-like tokenizer built in-test (no downloads): byte-level BPE trained on the given
texts, with Qwen's control tokens added and hearth's Qwen3 no-think chat template attached.

    path = build_tokenizer(tmp_dir, texts)       # a directory AutoTokenizer.from_pretrained can load
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from hearth.train.corpus import TEMPLATE_PATH

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def build_tokenizer(out_dir: Path, texts: Iterable[str], *, vocab_size: int = 1200, chat_template: bool = True) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # offsets must cover every character
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CONTROL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)

    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=TEMPLATE_PATH.read_text(encoding="utf-8") if chat_template else None,
    )
    out_dir = Path(out_dir)
    wrapped.save_pretrained(str(out_dir))
    return out_dir


if __name__ == "__main__":  # python -m tests.train.envelope_tokenizer OUT_DIR [CORPUS.jsonl]
    import sys

    from hearth.train.corpus import read_corpus

    corpus = Path(sys.argv[2]) if len(sys.argv) > 2 else TEMPLATE_PATH.parent / "example_corpus.jsonl"
    examples = read_corpus(corpus.read_text(encoding="utf-8").splitlines()).examples
    print(build_tokenizer(Path(sys.argv[1]), [e.rendered.text for e in examples]))
