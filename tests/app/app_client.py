"""Helpers that drive the app's forms over HTTP the way a browser does (CSRF tokens from the pages), read its
streamed answers, and send one submission twice at once (the resend races of reviews 51e-51h)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import httpx

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_AGENT = re.compile(r'<select name="agent_id"><option value="([0-9a-f]{32})"')
PASSWORD = "correct horse battery"


def csrf_of(html: str) -> str:
    m = _CSRF.search(html)
    assert m, "no CSRF token in the page"
    return m.group(1)


async def signup(client: httpx.AsyncClient, username: str, password: str = PASSWORD) -> str:
    """Sign up (logs the client in); returns the session's CSRF token."""
    page = await client.get("/signup")
    r = await client.post("/signup", data={"username": username, "password": password, "csrf": csrf_of(page.text)})
    assert r.status_code == 303, r.text
    home = await client.get("/")
    assert home.status_code == 200
    return csrf_of(home.text)


async def login(client: httpx.AsyncClient, username: str, password: str = PASSWORD) -> httpx.Response:
    page = await client.get("/login")
    return await client.post("/login", data={"username": username, "password": password, "csrf": csrf_of(page.text)})


async def create_companion(client: httpx.AsyncClient, csrf: str, persona: str = "wren", **extra) -> str:
    r = await client.post("/companions", data={"persona": persona, "world_view": "grounded", "share_context": "true",
                                               "csrf": csrf, **extra})
    assert r.status_code == 303, r.text
    return r.headers["location"].rsplit("/", 1)[-1]


async def start_rehearsal(client: httpx.AsyncClient, csrf: str, cid: str) -> str:
    """Add an agent (Sam, a blunt colleague) beside companion ``cid`` and start a rehearsal with it; returns the
    rehearsal's id."""
    r = await client.post("/agents", data={"name": "Sam", "personality": "blunt", "backstory": "a colleague",
                                           "relationship": "coworker", "companion_id": cid, "csrf": csrf})
    assert r.status_code == 303, r.text
    page = (await client.get(f"/companions/{cid}/simulate")).text
    agent_id = _AGENT.search(page).group(1)
    r = await client.post(f"/companions/{cid}/rehearsals", data={"agent_id": agent_id, "csrf": csrf})
    return r.headers["location"].rsplit("/", 1)[-1]


def sse_events(body: str) -> list[tuple[str, dict]]:
    """A streamed answer's (event, data) pairs, in order."""
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def streams_racing(client: httpx.AsyncClient, url: str, data: dict, csrf: str) -> list[dict]:
    """POST ``data`` to ``url`` twice at once as the page's script does (a streamed answer), with one submission id
    for both; each must end in "done". Returns the two "done" events' data, in the order of the posts. The model
    should hold both until each is past the look-up for a saved submission (a GatedModel)."""
    data = {**data, "submission_id": uuid.uuid4().hex}
    headers = {"accept": "text/event-stream", "x-csrf-token": csrf}
    answers = await asyncio.gather(*(client.post(url, data=data, headers=headers) for _ in range(2)))
    dones = [sse_events(r.text)[-1] for r in answers]
    assert [e for e, _ in dones] == ["done", "done"], [r.text for r in answers]
    return [d for _, d in dones]


async def forms_racing(client: httpx.AsyncClient, url: str, field: str, texts, csrf: str) -> httpx.Response:
    """POST the no-script form twice at once with one submission id, ``field`` set to each of the two ``texts``: one
    is saved (303), the unique index refuses the other (409). Returns the refused answer."""
    sid = uuid.uuid4().hex
    answers = await asyncio.gather(*(client.post(url, data={field: t, "csrf": csrf, "submission_id": sid})
                                     for t in texts))
    assert sorted(r.status_code for r in answers) == [303, 409], [r.text[-400:] for r in answers]
    return next(r for r in answers if r.status_code == 409)
