"""Review 51e: the form POST (no script) and the streamed chat accept the same replies.

Was: a reply whose first object-like span is a broken draft before the real envelope ('{"message": oops} {...}')
failed the streamed turn (the chain's stream check: the cut EnvelopeFilter shows must be what envelope.repair
keeps), while the non-streamed form POST saved it (repair alone takes the envelope after the draft), for chat and
rehearsal turns alike. Now both fail it, through the REAL chain against the real-socket fake OpenAI server.
"""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager

import pytest

from hearth.app.storage.models import Message, RehearsalTurn
from hearth.gateway.errors import InvalidResponse
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import envelope_for, kind_from_request, openai_handler
from tests.app.conftest import count_rows, running_app_on_chain
from tests.fakes.openai_server import Behavior, FakeOpenAI

pytestmark = pytest.mark.anyio
DRAFT = '{"message": oops} '  # object-like ({"), balanced, not JSON: a broken draft before the envelope


def _drafted(body: dict):
    if kind_from_request(body) != "chat":
        return openai_handler(body)
    return Behavior.reply(DRAFT + envelope_for(body["messages"], "chat"))


async def start_rehearsal(client, csrf: str, cid: str) -> str:
    r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "a colleague",
                                           "relationship": "coworker", "companion_id": cid, "csrf": csrf})
    assert r.status_code == 303, r.text
    page = (await client.get(f"/companions/{cid}/simulate")).text
    agent_id = re.search(r'<select name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
    assert r.status_code == 303, r.text
    return r.headers["location"].rsplit("/", 1)[-1]


@asynccontextmanager
async def _app_on_the_real_chain(tmp_path, master_key_text):
    async with FakeOpenAI(_drafted) as fake:
        async with running_app_on_chain(tmp_path, master_key_text, fake.base_url) as (app, client):
            csrf = await signup(client, "hana")
            yield app, client, csrf, await create_companion(client, csrf)


async def test_a_broken_draft_before_the_envelope_fails_the_chat_form_as_the_stream(tmp_path, master_key_text):
    async with _app_on_the_real_chain(tmp_path, master_key_text) as (app, client, csrf, cid):
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "event: done" not in r.text  # the chain's rule, unchanged
        # before: 303, and the turn the stream refused was saved
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello there", "csrf": csrf})
        assert r.status_code == 502 and "Nothing was saved" in r.text
        assert "could not be understood" in r.text and "hello there</textarea>" in r.text
        assert await count_rows(app, Message) == 0


async def test_a_broken_draft_before_the_envelope_fails_the_rehearsal_form_as_the_stream(tmp_path, master_key_text):
    async with _app_on_the_real_chain(tmp_path, master_key_text) as (app, client, csrf, cid):
        rid = await start_rehearsal(client, csrf, cid)
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "about Friday"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "event: done" not in r.text
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "about Monday", "csrf": csrf})
        assert r.status_code == 502 and "about Monday</textarea>" in r.text  # before: 303, saved
        assert await count_rows(app, RehearsalTurn) == 0


def test_the_check_is_the_chains_stream_check():
    from hearth.app.model import check_as_streamed

    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    good = envelope_for(messages, "chat")

    class Result:
        provider = "p"

        def __init__(self, text):
            self.text = text

    for ok in (good, f"<think></think>\n```json\n{good}\n```\nHope that helps!", "in the format {message, mood}: " + good):
        check_as_streamed(Result(ok))
    with pytest.raises(InvalidResponse) as err:
        check_as_streamed(Result(DRAFT + good))
    assert err.value.provider == "p"
    check_as_streamed(object())  # a double without the reply's text: nothing to compare
    assert json.loads(good)["message"] == "Echo: hi"
