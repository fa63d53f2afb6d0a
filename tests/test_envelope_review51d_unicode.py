"""review51d: a lone surrogate escape in a reply is refused with a reason that says what is wrong.

"\\ud800" is valid JSON (half of a UTF-16 pair: a model cut inside an emoji writes it) and json.loads gives a str
no UTF-8 column, page or log can hold, so the envelope refuses it. The reason was pydantic's "Input should be a
valid string, unable to parse raw data as a unicode string" for a value that is a string, and for one in a key
it came with no field at all, reading like a fault of the reply as a whole.
"""

from __future__ import annotations

import json

import pytest

from hearth.envelope import EnvelopeError, parse_envelope

GOOD = {"message": "Hey", "mood": "warm", "memories": [], "affection": 0, "trust": 0, "suggested_actions": []}


@pytest.mark.parametrize("text_, field", [
    (json.dumps({**GOOD, "memories": ["likes \ud83c tea"]}), "memories.0"),
    (json.dumps({**GOOD, "message": "\udfff"}), "message"),
])
def test_a_lone_surrogate_in_a_value_names_the_field_and_the_cause(text_, field):
    assert "\\ud" in text_  # json.dumps writes it as the escape a model would
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text_, "chat")
    assert info.value.field == field
    assert info.value.reason == "must be valid Unicode text, not a lone surrogate escape such as \\ud800 (half a character)"


def test_a_lone_surrogate_in_a_key_says_it_is_a_key():
    text_ = json.dumps({**GOOD, "mess\ud800age": "x"})
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text_, "chat")
    assert info.value.field is None
    assert info.value.reason.startswith("a key must be valid Unicode text"), info.value.reason
    assert str(info.value) == "envelope: " + info.value.reason


def test_a_surrogate_pair_is_one_character_and_accepted():
    assert parse_envelope(json.dumps({**GOOD, "message": "hi \U0001f600"}), "chat").message == "hi \U0001f600"
