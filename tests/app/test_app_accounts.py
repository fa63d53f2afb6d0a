"""Login and signup throttling (hearth.app.throttle): in the database, keyed by (account, client), a
growing delay instead of a lock-out, client addresses from trusted proxies only, device cookies."""

from __future__ import annotations

import asyncio

import pytest

from hearth.app import throttle
from hearth.app.throttle import Policy
from tests.app.app_client import PASSWORD, csrf_of, login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio


def test_policy_delays_double_after_the_free_attempts_up_to_the_cap():
    p = Policy(free=3, base_s=2.0, max_s=30.0, window_s=60.0)
    assert [p.delay_after(n) for n in range(1, 9)] == [0, 0, 2, 4, 8, 16, 30, 30]
    with pytest.raises(ValueError, match="backoff"):
        Policy(free=3, base_s=2.0, max_s=120.0, window_s=60.0)


async def test_backoff_in_the_database_grows_and_never_locks_for_good(db):
    p = Policy(free=2, base_s=10.0, max_s=40.0, window_s=100.0)
    t = 1_000_000.0
    async with db.sessions() as s:
        assert await throttle.attempt(s, "b", p, now=t) == 0
        assert await throttle.attempt(s, "b", p, now=t + 1) == 0       # 2nd: still free, next must wait 10 s
        assert await throttle.attempt(s, "b", p, now=t + 2) == pytest.approx(9)
        assert await throttle.attempt(s, "other", p, now=t + 2) == 0  # buckets are independent
        assert await throttle.attempt(s, "b", p, now=t + 11) == 0      # 3rd, after the wait; next waits 20 s
        assert await throttle.attempt(s, "b", p, now=t + 30) == pytest.approx(1)
        assert await throttle.attempt(s, "b", p, now=t + 31) == 0      # 4th; next waits 40 s (the cap)
        assert await throttle.attempt(s, "b", p, now=t + 70) == pytest.approx(1)
        assert await throttle.attempt(s, "b", p, now=t + 71) == 0      # 5th: the cap holds, no lock-out
        assert await throttle.attempt(s, "b", p, now=t + 172) == 0     # idle > window: starts again
        assert await throttle.attempt(s, "b", p, now=t + 173) == 0
        await throttle.forget(s, "b")
        assert await throttle.sweep(s, p, now=t + 500) == 1  # "other", idle past the window
        from sqlalchemy import func, select

        from hearth.app.storage.models import AuthThrottle
        async with s.begin():
            assert (await s.execute(select(func.count()).select_from(AuthThrottle))).scalar_one() == 0


async def test_a_burst_of_parallel_attempts_is_counted_exactly(db):
    p = Policy(free=3, base_s=60.0, max_s=60.0, window_s=600.0)

    async def one():
        async with db.sessions() as s:
            return await throttle.attempt(s, "burst", p)

    waits = await asyncio.gather(*(one() for _ in range(12)))
    assert sum(w == 0 for w in waits) == 3, waits


def test_client_address_believes_only_trusted_proxies():
    trusted = throttle.parse_networks(["10.0.0.0/8", "127.0.0.1"])
    assert throttle.client_address("203.0.113.9", "1.2.3.4", trusted) == "203.0.113.9"  # not a proxy: ignored
    assert throttle.client_address("127.0.0.1", "198.51.100.7", []) == "127.0.0.1"        # trust none (default)
    assert throttle.client_address("127.0.0.1", "198.51.100.7", trusted) == "198.51.100.7"
    # a client cannot pick its address by sending the header itself: the proxy appends the real one
    assert throttle.client_address("10.1.1.1", "6.6.6.6, 198.51.100.7, 10.2.2.2", trusted) == "198.51.100.7"
    with pytest.raises(ValueError, match="forwarded_allow_ips"):
        throttle.parse_networks(["not-an-ip"])


def test_device_cookies_belong_to_one_account_and_cannot_be_forged():
    secret = throttle.device_secret(b"k" * 16 + b"0123456789abcdef")
    alice, bob = "a" * 32, "b" * 32  # user ids
    cookie = throttle.new_device_cookie(secret, alice, 0)
    assert throttle.known_device(secret, alice, 0, cookie)
    assert throttle.known_device(secret, bob, 0, cookie) is None
    assert throttle.known_device(secret, alice, 1, cookie) is None  # issued before alice's password change
    nonce = cookie.split(".")[0]
    assert throttle.known_device(secret, alice, 0, nonce + "." + "0" * 32) is None
    assert throttle.known_device(secret, alice, 0, None) is None


# ------------------------------------------------------------------------------ over HTTP
# (SQLite: the throttle SQL itself runs on both backends above)
FAST = dict(login_free_attempts=3, login_backoff_base_s=300.0, login_backoff_max_s=600.0, login_window_s=3600.0)


async def _login_from(client, username: str, password: str, address: str | None):
    page = await client.get("/login")
    headers = {"x-forwarded-for": address} if address else {}
    return await client.post("/login", data={"username": username, "password": password,
                                             "csrf": csrf_of(page.text)}, headers=headers)


async def test_guessing_one_account_does_not_lock_out_other_users_at_that_address(make_settings, sqlite_url):
    # before: 20 failures from one address gave every user at that address 429 (and 5 locked the account)
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, client):
        await signup(client, "alice")
        await signup(client, "bob")
        client.cookies.clear()
        for _ in range(25):
            r = await login(client, "alice", "not the password")
            assert r.status_code in (401, 429)
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        assert (await login(client, "bob")).status_code == 303  # same address, other account: fine


async def test_behind_a_trusted_proxy_each_client_address_is_throttled_apart(make_settings, sqlite_url):
    settings = make_settings(sqlite_url, forwarded_allow_ips=["127.0.0.1/32"], **FAST)
    async with running_app(settings) as (app, client):
        await signup(client, "alice")
        client.cookies.clear()
        for _ in range(4):
            await _login_from(client, "alice", "guess guess guess", "198.51.100.66")
        r = await _login_from(client, "alice", PASSWORD, "198.51.100.66")
        assert r.status_code == 429  # the guessing address waits, right password or not
        r = await _login_from(client, "alice", PASSWORD, "203.0.113.5")
        assert r.status_code == 303, "the owner at another address was locked out"
    # without the proxy configured, the header is ignored: the guesses count against the peer address
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, client):
        client.cookies.clear()
        for i in range(4):
            await _login_from(client, "alice", "guess guess guess", f"198.51.100.{i}")
        assert (await _login_from(client, "alice", PASSWORD, "203.0.113.5")).status_code == 429


async def test_a_browser_that_logged_in_before_is_not_slowed_by_someone_elses_guesses(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, owner):
        await signup(owner, "alice")
        assert throttle.DEVICE_COOKIE in owner.cookies
        device = owner.cookies[throttle.DEVICE_COOKIE]
        owner.cookies.clear()
        for _ in range(5):  # an attacker at the same address (one NAT, one proxy) guesses
            await login(owner, "alice", "not the password")
        assert (await login(owner, "alice")).status_code == 429
        owner.cookies.set(throttle.DEVICE_COOKIE, device, path="/login")
        assert (await login(owner, "alice")).status_code == 303


async def test_parallel_login_guesses_cannot_slip_under_the_limit(make_settings, sqlite_url):
    # each guess is counted before the slow argon2 check, so a burst sent at once is limited too
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, client):
        await signup(client, "alice")
        client.cookies.clear()
        page = await client.get("/login")
        form = {"username": "alice", "password": "not the password", "csrf": csrf_of(page.text)}
        codes = sorted(r.status_code for r in await asyncio.gather(*(client.post("/login", data=form)
                                                                      for _ in range(12))))
        assert codes.count(401) == 3 and codes.count(429) == 9, codes


async def test_successful_logins_do_not_use_up_anything(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url, login_free_attempts=1)) as (app, client):
        await signup(client, "alice")
        for _ in range(4):
            client.cookies.clear()
            assert (await login(client, "alice")).status_code == 303


async def test_signup_is_throttled_per_address(make_settings, sqlite_url):
    # before: 200 signups in 48 s all passed (and their argon2 hashes slowed every login)
    settings = make_settings(sqlite_url, signup_free_attempts=3, signup_backoff_base_s=60.0)
    async with running_app(settings) as (app, client):
        codes = []
        for i in range(6):
            client.cookies.clear()
            page = await client.get("/signup")
            r = await client.post("/signup", data={"username": f"bot{i}", "password": PASSWORD,
                                                   "csrf": csrf_of(page.text)})
            codes.append(r.status_code)
        assert codes == [303, 303, 303, 429, 429, 429], codes
        assert int(r.headers["retry-after"]) > 0 and "try again" in r.text
