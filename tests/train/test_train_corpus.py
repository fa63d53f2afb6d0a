"""hearth.train.corpus + chat_format: envelope targets, Qwen3 no-think rendering, loss mask, rejections, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hearth.cli import app
from hearth.envelope import MODELS, ChatReply, dumps, parse_envelope
from hearth.prompts import system_prompt_for
from hearth.train.chat_format import EMPTY_THINK, render
from hearth.train.corpus import (
    IGNORE_INDEX, CorpusError, build, conversation_examples, load_tokenizer, read_corpus, tokenize,
)
from tests.train.envelope_tokenizer import build_tokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "hearth" / "train" / "data" / "example_corpus.jsonl"


@pytest.fixture(scope="module")
def corpus():
    return read_corpus(EXAMPLE.read_text(encoding="utf-8").splitlines())


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), [e.rendered.text for e in corpus.examples])


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def _conversations():
    return [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]


def _messages(example_text: str):
    """Messages the way a caller of apply_chat_template would hold them (no think block in content)."""
    from hearth.train.corpus import _messages_from_text

    return _messages_from_text(example_text)


# ------------------------------------------------------------------------------------ example corpus
def test_example_corpus_has_every_kind_and_one_documented_rejection(corpus):
    kinds = {e.kind for e in corpus.examples}
    assert kinds == {"chat", "feed_comment", "analyst"}
    assert 8 <= corpus.conversations <= 14
    assert corpus.rejected == [{"line": 11, "id": "invalid-empty-message",
                                "reason": "turns[1].envelope.message: must not be empty (or only whitespace)"}]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "corpus.md").read_text(encoding="utf-8")
    assert "turns[1].envelope.message: must not be empty" in doc  # the rejection docs/corpus.md shows is real


def test_every_target_is_the_canonical_envelope_after_an_empty_think_block(corpus):
    convs = {c["id"]: c for c in _conversations()}
    for example in corpus.examples:
        conv_id, turn = example.id.split("#")
        conv = convs[conv_id]
        (start, end), = example.rendered.spans
        target = example.rendered.text[start:end]
        assert target.startswith(EMPTY_THINK) and target.endswith("<|im_end|>")
        body = target[len(EMPTY_THINK):-len("<|im_end|>")]
        envelope = parse_envelope(body, example.kind)
        assert body == dumps(envelope)  # exactly the canonical serialisation, nothing else
        source = conv["turns"][int(turn)]["envelope"]
        assert envelope == MODELS[example.kind].model_validate(source)  # the corpus's own envelope, unchanged
        # system prompt at production size, from hearth.prompts
        assert example.rendered.text.startswith("<|im_start|>system\n" + system_prompt_for(conv)[1] + "<|im_end|>\n")


def test_multi_turn_gives_one_example_per_assistant_turn_with_history_unthought(corpus):
    first, second = [e for e in corpus.examples if e.id.startswith("wren-tama-scholarship#")]
    assert second.rendered.text.startswith(first.rendered.text[: first.rendered.spans[0][0]])
    # history reply: no think block (Qwen3's template drops it); only the trained turn has one
    assert second.rendered.text.count("<think>") == 1
    first_body = first.rendered.text[first.rendered.spans[0][0] + len(EMPTY_THINK):first.rendered.spans[0][1] - len("<|im_end|>")]
    # the earlier reply comes back as the app sends it: its message text alone, not the envelope it was trained as
    message = parse_envelope(first_body, first.kind).message
    assert f"<|im_start|>assistant\n{message}<|im_end|>\n" in second.rendered.text
    assert first_body not in second.rendered.text


# ------------------------------------------------------------------------------ template cross-check
def test_renderer_matches_the_chat_template(corpus, tok):
    assert tok.chat_template
    for example in corpus.examples:
        messages = _messages(example.rendered.text)
        full = tok.apply_chat_template(messages, tokenize=False, enable_thinking=False)
        assert full == example.rendered.text, example.id
        prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
        assert prompt == example.rendered.prompt, example.id
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_loss_mask_covers_exactly_the_reply_and_im_end(corpus, tok):
    for example in corpus.examples:
        ids, labels = tokenize(tok, example.rendered)
        templ = tok.apply_chat_template(_messages(example.rendered.text), tokenize=True, enable_thinking=False)
        templ_ids = templ["input_ids"] if hasattr(templ, "keys") else templ
        assert ids == list(templ_ids), example.id
        assert len(ids) == len(labels)
        trained = [i for i, lab in enumerate(labels) if lab != IGNORE_INDEX]
        assert trained == list(range(trained[0], trained[-1] + 1))  # one contiguous block
        assert all(labels[i] == ids[i] for i in trained)
        assert tok.convert_ids_to_tokens(ids[trained[0]]) == "<think>"
        assert tok.convert_ids_to_tokens(ids[trained[-1]]) == "<|im_end|>"
        assert trained[-1] == len(ids) - 2  # only the newline after <|im_end|> follows, untrained
        (start, end), = example.rendered.spans
        assert tok.decode([ids[i] for i in trained]) == example.rendered.text[start:end]
        # the prompt tokens are exactly what a server would feed before generating
        prompt_ids = tok(example.rendered.prompt, add_special_tokens=False)["input_ids"]
        assert ids[: trained[0]] == prompt_ids[: trained[0]]


# ------------------------------------------------------------------------------------- rejections
BAD_LINES = [
    ("{not json", "not JSON"),
    ('["a list"]', "must be a JSON object"),
    ('{"id": "x", "kind": "poem", "turns": []}', "kind"),
    ('{"id": "x", "kind": "chat", "world_view": "stoic", "stage": "friend", "turns": []}', "persona"),
    ('{"id": "x", "kind": "chat", "persona": "sol", "world_view": "stoic", "stage": "friend", "turns": []}', "turns is empty"),
    ('{"id": "x", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": '
     '[{"role": "assistant", "envelope": {"comment": "c", "tone": "t"}}]}', "must be a user turn"),
    ('{"id": "x", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": '
     '[{"role": "user", "content": "p"}]}', "last turn must be an assistant turn"),
    ('{"id": "x", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": '
     '[{"role": "user", "content": "p"}, {"role": "assistant", "content": "{}"}]}', "needs an 'envelope' object"),
    ('{"id": "x", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": '
     '[{"role": "user", "content": "p"}, {"role": "assistant", "envelope": {"comment": "c", "tone": "t", "x": 1}}]}',
     "turns[1].envelope.x: Extra inputs"),
    ('{"id": "x", "kind": "analyst", "analyst": "cynic", "turns": [{"role": "user", "content": "s"}, '
     '{"role": "assistant", "envelope": {"analyst": "mentor", "reading": "r", "advice": "a", "risk": "low"}}]}',
     "but the prompt is for 'cynic'"),
    ('{"id": "x", "kind": "feed_comment", "persona": "sol", "world_view": "stoic", "turns": '
     '[{"role": "user", "content": "p <|im_end|>"}, {"role": "assistant", "envelope": {"comment": "c", "tone": "t"}}]}',
     "control string"),
    ('{"id": "x", "kind": "chat", "prompt": "feed", "persona": "sol", "world_view": "stoic", "turns": []}',
     "does not produce kind"),
]


def test_bad_lines_are_collected_with_line_numbers_and_reasons():
    good = EXAMPLE.read_text(encoding="utf-8").splitlines()[0]
    lines = [good] + [line for line, _ in BAD_LINES] + ["", good]
    result = read_corpus(lines)
    assert len(result.examples) == 4  # both copies of the good two-turn conversation, nothing else
    assert [r["line"] for r in result.rejected] == list(range(2, 2 + len(BAD_LINES)))
    for rejected, (_, reason) in zip(result.rejected, BAD_LINES):
        assert reason in rejected["reason"], rejected


def test_conversation_examples_raises_corpus_error():
    with pytest.raises(CorpusError, match="missing field 'id'"):
        conversation_examples({"kind": "chat"})


def test_render_checks_roles():
    with pytest.raises(ValueError, match="end with an assistant"):
        render("s", [{"role": "user", "content": "u"}])
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        render("s", [{"role": "assistant", "content": "a"}])


# ------------------------------------------------------------------------------------------ build
def test_build_without_tokenizer_writes_text_and_mask(tmp_path):
    stats = build(EXAMPLE, tmp_path / "out")
    rows = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == stats["examples"] == 12 and stats["unit"] == "characters"
    for row in rows:
        (a, b), = row["mask"]
        assert row["text"][a:b].startswith(EMPTY_THINK) and row["text"][a:b].endswith("<|im_end|>")
    rejected = [json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [11]
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert on_disk["rejected"] == 1 and on_disk["accepted"] == 11
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_cli_build_with_tokenizer(tmp_path, tokenizer_dir, tok):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["corpus", "build", str(EXAMPLE), str(out), "--tokenizer", str(tokenizer_dir)])
    assert result.exit_code == 0, result.output
    assert "12 conversations: 11 accepted, 1 rejected" in result.output
    assert "rejected line 11" in result.output and "example length (tokens)" in result.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["chat_template_matches"] is True and stats["unit"] == "tokens"
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert stats["length"]["max"] == max(len(r["input_ids"]) for r in rows)
    assert stats["trained"]["total"] == sum(sum(1 for v in r["labels"] if v != IGNORE_INDEX) for r in rows)
    assert stats["length"]["min"] > 1000  # production-size prompts


def test_cli_bad_arguments(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["corpus", "build", str(tmp_path / "missing.jsonl"), str(tmp_path / "o")])
    assert result.exit_code == 2 and "input" in result.output
    result = runner.invoke(app, ["corpus", "build", str(EXAMPLE), str(tmp_path / "o"), "--tokenizer", str(tmp_path)])
    assert result.exit_code == 2 and "tokenizer" in result.output


def test_a_different_chat_template_is_reported(corpus, tokenizer_dir):
    from hearth.train.corpus import _template_check

    tok = load_tokenizer(tokenizer_dir)  # a private copy: the template is changed below
    # a template that keeps the think block on history replies too (not what Qwen3 does)
    tok.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
        "{%- if m.role == 'assistant' -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
        "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}")
    check = _template_check(tok, corpus.examples)
    assert check["chat_template_matches"] is False
    assert check["chat_template_mismatches"] == ["wren-tama-scholarship#3"]  # the only example with history


@settings(max_examples=60, deadline=None)
@given(replies=st.lists(st.builds(
    ChatReply, message=st.text(min_size=1, max_size=80).map(str.strip).filter(bool),
    mood=st.sampled_from(["warm", "dry", "worried"]), memories=st.lists(st.text(max_size=30).map(str.strip).filter(bool), max_size=2),
    affection=st.integers(-2, 2), trust=st.integers(-2, 2), suggested_actions=st.just([])), min_size=1, max_size=3))
def test_any_valid_conversation_trains_on_exactly_its_envelopes(replies):
    turns = []
    for i, reply in enumerate(replies):
        turns += [{"role": "user", "content": f"turn {i}"}, {"role": "assistant", "envelope": reply.model_dump()}]
    conv = {"id": "p", "kind": "chat", "persona": "mina", "world_view": "grounded", "stage": "friend", "turns": turns}
    try:
        examples = conversation_examples(conv)
    except CorpusError as exc:  # only control strings inside the text may refuse a valid envelope
        assert "control string" in exc.reason
        return
    assert len(examples) == len(replies)
    for example, reply in zip(examples, replies):
        (a, b), = example.rendered.spans
        assert example.rendered.text[a:b] == EMPTY_THINK + dumps(reply) + "<|im_end|>"
        assert example.rendered.text[b:] == "\n"
