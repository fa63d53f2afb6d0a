"""Helpers that drive the app's forms over HTTP the way a browser does (CSRF tokens from the pages)."""

from __future__ import annotations

import re

import httpx

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
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
