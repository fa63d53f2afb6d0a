"""run_cases refuses an api_key that cannot go in a header, before any call, without echoing it (review 74).

Was: the CLI checked the key's value (--api-key-env), run_cases did not. A key with a trailing newline (read from a
file in Python) failed every call in h11 with "LocalProtocolError: Illegal header value b'Bearer <the key>\\n'", and
that text, the whole key in it, became each reply's reason: printed in the failures table and written to the report.
"""

from __future__ import annotations

import asyncio

import pytest

from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.fakes.openai_server import Behavior, FakeOpenAI

SECRET = "sk-review74-SECRET"


@pytest.mark.parametrize("key", [SECRET + "\n", SECRET + " ", "Bearer " + SECRET, SECRET + "é"])
def test_a_key_that_cannot_go_in_a_header_is_refused_before_any_call_and_not_echoed(key):
    cases = load_suite("feed")[:2]

    async def go():
        async with FakeOpenAI(Behavior.reply('{"comment": "Nice.", "tone": "warm"}')) as server:
            try:
                scores = await run_cases(cases, base_url=server.base_url, model="m", api_key=key, timeout_s=5)
            except ValueError as exc:
                return exc, None, server.requests
            return None, scores, server.requests

    error, scores, requests = asyncio.run(go())
    leaked = [s.reason for s in scores or [] if s.reason and SECRET in s.reason]
    assert not leaked, leaked
    assert error is not None and "api_key" in str(error), (error, [s.reason for s in scores or []])
    assert SECRET not in str(error)
    assert requests == []


def test_a_good_key_is_sent_as_a_bearer_token():
    cases = load_suite("feed")[:1]

    async def go():
        async with FakeOpenAI(Behavior.reply('{"comment": "Nice.", "tone": "warm"}')) as server:
            scores = await run_cases(cases, base_url=server.base_url, model="m", api_key=SECRET, timeout_s=5)
            return scores, server.headers

    scores, headers = asyncio.run(go())
    assert scores[0].passed, scores[0].reason
    assert headers[0]["Authorization"] == f"Bearer {SECRET}"
