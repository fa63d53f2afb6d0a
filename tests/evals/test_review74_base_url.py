"""A --base-url with a query or a fragment is refused at start-up (review 74).

Was: the client appends /chat/completions to the base URL as a string, so "http://host/v1?api-version=1" posted to
"/v1?api-version=1/chat/completions": the path /v1, the query garbled. Every call failed (404 from most servers)
and was scored as a failing reply, exit 1 (FAIL) instead of 2 (bad arguments); a secret in the query (?key=...)
was also written into the report's base_url.
"""

from __future__ import annotations

import pytest

from hearth.evals.runner import main
from tests.fakes.openai_server import Behavior, FakeOpenAI


@pytest.mark.parametrize("tail", ["?api-version=2024-02-01", "?key=SECRET", "#v1", "/?x=1"])
def test_a_base_url_with_a_query_or_fragment_is_refused_before_any_call(tail, capsys):
    server = FakeOpenAI(Behavior.reply('{"comment": "Nice.", "tone": "warm"}')).start_in_thread()
    try:
        rc = main(suite="feed", base_url=server.base_url + tail, model="m", timeout_s=5)
        requests = list(server.requests)
    finally:
        server.stop()
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 2, out
    assert "--base-url" in out and ("query" in out or "fragment" in out), out
    assert requests == []


def test_a_plain_base_url_still_runs(capsys):
    server = FakeOpenAI(Behavior.reply('{"comment": "Nice.", "tone": "warm"}')).start_in_thread()
    try:
        rc = main(suite="feed", base_url=server.base_url + "/", model="m", timeout_s=5)
    finally:
        server.stop()
    assert rc == 0, capsys.readouterr().out
