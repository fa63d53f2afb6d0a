"""Review 74: login_free_attempts / signup_free_attempts too large for the throttle table are refused at start-up.

They had no upper bound. The throttle compares a bucket's ``attempts`` column (an INTEGER: 64 bits on SQLite, 32 on
PostgreSQL) with them in SQL, so a value the column cannot hold (``login_free_attempts = 10000000000000000000``, or
past 2**31 on PostgreSQL) started the app and then failed every login (every signup) with a 500: an OverflowError
from the SQLite driver, a DataError from asyncpg. Start-up now refuses such a value naming the setting."""

from __future__ import annotations

import pytest

from hearth.app.settings import SettingsError, load_settings
from tests.app.app_client import login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("field", ["login_free_attempts", "signup_free_attempts"])
@pytest.mark.parametrize("value", [10 ** 19, 2 ** 31])
def test_free_attempts_past_the_column_are_refused_naming_the_setting(tmp_path, master_key_text, field, value):
    with pytest.raises(SettingsError) as caught:
        load_settings(None, env={"HEARTH_MASTER_KEY": master_key_text},
                      overrides={"var_dir": str(tmp_path / "var"), field: value})
    assert caught.value.field == field, str(caught.value)


async def test_a_large_allowance_still_serves_signups_and_logins(database_url, make_settings):
    settings = make_settings(database_url, login_free_attempts=1_000_000, signup_free_attempts=1_000_000)
    async with running_app(settings) as (_, client):
        await signup(client, "alice")
        assert (await login(client, "alice", "not-the-password-1")).status_code in (400, 401)
