"""A text within max_text_chars is taken by the forms however many line breaks it has.

A browser sends each line break of a text box as CR LF (two characters; the box's maxlength counts it as one), and
clean_text turns it back into one. FastAPI's Form(max_length) counts what was sent: with max_text_chars at its
largest allowed value (common.FORM_TEXT_MAX, the forms' cap), a message of many short lines under the limit met a
422 ("String should have at most 50000 characters") and, on the no-script form, lost its text.
"""

from __future__ import annotations

import pytest

from hearth.app.common import FORM_TEXT_MAX
from hearth.prompt_budget import largest_system_prompt
from tests.app.app_client import create_companion, signup
from tests.app.conftest import running_app

BODY = 12 * (FORM_TEXT_MAX + 1) + 1024
PROMPT = largest_system_prompt(30)[1] + FORM_TEXT_MAX  # the prompt budget such a message needs


@pytest.mark.anyio
async def test_a_message_of_many_lines_within_the_limit_is_taken(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX, max_body_bytes=BODY, max_prompt_chars=PROMPT)
    async with running_app(settings) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        sent = "ab\r\n" * (FORM_TEXT_MAX // 3)          # 66,664 characters sent, 49,998 once cleaned
        r = await client.post(f"/companions/{cid}/messages", data={"message": sent, "csrf": csrf})
        assert r.status_code == 303, r.text[:300]
        page = await client.get(f"/companions/{cid}")
        assert page.text.count("ab\nab") > 1000


@pytest.mark.anyio
async def test_a_post_and_a_situation_of_many_lines_within_the_limit_are_taken(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, max_text_chars=FORM_TEXT_MAX, max_body_bytes=BODY, max_prompt_chars=PROMPT)
    async with running_app(settings) as (_, client):
        csrf = await signup(client, "ann")
        cid = await create_companion(client, csrf)
        sent = "ab\r\n" * (FORM_TEXT_MAX // 3)
        r = await client.post("/feed/posts", data={"post": sent, "csrf": csrf})
        assert r.status_code == 303, r.text[:300]
        r = await client.post(f"/companions/{cid}/situations", data={"situation": sent, "csrf": csrf})
        assert r.status_code == 303, r.text[:300]
