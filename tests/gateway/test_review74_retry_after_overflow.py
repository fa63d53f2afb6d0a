"""Review 74: an upstream error whose Retry-After is an HTTP-date with a year too large for the platform's C long
(email.utils.parsedate_to_datetime raises OverflowError, not ValueError) falls through to the next provider.

parse_retry_after caught only TypeError and ValueError: the OverflowError escaped Provider._open, which is no
ProviderError, so the chain did not fall back: the request ended as the gateway's own error (a 500 internal_error)
although the next provider was healthy. Real loopback fakes.
"""

from __future__ import annotations

import pytest

from hearth.gateway.chain import Chain
from hearth.gateway.providers import parse_retry_after
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT_JSON, MESSAGES, gateway, make_config, provider, steady

pytestmark = pytest.mark.anyio
HUGE_DATE = "Mon, 01 Jan 99999999999999999999 00:00:00 GMT"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_parse_retry_after_reads_a_date_past_any_year_as_unparsable():
    assert parse_retry_after(HUGE_DATE) is None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_503_with_an_overflowing_retry_after_date_falls_through(stream):
    broken = Behavior.status(503, headers={"Retry-After": HUGE_DATE})
    async with FakeOpenAI(broken) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
        async with Chain(make_config(provider("a", a), steady("b", b))) as chain:
            if stream:
                events = [ev async for ev in chain.stream(MESSAGES, kind="chat")]
                result = events[-1].result
            else:
                result = await chain.complete(MESSAGES, kind="chat")
    assert result.provider == "b"
    assert result.attempts == [("a", "status_503"), ("b", "ok")]


async def test_the_gateway_answers_from_the_next_provider_not_with_a_500():
    broken = Behavior.status(503, headers={"Retry-After": HUGE_DATE})
    async with FakeOpenAI(broken) as a, FakeOpenAI(Behavior.reply(CHAT_JSON)) as b:
        async with gateway(make_config(provider("a", a), steady("b", b))) as client:
            r = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
            body = await r.json()
    assert r.status == 200, body
    assert body["hearth"]["provider"] == "b"
