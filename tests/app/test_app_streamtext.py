"""The streamed-message preview decodes the envelope's "message" value across arbitrary deltas."""

from __future__ import annotations

import json

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
