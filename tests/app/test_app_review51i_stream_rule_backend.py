"""Review 51i: a backend other than the chain (an object handed to create_app) is held to the streamed envelope
rule on the page's streamed path too, not only on the form's.

Was: model.check_as_streamed ran in the form path (companions.chat_turn, simulation.rehearsal_turn) only. The
streamed path (routes._util.reply_events) took such a backend's result as it came, from complete() when it has no
stream() and from its stream's last event otherwise: a reply with a broken draft before its envelope was saved
when the page's script sent the message and refused (502, nothing saved) when the form did.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import func, select

from hearth.app.storage.models import Message, RehearsalTurn
from hearth.envelope import parse_envelope
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel, envelope_for
from tests.app.conftest import running_app
from tests.app.test_app_review51e_stream_rule import DRAFT, start_rehearsal

pytestmark = pytest.mark.anyio


class DraftingModel(FakeModel):
    """FakeModel whose chat replies carry a broken draft before the envelope (its own stream passes them on)."""

    async def complete(self, messages, *, kind, **kw):
        result = await super().complete(messages, kind=kind, **kw)
        if kind != "chat":
            return result
        text = DRAFT + envelope_for(messages, kind)
        return SimpleNamespace(envelope=parse_envelope(text, kind), text=text, provider="fake")


class DraftingCompleteOnly:
    """The same replies from a backend with complete() alone (reply_events asks it in one piece)."""

    def __init__(self) -> None:
        self._inner = DraftingModel()

    async def complete(self, messages, *, kind, **kw):
        return await self._inner.complete(messages, kind=kind, **kw)


async def _count(app, model) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


@pytest.mark.parametrize("backend", [DraftingModel, DraftingCompleteOnly], ids=["stream", "complete_only"])
async def test_the_streamed_chat_refuses_what_the_form_refuses(make_settings, sqlite_url, backend):
    async with running_app(make_settings(sqlite_url), model=backend()) as (app, client):
        csrf = await signup(client, "hana")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello there", "csrf": csrf})
        assert r.status_code == 502 and "hello there</textarea>" in r.text  # the form path: refused
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "event: done" not in r.text, r.text[-400:]  # before: done, saved
        assert await _count(app, Message) == 0


@pytest.mark.parametrize("backend", [DraftingModel, DraftingCompleteOnly], ids=["stream", "complete_only"])
async def test_the_streamed_rehearsal_refuses_what_the_form_refuses(make_settings, sqlite_url, backend):
    async with running_app(make_settings(sqlite_url), model=backend()) as (app, client):
        csrf = await signup(client, "hana")
        cid = await create_companion(client, csrf)
        rid = await start_rehearsal(client, csrf, cid)
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "about Monday", "csrf": csrf})
        assert r.status_code == 502 and "about Monday</textarea>" in r.text
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "about Friday"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert "event: error" in r.text and "event: done" not in r.text, r.text[-400:]
        assert await _count(app, RehearsalTurn) == 0
