"""A '"' of chatter inside a stray "{" must not hide what follows it.

The stray brace's pass (_inside_stray_brace) read the text after "Sure {" with JSON string state, so a lone
quote of chatter (12" , 5" tall) opened a "string" that ran to the end of the reply and hid every brace after it:
"Sure {" + envelope + ' the 12" one: ' + another envelope was taken as one object (repair accepted the first,
the stream showed it), though the same reply without "Sure {" is refused as two objects.
"""

from __future__ import annotations

import json
import time

import pytest

from hearth.envelope import EnvelopeError, parse_envelope, repair
from hearth.envelope_stream import streamed_cut

VALID_CHAT = {"message": "Hey, how did the exam go?", "mood": "curious", "memories": [],
              "affection": 1, "trust": 0, "suggested_actions": []}


def chat(**changes) -> str:
    return json.dumps({**VALID_CHAT, **changes})


@pytest.mark.parametrize("text_, reason", [
    ("Sure {\n" + chat() + '\nOr the 12" one:\n' + chat(message="other"), "JSON objects"),
    ("Sure {\n" + chat(message="draft") + '\nIt is 5" tall:\n' + chat()[:-20], "not valid JSON"),
    ('Sure { 1" 2" 3" {\n' + chat() + '\n12" one:\n' + chat(message="other"), "refusing to choose"),
])
def test_a_quote_of_chatter_after_a_stray_brace_hides_no_second_object(text_, reason):
    with pytest.raises(EnvelopeError) as info:
        repair(text_)
    assert reason in info.value.reason
    with pytest.raises(EnvelopeError):
        parse_envelope(text_, "chat")


@pytest.mark.parametrize("before", ['Sure { here is "the" reply:\n', 'Sure { it is 5" tall:\n',
                                    'Sure { 5" {\n', '{ x" {\n'])
def test_quotes_of_chatter_after_a_stray_brace_before_the_envelope(before):
    text_ = before + chat() + "\nHope that helps."
    assert repair(text_) == chat()
    assert parse_envelope(text_, "chat").message == VALID_CHAT["message"]
    assert streamed_cut(text_) == repair(text_)


@pytest.mark.parametrize("text_", ['{ " ' * 16_000, '{ "' * 20_000 + chat(), '{ x" ' * 12_000 + chat()])
def test_many_stray_braces_and_quotes_take_linear_time(text_):
    began = time.perf_counter()
    try:
        parse_envelope(text_, "chat")
    except EnvelopeError:
        pass
    assert time.perf_counter() - began < 3.0  # ~0.07 s here, quadratic: seconds to minutes; 3: room for a CI stall
