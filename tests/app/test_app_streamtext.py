"""The streamed-message preview decodes the envelope's "message" value across arbitrary deltas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearth.app.streamtext import MessageStream


@settings(max_examples=200, deadline=None)
@given(message=st.text(min_size=1, max_size=80), cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=12),
       ascii_only=st.booleans())
def test_any_split_yields_exactly_the_message(message, cuts, ascii_only):
    doc = json.dumps({"message": message, "mood": "ok", "memories": []}, ensure_ascii=ascii_only)
    points = sorted({c % len(doc) for c in cuts})
    pieces = [doc[a:b] for a, b in zip([0, *points], [*points, len(doc)])]
    stream = MessageStream()
    assert "".join(stream.feed(p) for p in pieces) == message
    assert stream.done


def test_message_key_after_other_keys_and_nothing_before_it():
    s = MessageStream()
    assert s.feed('{"mood": "x", ') == ""
    assert s.feed('"message": "a\\') == "a"
    assert s.feed('nb"}') == "\nb"
    assert s.feed("more") == ""


# ------------------------------------------------------------------------------ half a surrogate pair (review 62)
# JSON lets a model write half of a UTF-16 surrogate pair ("\ud83d" with no "\ude00" after it: cut inside an emoji);
# the final envelope refuses it, but the preview passed it on as the character itself, which no UTF-8 event can
# carry: sse() raised UnicodeEncodeError and the streamed turn failed on that instead of as the invalid reply it is.
def _encodable(text: str) -> str:
    text.encode("utf-8")  # raises on a lone surrogate
    return text


@pytest.mark.parametrize("doc, shown", [
    ('{"message": "hi \\ud83d there", "mood": "ok"}', "hi \ufffd there"),    # a high half, then plain text
    ('{"message": "hi \\ud83d\\n", "mood": "ok"}', "hi \ufffd\n"),          # a high half, then another escape
    ('{"message": "hi \\ud83d\\u0041", "mood": "ok"}', "hi \ufffdA"),      # ... then a \\u escape of no low half
    ('{"message": "hi \\ude00 there", "mood": "ok"}', "hi \ufffd there"),    # a low half alone
    ('{"message": "hi \\ud83d", "mood": "ok"}', "hi \ufffd"),                # a high half at the very end
    ('{"message": "hi \\ud83d\\ude00!", "mood": "ok"}', "hi \U0001F600!"),   # a whole pair still decodes
])
def test_a_lone_surrogate_escape_is_shown_as_a_replacement_character(doc, shown):
    for step in (1, 3, 7, len(doc)):
        stream = MessageStream()
        out = "".join(_encodable(stream.feed(doc[i:i + step])) for i in range(0, len(doc), step))
        assert out == shown, step
        assert stream.done


def test_surrogates_already_decoded_in_the_deltas():
    # a provider whose chunks were JSON themselves may hand over the halves of a pair as characters, one per delta
    stream = MessageStream()
    pieces = ['{"message": "a', "\ud83d", "\ude00", "b \udc00 c \ud83d", '"}']
    assert "".join(_encodable(stream.feed(p)) for p in pieces) == "a\U0001F600b \ufffd c \ufffd"


def test_a_u_escape_without_four_hex_digits_is_shown_raw():
    # before: int() raised ValueError on "\\uzz12" (and took "\\u 12a" or "\\u+12a" for a number)
    for bad in ("\\uzz12", "\\u 12a", "\\u+12a"):
        stream = MessageStream()
        assert stream.feed('{"message": "a' + bad + 'b"}') == "a" + bad[1:] + "b"
