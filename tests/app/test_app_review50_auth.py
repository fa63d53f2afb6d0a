"""Security review 50: password spraying from one address, and device cookies that outlived a password change.

* Logins were throttled per (account, client) only, so one address trying one common password against many
  accounts had every account's free attempts, and each cost an argon2 hash: now an address has a budget of failed
  logins across accounts (``login_address_failures`` per ``login_address_window_s``), spent before the hash.
* A device cookie was signed over the username alone: it exempted its holder from the address's throttle for
  ever, through any password change, and for whoever signed up under the name after the account was deleted.
  Now it is signed over the user id and a device epoch that a password change moves on (migration 0003).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from datetime import datetime, timezone

import pytest
from alembic import command
from argon2 import PasswordHasher
from sqlalchemy import func, select, text

from hearth.app import accounts, crypto, throttle
from hearth.app.settings import SettingsError, load_settings
from hearth.app.storage import create_database, upgrade
from hearth.app.storage.migrate import alembic_config
from hearth.app.storage.models import AuthThrottle, Companion, Session, User, new_id
from tests.app.app_client import PASSWORD, csrf_of, login, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

SPRAY = "Summer2024!!"  # the one common password a sprayer tries everywhere
NEW_PASSWORD = "a brand new passphrase"
PROXY = dict(forwarded_allow_ips=["127.0.0.1/32"])  # the tests' peer is 127.0.0.1; X-Forwarded-For picks the client


class _CountingHasher:
    """An argon2id hasher that counts its verifications (each is ~50 ms of CPU, with the app's parameters, that a
    sprayer makes the server pay). Light parameters: these tests hash dozens of times on a 2-core CI machine."""

    def __init__(self):
        self.real, self.verified = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1), 0

    def verify(self, stored, password):
        self.verified += 1
        return self.real.verify(stored, password)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture(autouse=True)
def hasher(monkeypatch):
    counting = _CountingHasher()
    monkeypatch.setattr(accounts, "_hasher", counting)
    return counting


async def _login_from(client, username: str, password: str, address: str):
    page = await client.get("/login")
    return await client.post("/login", data={"username": username, "password": password, "csrf": csrf_of(page.text)},
                             headers={"x-forwarded-for": address})


async def _accounts(client, names) -> dict[str, str]:
    """Sign each name up (from a fresh browser); their device cookies, by name. The client keeps none."""
    cookies = {}
    for name in names:
        client.cookies.clear()
        await signup(client, name)
        cookies[name] = client.cookies[throttle.DEVICE_COOKIE]
    client.cookies.clear()
    return cookies


# ------------------------------------------------------------------------------ 1. the address's failure budget
async def test_one_address_spraying_a_password_over_many_accounts_is_stopped_before_the_hash(
        make_settings, database_url, master_key, hasher):
    # before: each of the 8 accounts' first attempts was free (the throttle is per account and address), so all 8
    # were checked (8 argon2 hashes, 401 each); a sprayer with thousands of names was never slowed
    settings = make_settings(database_url, login_address_failures=3, login_address_window_s=3600.0, **PROXY)
    names = [f"user{i}" for i in range(8)]
    async with running_app(settings) as (app, client):
        await _accounts(client, names)
        hasher.verified = 0
        codes = [(await _login_from(client, n, SPRAY, "198.51.100.7")).status_code for n in names]
        assert codes == [401] * 3 + [429] * 5, codes
        assert hasher.verified == 3, "a refused login still paid for an argon2 hash"
        r = await _login_from(client, "user7", PASSWORD, "198.51.100.7")
        # refused before the check, right password or not; the budget gains one back every 3600 / 3 s
        assert r.status_code == 429 and "try again" in r.text
        assert 1100 < int(r.headers["retry-after"]) <= 1201 and hasher.verified == 3
        # everyone else is unaffected
        assert (await _login_from(client, "user7", PASSWORD, "203.0.113.5")).status_code == 303
        # its key is an HMAC under the throttle key, as the other buckets' are (nothing in the table names the address)
        async with app.state.hearth.db.sessions() as s:
            keys = set((await s.execute(select(AuthThrottle.key))).scalars())
    bucket = "login-failures|ip:198.51.100.7"
    assert throttle.bucket_hash(bucket, throttle.throttle_secret(master_key)) in keys
    assert hashlib.sha256(b"hearth/throttle|" + bucket.encode()).hexdigest() not in keys


async def test_the_budget_counts_an_ipv6_client_as_its_64(make_settings, sqlite_url, hasher):
    settings = make_settings(sqlite_url, login_address_failures=2, **PROXY)
    async with running_app(settings) as (app, client):
        await _accounts(client, ["ann", "ben", "cat"])
        codes = [(await _login_from(client, n, SPRAY, f"2001:db8:1:2::{i + 1:x}")).status_code
                 for i, n in enumerate(["ann", "ben", "cat"])]
        assert codes == [401, 401, 429], "a fresh address in the same /64 got a fresh budget"
        assert (await _login_from(client, "cat", PASSWORD, "2001:db8:1:3::1")).status_code == 303  # another /64
        client.cookies.clear()  # (cat's browser now holds cat's device cookie, which the budget leaves alone)
        # an IPv4-mapped address is its IPv4 address
        for n in ("ann", "ben"):
            assert (await _login_from(client, n, SPRAY, "192.0.2.1")).status_code == 401
        assert (await _login_from(client, "cat", SPRAY, "::ffff:192.0.2.1")).status_code == 429


async def test_only_failed_logins_use_the_budget(make_settings, sqlite_url):
    # NAT neighbours logging in (right passwords, new browsers) do not use up the address's budget, and a login
    # that the (account, client) backoff refuses unchecked costs none either
    settings = make_settings(sqlite_url, login_address_failures=3, login_free_attempts=1, login_backoff_base_s=600.0,
                             login_backoff_max_s=600.0)
    async with running_app(settings) as (app, client):
        await _accounts(client, ["ann", "ben", "cat", "dan"])
        assert (await login(client, "ann", SPRAY)).status_code == 401  # 1 of 3
        for _ in range(4):
            assert (await login(client, "ann", SPRAY)).status_code == 429  # ann's own backoff: unchecked, free
        for _ in range(5):
            client.cookies.clear()
            assert (await login(client, "ben")).status_code == 303  # right password: given back
            client.cookies.clear()
        assert (await login(client, "cat", SPRAY)).status_code == 401  # 2 of 3
        assert (await login(client, "dan", SPRAY)).status_code == 401  # 3 of 3
        r = await login(client, "ben")
        assert r.status_code == 429, "the budget did not run out after three failed logins"


async def test_a_browser_with_the_accounts_device_cookie_is_not_charged_to_its_address(make_settings, sqlite_url,
                                                                                        hasher):
    settings = make_settings(sqlite_url, login_address_failures=2)
    async with running_app(settings) as (app, client):
        cookies = await _accounts(client, ["ann", "ben", "cat"])
        for n in ("ben", "cat"):  # someone at the same address (one NAT) sprays
            assert (await login(client, n, SPRAY)).status_code == 401
        assert (await login(client, "ann")).status_code == 429  # a new browser waits, right password or not
        # ann's own browser (its device cookie for ann) goes straight to the password check
        client.cookies.set(throttle.DEVICE_COOKIE, cookies["ann"], path="/login")
        assert (await login(client, "ann", "a typo in it")).status_code == 401
        assert (await login(client, "ann")).status_code == 303
        # a device cookie of another account is no pass for spraying: it is ann's, not ben's
        client.cookies.clear()
        client.cookies.set(throttle.DEVICE_COOKIE, cookies["ann"], path="/login")
        before = hasher.verified
        assert (await login(client, "ben", SPRAY)).status_code == 429 and hasher.verified == before


async def test_a_parallel_burst_cannot_overdraw_the_budget(make_settings, sqlite_url, hasher):
    settings = make_settings(sqlite_url, login_address_failures=3)
    names = [f"user{i}" for i in range(10)]
    async with running_app(settings) as (app, client):
        await _accounts(client, names)
        page = await client.get("/login")
        token = csrf_of(page.text)
        hasher.verified = 0
        responses = await asyncio.gather(*(client.post("/login", data={"username": n, "password": SPRAY,
                                                                       "csrf": token}) for n in names))
    codes = sorted(r.status_code for r in responses)
    assert codes == [401] * 3 + [429] * 7, codes
    assert hasher.verified == 3


async def test_the_budget_can_be_turned_off(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url, login_address_failures=0)) as (app, client):
        await _accounts(client, [f"user{i}" for i in range(4)])
        assert [(await login(client, f"user{i}", SPRAY)).status_code for i in range(4)] == [401] * 4
        async with app.state.hearth.db.sessions() as s:  # only the four (account, address) buckets
            assert (await s.execute(select(func.count()).select_from(AuthThrottle))).scalar_one() == 4 + 1


async def test_the_budget_refills_at_its_rate_and_a_refund_is_exact(db):
    b = throttle.Budget(failures=3, window_s=30.0)  # a burst of 3, then one back every 10 s
    t = 1_000_000.0
    async with db.sessions() as s:
        for _ in range(3):
            assert await throttle.spend(s, "a", b, now=t) == 0
        assert await throttle.spend(s, "a", b, now=t) == pytest.approx(10)
        assert await throttle.spend(s, "other", b, now=t) == 0  # budgets are independent
        assert await throttle.spend(s, "a", b, now=t + 10) == 0  # one came back
        assert await throttle.spend(s, "a", b, now=t + 10) == pytest.approx(10)
        await throttle.refund(s, "a", b)  # the last one was a right password
        assert await throttle.spend(s, "a", b, now=t + 10) == 0
        assert await throttle.spend(s, "a", b, now=t + 15) == pytest.approx(5)
        # idle for a window: full again, and no fuller
        for _ in range(3):
            assert await throttle.spend(s, "a", b, now=t + 100) == 0
        assert await throttle.spend(s, "a", b, now=t + 100) == pytest.approx(10)
        # refunds of units spent from a full budget bank nothing beyond the burst
        for _ in range(5):
            assert await throttle.spend(s, "a", b, now=t + 1000) == 0
            await throttle.refund(s, "a", b)
        assert [await throttle.spend(s, "a", b, now=t + 1000) == 0 for _ in range(4)] == [True] * 3 + [False]
        # parallel spends read the clock before they queue for the row, so they reach it out of order: the later
        # clock first must not make an earlier one refuse itself while the budget lasts
        assert [await throttle.spend(s, "late", b, now=t + d) for d in (1, 0, 0.5)] == [0, 0, 0]
        assert await throttle.spend(s, "late", b, now=t + 0.5) == pytest.approx(10.5)
        # a budget idle for its window is full: the sweep drops it ("other" and "late" too)
        assert await throttle.sweep(s, b, now=t + 1000 + 29) == 2
        assert await throttle.sweep(s, b, now=t + 1000 + 31) == 1
        async with s.begin():
            assert (await s.execute(select(func.count()).select_from(AuthThrottle))).scalar_one() == 0


async def test_parallel_spends_take_exactly_the_budget(db):
    b = throttle.Budget(failures=3, window_s=600.0)

    async def one():
        async with db.sessions() as s:
            return await throttle.spend(s, "burst", b)

    waits = await asyncio.gather(*(one() for _ in range(12)))
    assert sum(w == 0 for w in waits) == 3, waits


def test_the_budget_settings_are_checked_at_start_up(tmp_path, master_key_text):
    def load(**overrides):
        return load_settings(None, env={"HEARTH_MASTER_KEY": master_key_text},
                             overrides={"var_dir": str(tmp_path), **overrides})

    default = load().address_budget()
    assert (default.failures, default.window_s) == (100, 3600.0)  # a NAT's worth of typos per hour
    assert load(login_address_failures=20, login_address_window_s=60).address_budget() == throttle.Budget(20, 60.0)
    assert load(login_address_failures=0).address_budget() is None
    for field, bad in [("login_address_failures", -1), ("login_address_failures", "lots"),
                       ("login_address_failures", 2.5), ("login_address_window_s", 0),
                       ("login_address_window_s", -5.0), ("login_address_window_s", math.inf),
                       ("login_address_window_s", math.nan), ("login_address_window_s", "an hour")]:
        with pytest.raises(SettingsError) as info:
            load(**{field: bad})
        assert info.value.field == field, (field, bad, info.value)
    with pytest.raises(ValueError, match="failures"):
        throttle.Budget(0, 60.0)
    with pytest.raises(ValueError, match="window_s"):
        throttle.Budget(5, math.inf)


# ------------------------------------------------------------------------------ 2. device cookies and the epoch
FAST = dict(login_free_attempts=3, login_backoff_base_s=300.0, login_backoff_max_s=600.0)


async def test_a_password_change_revokes_the_device_cookies_issued_before_it(make_settings, database_url):
    # before: the cookie was a MAC of the username alone. One copied off the owner's laptop exempted its holder
    # from the address's throttle for ever: changing the password, the one thing the owner can do, did not end it
    async with running_app(make_settings(database_url, **FAST)) as (app, client):
        csrf = await signup(client, "alice")
        stolen = client.cookies[throttle.DEVICE_COOKIE]
        r = await client.post("/account/password", data={"current_password": PASSWORD, "new_password": NEW_PASSWORD,
                                                         "csrf": csrf})
        assert r.status_code == 303
        fresh = client.cookies[throttle.DEVICE_COOKIE]  # the browser that changed it gets a new one
        client.cookies.clear()
        for _ in range(3):  # guesses from the address, without a cookie
            assert (await login(client, "alice", "guess guess guess")).status_code == 401
        assert (await login(client, "alice", NEW_PASSWORD)).status_code == 429
        client.cookies.set(throttle.DEVICE_COOKIE, stolen, path="/login")
        r = await login(client, "alice", NEW_PASSWORD)
        assert r.status_code == 429, "the device cookie from before the password change still exempts its holder"
        assert fresh != stolen
        client.cookies.clear()
        client.cookies.set(throttle.DEVICE_COOKIE, fresh, path="/login")
        r = await login(client, "alice", NEW_PASSWORD)
        assert r.status_code == 303  # the owner's browser, changed since, logs in
        assert throttle.DEVICE_COOKIE not in r.cookies  # its cookie is still good: kept
        async with app.state.hearth.db.sessions() as s:
            assert (await s.execute(select(User.device_epoch))).scalar_one() == 1


async def test_a_login_from_a_browser_with_an_outdated_device_cookie_gets_a_new_one(make_settings, sqlite_url):
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, client):
        csrf = await signup(client, "alice")
        old = client.cookies[throttle.DEVICE_COOKIE]
        await client.post("/account/password", data={"current_password": PASSWORD, "new_password": NEW_PASSWORD,
                                                     "csrf": csrf})
        client.cookies.clear()
        client.cookies.set(throttle.DEVICE_COOKIE, old, path="/login")
        r = await login(client, "alice", NEW_PASSWORD)
        assert r.status_code == 303
        new = r.cookies.get(throttle.DEVICE_COOKIE)
        assert new and new != old
        async with app.state.hearth.db.sessions() as s:
            user_id, epoch = await accounts.device_owner(s, "alice")
        assert epoch == 1
        assert app.state.hearth.throttle.known_device(user_id, 1, new)
        assert app.state.hearth.throttle.known_device(user_id, 1, old) is None


async def test_a_deleted_accounts_device_cookie_is_nothing_to_a_new_account_of_that_name(make_settings, sqlite_url):
    # before: the cookie named the username, so it stayed valid for whoever signed up under the name next
    async with running_app(make_settings(sqlite_url, **FAST)) as (app, client):
        csrf = await signup(client, "alice")
        old = client.cookies[throttle.DEVICE_COOKIE]
        assert (await client.post("/account/delete", data={"password": PASSWORD, "csrf": csrf})).status_code == 303
        client.cookies.clear()
        await signup(client, "alice", NEW_PASSWORD)  # someone else
        client.cookies.clear()
        for _ in range(3):
            assert (await login(client, "alice", "guess guess guess")).status_code == 401
        client.cookies.set(throttle.DEVICE_COOKIE, old, path="/login")
        assert (await login(client, "alice", "guess guess guess")).status_code == 429


async def test_upgrading_from_the_previous_schema_keeps_users_and_their_logins(make_settings, database_url,
                                                                              master_key):
    # a database at revision 0002 (before the device epoch) with a user and a companion in it
    database = create_database(database_url)
    uid, cid = new_id(), new_id()
    try:
        await upgrade(database.engine, "0002")
        pw_hash = accounts._hasher.hash(PASSWORD)
        now = datetime.now(timezone.utc)
        async with database.engine.begin() as conn:
            await conn.execute(text(
                "INSERT INTO users (id, username, password_hash, wrapped_key, master_key_id, created_at) "
                "VALUES (:id, 'alice', :pw, :wk, :mk, :now)"),
                dict(id=uid, pw=pw_hash, wk=crypto.wrap_data_key(master_key, crypto.new_data_key(), uid),
                     mk=crypto.master_key_id(master_key), now=now))
            await conn.execute(text(
                "INSERT INTO companions (id, user_id, name_ct, persona_ct, world_view, share_context, affection, "
                "trust, created_at) VALUES (:id, :uid, :b, :b, 'grounded', true, 0, 0, :now)"),
                dict(id=cid, uid=uid, b=b"x" * 40, now=now))
    finally:
        await database.dispose()

    # the app upgrades it at start-up; alice logs in and her browser gets a device cookie at epoch 0
    async with running_app(make_settings(database_url, **FAST)) as (app, client):
        r = await login(client, "alice")
        assert r.status_code == 303
        assert app.state.hearth.throttle.known_device(uid, 0, r.cookies[throttle.DEVICE_COOKIE])

    # and back down to 0002 without losing a row (SQLite's copy-and-drop of `users` would cascade the drop)
    database = create_database(database_url)
    try:
        async with database.engine.begin() as conn:
            await conn.run_sync(lambda c: command.downgrade(alembic_config(c), "0002"))
        async with database.engine.connect() as conn:
            assert (await conn.execute(text("select version_num from alembic_version"))).scalar_one() == "0002"
            assert (await conn.execute(text("select count(*) from users"))).scalar_one() == 1
            assert (await conn.execute(text("select count(*) from companions"))).scalar_one() == 1
            assert (await conn.execute(text("select count(*) from sessions"))).scalar_one() == 1
        await upgrade(database.engine)
        async with database.sessions() as s:
            assert (await s.execute(select(User.device_epoch).where(User.id == uid))).scalar_one() == 0
            assert (await s.execute(select(func.count()).select_from(Companion))).scalar_one() == 1
    finally:
        await database.dispose()


# ------------------------------------------------------------------------------ 3. one place holds the keys
def test_the_apps_throttle_holds_the_same_keys_as_before(master_key):
    t = throttle.Throttle.for_master_key(master_key)
    assert t.secret == throttle.throttle_secret(master_key)
    assert t.device_key == throttle.device_secret(master_key)
    assert master_key.hex() not in repr(t) and repr(t.secret) not in repr(t)


async def test_the_routes_key_their_buckets_with_the_throttle_key(make_settings, sqlite_url, master_key):
    async with running_app(make_settings(sqlite_url)) as (app, client):
        csrf = await signup(client, "alice")
        assert (await client.post("/account/password", data={"current_password": "not it at all",
                                                             "new_password": NEW_PASSWORD, "csrf": csrf})
                ).status_code == 400
        client.cookies.clear()
        assert (await login(client, "alice", "not the password")).status_code == 401
        async with app.state.hearth.db.sessions() as s:
            keys = set((await s.execute(select(AuthThrottle.key))).scalars())
            user_id = (await s.execute(select(User.id))).scalar_one()
            session_id = (await s.execute(select(Session.id))).scalar_one()  # the account page's check: per session
    secret = throttle.throttle_secret(master_key)
    assert keys == {throttle.bucket_hash(b, secret) for b in (
        "signup|ip:127.0.0.1", "login|alice|ip:127.0.0.1", "login-failures|ip:127.0.0.1",
        f"password|{user_id}|session:{session_id}")}


async def test_downgrading_to_the_first_schema_keeps_every_row(database_url, master_key):
    # before: on SQLite, 0002's downgrade dropped companions.chat_epoch by batch mode's copy-and-drop of the table,
    # and with foreign_keys=ON dropping the old `companions` deleted every message and memory with it (ON DELETE
    # CASCADE); 0003's users.device_epoch the same for every row of every user
    from hearth.app import companions
    from hearth.app.storage.models import Memory, Message, Session
    from tests.app.app_fakes import FakeModel

    database = create_database(database_url)
    try:
        await upgrade(database.engine)
        async with database.sessions() as s:
            new = await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=60)
        async with database.sessions() as s:
            user = (await s.execute(select(User).where(User.id == new.user_id))).scalar_one()
        cipher = crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
        async with database.sessions() as s:
            comp = await companions.create_companion(s, cipher, persona="wren")
            await companions.chat_turn(s, FakeModel(), cipher, comp.id, "Hi, my name is Robin", max_chars=4000,
                                       turns=20, prompt_memories=30, deadline_s=5.0)
        tables = {"users": User, "sessions": Session, "companions": Companion, "messages": Message,
                  "memories": Memory}
        async with database.sessions() as s:
            before = {name: (await s.execute(select(func.count()).select_from(m))).scalar_one()
                      for name, m in tables.items()}
        assert before == {"users": 1, "sessions": 1, "companions": 1, "messages": 2, "memories": 1}
        async with database.engine.begin() as conn:
            await conn.run_sync(lambda c: command.downgrade(alembic_config(c), "0001"))
        async with database.engine.connect() as conn:
            after = {name: (await conn.execute(text(f"select count(*) from {name}"))).scalar_one() for name in tables}
        assert after == before
        await upgrade(database.engine)  # and up again
    finally:
        await database.dispose()
