"""Review 51f: the streamed envelope rule lives in the chain, for complete() as for stream().

A chat reply whose first object-like span is a broken draft before the real envelope fails a stream (the filter
shows the draft, which is not what hearth.envelope.repair keeps). complete() parsed the same reply through repair
alone: the chain recorded a success for the provider, and the app then refused the result itself
(app.model.check_as_streamed), so the chain neither fell back to the next provider nor counted the reply against
the provider's breaker. Now complete() applies the rule to the kinds the app streams (STREAMED_KINDS): such a
reply is an invalid_response inside the chain, like any reply it cannot use. Real loopback fake providers.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from hearth.envelope import repair
from hearth.gateway.chain import Chain
from hearth.gateway.errors import InvalidResponse
from hearth.gateway.streamfilter import STREAMED_KINDS, EnvelopeFilter, check_streamed, streamed_cut
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import CHAT, CHAT_JSON, MESSAGES, make_config, provider, steady

DRAFT = '{"message": oops} '   # object-like ('{"'), balanced, not JSON: a broken draft before the envelope
FROM_B = json.dumps({**CHAT, "message": "From b."})
COMMENT = json.dumps({"comment": "Love this.", "tone": "warm"})


def _sample(chain: Chain, name: str, **labels: str) -> float:
    return chain.metrics.registry.get_sample_value(name, labels) or 0.0


async def _ask(kind: str, first: str, second: str, **gateway):
    async with FakeOpenAI(Behavior.reply(first)) as a, FakeOpenAI(Behavior.reply(second)) as b:
        async with Chain(make_config(provider("a", a), steady("b", b), **gateway)) as chain:
            result = await chain.complete(MESSAGES, kind=kind)
            status = {s["name"]: s for s in await chain.status()}
            counts = {"invalid": _sample(chain, "hearth_gateway_errors_total", provider="a", error="invalid_response"),
                      "fallbacks": _sample(chain, "hearth_gateway_fallbacks_total", provider="a")}
            return result, status, counts, len(b.requests)


def test_a_chat_reply_the_stream_would_fail_falls_back_to_the_next_provider():
    result, status, counts, _ = asyncio.run(_ask("chat", DRAFT + CHAT_JSON, FROM_B))
    # before: answered by a (repair's envelope after the draft), recorded as its success
    assert result.provider == "b" and result.envelope.message == "From b."
    assert result.attempts == [("a", "invalid_response"), ("b", "ok")]
    assert counts == {"invalid": 1.0, "fallbacks": 1.0}
    assert status["a"]["consecutive_failures"] == 1 and status["b"]["consecutive_failures"] == 0


def test_it_counts_against_the_breaker_like_any_invalid_reply():
    _, status, _, _ = asyncio.run(_ask("chat", DRAFT + CHAT_JSON, FROM_B, breaker_failures=1))
    assert status["a"]["state"] == "open"   # before: closed, the draft was a success


def test_a_feed_comment_keeps_repairs_reading():
    # the app asks for feed comments in one piece: a broken draft before the envelope is chatter there
    result, status, counts, asked_b = asyncio.run(_ask("feed_comment", '{"comment": oops} ' + COMMENT, COMMENT))
    assert result.provider == "a" and result.envelope.comment == "Love this."
    assert counts == {"invalid": 0.0, "fallbacks": 0.0} and asked_b == 0
    assert status["a"]["consecutive_failures"] == 0


@pytest.mark.parametrize("text", [
    CHAT_JSON,
    f"<think></think>\n```json\n{CHAT_JSON}\n```\nHope that helps!",
    "in the format {message, mood}: " + CHAT_JSON,
], ids=["clean", "wrapped", "chatter-brace"])
def test_what_a_stream_shows_is_repairs_envelope(text):
    assert streamed_cut(text) == repair(text)
    check_streamed(text, "a")
    cut = EnvelopeFilter()
    for i in range(0, len(text), 3):   # delta by delta, as Chain.stream feeds it: the same cut
        cut.feed(text[i:i + 3])
    check_streamed(text, "a", shown=cut.text)


def test_check_streamed_names_the_provider_and_compares_what_was_shown():
    assert STREAMED_KINDS == frozenset({"chat"})
    assert streamed_cut(DRAFT + CHAT_JSON) == DRAFT.strip()
    with pytest.raises(InvalidResponse) as err:
        check_streamed(DRAFT + CHAT_JSON, "a")
    assert err.value.provider == "a"
    with pytest.raises(InvalidResponse):
        check_streamed(CHAT_JSON, "a", shown=CHAT_JSON[:-1])   # a stream that showed something else
    with pytest.raises(TypeError, match="text"):
        check_streamed(None, "a")
