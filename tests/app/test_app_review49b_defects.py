"""Defects found by review 49b of the app (feature behaviour; each test failed before its fix):

* the Simulation Mode panel (a situation, and each rehearsal exchange) saw the context the user shares but
  nothing of what the user had told the companion: the companion's memories never reached the analysts;
* the export's times had no UTC offset on SQLite (PostgreSQL's had one): whatever reads the file takes
  them for local time;
* a chat longer than 200 messages showed only its last 200, with no way to reach the earlier ones.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from hearth.app.common import seal
from hearth.app.crypto import UserCipher
from hearth.app.storage.models import Message, User
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel, analyst_of
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
SSE = {"accept": "text/event-stream"}
MEMORY = "The user's name is Sam"


async def _agent(client, csrf: str, cid: str) -> str:
    await client.post("/agents", data={"name": "Dana", "personality": "blunt, busy", "backstory": "my team lead",
                                       "relationship": "manager", "companion_id": cid, "csrf": csrf})
    page = await client.get(f"/companions/{cid}/simulate")
    aid = re.search(r'data-agent="([0-9a-f]{32})"', page.text).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": aid, "csrf": csrf})
    return r.headers["location"].rsplit("/", 1)[-1]


def _analyst_prompts(model: FakeModel) -> dict[str, str]:
    return {analyst_of(m): m[0]["content"] for k, m in model.calls if k == "analyst"}


# ------------------------------------------------------------------------------ the panel and the companion's memories
async def test_the_panel_knows_what_the_user_told_the_companion(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await client.post("/context", data={"shared_context": "I work night shifts at a bakery.", "csrf": csrf})
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "Hi, my name is Sam", "csrf": csrf})
        assert r.status_code == 303 and "name is Sam" in (await client.get(f"/companions/{cid}")).text

        for headers in ({}, SSE):  # the form POST and the page's streamed panel
            model.calls.clear()
            r = await client.post(f"/companions/{cid}/situations", headers=headers,
                                  data={"situation": "My boss ignored my email", "csrf": csrf})
            assert r.status_code in (200, 303)
            prompts = _analyst_prompts(model)
            assert len(prompts) == 5
            for analyst, system in prompts.items():
                assert "night shifts at a bakery" in system, analyst
                assert MEMORY in system, f"{analyst} does not know what the user told their companion"

        rid = await _agent(client, csrf, cid)
        model.calls.clear()
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "Can we talk?", "csrf": csrf}, headers=SSE)
        assert "event: done" in r.text
        prompts = _analyst_prompts(model)
        assert len(prompts) == 5 and all(MEMORY in p for p in prompts.values())


async def test_a_companion_the_user_does_not_share_with_gives_its_panel_nothing(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        await client.post("/context", data={"shared_context": "PRIVATE-CONTEXT", "csrf": csrf})
        r = await client.post("/companions", data={"persona": "wren", "world_view": "grounded", "csrf": csrf})
        cid = r.headers["location"].rsplit("/", 1)[-1]  # share_context unticked
        await client.post(f"/companions/{cid}/messages", data={"message": "my name is Sam", "csrf": csrf})
        model.calls.clear()
        await client.post(f"/companions/{cid}/situations", data={"situation": "A hard week", "csrf": csrf})
        prompts = _analyst_prompts(model)
        assert len(prompts) == 5
        assert not any("PRIVATE-CONTEXT" in p or MEMORY in p for p in prompts.values())


# ------------------------------------------------------------------------------ the export's times
def _times(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "created_at":
                yield value
            else:
                yield from _times(value)
    elif isinstance(node, list):
        for value in node:
            yield from _times(value)


async def test_the_exports_times_carry_their_utc_offset(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        before = datetime.now(timezone.utc)
        await client.post(f"/companions/{cid}/messages", data={"message": "hello", "csrf": csrf})
        await client.post(f"/companions/{cid}/situations", data={"situation": "A hard week", "csrf": csrf})
        await client.post("/feed/posts", data={"post": "Found a bakery", "csrf": csrf})
        data = (await client.get("/account/export")).json()
    times = list(_times(data))
    assert len(times) == 5  # the account, two messages, the situation, the post
    for text in times:
        when = datetime.fromisoformat(text)
        assert when.utcoffset() == timedelta(0), f"{text!r} has no UTC offset"
        assert before - timedelta(minutes=5) < when < datetime.now(timezone.utc) + timedelta(minutes=5)


# ------------------------------------------------------------------------------ a long chat
async def test_a_500_turn_chat_pages_back_to_its_first_message(make_settings, sqlite_url, master_key):
    model = FakeModel()
    settings = make_settings(sqlite_url)
    async with running_app(settings, model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        db = app.state.hearth.db
        async with db.sessions() as s, s.begin():
            user = (await s.execute(select(User))).scalar_one()
            cipher = UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
            start = datetime.now(timezone.utc) - timedelta(days=30)
            for i in range(1000):  # 500 turns, written as save_turn writes them
                row = Message(id=f"{i:032x}", user_id=user.id, companion_id=cid,
                              role="user" if i % 2 == 0 else "companion", created_at=start + timedelta(seconds=i))
                row.body_ct = seal(cipher, row, "body_ct", f"line {i}")
                s.add(row)

        seen, url = [], f"/companions/{cid}"
        while url:
            page = await client.get(url)
            assert page.status_code == 200
            lines = [int(n) for n in re.findall(r'<li class="msg [a-z]+" data-id="[0-9a-f]{32}"><p>line (\d+)</p>',
                                                page.text)]
            assert 0 < len(lines) <= 200
            seen = lines + seen
            more = re.search(r'href="(/companions/[0-9a-f]{32}\?before=[0-9a-f]{32})" id="earlier"', page.text)
            url = more.group(1) if more else None
        assert seen == list(range(1000)), "some of the chat cannot be reached from its page"

        model.calls.clear()
        r = await client.post(f"/companions/{cid}/messages", data={"message": "still there?", "csrf": csrf})
        assert r.status_code == 303
        sent = model.calls[0][1]
        turns = settings.chat_context_turns
        assert len(sent) == 1 + 2 * turns + 1  # system, the last N turns, the new message
        assert sent[1]["content"] == f"line {1000 - 2 * turns}"

        other = await client.get(f"/companions/{cid}?before={'f' * 32}")  # not a message of this chat
        assert other.status_code == 404
