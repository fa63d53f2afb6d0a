"""Defects found by review 49 of the app (one test per defect; each failed before its fix):

* a streamed turn (chat, rehearsal, panel) was cancelled with the page: a closed tab or a switch to the
  companion in mid-rehearsal lost the exchange the user had already seen, where a plain form POST finishes it;
* the current-password check of the account page (password change, deletion) was not throttled;
* the default body limit refused context the form allows (long non-ASCII text: a bare 413, the text lost),
  and a body limit too small for the app's own text fields was accepted at start-up;
* a non-text path in the settings (var_dir = 5) was a TypeError traceback, not an error naming the field.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlencode

import pytest
from sqlalchemy import func, select

from hearth.app.storage import create_database
from hearth.app.storage.models import Message, Reading, RehearsalTurn, Situation, User
from tests.app.app_client import PASSWORD, create_companion, login, signup
from tests.app.app_fakes import FakeModel, analyst_of
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def _count(url: str, model, app=None) -> int:
    if app is not None:
        async with app.state.hearth.db.sessions() as s:
            return (await s.execute(select(func.count()).select_from(model))).scalar_one()
    db = create_database(url)
    try:
        async with db.sessions() as s:
            return (await s.execute(select(func.count()).select_from(model))).scalar_one()
    finally:
        await db.dispose()


# ------------------------------------------------------------------------------ streamed turns and the page leaving
class _HeldModel(FakeModel):
    """FakeModel that holds part of a turn until ``release``: a chat stream after half of its pieces
    (``hold_chat``), and every analyst but the optimist (``hold_analysts``)."""

    def __init__(self, *, hold_chat: bool, hold_analysts: bool):
        super().__init__()
        self.release = asyncio.Event()
        self.hold_chat, self.hold_analysts = hold_chat, hold_analysts

    async def complete(self, messages, *, kind, **kw):
        if kind == "analyst" and self.hold_analysts and analyst_of(messages) != "optimist":
            await self.release.wait()
        return await super().complete(messages, kind=kind, **kw)

    async def stream(self, messages, *, kind, **kw):
        events = [ev async for ev in super().stream(messages, kind=kind, **kw)]
        for i, ev in enumerate(events):
            if self.hold_chat and i == len(events) // 2:
                await self.release.wait()
            yield ev


async def _post_then_leave(app, client, path: str, form: dict, csrf: str, leave_on: bytes) -> bytes:
    """POST as the page's streaming fetch does, over a connection that closes (the tab closed, the user
    followed a link) as soon as the response carries ``leave_on``. Returns what was received."""
    body = urlencode(form).encode()
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},  # uvicorn's HTTP spec version
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/x-www-form-urlencoded"),
                         (b"content-length", str(len(body)).encode()), (b"accept", b"text/event-stream"),
                         (b"x-csrf-token", csrf.encode()), (b"cookie", cookie.encode())]}
    gone, got, sent = asyncio.Event(), bytearray(), [False]

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            got.extend(message.get("body", b""))
            if leave_on in got:
                gone.set()

    await asyncio.wait_for(app(scope, receive, send), 10)
    assert gone.is_set(), got.decode()
    return bytes(got)


async def _agent_and_rehearsal(client, csrf: str, cid: str) -> str:
    await client.post("/agents", data={"name": "Dana", "personality": "blunt", "backstory": "my manager",
                                       "relationship": "manager", "companion_id": cid, "csrf": csrf})
    page = (await client.get(f"/companions/{cid}/simulate")).text
    agent_id = re.search(r'name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
    return r.headers["location"].rsplit("/", 1)[1]


async def test_a_chat_reply_the_page_left_during_is_still_saved(make_settings, database_url):
    model = _HeldModel(hold_chat=True, hold_analysts=False)
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        got = await _post_then_leave(app, client, f"/companions/{cid}/messages",
                                     {"message": "I finally told my sister about the move"}, csrf, b"event: delta")
        assert b"event: delta" in got and b"event: done" not in got  # the user saw the reply begin, then left
        model.release.set()
    # the app's shutdown waits for the turn; before: it was cancelled with the response and nothing was saved
    assert await _count(database_url, Message) == 2


async def test_switching_to_the_companion_mid_rehearsal_keeps_the_exchange(make_settings, database_url):
    model = _HeldModel(hold_chat=False, hold_analysts=True)
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        rid = await _agent_and_rehearsal(client, csrf, cid)
        # the agent's reply arrived; while the panel reads it, the user taps "Talk to <companion>"
        got = await _post_then_leave(app, client, f"/rehearsals/{rid}/turns", {"message": "I need Fridays off"},
                                     csrf, b"event: reply")
        assert b"Echo: I need Fridays off" in got
        model.release.set()
    assert await _count(database_url, RehearsalTurn) == 2  # before: 0, the rehearsal had to start that exchange over
    assert await _count(database_url, Reading) == 5


async def test_a_panel_the_page_left_during_is_still_saved(make_settings, database_url):
    model = _HeldModel(hold_chat=False, hold_analysts=True)
    async with running_app(make_settings(database_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        got = await _post_then_leave(app, client, f"/companions/{cid}/situations",
                                     {"situation": "My landlord wants to raise the rent"}, csrf, b"event: reading")
        assert b"optimist reads" in got
        model.release.set()
    assert await _count(database_url, Situation) == 1 and await _count(database_url, Reading) == 5


# ------------------------------------------------------------------------------ the current-password check
@pytest.mark.parametrize("action", ["password", "delete"])
async def test_guessing_the_current_password_on_the_account_page_is_throttled(make_settings, sqlite_url, action):
    # a minute's wait after the free attempts: the test cannot outrun it on a slow machine
    async with running_app(make_settings(sqlite_url, login_backoff_base_s=60)) as (app, client):
        csrf = await signup(client, "alice")
        free = app.state.hearth.settings.login_free_attempts

        async def attempt(password: str):
            if action == "password":
                return await client.post("/account/password", data={
                    "csrf": csrf, "current_password": password, "new_password": "a brand new passphrase"})
            return await client.post("/account/delete", data={"csrf": csrf, "password": password})

        for i in range(free):
            r = await attempt(f"guess number {i}")
            assert r.status_code == 400, r.text
        # before: every guess was checked (an argon2 hash each), as fast as the session-holder could send them
        r = await attempt("guess number 99")
        assert r.status_code == 429 and "Retry-After" in r.headers and "try again in" in r.text
        r = await attempt(PASSWORD)  # even the right one waits: nothing tells a guesser which one it was
        assert r.status_code == 429
        assert await _count(sqlite_url, User, app) == 1
        # logging in elsewhere is not held up by it (the login limits are the login's own)
        client.cookies.clear()
        assert (await login(client, "alice")).status_code == 303


async def test_the_right_password_on_the_account_page_clears_the_count(make_settings, sqlite_url):
    # a minute's wait after the free attempts: the test cannot outrun it on a slow machine
    async with running_app(make_settings(sqlite_url, login_backoff_base_s=60)) as (app, client):
        csrf = await signup(client, "alice")
        free = app.state.hearth.settings.login_free_attempts
        for i in range(free - 1):
            assert (await client.post("/account/delete", data={"csrf": csrf, "password": f"typo {i} xx"})).status_code == 400
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": "a brand new passphrase"})
        assert r.status_code == 303
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/account")).text).group(1)
        for i in range(free - 1):  # a fresh count: the owner's typos before do not add up
            r = await client.post("/account/delete", data={"csrf": csrf, "password": f"typo {i} yy"})
            assert r.status_code == 400


# ------------------------------------------------------------------------------ body limit against the text fields
async def test_the_longest_context_the_form_allows_is_accepted_in_any_script(make_settings, sqlite_url):
    from hearth.app.companions import MAX_CONTEXT

    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "mei")
        context = "我在上海做护士，每周值三个夜班。" * (MAX_CONTEXT // 16)
        assert len(context) == MAX_CONTEXT  # the textarea's maxlength; 9 bytes a character once form-encoded
        r = await client.post("/context", data={"shared_context": context, "csrf": csrf})
        assert r.status_code == 303, r.text[:200]  # before: 413 "request body over the 65536-byte limit"
        assert context in (await client.get("/")).text


def test_a_body_limit_too_small_for_the_text_fields_is_refused_at_start_up(tmp_path):
    from hearth.app.crypto import new_master_key_text
    from hearth.app.settings import SettingsError, load_settings

    env = {"HEARTH_MASTER_KEY": new_master_key_text()}
    with pytest.raises(SettingsError) as info:  # before: accepted; every long non-ASCII text then got a 413
        load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "v"), "max_body_bytes": 64 * 1024})
    assert info.value.field == "max_body_bytes" and "shared_context" in str(info.value)
    with pytest.raises(SettingsError) as info:  # a longer message limit needs a larger body too
        load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "v"), "max_text_chars": 20000})
    assert info.value.field == "max_body_bytes" and "max_text_chars" in str(info.value)
    load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "v")})  # the defaults fit


# ------------------------------------------------------------------------------ settings of the wrong type
@pytest.mark.parametrize("field", ["var_dir", "master_key_file"])
def test_a_path_setting_that_is_not_text_names_the_field(tmp_path, field):
    from hearth.app.crypto import new_master_key_text
    from hearth.app.settings import SettingsError, load_settings

    cfg = tmp_path / "hearth.toml"
    cfg.write_text(f"[app]\n{field} = 5\n")
    env = {} if field == "master_key_file" else {"HEARTH_MASTER_KEY": new_master_key_text()}
    with pytest.raises(SettingsError) as info:  # before: TypeError, a traceback from `hearth serve`
        load_settings(cfg, env=env)
    assert info.value.field == field and "path" in str(info.value)
