"""A stray "{" of chatter before the envelope: the object after it is still found.

"Sure {\\n" followed by a valid envelope was refused: the scan from the first "{" took the whole rest of the
reply as one brace span, which never closed (the stray brace has no partner), so repair saw no complete object
and handed the parser "{\\n{...}" ("not valid JSON"). The stream filter already dropped that brace as chatter and
showed the envelope, so the app showed a reply and then refused it; the eval scored it invalid.
A stray brace that never closes and does not start like an object is chatter now; what repair refuses is
unchanged: two objects, an object then a cut-off one, a duplicate key, a cut-off object (and its inner objects).
"""

from __future__ import annotations

import json
import time

import pytest

from hearth.envelope import EnvelopeError, parse_envelope, repair
from hearth.envelope_stream import streamed_cut

VALID_CHAT = {"message": "Hey, how did the exam go?", "mood": "curious", "memories": [],
              "affection": 1, "trust": 0, "suggested_actions": []}
COMMENT = json.dumps({"comment": "Love this.", "tone": "warm"})
READING = json.dumps({"analyst": "cynic", "reading": "r", "advice": "a", "risk": "low"})


def chat(**changes) -> str:
    return json.dumps({**VALID_CHAT, **changes})


STRAY = ["Sure {\n", "{\n", "{note ", "{\n{\n", "Sure { (here it is) {\n", "{note} {\n",
         "Here {it is:\n```json\n", "<think></think>\nOk {\n", "{ x } { y \n"]


@pytest.mark.parametrize("before", STRAY)
def test_a_stray_brace_before_the_envelope_is_chatter(before):
    body = chat()
    text_ = before + body + ("\n```" if "```" in before else "")
    assert repair(text_) == body
    assert parse_envelope(text_, "chat").message == VALID_CHAT["message"]
    assert streamed_cut(text_) == repair(text_)   # what a stream shows is what repair keeps


@pytest.mark.parametrize("kind, body", [("feed_comment", COMMENT), ("analyst", READING)])
def test_every_kind(kind, body):
    assert repair("Sure {\n" + body + "\nHope that helps.") == body
    parse_envelope("Sure {\n" + body, kind)


def test_braces_and_quotes_inside_the_envelope_after_a_stray_brace():
    body = chat(message='She wrote "}{" on the card, then {laughed}.')
    assert parse_envelope("Sure {\n" + body, "chat").message.startswith("She wrote")


@pytest.mark.parametrize("text_, reason", [
    ("Sure {\n" + chat() + "\n" + chat(message="other"), "2 JSON objects"),
    # an object hidden behind a stray brace after the first one was dropped unseen: two objects, refused
    (chat() + "\n:{ " + chat(message="other"), "2 JSON objects"),
    ("Sure {\n" + chat(message="draft") + "\n" + chat()[:-20], "followed by another that is not valid JSON"),
    ("Sure {\n" + chat()[:-1] + ', "message": "the other one"}', "duplicate key 'message'"),
])
def test_what_repair_refuses_is_still_refused_after_a_stray_brace(text_, reason):
    with pytest.raises(EnvelopeError) as info:
        repair(text_)
    assert reason in info.value.reason and info.value.field is None
    with pytest.raises(EnvelopeError):
        parse_envelope(text_, "chat")


def test_a_cut_off_envelope_after_a_stray_brace_is_handed_to_the_parser_and_refused():
    truncated = chat()[:-20]
    assert repair("Sure {\n" + truncated) == truncated   # as after any chatter: from its "{", still cut off
    with pytest.raises(EnvelopeError, match="not valid JSON"):
        parse_envelope("Sure {\n" + truncated, "chat")


@pytest.mark.parametrize("text_", [
    '{"reply": ' + chat(),                 # a cut-off object: its inner objects are its values, not candidates
    'Sure {\n{"reply": ' + chat(),
    '{"reply": {\n' + chat(),
])
def test_an_envelope_inside_a_cut_off_object_is_not_taken(text_):
    with pytest.raises(EnvelopeError, match="not valid JSON"):
        parse_envelope(text_, "chat")


def test_a_non_envelope_object_after_a_stray_brace_is_validated_not_accepted():
    with pytest.raises(EnvelopeError) as info:
        parse_envelope('Sure {\n{"a": 1}', "chat")
    assert info.value.field is not None


@pytest.mark.parametrize("text_", ["{" * 60_000, "{" * 20_000 + chat(), "{ " * 30_000, '{"' + "{" * 60_000,
                                   "{x" * 30_000, "{" * 30_000 + "}" * 30_000 + "{" * 1000])
def test_many_stray_braces_take_linear_time(text_):
    # trying every "{" as a new start would be quadratic: 60k braces would take minutes
    began = time.perf_counter()
    try:
        parse_envelope(text_, "chat")
    except EnvelopeError:
        pass
    assert time.perf_counter() - began < 3.0  # ~0.07 s here, quadratic: seconds to minutes; 3: room for a CI stall
