"""README's `hearth corpus build` example output is what the command prints today.

The README shows the run over the example corpus with the tests' small BPE tokenizer
(`python -m tests.train.envelope_tokenizer DIR`). When the length statistics changed (a241a33: p50 became the
median) the README kept the old p50 column (2625 and 140 where the build now prints 2624.5 and 130).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from hearth.train.corpus import TEMPLATE_PATH, build, read_corpus  # noqa: E402
from tests.train.envelope_tokenizer import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = TEMPLATE_PATH.parent / "example_corpus.jsonl"


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"```\n\$ hearth corpus build src/hearth/train/data/example_corpus\.jsonl .*?```", text, re.S)
    assert m, "README no longer shows the example corpus build"
    return m.group(0)


def _row(block: str, name: str) -> list[str]:
    m = re.search(rf"│\s*{name}\s*│(.*)│", block)
    assert m, name
    return [c.strip() for c in m.group(1).split("│")]


def test_readme_corpus_build_output_matches_a_build(tmp_path):
    examples = read_corpus(EXAMPLE.read_text(encoding="utf-8").splitlines()).examples
    tok = build_tokenizer(tmp_path / "tok", [e.rendered.text for e in examples])
    stats = build(EXAMPLE, tmp_path / "out", tok)
    block = _readme_block()

    head = re.search(r"(\d+) conversations: (\d+) accepted, (\d+) rejected -> (\d+) examples (.*)", block)
    assert head
    assert [int(x) for x in head.groups()[:4]] == [stats["conversations"], stats["accepted"],
                                                   stats["conversations"] - stats["accepted"], stats["examples"]]
    kinds = dict(kv.split("=") for kv in head.group(5).split(", "))
    assert {k: int(v) for k, v in kinds.items()} == stats["examples_by_kind"]

    columns = [c.strip() for c in re.search(r"┃\s*┃(.*)┃", block).group(1).split("┃")]
    assert columns == ["min", "mean", "p50", "p95", "max", "total"]
    for name in ("length", "trained"):
        shown = _row(block, name)
        assert shown == [str(stats[name][c]) for c in columns], (name, shown, stats[name])
