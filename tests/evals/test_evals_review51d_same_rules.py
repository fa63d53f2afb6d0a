"""review51d: the eval scores a reply by the rules the app acts on it by.

The app gets its chat replies streamed through hearth's gateway (app/routes/_util.reply_events), which cuts the
envelope out of the stream as it comes (hearth/envelope_stream.py: from the first '{"') and refuses the reply when
that is not the object hearth.envelope.repair finds in the whole text. repair skips a broken object-like span
before the object (an echoed format, a broken draft), so those replies passed the eval scored against the model
directly while the app showed the user the broken span and then failed the turn. And where the reply as a whole
was not one JSON object, the eval wrote reasons of its own ("reply is JSON but not an object", "not valid JSON:
ValueError") for what parse_envelope explains ("expected a JSON object, got list", the digit limit).

Each reply below is served by a fake model on loopback, once straight to the eval and once through the real
gateway streaming it as the app's chat does: the two verdicts must agree.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from hearth.envelope import EnvelopeError, parse_envelope
from hearth.evals.runner import run_cases
from hearth.evals.suites import load_suite
from tests.evals.test_evals_review50_gateway import gateway_url
from tests.fakes.openai_server import Behavior, FakeOpenAI
from tests.gateway.gateway_helpers import make_config, provider

CHAT_CASE = load_suite("companion")[0]
FEED_CASE = load_suite("feed")[0]
GOOD = {"message": "I'm here.", "mood": "calm", "memories": [], "affection": 0, "trust": 0, "suggested_actions": []}
TEXT = json.dumps(GOOD)
# connect_s: a loopback connect is instant, but a loaded CI machine can stall the process for about a second
TIMEOUTS = {"connect_s": 5.0, "first_token_s": 5.0, "total_s": 5.0}


def chat(**changes) -> str:
    return json.dumps({**GOOD, **changes})


REPLIES = {
    "clean": TEXT,
    "fenced": f"```json\n{TEXT}\n```",
    "think": f"<think>\nshort and warm\n</think>\n{TEXT}",
    "prose around": f"Sure! Here it is: {TEXT}\nHope that helps.",
    "bom": "\ufeff" + TEXT,
    "surrogate pair": chat(message="hi \ud83d\ude00"),
    "long string": chat(message="x" * 2001),
    "duplicate key": TEXT[:-1] + ', "message": "B"}',
    "two objects": TEXT + TEXT,
    "nan": TEXT.replace('"affection": 0', '"affection": NaN'),
    "infinity": TEXT.replace('"affection": 0', '"affection": -Infinity'),
    "huge number": TEXT.replace('"affection": 0', '"affection": ' + "9" * 5000),
    "lone surrogate": TEXT.replace("I'm here.", "hi \\ud800"),
    "deep nesting": '{"message": ' + "[" * 20000 + "]" * 20000 + "}",
    "array of one": f"[{TEXT}]",
    # a broken object-like span before the envelope: repair calls it chatter, the app's stream starts there
    "echoed format": 'Format: {"message": string, "mood": string, ...}\n' + TEXT,
    "broken draft": chat(message="draft")[:-1] + ",}\nFixed:\n" + TEXT,
    "draft in reasoning": 'Plan: reply with {"message": "draft", mood: warm}</think>\n\n' + TEXT,
}


def verdicts(texts: dict[str, str], case) -> tuple[dict, dict]:
    """{name: score} of each reply scored straight from the model, and through the gateway streaming it."""
    current: list[str] = []

    async def go():
        async with FakeOpenAI(lambda body: Behavior.reply(current[0])) as model:
            cfg = make_config(provider("a", model, model="hearth-lora", timeouts=TIMEOUTS), deadline_s=10.0,
                              breaker_failures=1000)
            direct, gateway = {}, {}
            async with gateway_url(cfg) as url:
                for name, text in texts.items():
                    current[:] = [text]
                    direct[name], = await run_cases([case], base_url=model.base_url, model="m", timeout_s=10,
                                                    stream=True)
                    gateway[name], = await run_cases([case], base_url=url, model="hearth-lora", timeout_s=10,
                                                     stream=True)
            return direct, gateway

    return asyncio.run(go())


def test_the_eval_passes_a_chat_reply_exactly_when_the_apps_streamed_chat_takes_it():
    direct, gateway = verdicts(REPLIES, CHAT_CASE)
    disagree = {name: (direct[name].reason, gateway[name].reason) for name in REPLIES
                if direct[name].passed != gateway[name].passed}
    assert not disagree, disagree
    passing = {name for name in REPLIES if direct[name].passed}
    assert passing == {"clean", "fenced", "think", "prose around", "bom", "surrogate pair", "array of one"}
    for name in ("echoed format", "broken draft", "draft in reasoning"):
        row = direct[name]
        assert row.checks["json"] is False and row.checks["schema"] is None, (name, row.checks)
        assert "first object-like span" in row.reason and "the app streams chat replies" in row.reason, row.reason
        assert row.repaired is True


@pytest.mark.parametrize("name, reason", [
    ("huge number", "Exceeds the limit (4300 digits)"),
    ("deep nesting", "RecursionError: maximum recursion depth exceeded"),
    ("a list", "expected a JSON object, got list"),
])
def test_a_reply_that_is_not_one_object_gets_the_reason_parse_envelope_gives(name, reason):
    text = REPLIES.get(name, "[1, 2]")
    direct, _ = verdicts({name: text}, CHAT_CASE)
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(text, "chat")
    row = direct[name]
    assert row.checks["json"] is False and row.reason == info.value.reason, (row.reason, info.value.reason)
    assert reason in row.reason


def test_a_feed_comment_which_the_app_does_not_stream_keeps_repairs_reading():
    # the app asks for feed comments in one piece (app/feed.py: complete): a broken draft before is chatter there
    comment = json.dumps({"comment": "Love this.", "tone": "warm"})
    direct, _ = verdicts({"echoed format": 'Format: {"comment": string, ...}\n' + comment}, FEED_CASE)
    assert direct["echoed format"].passed, direct["echoed format"].reason
