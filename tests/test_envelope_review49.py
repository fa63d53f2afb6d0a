"""review49: repair and parse never choose between two readings of one reply."""

from __future__ import annotations

import json

import pytest

from hearth.envelope import EnvelopeError, parse_envelope, repair

VALID_CHAT = {"message": "Hey, how did the exam go?", "mood": "curious", "memories": [],
              "affection": 1, "trust": 0, "suggested_actions": []}


def chat(**changes) -> str:
    return json.dumps({**VALID_CHAT, **changes})


@pytest.mark.parametrize("text_", [
    # the model wrote two messages and two affection shifts in one object: json.loads kept the last of each,
    # while the app's stream preview (app/streamtext) showed the first message
    chat()[:-1] + ', "message": "I never want to talk to you again.", "affection": -2}',
    # the same inside chatter (the scan path, not the fast path)
    "Here you go:\n" + chat()[:-1] + ', "message": "the other one"}\nHope that helps.',
])
def test_duplicate_keys_are_refused_not_resolved_to_the_last(text_):
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text_, "chat")
    assert "duplicate key 'message'" in info.value.reason or "duplicate key 'affection'" in info.value.reason
    assert info.value.field is None
    with pytest.raises(EnvelopeError, match="duplicate key"):
        repair(text_)


def test_a_duplicate_seen_before_a_syntax_error_is_reported_as_the_syntax_error():
    # the decoder builds the inner object (and sees its duplicate) before it reaches "oops"
    with pytest.raises(EnvelopeError) as info:
        parse_envelope('{"x": {"a": 1, "a": 2} oops}', "chat")
    assert "not valid JSON" in info.value.reason


@pytest.mark.parametrize("text_", [
    # a complete draft, then the corrected reply cut off by max_tokens: the draft was accepted
    chat(message="draft") + "\n\nActually, let me redo that:\n" + chat(message="the real reply")[:-40],
    # a complete draft, then a corrected reply with a syntax error (trailing comma): the draft was accepted
    chat(message="draft") + "\nCorrected:\n" + chat(message="the real reply")[:-1] + ",}",
    # a reasoning model whose template opens <think> in the prompt: only </think> is in the reply, and the
    # JSON drafted while thinking was taken over the (broken) final answer
    'Plan: reply with ' + chat(message="thinking draft") + ' then check.</think>\n\n' + chat(message="final")[:-1] + ",}",
])
def test_a_valid_object_next_to_a_broken_object_is_not_chosen(text_):
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text_, "chat")
    assert info.value.field is None and "followed by another that is not valid JSON" in info.value.reason
    with pytest.raises(EnvelopeError):
        repair(text_)


@pytest.mark.parametrize("text_", [
    # the format echoed before the answer, or a broken draft the answer corrects: the later object is the answer
    'Format: {"message": string, "mood": string, ...}\n' + chat(),
    chat(message="draft")[:-1] + ",}\nFixed:\n" + chat(),
    'Plan: reply with {"message": "draft", mood: warm}</think>\n\n' + chat(),
])
def test_a_broken_object_before_the_valid_one_is_chatter(text_):
    assert parse_envelope(text_, "chat").message == VALID_CHAT["message"]


@pytest.mark.parametrize("chatter", [
    "I'm so {happy} for you!",      # braces in prose: not an object
    "(smiley :{ )",                  # an unmatched brace in prose
    "Template: {name}",
])
def test_braces_in_chatter_around_one_object_still_repair(chatter):
    body = chat()
    assert repair(f"{body}\n{chatter}") == body
    assert parse_envelope(f"{body}\n{chatter}", "chat").message == VALID_CHAT["message"]
