"""Account review 58: defects in password change and account control, each seen failing first."""

from __future__ import annotations

import pytest

from hearth.app import account as account_svc
from hearth.app import accounts
from tests.app.app_client import PASSWORD

pytestmark = pytest.mark.anyio

NEW_PASSWORD = "a brand new passphrase"
THIEF_PASSWORD = "the thief's own passphrase"


async def test_a_password_change_checked_against_a_stale_hash_is_refused(db, master_key):
    # before: change_password checked `current` against the users row its request loaded (with the session), then
    # wrote the new hash unconditionally. A request on a stolen session that was loaded before the owner changed
    # the password (which ends that session) still passed with the OLD password and took the account over: the
    # thief's password set, the owner's new session deleted.
    async with db.sessions() as s:
        first = await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
        stale = (await accounts.session_user(s, first.token))[1]  # the thief's request, loaded before the change
    async with db.sessions() as s:
        owner = (await accounts.session_user(s, first.token))[1]
        mine = await account_svc.change_password(s, owner, current=PASSWORD, new=NEW_PASSWORD, ttl_s=3600)
    async with db.sessions() as s:
        with pytest.raises(accounts.AccountError) as err:
            await account_svc.change_password(s, stale, current=PASSWORD, new=THIEF_PASSWORD, ttl_s=3600)
        assert err.value.field == "current_password"
    async with db.sessions() as s:
        assert await accounts.session_user(s, mine.token) is not None, "the owner's session was ended"
        assert await accounts.login(s, username="alice", password=THIEF_PASSWORD, ttl_s=3600) is None
        assert await accounts.login(s, username="alice", password=NEW_PASSWORD, ttl_s=3600) is not None


async def test_an_account_deletion_checked_against_a_stale_hash_is_refused(db, master_key):
    # before: delete_account checked the password against the users row its request loaded, then deleted the user
    # unconditionally: a request on a stolen session loaded before the owner changed the password deleted the
    # account with the OLD password.
    async with db.sessions() as s:
        first = await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
        stale = (await accounts.session_user(s, first.token))[1]
    async with db.sessions() as s:
        owner = (await accounts.session_user(s, first.token))[1]
        await account_svc.change_password(s, owner, current=PASSWORD, new=NEW_PASSWORD, ttl_s=3600)
    async with db.sessions() as s:
        with pytest.raises(accounts.AccountError) as err:
            await account_svc.delete_account(s, stale, password=PASSWORD)
        assert err.value.field == "password"
    async with db.sessions() as s:
        assert await accounts.login(s, username="alice", password=NEW_PASSWORD, ttl_s=3600) is not None, \
            "the account was deleted with the old password"


async def test_two_logins_racing_a_rehash_both_get_a_session(db, master_key, monkeypatch):
    # before: after argon2's parameters were raised, two logins with the right password at once (two devices, a
    # double submit) both verified the old hash; the first rehashed it, and the second then found the stored hash
    # changed and returned None: a right password refused as a wrong one (and counted as a failed login).
    import asyncio

    from tests.app.test_app_review49c_defects import _PausingHasher
    async with db.sessions() as s:
        await accounts.signup(s, username="alice", password=PASSWORD, master_key=master_key, ttl_s=3600)
    hasher = _PausingHasher(accounts._hasher, PASSWORD, True)  # every hash due for a rehash
    monkeypatch.setattr(accounts, "_hasher", hasher)

    async def one_login():
        async with db.sessions() as s:
            return await accounts.login(s, username="alice", password=PASSWORD, ttl_s=3600)

    slow = asyncio.create_task(one_login())
    assert await asyncio.to_thread(hasher.entered.wait, 20)  # inside its hash check of the old hash
    assert await one_login() is not None  # the other login rehashes meanwhile
    hasher.go.set()
    assert await slow is not None, "a right password was refused because another login rehashed it"
