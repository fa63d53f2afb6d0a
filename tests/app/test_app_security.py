"""Security properties over HTTP: user A can neither read nor change user B's data through ANY route
(the routes are enumerated from the app, so a new route is covered or fails this test), and no
user text reaches the SQLite file in plaintext."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hearth.app.storage import models
from tests.app.app_client import create_companion, signup
from tests.app.app_fakes import FakeModel
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

MARKER = "ZEBRAPLAIN7731"
PARAM_RE = re.compile(r"{(\w+)}")
# routes that take no record id and act only on the caller's own account (checked below by their effect)
OWN_ACCOUNT_ROUTES = {("GET", "/signup"), ("POST", "/signup"), ("GET", "/login"), ("POST", "/login"),
                      ("POST", "/logout"), ("GET", "/healthz"), ("GET", "/"), ("POST", "/context"),
                      ("POST", "/companions"), ("GET", "/feed"), ("POST", "/feed/posts"), ("POST", "/agents"),
                      ("GET", "/account"), ("POST", "/account/password"), ("GET", "/account/export"),
                      ("POST", "/account/delete")}


def app_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every endpoint the app serves, read from the app's router."""
    out = []

    def walk(routes):
        for r in routes:
            if hasattr(r, "effective_route_contexts"):  # FastAPI's included router
                for ctx in r.effective_route_contexts():
                    out.extend((m, ctx.path) for m in sorted(ctx.methods or ()))
            elif hasattr(r, "methods") and r.methods:
                out.extend((m, r.path) for m in sorted(r.methods))
            elif hasattr(r, "routes") and r.routes:  # a mounted router
                walk(r.routes)
    walk(app.routes)
    return sorted(set(out))


async def _bob_world(client, csrf: str) -> dict[str, str]:
    """Bob creates one of everything; returns the ids by path-parameter name."""
    cid = await create_companion(client, csrf)
    await client.post(f"/companions/{cid}/messages", data={"message": f"bob {MARKER} chat", "csrf": csrf})
    r = await client.post(f"/companions/{cid}/situations", data={"situation": f"bob {MARKER} situation", "csrf": csrf})
    situation_id = r.headers["location"].split("#s-")[1]
    await client.post("/agents", data={"name": "Dana", "personality": "blunt", "backstory": "lead",
                                       "relationship": "manager", "companion_id": cid, "csrf": csrf})
    page = (await client.get(f"/companions/{cid}/simulate")).text
    agent_id = re.search(r'name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
    rehearsal_id = r.headers["location"].rsplit("/", 1)[1]
    await client.post(f"/rehearsals/{rehearsal_id}/turns", data={"message": f"bob {MARKER} rehearsal", "csrf": csrf})
    r = await client.post("/feed/posts", data={"post": f"bob {MARKER} post", "csrf": csrf})
    post_id = r.headers["location"].split("#p-")[1]
    return {"companion_id": cid, "situation_id": situation_id, "agent_id": agent_id, "rehearsal_id": rehearsal_id,
            "post_id": post_id}


async def _row_counts(app) -> dict[str, int]:
    counts = {}
    async with app.state.hearth.db.sessions() as s:
        for table in models.Base.metadata.sorted_tables:
            if table.name != "sessions":
                counts[table.name] = (await s.execute(select(func.count()).select_from(table))).scalar_one()
    return counts


async def test_no_route_lets_one_user_read_or_change_anothers_data(make_settings, database_url):
    async with running_app(make_settings(database_url)) as (app, bob):
        bob_csrf = await signup(bob, "bob")
        ids = await _bob_world(bob, bob_csrf)
        bob_cookies = dict(bob.cookies)

        bob.cookies.clear()  # same client object, now as alice
        alice = bob
        alice_csrf = await signup(alice, "alice")
        own_cid = await create_companion(alice, alice_csrf)
        before = await _row_counts(app)

        routes = app_routes(app)
        assert len(routes) >= 20
        form = {"csrf": alice_csrf, "message": "x", "situation": "x", "post": "x", "world_view": "playful",
                "persona": "x", "name": "x", "personality": "x", "backstory": "x", "relationship": "x",
                "agent_id": ids["agent_id"], "companion_id": ids["companion_id"], "share_context": "true"}
        checked = []
        for method, path in routes:
            params = PARAM_RE.findall(path)
            if not params:
                continue
            unknown = set(params) - set(ids)
            assert not unknown, f"{method} {path}: new path parameter {unknown}; add it to this test"
            url = PARAM_RE.sub(lambda m: ids[m.group(1)], path)
            # POST twice: as a plain form and as the page's streaming fetch (a separate code path)
            for accept in (("text/html", "text/event-stream") if method == "POST" else ("text/html",)):
                r = await alice.request(method, url, data=form if method == "POST" else None,
                                        headers={"accept": accept})
                assert r.status_code == 404, f"{method} {path} ({accept}) -> {r.status_code}"
                assert MARKER not in r.text
            checked.append((method, path))
        no_param = {(m, p) for m, p in routes if not PARAM_RE.search(p)}
        assert no_param <= OWN_ACCOUNT_ROUTES, f"routes without a test: {no_param - OWN_ACCOUNT_ROUTES}"

        # id-free routes: pages show only alice's data; forms that name bob's records are refused
        for path in ("/", "/feed"):
            assert MARKER not in (await alice.get(path)).text
        r = await alice.post("/agents", data=form)  # names bob's companion
        assert r.status_code == 404
        r = await alice.post(f"/companions/{own_cid}/rehearsals", data=form)  # names bob's agent
        assert r.status_code == 400
        assert await _row_counts(app) == before, "a refused request changed data"
        assert len(checked) >= 14

        # bob still sees all of his data
        alice.cookies.clear()
        alice.cookies.update(bob_cookies)
        page = (await alice.get(f"/companions/{ids['companion_id']}")).text
        assert f"bob {MARKER} chat" in page
        assert f"bob {MARKER} post" in (await alice.get("/feed")).text


class _MarkedToneModel(FakeModel):
    """FakeModel whose feed comments carry the marker in their tone (how the post came across)."""

    async def complete(self, messages, *, kind, **kw):
        result = await super().complete(messages, kind=kind, **kw)
        if kind == "feed_comment":
            result.envelope = result.envelope.model_copy(update={"tone": f"tone {MARKER}"})
        return result


async def test_no_plaintext_user_text_in_the_sqlite_file(make_settings, tmp_path):
    db_file = tmp_path / "plain.sqlite3"
    async with running_app(make_settings(f"sqlite+aiosqlite:///{db_file}"), model=_MarkedToneModel()) as (app, client):
        csrf = await signup(client, "carol")
        await client.post("/context", data={"shared_context": f"context {MARKER}", "csrf": csrf})
        cid = await create_companion(client, csrf, persona=f"persona {MARKER}", name=f"Name{MARKER}")
        await client.post(f"/companions/{cid}/messages", data={"message": f"my name is {MARKER} ok", "csrf": csrf})
        await client.post(f"/companions/{cid}/situations", data={"situation": f"situation {MARKER}", "csrf": csrf})
        await client.post("/agents", data={"name": f"A{MARKER}", "personality": f"p {MARKER}",
                                           "backstory": f"b {MARKER}", "relationship": f"r {MARKER}",
                                           "companion_id": cid, "csrf": csrf})
        page = (await client.get(f"/companions/{cid}/simulate")).text
        agent_id = re.search(r'name="agent_id"><option value="([0-9a-f]{32})"', page).group(1)
        r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
        rehearsal = r.headers["location"]
        await client.post(f"{rehearsal}/turns", data={"message": f"rehearse {MARKER}", "csrf": csrf})
        assert f"rehearse {MARKER}" in (await client.get(rehearsal)).text
        await client.post("/feed/posts", data={"post": f"post {MARKER}", "csrf": csrf})
        assert f"tone {MARKER}" in (await client.get("/feed")).text
        page = (await client.get(f"/companions/{cid}")).text
        # the app did store and show it (memories too: "The user's name is ZEBRA...")
        assert f"my name is {MARKER} ok" in page and f"name is {MARKER}" in page
        files = [p for p in Path(tmp_path).iterdir() if p.name.startswith("plain.sqlite3")]
        raw = b"".join(p.read_bytes() for p in files)  # the main file and the WAL
        assert len(raw) > 10_000
        for encoding in ("utf-8", "utf-16-le", "utf-16-be"):
            assert MARKER.encode(encoding) not in raw, f"plaintext found ({encoding})"
        assert b"carol" in raw  # the grep itself works: the (non-secret) username is there in clear
