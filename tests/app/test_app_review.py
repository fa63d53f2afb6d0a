"""Defects found by a correctness review of the app's write and error paths (one test per defect; each
failed before its fix)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def _count(app, model) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


class _ChatFails(FakeModel):
    async def complete(self, messages, *, kind, **kw):
        if kind == "chat":
            from hearth.gateway.errors import AllProvidersFailed, Timeout
            raise AllProvidersFailed("all failed", [Timeout("fake", "total", 30.0)])
        return await super().complete(messages, kind=kind, **kw)


async def test_without_javascript_a_failed_chat_reply_keeps_the_message_in_the_box(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=_ChatFails()) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "It was a hard day at work", "csrf": csrf},
                              headers={"accept": "text/html"})
        # before: a bare 502 error page; the message the user typed was gone
        assert r.status_code == 502
        assert 'id="chat-form"' in r.text and ">It was a hard day at work</textarea>" in r.text
        assert "The model took too long to answer." in r.text and "Nothing was saved" in r.text
        assert "AllProvidersFailed" not in r.text
        assert await _count(app, Message) == 0
