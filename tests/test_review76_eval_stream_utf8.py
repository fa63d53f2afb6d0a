"""review76: a streamed chat answer is decoded as hearth's gateway decodes it: UTF-8, and a byte that is not UTF-8
fails the chunk that holds it.

Was: the eval's client decoded the SSE body with the charset its Content-Type named (UTF-8 when none) and
errors="replace". The gateway (gateway/providers.py ChatStream) decodes each data line as json.loads decodes bytes:
UTF-8, strictly, and a line that is not is a bad SSE event. So a stream with a UTF-8 sequence cut short (a server
that splits a character across two tokens and sends the bytes as they come) passed the eval, the message carrying
U+FFFD where the character was, while the app's streamed chat failed the turn; and a charset=iso-8859-1 label on a
UTF-8 stream scored a reply with mojibake ("Ã©") where the app shows "é".

Each answer is served by a real loopback server, once straight to the eval and once through the real gateway as
the app's chat streams it: the two verdicts must agree, and so must the reply's text.
"""

from __future__ import annotations

import json

from tests.evals.eval_vs_gateway import agree, event, fake_model, serve_fake, verdicts as both
from tests.fakes.openai_server import Behavior

GOOD = json.dumps({"message": "Ça va, café ?", "mood": "calm", "memories": [], "affection": 0, "trust": 0,
                   "suggested_actions": []}, ensure_ascii=False)


def _event(delta: dict, finish: str | None = None) -> bytes:
    return event(delta, finish, ensure_ascii=False).encode()


def _sse(content: bytes) -> bytes:
    """A stream of one content chunk whose data line is ``content`` as raw bytes in place of the reply."""
    middle = _event({"content": "@@"}).replace(b"@@", content)
    return _event({"role": "assistant", "content": ""}) + middle + _event({}, "stop") + b"data: [DONE]\n\n"


ESCAPED = json.dumps(GOOD, ensure_ascii=False)[1:-1].encode()  # the reply as a JSON string's inside, UTF-8 as written
ANSWERS = {
    "utf-8": Behavior.raw(_sse(ESCAPED), content_type="text/event-stream"),
    "a UTF-8 sequence cut short": Behavior.raw(_sse(ESCAPED.replace("é".encode(), b"\xc3")),
                                               content_type="text/event-stream"),
    "labelled iso-8859-1": Behavior.raw(_sse(ESCAPED), content_type="text/event-stream; charset=iso-8859-1"),
}


def verdicts() -> tuple[dict, dict]:
    return both(fake_model(), ANSWERS, serve_fake)


def test_a_streamed_answer_is_decoded_as_the_gateway_decodes_it():
    direct, gateway = verdicts()
    agree(direct, gateway)
    assert {name for name in ANSWERS if direct[name].passed} == {"utf-8", "labelled iso-8859-1"}
    for name in ("utf-8", "labelled iso-8859-1"):
        assert direct[name].content == GOOD, (name, direct[name].content)
    cut = direct["a UTF-8 sequence cut short"]
    assert cut.status == 200 and cut.checks["response"] is False, cut
    assert cut.reason.startswith("malformed stream chunk (not UTF-8)"), cut.reason
