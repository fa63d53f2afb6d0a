"""Security review 49c: defects found in the app's accounts, sessions and throttling, each seen failing first."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hearth.app import account as account_svc
from hearth.app import accounts
from tests.app.app_client import PASSWORD, csrf_of, signup
from tests.app.conftest import running_app

pytestmark = pytest.mark.anyio

NEW_PASSWORD = "a brand new passphrase"


class _PausingHasher:
    """The real argon2 hasher, except that the first verification of ``pause_on`` waits for ``go`` (the slow
    hash check is where a login sits while the password changes underneath it), and every hash needs a rehash
    when ``rehash`` is set (the parameters were raised since it was made)."""

    def __init__(self, real, pause_on: str, rehash: bool):
        self.real, self.pause_on, self.rehash = real, pause_on, rehash
        self.entered, self.go = threading.Event(), threading.Event()

    def verify(self, stored, password):
        if password == self.pause_on:
            self.pause_on = None
            self.entered.set()
            assert self.go.wait(20)
        return self.real.verify(stored, password)

    def check_needs_rehash(self, stored):
        return self.rehash or self.real.check_needs_rehash(stored)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("rehash", [False, True], ids=["plain", "rehash-due"])
async def test_a_login_with_the_old_password_racing_a_password_change_gets_no_session(db, master_key, monkeypatch,
                                                                                     rehash):
    # before: login() checked the password, then (a transaction later) inserted the session without looking again.
    # A login with the old password (the one the owner changes because someone else has it) whose argon2 check
    # was running when the change committed got a session that survived "every other session is logged out";
    # and when the stored hash was due for a rehash, it wrote the OLD password's hash back over the new one.
    async with db.sessions() as s:
        first = await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
        owner = (await accounts.session_user(s, first.token))[1]
    hasher = _PausingHasher(accounts._hasher, PASSWORD, rehash)
    monkeypatch.setattr(accounts, "_hasher", hasher)

    async def attacker_login():
        async with db.sessions() as s:
            return await accounts.login(s, username="alice", password=PASSWORD, ttl_s=3600)

    attacker = asyncio.create_task(attacker_login())
    assert await asyncio.to_thread(hasher.entered.wait, 20)  # the attacker's login is inside its hash check
    async with db.sessions() as s:
        await account_svc.change_password(s, owner, current=PASSWORD, new=NEW_PASSWORD, ttl_s=3600)
    hasher.go.set()
    stolen = await attacker
    async with db.sessions() as s:
        assert stolen is None or await accounts.session_user(s, stolen.token) is None, \
            "a session made with the old password outlived the password change"
        assert await accounts.login(s, username="alice", password=PASSWORD, ttl_s=3600) is None, \
            "the old password works again"
        assert await accounts.login(s, username="alice", password=NEW_PASSWORD, ttl_s=3600) is not None


async def test_a_login_racing_the_accounts_deletion_is_refused_not_a_500(db, master_key, monkeypatch):
    # before: the session's insert hit the foreign key of the deleted user (an IntegrityError: a 500)
    async with db.sessions() as s:
        first = await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
        owner = (await accounts.session_user(s, first.token))[1]
    hasher = _PausingHasher(accounts._hasher, PASSWORD, False)
    monkeypatch.setattr(accounts, "_hasher", hasher)

    async def racing_login():
        async with db.sessions() as s:
            return await accounts.login(s, username="alice", password=PASSWORD, ttl_s=3600)

    task = asyncio.create_task(racing_login())
    assert await asyncio.to_thread(hasher.entered.wait, 20)
    async with db.sessions() as s:
        await account_svc.delete_account(s, owner, password=PASSWORD)
    hasher.go.set()
    assert await task is None


# ------------------------------------------------------------------------------ IPv6 clients
FAST = dict(login_free_attempts=3, login_backoff_base_s=300.0, login_backoff_max_s=600.0, login_window_s=3600.0,
            signup_free_attempts=2, signup_backoff_base_s=300.0, signup_backoff_max_s=600.0, signup_window_s=3600.0)


async def _post_from(client, path: str, username: str, password: str, address: str):
    page = await client.get(path)
    return await client.post(path, data={"username": username, "password": password, "csrf": csrf_of(page.text)},
                             headers={"x-forwarded-for": address})


async def test_an_ipv6_guesser_cannot_reset_the_throttle_by_changing_the_low_64_bits(make_settings, sqlite_url):
    # before: the bucket was the exact address. Every IPv6 host is handed a /64 (2**64 addresses), so a guesser
    # who took a fresh address for each try was never slowed: the login limit did not exist for them.
    settings = make_settings(sqlite_url, forwarded_allow_ips=["127.0.0.1/32"], **FAST)
    async with running_app(settings) as (app, client):
        await signup(client, "alice")
        client.cookies.clear()
        for i in range(3):
            r = await _post_from(client, "/login", "alice", "guess guess guess", f"2001:db8:1:2::{i + 1:x}")
            assert r.status_code == 401
        r = await _post_from(client, "/login", "alice", PASSWORD, "2001:db8:1:2:dead:beef:0:99")
        assert r.status_code == 429, "a fresh address in the same /64 started the count again"
        # the same host written as an IPv4-mapped address is that IPv4 address
        for _ in range(3):
            await _post_from(client, "/login", "alice", "guess guess guess", "198.51.100.7")
        assert (await _post_from(client, "/login", "alice", PASSWORD, "::ffff:198.51.100.7")).status_code == 429
        # the owner in another /64 logs in as usual
        assert (await _post_from(client, "/login", "alice", PASSWORD, "2001:db8:1:3::1")).status_code == 303
        # signups count per /64 as well
        client.cookies.clear()
        codes = [(await _post_from(client, "/signup", f"user{i}", PASSWORD, f"2001:db8:9:9::{i + 1:x}")).status_code
                 for i in range(3)]
        assert codes == [303, 303, 429]


# ------------------------------------------------------------------------------ throttle table
async def test_the_throttle_table_cannot_be_read_back_into_accounts_and_addresses(make_settings, sqlite_url):
    # before: a bucket's key was an unkeyed SHA-256 of "login|<username>|ip:<address>". With the usernames from
    # the users table and 2**32 IPv4 addresses, a copy of the database gave back, in seconds, who was trying to
    # log in to which account from where (and "password|<user id>" which user mistyped the account password).
    # Now it is an HMAC under a key derived from the master key, which the database never holds.
    import hashlib

    from sqlalchemy import select

    from hearth.app.storage.models import AuthThrottle, Session, User

    def unkeyed(bucket: str) -> str:
        return hashlib.sha256(b"hearth/throttle|" + bucket.encode()).hexdigest()

    settings = make_settings(sqlite_url, **FAST)
    async with running_app(settings) as (app, client):
        csrf = await signup(client, "alice")
        r = await client.post("/account/password", data={"current_password": "not it at all", "new_password":
                                                          NEW_PASSWORD, "csrf": csrf})
        assert r.status_code == 400
        client.cookies.clear()
        for _ in range(2):
            r = await _post_from(client, "/login", "alice", "guess guess guess", "198.51.100.7")
            assert r.status_code == 401
        async with app.state.hearth.db.sessions() as s:
            keys = set((await s.execute(select(AuthThrottle.key))).scalars())
            user_id = (await s.execute(select(User.id))).scalar_one()
            session_id = (await s.execute(select(Session.id))).scalar_one()
    # the signup's address, alice from 127.0.0.1, 127.0.0.1's failed logins, and alice's account-page check
    assert len(keys) == 4
    guessable = {unkeyed(b) for b in ("signup|ip:127.0.0.1", "login|alice|ip:127.0.0.1", "login-failures|ip:127.0.0.1",
                                      f"password|{user_id}|session:{session_id}")}
    assert not keys & guessable, "the throttle table names accounts and addresses to anyone with a copy of it"


# ------------------------------------------------------------------------------ error logs
async def test_a_failed_statement_leaves_the_rows_secrets_out_of_the_error_and_its_log(db, master_key):
    # before: SQLAlchemy wrote the bound parameters into every statement error ("[parameters: (...)]"), and an
    # unhandled one reaches the server's log as the traceback of a 500: a failed write to `users` put the
    # account's argon2 hash and wrapped data key there, a failed session insert its CSRF token.
    from sqlalchemy.exc import IntegrityError

    from hearth.app import crypto
    from hearth.app.storage.models import User

    async with db.sessions() as s:
        await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
    secret_hash = accounts._hasher.hash("the other alice's password")
    with pytest.raises(IntegrityError) as caught:
        async with db.sessions() as s, s.begin():
            s.add(User(id="f" * 32, username="alice", password_hash=secret_hash, master_key_id="0" * 16,
                       wrapped_key=crypto.wrap_data_key(master_key, crypto.new_data_key(), "f" * 32)))
    # (PostgreSQL's own message names the duplicate key, here the username: that column is plaintext anyway)
    assert "argon2" not in str(caught.value) and secret_hash[-22:] not in str(caught.value)
