"""Review 52e: a damaged row (its sealed bytes no longer open) in the lists other than the feed.

Was: one message, memory, situation, reading, agent, rehearsal turn, companion name or persona, or the shared context
whose sealed text does not open made the page that lists it a 500 (the chat, Simulation Mode, a rehearsal, the home
page), the account export too, and a chat (or rehearsal) turn could not even start: the context read before the
model call raised. Now every page shows the other rows and the damaged one as "could not be read", the export gives
it as null, a turn leaves the unreadable texts out of what the model is told (never a placeholder in their place),
a turn that cannot do without one (the companion's persona, the rehearsed person) is refused with a clear answer
and nothing saved, one warning per read names the user id and the count, and no stored row is rewritten.
"""

from __future__ import annotations

import html
import json
import logging
import re
import sqlite3

import pytest
from sqlalchemy import select

from hearth.app.storage.models import Agent, Companion, Memory, Message, Reading, RehearsalTurn, Situation, User
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
HTML = {"accept": "text/html"}
UNREADABLE = "could not be read"


def _damaged(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 1])  # the GCM tag no longer matches


def _sealed(sqlite_url: str) -> dict[str, list]:
    """Every sealed column of every table, as stored: what a read must leave exactly as it was."""
    columns = {"messages": "body_ct, meta_ct", "memories": "text_ct", "situations": "text_ct", "readings": "body_ct",
               "agents": "name_ct, personality_ct, backstory_ct, relationship_ct", "rehearsal_turns": "body_ct",
               "companions": "name_ct, persona_ct", "users": "shared_context_ct, wrapped_key"}
    con = sqlite3.connect(sqlite_url.split("///", 1)[1])
    try:
        return {t: sorted(con.execute(f"select id, {c} from {t}")) for t, c in columns.items()}
    finally:
        con.close()


async def _damage(db, model, where, column: str) -> str:
    """Flip the last byte of ``column`` of the first ``model`` row matching ``where`` (oldest first); its id."""
    async with db.sessions() as s, s.begin():
        row = (await s.execute(select(model).where(*where).order_by(model.created_at).limit(1))).scalar_one()
        setattr(row, column, _damaged(getattr(row, column)))
        return row.id


def _warnings(caplog, user_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if user_id in r.getMessage() and "not open" in r.getMessage()]


def _unread(caplog, user_id: str, outcome: str = "") -> int:
    """How many unreadable texts the warnings (those saying ``outcome``) counted."""
    return sum(int(re.search(r"(\d+) sealed texts?", m).group(1)) for m in _warnings(caplog, user_id) if outcome in m)


async def _user_id(db, name: str) -> str:
    async with db.sessions() as s, s.begin():
        return (await s.execute(select(User.id).where(User.username == name))).scalar_one()


def _prompt_text(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages)


async def test_one_unreadable_message_or_memory_does_not_take_the_chat_down(make_settings, sqlite_url, caplog):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf, "wren")
        for text in ("My name is Ann", "tell me about rivers", "My name is Annie", "and about hills"):
            r = await client.post(f"/companions/{cid}/messages", data={"message": text, "csrf": csrf})
            assert r.status_code == 303, r.text
        db = app.state.hearth.db
        uid = await _user_id(db, "ann")
        mine = (Message.companion_id == cid, Message.role == "user")
        async with db.sessions() as s, s.begin():
            said = (await s.execute(select(Message).where(*mine).order_by(Message.created_at))).scalars().all()
            said[1].body_ct = _damaged(said[1].body_ct)  # "tell me about rivers"
            reply = (await s.execute(select(Message).where(Message.companion_id == cid, Message.role == "companion")
                                     .order_by(Message.created_at))).scalars().first()
            reply.meta_ct = _damaged(reply.meta_ct)  # the first reply's mood and suggestions
        await _damage(db, Memory, (Memory.companion_id == cid,), "text_ct")  # "The user's name is Ann"
        stored = _sealed(sqlite_url)
        caplog.set_level(logging.WARNING, logger="hearth.app")

        page = await client.get(f"/companions/{cid}", headers=HTML)  # before: DecryptError out of the app (a 500)
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        assert "<p>My name is Ann</p>" in text and "<p>and about hills</p>" in text
        assert "<p>tell me about rivers</p>" not in text and "<p>Echo: tell me about rivers</p>" in text  # its reply is readable
        assert text.count("This message could not be read") == 1
        assert len(re.findall(r'<li class="msg ', page.text)) == 8  # nothing dropped
        memories = re.search(r'<ul class="list" id="memories">(.*?)</ul>', text, re.S).group(1)
        assert "The user's name is Annie" in memories and memories.count(UNREADABLE) == 1
        assert "The user's name is Ann<" not in memories and memories.count("<li") == 2
        assert ">None<" not in page.text
        assert _unread(caplog, uid, "shown as unreadable") == 3, caplog.text

        r = await client.get("/account/export")  # before: DecryptError as well
        assert r.status_code == 200
        chat = json.loads(r.text)["companions"][0]
        assert [m["text"] for m in chat["messages"] if m["role"] == "user"] == [
            "My name is Ann", None, "My name is Annie", "and about hills"]
        assert chat["messages"][1]["mood"] is None and chat["messages"][3]["mood"] == "warm"
        assert chat["memories"] == [None, "The user's name is Annie"]

        # a new turn: the unreadable message and memory are left out of what the model is told, not replaced
        caplog.clear()
        model.calls.clear()
        r = await client.post(f"/companions/{cid}/messages", data={"message": "what do you know?", "csrf": csrf})
        assert r.status_code == 303, r.text  # before: DecryptError while reading the context
        (kind, sent), = model.calls
        prompt = _prompt_text(sent)
        assert kind == "chat" and "My name is Ann" in prompt and "The user's name is Annie" in prompt
        assert "tell me about rivers" not in prompt.replace("Echo: tell me about rivers", "")
        assert sent[0]["content"].count("The user's name is Ann") == 1  # only "...Annie"
        assert UNREADABLE not in prompt and "None" not in prompt
        assert len(sent) == 1 + 7 + 1  # system, the 7 readable earlier messages, the new one
        assert _unread(caplog, uid, "left out of what the model is told") >= 2, caplog.text
        assert all(rec.exc_info is None for rec in caplog.records)
        after = _sealed(sqlite_url)
        for table, rows in stored.items():  # the damaged rows (and every other) stay exactly as they were
            assert set(rows) <= set(after[table]), table


async def test_a_companion_whose_name_persona_or_shared_context_does_not_open(make_settings, sqlite_url, caplog):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "ann")
        r = await client.post("/context", data={"shared_context": "I moved to Oslo last spring", "csrf": csrf})
        assert r.status_code == 303
        hurt = await create_companion(client, csrf, "wren")
        other = await create_companion(client, csrf, "juno")
        db = app.state.hearth.db
        uid = await _user_id(db, "ann")
        await _damage(db, Companion, (Companion.id == hurt,), "name_ct")
        await _damage(db, Companion, (Companion.id == hurt,), "persona_ct")
        stored = _sealed(sqlite_url)
        caplog.set_level(logging.WARNING, logger="hearth.app")

        home = await client.get("/", headers=HTML)  # before: DecryptError (a 500)
        assert home.status_code == 200, home.text
        assert f'href="/companions/{hurt}">(name could not be read)</a>' in home.text
        assert f'href="/companions/{other}">Juno</a>' in home.text and "I moved to Oslo last spring" in home.text
        page = await client.get(f"/companions/{hurt}", headers=HTML)
        assert page.status_code == 200, page.text
        assert "(name could not be read)" in page.text and ">None<" not in page.text and "None" not in page.text

        # a turn cannot be played without the persona: refused with the message kept, nothing saved
        r = await client.post(f"/companions/{hurt}/messages", data={"message": "hello there", "csrf": csrf},
                              headers=HTML)
        assert r.status_code == 503, r.text
        assert "persona could not be read" in r.text and ">hello there</textarea>" in r.text
        r = await client.post(f"/companions/{hurt}/messages", data={"message": "hello there", "csrf": csrf},
                              headers={"accept": "text/event-stream"})
        assert "event: error" in r.text and "persona could not be read" in r.text
        assert model.calls == []
        assert _sealed(sqlite_url) == stored

        # the shared context does not open either: the home page says so, the model is not told it
        async with db.sessions() as s, s.begin():
            user = await s.get(User, uid)
            user.shared_context_ct = _damaged(user.shared_context_ct)
        stored = _sealed(sqlite_url)
        caplog.clear()
        home = await client.get("/", headers=HTML)
        assert home.status_code == 200 and "What you shared could not be read" in home.text
        r = await client.post("/feed/posts", data={"post": "a long walk", "csrf": csrf})
        assert r.status_code == 303, r.text  # only the readable companion comments
        r = await client.post(f"/companions/{other}/messages", data={"message": "hi", "csrf": csrf})
        assert r.status_code == 303, r.text
        assert [kind for kind, _ in model.calls] == ["feed_comment", "chat"]
        for _, sent in model.calls:
            assert "Oslo" not in _prompt_text(sent) and UNREADABLE not in _prompt_text(sent)
        assert _warnings(caplog, uid), caplog.text
        r = await client.get("/account/export")
        assert r.status_code == 200
        exported = json.loads(r.text)
        assert exported["shared_context"] is None
        assert [(c["name"], c["persona"]) for c in exported["companions"]] == [(None, None), ("Juno", "juno")]
        after = _sealed(sqlite_url)
        for table, rows in stored.items():
            assert set(rows) <= set(after[table]), table


async def test_unreadable_situations_readings_agents_and_rehearsal_turns(make_settings, sqlite_url, caplog):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf, "wren")
        r = await client.post(f"/companions/{cid}/messages", data={"message": "My name is Ann", "csrf": csrf})
        assert r.status_code == 303
        for text in ("my boss shouted", "my sister called"):
            r = await client.post(f"/companions/{cid}/situations", data={"situation": text, "csrf": csrf})
            assert r.status_code == 303, r.text
        for name in ("Sam", "Kit"):
            r = await client.post("/agents", data={"name": name, "personality": "blunt", "backstory": "old friend",
                                                   "relationship": "friend", "companion_id": cid, "csrf": csrf})
            assert r.status_code == 303, r.text
        db = app.state.hearth.db
        uid = await _user_id(db, "ann")
        async with db.sessions() as s, s.begin():
            sam, kit = (await s.execute(select(Agent.id).order_by(Agent.created_at))).scalars().all()
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": sam, "csrf": csrf})
        rid = r.headers["location"].rsplit("/", 1)[-1]
        for text in ("we need to talk", "about the car"):
            r = await client.post(f"/rehearsals/{rid}/turns", data={"message": text, "csrf": csrf})
            assert r.status_code == 303, r.text
        await _damage(db, Situation, (Situation.companion_id == cid,), "text_ct")  # "my boss shouted"
        await _damage(db, Reading, (Reading.situation_id.isnot(None),), "body_ct")  # one reading of a situation
        await _damage(db, Reading, (Reading.turn_id.isnot(None),), "body_ct")  # one reading of a rehearsal turn
        await _damage(db, RehearsalTurn, (RehearsalTurn.role == "user",), "body_ct")  # "we need to talk"
        await _damage(db, Agent, (Agent.id == kit,), "name_ct")
        stored = _sealed(sqlite_url)
        caplog.set_level(logging.WARNING, logger="hearth.app")

        page = await client.get(f"/companions/{cid}/simulate", headers=HTML)  # before: DecryptError (a 500)
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        assert '<p class="quote">my sister called</p>' in text and '<p class="quote">my boss shouted' not in text
        assert text.count("This situation could not be read") == 1
        assert text.count("This reading could not be read") == 1
        assert len(re.findall(r'<li class="reading (?:ok|failed)', page.text)) == 10  # nothing dropped
        assert 'name="situation" value="None"' not in page.text and ">None<" not in page.text
        assert "(name could not be read)" in text and "Sam" in text
        assert _unread(caplog, uid, "shown as unreadable") == 3, caplog.text

        page = await client.get(f"/rehearsals/{rid}", headers=HTML)  # before: DecryptError (a 500)
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        assert "<p>about the car</p>" in text and "<p>we need to talk</p>" not in text
        assert text.count("This turn could not be read") == 1 and text.count("This reading could not be read") == 1

        r = await client.get("/account/export")  # before: DecryptError as well
        assert r.status_code == 200
        exported = json.loads(r.text)
        comp = exported["companions"][0]
        assert [s["text"] for s in comp["situations"]] == ["my sister called", None]
        assert [a["name"] for a in exported["agents"]] == ["Sam", None]
        assert [t["text"] for t in comp["rehearsals"][0]["turns"]][::2] == [None, "about the car"]

        # a rehearsal turn leaves the unreadable turn out of what the agent and the panel are told
        model.calls.clear()
        caplog.clear()
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "and the keys", "csrf": csrf})
        assert r.status_code == 303, r.text  # before: DecryptError while reading the rehearsal
        assert len(model.calls) == 6  # the agent, then the five analysts
        for _, sent in model.calls:
            prompt = _prompt_text(sent)
            assert "we need to talk" not in prompt.replace("Echo: we need to talk", "")
            assert UNREADABLE not in prompt and "None" not in prompt
        assert "about the car" in _prompt_text(model.calls[0][1])
        assert _unread(caplog, uid, "left out of what the model is told") >= 1, caplog.text
        # a rehearsal with the unreadable person cannot be played: refused, nothing saved
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": kit, "csrf": csrf})
        kid = r.headers["location"].rsplit("/", 1)[-1]
        assert (await client.get(f"/rehearsals/{kid}", headers=HTML)).status_code == 200
        model.calls.clear()
        r = await client.post(f"/rehearsals/{kid}/turns", data={"message": "hi Kit", "csrf": csrf}, headers=HTML)
        assert r.status_code == 503 and "could not be read" in r.text and ">hi Kit</textarea>" in r.text
        assert model.calls == []
        after = _sealed(sqlite_url)
        for table, rows in stored.items():
            assert set(rows) <= set(after[table]), table
