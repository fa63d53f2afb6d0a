"""review76: a streamed chat case is read as hearth's gateway reads the stream it asks a provider for.

Was: the eval's client read a stream request's answer by its Content-Type: text/event-stream as SSE, anything else
as a completion in one piece. The gateway (gateway/providers.py ChatStream) reads the answer to its stream request
as SSE whatever the Content-Type says: "data:" lines, nothing else. So, scored straight from a model:

    * a server that ignores "stream": true and answers with one application/json completion passed the eval, while
      the app's streamed chat (every chat turn of a page with its script on) failed every turn ("the stream ended
      without a finish_reason or [DONE]": no data line);
    * a server that streams SSE under another Content-Type (text/plain, a proxy's rewrite) failed the eval
      ("malformed completion"), while the app showed and saved those replies.

Each answer is served by a real loopback server, once straight to the eval and once through the real gateway as
the app's chat streams it: the two verdicts must agree.
"""

from __future__ import annotations

import json

from tests.evals.eval_vs_gateway import GOOD, SSE, agree, fake_model, serve_fake, verdicts as both
from tests.fakes.openai_server import Behavior, completion_json

ANSWERS = {
    "one piece, application/json": Behavior.raw(json.dumps(completion_json(GOOD, "m"))),
    "SSE as text/plain": Behavior.raw(SSE, content_type="text/plain"),
    "SSE with no content type": Behavior.raw(SSE, content_type=""),
    "SSE as text/event-stream": Behavior.raw(SSE, content_type="text/event-stream"),
}


def verdicts() -> tuple[dict, dict]:
    return both(fake_model(), ANSWERS, serve_fake)


def test_a_streamed_chat_answer_passes_the_eval_exactly_when_the_apps_streamed_chat_takes_it():
    direct, gateway = verdicts()
    agree(direct, gateway)
    assert {name for name in ANSWERS if direct[name].passed} == {
        "SSE as text/plain", "SSE with no content type", "SSE as text/event-stream"}


def test_an_answer_in_one_piece_to_a_stream_request_says_so():
    direct, _ = verdicts()
    row = direct["one piece, application/json"]
    assert row.status == 200 and row.checks["response"] is False, (row.status, row.checks)
    assert "not as server-sent events" in row.reason and "application/json" in row.reason, row.reason
