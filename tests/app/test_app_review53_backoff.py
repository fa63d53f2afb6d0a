"""Review 53: a login backoff whose base is so small that 60 doublings stay under its cap
(``login_backoff_base_s = 1e-16``) hung the event loop at the first login. The throttle listed its backoff tiers until
the delay reached the cap, which it never does (the delay stops doubling after 60 steps), so the worker answered
nothing any more. Now the tiers end where the delay stops growing, and the SQL keeps delay_after's delays. Each test
failed (timed out) before the fix."""

from __future__ import annotations

import pytest

from hearth.app.throttle import Policy
from tests.app.app_client import PASSWORD, login, signup
from tests.app.conftest import running_app


@pytest.mark.timeout(30)  # before: the tiers never ended
def test_a_backoff_that_stops_doubling_under_its_cap_has_a_last_tier():
    policy = Policy(free=2, base_s=1e-16, max_s=900.0, window_s=3600.0)
    tiers = policy._tiers()
    assert len(tiers) <= 61
    assert [d for _, d in tiers] == [policy.delay_after(n) for n, _ in tiers]
    assert policy.delay_after(10**6) == policy.delay_after(2 + 60) < 900.0
    # a policy that reaches its cap keeps its tiers as they were
    usual = Policy(free=5, base_s=1.0, max_s=900.0, window_s=3600.0)
    assert usual._tiers() == [(5 + k, float(2 ** k)) for k in range(10)]


@pytest.mark.anyio
@pytest.mark.timeout(60)  # before: the first login never answered (the event loop was stuck)
async def test_a_login_with_a_tiny_backoff_base_answers(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, login_free_attempts=1, login_backoff_base_s=1e-16)
    async with running_app(settings) as (_, client):
        await signup(client, "alice")
        client.cookies.clear()
        for _ in range(3):
            assert (await login(client, "alice", "not the password")).status_code == 401
        assert (await login(client, "alice", PASSWORD)).status_code == 303
