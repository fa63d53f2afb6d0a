"""The web app over HTTP (in process): accounts, cookies, CSRF, chat (plain and streamed), Simulation
Mode, rehearsal, feed, clearing, and the no-model page."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import func, select

from hearth.app.model import NoModel
from hearth.app.storage.models import Message
from tests.app.app_client import PASSWORD, create_companion, csrf_of, login, signup, sse_events
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


async def _messages(app) -> int:
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(Message))).scalar_one()


async def test_signup_sets_a_safe_cookie_and_pages_need_login(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        assert (await client.get("/")).headers["location"] == "/login"
        page = await client.get("/signup")
        r = await client.post("/signup", data={"username": "alice", "password": PASSWORD, "csrf": csrf_of(page.text)})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"].lower()
        assert "hearth_session=" in cookie and "httponly" in cookie and "samesite=lax" in cookie
        assert "secure" not in cookie.replace("samesite", "")  # development on loopback: plain http allowed
        assert (await client.get("/")).status_code == 200
        csrf = csrf_of((await client.get("/")).text)
        assert (await client.post("/logout", data={"csrf": csrf})).status_code == 303
        assert (await client.get("/")).status_code == 303


async def test_cookie_is_secure_outside_loopback_development(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, environment="production", host="0.0.0.0")
    assert settings.cookie_secure
    async with running_app(settings, base_url="https://testserver") as (app, client):
        page = await client.get("/signup")
        r = await client.post("/signup", data={"username": "alice", "password": PASSWORD, "csrf": csrf_of(page.text)})
        assert "; secure" in r.headers["set-cookie"].lower()


async def test_forms_without_the_csrf_token_are_refused(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        await client.get("/signup")
        r = await client.post("/signup", data={"username": "mallory", "password": PASSWORD})
        assert r.status_code == 403
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hi", "csrf": "forged"})
        assert r.status_code == 403
        r = await client.post(f"/companions/{cid}/clear", data={})
        assert r.status_code == 403
        assert await _messages(app) == 0


async def test_login_backs_off_after_the_free_attempts(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, login_free_attempts=3, login_backoff_base_s=60, login_backoff_max_s=600,
                             login_window_s=600)
    async with running_app(settings) as (app, client):
        await signup(client, "alice")
        client.cookies.clear()
        for _ in range(3):
            assert (await login(client, "alice", "not the password")).status_code == 401
        r = await login(client, "alice", PASSWORD)  # from the guessing client, even the right password waits
        assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= 61
        assert "hearth_session" not in r.headers.get("set-cookie", "")


async def test_oversized_bodies_get_413(make_settings, sqlite_url):
    # (the smallest body limit the settings accept: the longest text field's, 8000 characters at 12 bytes each)
    async with running_app(make_settings(sqlite_url, max_body_bytes=100_000)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        big = "x" * 200_000
        r = await client.post(f"/companions/{cid}/messages", data={"message": big, "csrf": csrf})
        assert r.status_code == 413

        async def chunked():  # no Content-Length: the limit must hold on the bytes received
            yield f"csrf={csrf}&message=".encode()
            for _ in range(200):
                yield b"y" * 1000

        r = await client.post(f"/companions/{cid}/messages", content=chunked(),
                              headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413
        # under the body limit but over the text limit: a clear 400 naming the field, nothing stored
        r = await client.post(f"/companions/{cid}/messages", data={"message": "z" * 4001, "csrf": csrf})
        assert r.status_code == 400 and "message" in r.text
        assert await _messages(app) == 0


async def test_chat_plain_and_streamed(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "my name is Robin", "csrf": csrf})
        assert r.status_code == 303
        page = (await client.get(f"/companions/{cid}")).text
        assert "Echo: my name is Robin" in page and "The user&#39;s name is Robin" in page

        r = await client.post(f"/companions/{cid}/messages", data={"message": 'quote " and \\ and ünïcode'},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        events = sse_events(r.text)
        assert r.headers["content-type"].startswith("text/event-stream")
        deltas = "".join(d["text"] for e, d in events if e == "delta")
        assert deltas == 'Echo: quote " and \\ and ünïcode'  # the preview decodes escapes across deltas
        assert events[-1][0] == "done" and events[-1][1]["message"] == deltas
        assert events[-1][1]["stage"] == "stranger"
        assert await _messages(app) == 4


async def test_failed_model_call_shows_an_error_and_stores_nothing(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=FakeModel(fail={"chat"})) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello", "csrf": csrf},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        assert sse_events(r.text)[-1][0] == "error"
        assert await _messages(app) == 0


async def test_no_model_configured_explains_the_setup(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=NoModel()) as (app, client):
        csrf = await signup(client, "alice")
        home = await client.get("/")
        assert "No model endpoint yet" in home.text and "[[providers]]" in home.text and "base_url" in home.text
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "hello", "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 503 and "No model is configured" in r.text
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "x", "csrf": csrf})
        assert r.status_code == 503
        assert await _messages(app) == 0


async def test_simulation_rehearsal_feed_and_clear_over_http(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url), model=FakeModel(fail={"cynic"})) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/situations", data={"situation": "My friend cancelled again"},
                              headers={"accept": "text/event-stream", "x-csrf-token": csrf})
        events = sse_events(r.text)
        readings = [d for e, d in events if e == "reading"]
        assert sorted(d["analyst"] for d in readings) == sorted(
            ["optimist", "cynic", "mentor", "status_observer", "gossiper"])
        assert [d["analyst"] for d in readings if not d["ok"]] == ["cynic"]
        assert events[-1] == ("done", {"situation_id": events[-1][1]["situation_id"], "failed": 1})
        sim = (await client.get(f"/companions/{cid}/simulate")).text
        assert "My friend cancelled again" in sim and "did not answer" in sim

        r = await client.post("/agents", data={"name": "Dana", "personality": "blunt", "backstory": "team lead",
                                               "relationship": "manager", "companion_id": cid, "csrf": csrf})
        assert r.status_code == 303
        agent_id = re.search(r'name="agent_id"><option value="([0-9a-f]{32})"',
                                                    (await client.get(f"/companions/{cid}/simulate")).text).group(1)
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
        rid = r.headers["location"].rsplit("/", 1)[-1]
        r = await client.post(f"/rehearsals/{rid}/turns", data={"message": "Can we talk about my role?", "csrf": csrf})
        assert r.status_code == 303
        # switch to the companion mid-rehearsal, chat, and come back: both threads are where they were
        await client.post(f"/companions/{cid}/messages", data={"message": "wish me luck", "csrf": csrf})
        page = (await client.get(f"/companions/{cid}")).text
        assert f"/rehearsals/{rid}" in page and "Echo: wish me luck" in page
        assert "Can we talk about my role?" not in page
        reh = (await client.get(f"/rehearsals/{rid}")).text
        assert "Echo: Can we talk about my role?" in reh and "Panel (4/5)" in reh

        r = await client.post("/feed/posts", data={"post": "Finished the quilt", "csrf": csrf})
        assert r.status_code == 303
        feed = (await client.get("/feed")).text
        assert "Finished the quilt" in feed and "Proud of you for: Finished the quilt" in feed

        assert (await client.post(f"/companions/{cid}/clear", data={"csrf": csrf})).status_code == 303
        assert "Echo: wish me luck" not in (await client.get(f"/companions/{cid}")).text
        assert await _messages(app) == 0


async def test_security_headers_and_phone_viewport(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        r = await client.get("/login")
        assert r.headers["x-frame-options"] == "DENY" and "default-src 'self'" in r.headers["content-security-policy"]
        assert 'name="viewport" content="width=device-width' in r.text


async def test_world_view_switch_reaches_the_prompt(make_settings, sqlite_url):
    model = FakeModel()
    async with running_app(make_settings(sqlite_url), model=model) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/settings", data={"world_view": "stoic", "csrf": csrf})
        assert r.status_code == 303
        await client.post(f"/companions/{cid}/messages", data={"message": "hi", "csrf": csrf})
        from hearth import prompts

        system = model.calls[-1][1][0]["content"]
        assert prompts.WORLD_VIEWS["stoic"] in system and prompts.WORLD_VIEWS["grounded"] not in system
        r = await client.post(f"/companions/{cid}/settings", data={"world_view": "nihilist", "csrf": csrf},
                              headers={"accept": "text/html"})
        assert r.status_code == 400 and "world_view" in r.text


async def test_start_up_rotates_data_keys_from_the_previous_master_key(make_settings, sqlite_url, master_key_text):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        cid = await create_companion(client, csrf)
        await client.post(f"/companions/{cid}/messages", data={"message": "before rotation", "csrf": csrf})
    from hearth.app.crypto import new_master_key_text
    from hearth.app.settings import load_settings

    new_key = new_master_key_text()
    rotated = load_settings(None, env={"HEARTH_MASTER_KEY": new_key, "HEARTH_PREVIOUS_MASTER_KEY": master_key_text},
                            overrides={"database_url": sqlite_url})
    async with running_app(rotated) as (app, client):
        assert (await login(client, "alice")).status_code == 303
        assert "Echo: before rotation" in (await client.get(f"/companions/{cid}")).text
    # the rotation persisted: the new key alone now opens the account's data
    plain_new = load_settings(None, env={"HEARTH_MASTER_KEY": new_key}, overrides={"database_url": sqlite_url})
    async with running_app(plain_new) as (app, client):
        assert (await login(client, "alice")).status_code == 303
        assert "Echo: before rotation" in (await client.get(f"/companions/{cid}")).text


def test_serve_refuses_a_bad_provider_config_naming_the_field(tmp_path, capsys, monkeypatch):
    from hearth.app.main import serve

    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[providers]]\nname = "x"\nbase_url = "ftp://nope"\nmodel = "m"\n')
    monkeypatch.setenv("HEARTH_MASTER_KEY", "")
    monkeypatch.chdir(tmp_path)
    assert serve(config=cfg, port=0) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "base_url" in err
