"""Review 52l (train): bad corpus input is refused naming its line, and nothing the author wrote is silently dropped.

Was:
- a line with a lone surrogate escape in user-written text ("\\udc00" in a user turn, the shared context, a memory:
  valid JSON, not encodable as UTF-8) was accepted, then the whole build crashed writing train.jsonl
  ("'utf-8' codec can't encode character '\\udc00' in position 4692"), naming neither the file nor the line;
- a line that is not UTF-8 stopped the whole build with "'utf-8' codec can't decode byte 0xff in position 0",
  naming neither the file nor the line (the position is in a read buffer, not the line);
- a key written twice in a line ({"message": "A", "message": "B"}) trained the last value and dropped the other
  without a word, where the app's own parser (hearth.envelope) refuses a reply with a duplicate key;
- an empty input file (or only blank lines) "built" an empty train.jsonl with exit code 0, replacing a good one.
"""

from __future__ import annotations

import json
import pytest

from hearth.train.corpus import TEMPLATE_PATH, build, read_corpus

EXAMPLE_PATH = TEMPLATE_PATH.parent / "example_corpus.jsonl"
GOOD = EXAMPLE_PATH.read_text(encoding="utf-8").splitlines()[0]


def _with(path: str, value) -> str:
    """GOOD with one field replaced (a dotted path, list indices as ints)."""
    conv = json.loads(GOOD)
    *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    obj = conv
    for p in head:
        obj = obj[p]
    obj[last] = value
    return json.dumps(conv)  # ensure_ascii: a lone surrogate travels as the JSON escape a writer would produce


@pytest.mark.parametrize("field", ["turns.0.content", "shared_context", "memories.0", "id"])
def test_a_lone_surrogate_in_user_text_is_a_rejected_line_not_a_crashed_build(tmp_path, field):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([GOOD, _with(field, "half an emoji \udc00 here"), GOOD]) + "\n", encoding="utf-8")
    stats = build(src, tmp_path / "out")
    assert [r["line"] for r in stats["rejected_lines"]] == [2]
    assert json.loads((tmp_path / "out" / "rejected.jsonl").read_text(encoding="utf-8"))["line"] == 2
    reason = stats["rejected_lines"][0]["reason"]
    assert field.replace(".0", "[0]") in reason and "surrogate" in reason, reason
    rows = (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(rows) == stats["examples"] == 4 and {json.loads(r)["line"] for r in rows} == {1, 3}


def test_a_line_that_is_not_utf8_is_a_rejected_line_naming_it(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(GOOD.encode() + b"\n" + b'{"id": "caf\xe9"}\n' + GOOD.encode() + b"\n")
    stats = build(src, tmp_path / "out")
    assert [(r["line"], r["id"]) for r in stats["rejected_lines"]] == [(2, None)]
    assert "UTF-8" in stats["rejected_lines"][0]["reason"]
    assert stats["accepted"] == 2 and stats["conversations"] == 3


def test_a_key_written_twice_is_refused_not_resolved_to_its_last_value():
    conv = json.loads(GOOD)
    envelope = json.dumps(conv["turns"][1]["envelope"])
    line = GOOD.replace(envelope, '{"message": "the first draft", ' + envelope[1:])
    assert line != GOOD
    result = read_corpus([GOOD, line])
    assert [r["line"] for r in result.rejected] == [2]
    assert "'message'" in result.rejected[0]["reason"] and "twice" in result.rejected[0]["reason"]


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_an_empty_input_is_refused_naming_it_and_keeps_the_last_build(tmp_path, text):
    out = tmp_path / "out"
    build(EXAMPLE_PATH, out)
    before = (out / "train.jsonl").read_bytes()
    src = tmp_path / "empty.jsonl"
    src.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"^input: .*empty\.jsonl holds no conversation"):
        build(src, out)
    assert (out / "train.jsonl").read_bytes() == before


def test_a_corpus_whose_every_line_is_rejected_is_refused_with_the_reasons_and_keeps_the_last_build(tmp_path):
    """Was: an empty train.jsonl written with exit 0 over the last good build (hearth train refused it later)."""
    out = tmp_path / "out"
    build(EXAMPLE_PATH, out)
    before = (out / "train.jsonl").read_bytes()
    src = tmp_path / "bad.jsonl"
    src.write_text("not json\n" + _with("turns.0.content", "") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^input: .*bad\.jsonl: none of its 2 lines built an example") as info:
        build(src, out)
    assert "line 1" in str(info.value) and "line 2" in str(info.value)  # the reasons, where to look
    assert (out / "train.jsonl").read_bytes() == before
