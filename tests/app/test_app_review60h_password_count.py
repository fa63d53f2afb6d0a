"""The account page's current-password check is throttled per account with the login policy, and "the right password
clears the count" (docs/app.md, Account control). A password change whose current password was right but whose new
one was refused (too short, the same as the current one) did not clear it: each such try counted as a wrong
password, so a user who typed their current password right and a weak new one a few times was told "Too many
password attempts" (429) on the next, right, change. Now a refused new password clears the count as the right
current password does."""

from __future__ import annotations

import pytest

from tests.app.app_client import PASSWORD, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio
NEW_PASSWORD = "a brand new passphrase"


async def test_the_right_current_password_clears_the_count_when_the_new_one_is_refused(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        free = app.state.hearth.settings.login_free_attempts
        for new in ["short", PASSWORD] * free:  # more refused changes than the free attempts
            r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                             "new_password": new})
            assert r.status_code == 400 and "new_password" in r.text, (r.status_code, r.text[-300:])
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": NEW_PASSWORD})
        assert r.status_code == 303, r.text[-300:]


async def test_wrong_current_passwords_still_count(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        free = app.state.hearth.settings.login_free_attempts
        for _ in range(free):
            r = await client.post("/account/password", data={"csrf": csrf, "current_password": "wrong one!!",
                                                             "new_password": NEW_PASSWORD})
            assert r.status_code == 400
        r = await client.post("/account/password", data={"csrf": csrf, "current_password": PASSWORD,
                                                         "new_password": NEW_PASSWORD})
        assert r.status_code == 429
