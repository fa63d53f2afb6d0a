"""Settings that failed only at the first request are refused at start-up, naming the setting:

- ``max_text_chars`` above what the forms take (common.FORM_TEXT_MAX): longer texts met a 422 when sent;
- ``session_ttl_s`` so long that a session's expiry is past the year 9999: every signup and login raised
  OverflowError (a 500) and nobody could log in.
The requests themselves are shown against a real SQLite file.
"""

from __future__ import annotations

import pytest

from hearth.app.common import FORM_TEXT_MAX
from hearth.app.settings import SettingsError
from hearth.prompt_budget import largest_system_prompt
from tests.app.app_client import create_companion, signup
from tests.app.conftest import running_app

BODY = 12 * (FORM_TEXT_MAX + 1) + 1024  # max_body_bytes that carries the longest text either way


def test_a_text_limit_above_what_the_forms_take_is_refused_at_start_up(make_settings, sqlite_url):
    # before: accepted; a message of 50001..60000 characters then got "422: String should have at most 50000"
    with pytest.raises(SettingsError) as caught:
        make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX + 1, max_body_bytes=BODY)
    assert caught.value.field == "max_text_chars"


@pytest.mark.anyio
async def test_the_largest_text_limit_allowed_is_taken_by_the_forms(make_settings, sqlite_url):
    # a prompt budget that holds the largest system prompt and one such message (test_app_prompt_budget)
    settings = make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX, max_body_bytes=BODY,
                             max_prompt_chars=largest_system_prompt(30)[1] + FORM_TEXT_MAX)
    async with running_app(settings) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        r = await client.post(f"/companions/{cid}/messages", data={"message": "x" * FORM_TEXT_MAX, "csrf": csrf})
        assert r.status_code == 303, r.text[:300]


def test_a_session_lifetime_past_what_a_date_holds_is_refused_at_start_up(make_settings, sqlite_url):
    # before: accepted; the first signup raised OverflowError("date value out of range") out of the route
    with pytest.raises(SettingsError) as caught:
        make_settings(sqlite_url, session_ttl_s=10**12)
    assert caught.value.field == "session_ttl_s"


@pytest.mark.anyio
async def test_the_longest_session_lifetime_allowed_signs_up(make_settings, sqlite_url):
    from hearth.app.settings import MAX_SESSION_TTL_S

    async with running_app(make_settings(sqlite_url, session_ttl_s=MAX_SESSION_TTL_S)) as (_, client):
        await signup(client, "ann")
