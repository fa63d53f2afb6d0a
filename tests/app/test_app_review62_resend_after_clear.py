"""A chat turn resent (same submission id) after the chat was cleared was sent to the model and saved again: the clear
had deleted the rows that would have recognised it as a resend, so the cleared message and a new reply came back
into the emptied chat (a second tab, a lost answer sent again, the browser posting the form again after "back").
Now the chat page's form carries the chat's epoch (which each clear moves on), and a turn sent from a page loaded
before a clear is refused as a turn cleared while its reply was written is: nothing asked of the model, nothing
saved (409 on the form, an ``error`` event on the stream). Both backends."""

from __future__ import annotations

import re

import pytest

from hearth.app import companions
from hearth.app.storage.models import Message
from tests.app.app_client import create_companion, signup, sse_events
from tests.app.app_fakes import FakeModel
from tests.app.app_users import signed_up
from tests.app.conftest import count_rows, running_app

pytestmark = pytest.mark.anyio
_HIDDEN = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)">')
TURN = dict(max_chars=4000, turns=20, prompt_memories=30, deadline_s=5.0)


async def _chat_form(client, cid) -> dict:
    """The hidden fields of the chat page's message form, as the page (or its script) posts them."""
    page = (await client.get(f"/companions/{cid}")).text
    form = page[page.index('id="chat-form"'):]
    return dict(_HIDDEN.findall(form[:form.index("</form>")]))


def _chat_calls(model) -> int:
    return len([c for c in model.calls if c[0] == "chat"])


async def test_a_streamed_resend_after_a_clear_is_not_saved_again(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        fields = {**await _chat_form(client, cid), "message": "my name is Robin"}
        headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
        first = sse_events((await client.post(f"/companions/{cid}/messages", headers=headers, data=fields)).text)
        assert first[-1][0] == "done" and await count_rows(app, Message) == 2
        assert (await client.post(f"/companions/{cid}/clear", data={"csrf": csrf})).status_code == 303
        # the page never got that "done" (or another tab cleared the chat) and sends the same text again
        again = sse_events((await client.post(f"/companions/{cid}/messages", headers=headers, data=fields)).text)
        assert [e for e, _ in again] == ["error"], again  # before: deltas and a "done", the turn saved again
        assert "cleared" in again[0][1]["message"]
        assert await count_rows(app, Message) == 0
        assert _chat_calls(model) == 1  # the model was not asked again
        # the page loaded after the clear sends as usual
        fresh = {**await _chat_form(client, cid), "message": "hello again"}
        assert sse_events((await client.post(f"/companions/{cid}/messages", headers=headers,
                                             data=fresh)).text)[-1][0] == "done"
        assert await count_rows(app, Message) == 2


async def test_a_form_posted_again_after_a_clear_is_not_saved_again(make_settings, database_url):
    model = FakeModel()
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        form = {**await _chat_form(client, cid), "message": "hello"}
        assert (await client.post(f"/companions/{cid}/messages", data=form)).status_code == 303
        assert (await client.post(f"/companions/{cid}/clear", data={"csrf": csrf})).status_code == 303
        r = await client.post(f"/companions/{cid}/messages", data=form)  # "back", and the browser posts it again
        assert r.status_code == 409, r.status_code  # before: 303, the cleared message saved again
        assert "cleared" in r.text and "Echo: hello" not in r.text
        assert await count_rows(app, Message) == 0 and _chat_calls(model) == 1
        # the page it answers with carries the chat's new epoch: sending from it works
        again = {**dict(_HIDDEN.findall(r.text[r.text.index('id="chat-form"'):])), "message": "hello"}
        assert again["chat_epoch"] != form["chat_epoch"]
        assert (await client.post(f"/companions/{cid}/messages", data=again)).status_code == 303
        assert await count_rows(app, Message) == 2


async def test_chat_turn_from_before_a_clear_asks_nothing_and_saves_nothing(db, master_key):
    cipher = (await signed_up(db, master_key))[1]
    model = FakeModel()
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        await companions.chat_turn(s, model, cipher, comp.id, "hi", submission_id="a" * 32, chat_epoch=0, **TURN)
        await companions.clear_chat(s, cipher.user_id, comp.id)
        for sid in ("a" * 32, "b" * 32, None):  # the resend, and any other turn sent from the page before the clear
            with pytest.raises(companions.ChatCleared, match="cleared"):
                await companions.chat_turn(s, model, cipher, comp.id, "hi", submission_id=sid, chat_epoch=0, **TURN)
        assert await companions.history(s, cipher, comp.id) == []
        turn = await companions.chat_turn(s, model, cipher, comp.id, "hi", submission_id="a" * 32, chat_epoch=1,
                                          **TURN)
        assert not turn.replayed
    assert _chat_calls(model) == 2
