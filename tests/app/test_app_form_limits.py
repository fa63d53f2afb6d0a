"""The forms' text boxes take their maxlength from the server, never from a number of their own.

A companion's name, persona and the shared context, and the rehearsed person's fields, come from
hearth.app.textlimits (what companions.py and simulation.create_agent enforce); the boxes for a message, a post, a
situation and a rehearsal line from the loaded settings' max_text_chars (what the routes enforce). A deployment that
changes max_text_chars gets boxes that match it; no template writes a limit as a literal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hearth.app import main
from hearth.app.settings import AppSettings
from hearth.app.textlimits import AGENT_FIELD_LIMITS, MAX_CONTEXT, MAX_NAME, MAX_PERSONA
from tests.app.app_client import create_companion, signup, start_rehearsal
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

_FIELD = re.compile(r"<(?:input|textarea)\b[^>]*>")
_NAME = re.compile(r'\bname="([^"]+)"')
_MAXLENGTH = re.compile(r'\bmaxlength="([^"]*)"')


def _maxlengths(html: str) -> dict[str, int]:
    """{field name: maxlength} of every input and text box on the page that has a maxlength."""
    out = {}
    for tag in _FIELD.findall(html):
        limit = _MAXLENGTH.search(tag)
        if limit:
            name = _NAME.search(tag).group(1)
            assert name not in out, f"two boxes named {name}"
            out[name] = int(limit.group(1))  # an empty maxlength (a missing template value) fails here
    return out


async def _pages(client) -> dict[str, dict[str, int]]:
    csrf = await signup(client, "ann")
    # a companion with a persona of the user's own: its page has the persona box
    cid = await create_companion(client, csrf, name="Juniper", custom_persona="A patient, curious friend.")
    rid = await start_rehearsal(client, csrf, cid)
    pages = {"/": "/", "companion": f"/companions/{cid}", "feed": "/feed",
             "simulate": f"/companions/{cid}/simulate", "rehearsal": f"/rehearsals/{rid}"}
    out = {}
    for key, url in pages.items():
        r = await client.get(url)
        assert r.status_code == 200, (url, r.status_code)
        out[key] = _maxlengths(r.text)
    return out


def _expected(max_text_chars: int, name: int = MAX_NAME, persona: int = MAX_PERSONA, context: int = MAX_CONTEXT,
              agent: dict[str, int] = AGENT_FIELD_LIMITS) -> dict[str, dict[str, int]]:
    return {"/": {"name": name, "custom_persona": persona, "shared_context": context},
            "companion": {"message": max_text_chars, "persona": persona},
            "feed": {"post": max_text_chars},
            "simulate": {"situation": max_text_chars, **agent},
            "rehearsal": {"message": max_text_chars}}


async def test_the_boxes_take_the_server_limits(make_settings, sqlite_url):
    settings = make_settings(sqlite_url)
    assert settings.max_text_chars == AppSettings.model_fields["max_text_chars"].default
    async with running_app(settings) as (_, client):
        assert await _pages(client) == _expected(settings.max_text_chars)


async def test_the_message_boxes_follow_a_changed_max_text_chars(make_settings, sqlite_url):
    default = AppSettings.model_fields["max_text_chars"].default
    chars = default // 3 + 7  # neither the default nor any of textlimits' numbers
    assert chars not in (default, MAX_NAME, MAX_PERSONA, MAX_CONTEXT, *AGENT_FIELD_LIMITS.values())
    settings = make_settings(sqlite_url, max_text_chars=chars)
    async with running_app(settings) as (_, client):
        assert await _pages(client) == _expected(chars)


async def test_the_boxes_follow_the_numbers_the_app_is_built_with(make_settings, sqlite_url, monkeypatch):
    # other numbers in the place the app reads them from: every box shows them (none is a copy of its own)
    agent = {field: limit + 3 + i for i, (field, limit) in enumerate(AGENT_FIELD_LIMITS.items())}
    for attr, value in (("MAX_NAME", MAX_NAME + 1), ("MAX_PERSONA", MAX_PERSONA + 2),
                        ("MAX_CONTEXT", MAX_CONTEXT - 1), ("AGENT_FIELD_LIMITS", agent)):
        monkeypatch.setattr(main, attr, value)
    settings = make_settings(sqlite_url, max_text_chars=999)
    async with running_app(settings) as (_, client):
        assert await _pages(client) == _expected(999, MAX_NAME + 1, MAX_PERSONA + 2, MAX_CONTEXT - 1, agent)


def test_no_template_or_script_writes_a_limit_of_its_own():
    static = Path(main.__file__).parent
    files = [*sorted((static / "templates").glob("*.html")), *sorted((static / "static").glob("*.js"))]
    assert files
    for path in files:
        literal = re.findall(r'maxlength\s*=\s*["\']?\d|maxLength\s*=\s*\d', path.read_text())
        assert not literal, (path.name, literal)
