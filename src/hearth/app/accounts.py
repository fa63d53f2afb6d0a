"""Accounts: signup, login, logout, sessions (throttling: hearth.app.throttle).

Passwords are hashed with argon2id (argon2-cffi defaults). Sessions are random tokens; the cookie
holds the token and the database holds only its SHA-256, so a database leak does not hand out
live sessions. Each session has its own CSRF token.

Signup writes the user, the user's wrapped data key and the first session in ONE transaction: an
account either exists and can log in, or does not exist at all.

Expired sessions: a login deletes its user's in the transaction that adds its new one, and every new session
(a signup's, a login's) then deletes up to SESSION_SWEEP_BATCH expired sessions of any user (sweep_expired_sessions),
so those of a user who never comes back go too. Sessions are only ever added by a signup or a login, so expired rows
cannot pile up: each new row removes up to a batch of them. No background task, and each statement stays bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app import crypto
from hearth.app.storage.models import Session, User, new_id, utcnow

log = logging.getLogger("hearth.app")
# how many expired sessions (of any user) one new session's sweep deletes at most (sweep_expired_sessions)
SESSION_SWEEP_BATCH = 500
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{2,31}$")
MIN_PASSWORD, MAX_PASSWORD = 10, 256

_hasher = PasswordHasher()  # argon2id
# verified against when the username does not exist, so both paths cost one argon2 verification
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


class AccountError(ValueError):
    """Bad signup/login input; ``.field`` names it (the message is safe to show)."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


# what the user is told when their wrapped data key does not open (the login and every page of a session)
DATA_KEY_DAMAGED = ("Your account's data cannot be opened on this server: its stored key does not match the "
                    "server's key. Nothing was changed. Please contact the operator of this server.")


class DataKeyDamaged(RuntimeError):
    """The password matched, but the account's wrapped data key does not open under the master key (a damaged or
    altered users row): nothing of the account can be read, so no session is given. ``.user_id`` names it."""

    def __init__(self, user_id: str):
        self.user_id = user_id
        super().__init__(f"the data key of user {user_id} does not open under the master key")


@dataclass(frozen=True)
class NewSession:
    token: str  # goes into the cookie, never stored
    user_id: str
    csrf_token: str
    expires_at: datetime
    device_epoch: int = 0  # the account's device epoch when the session began (its device cookie is signed over it)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def normalise_username(username: str) -> str:
    name = (username or "").strip().lower()
    if not USERNAME_RE.match(name):
        raise AccountError("username", "3-32 characters: letters, digits, '.', '_' or '-'")
    return name


def _check_password(password: str) -> str:
    if not (MIN_PASSWORD <= len(password or "") <= MAX_PASSWORD):
        raise AccountError("password", f"must be {MIN_PASSWORD}-{MAX_PASSWORD} characters")
    return password


def _session_row(user_id: str, ttl_s: int, device_epoch: int = 0) -> tuple[Session, NewSession]:
    token = secrets.token_urlsafe(32)
    new = NewSession(token=token, user_id=user_id, csrf_token=secrets.token_urlsafe(32),
                     expires_at=utcnow() + timedelta(seconds=ttl_s), device_epoch=device_epoch)
    return Session(id=token_hash(token), user_id=user_id, csrf_token=new.csrf_token, expires_at=new.expires_at), new


async def sweep_expired_sessions(db: AsyncSession, *, limit: int | None = None) -> int:
    """Delete up to ``limit`` (SESSION_SWEEP_BATCH) expired sessions of any user, in a transaction of its own; how
    many went. Run after each new session (signup, login): a database error here is logged and answered 0, never
    raised, so housekeeping cannot fail the login that ran it (its session is committed); the next one tries again."""
    limit = SESSION_SWEEP_BATCH if limit is None else limit
    expired = select(Session.id).where(Session.expires_at <= utcnow()).limit(limit)
    try:
        async with db.begin():
            gone = await db.execute(delete(Session).where(Session.id.in_(expired.scalar_subquery()))
                                    .execution_options(synchronize_session=False))
    except SQLAlchemyError as exc:
        log.warning("expired sessions not swept (tried again at the next login): %s", type(exc).__name__)
        return 0
    return gone.rowcount


async def signup(db: AsyncSession, *, username: str, password: str, master_key: bytes, ttl_s: int) -> NewSession:
    """Create the account and its first session atomically. AccountError for bad input or a taken name."""
    name = normalise_username(username)
    _check_password(password)
    pw_hash = await asyncio.to_thread(_hasher.hash, password)  # ~50 ms of CPU: keep the loop free
    user_id = new_id()
    user = User(id=user_id, username=name, password_hash=pw_hash, master_key_id=crypto.master_key_id(master_key),
                wrapped_key=crypto.wrap_data_key(master_key, crypto.new_data_key(), user_id))
    row, new = _session_row(user_id, ttl_s)
    try:
        async with db.begin():
            db.add(user)
            await db.flush()  # the user row must exist before the session's foreign key
            db.add(row)
    except IntegrityError:
        raise AccountError("username", "is taken") from None
    await sweep_expired_sessions(db)
    return new


async def login(db: AsyncSession, *, username: str, password: str, ttl_s: int,
                master_key: bytes | None = None, _retries: int = 2) -> NewSession | None:
    """A new session when the password matches, else None (same cost either way). With ``master_key``: the
    account's data key must open under it, else DataKeyDamaged and nothing is written (no session, no rehash)."""
    name = (username or "").strip().lower()
    user = None
    if USERNAME_RE.match(name):  # no such account can exist otherwise (and NUL bytes never reach PostgreSQL)
        async with db.begin():  # read transaction, closed before the slow hash check
            # populate_existing: a row already in this session (a retry below) is read again, not its stale copy
            user = (await db.execute(select(User).where(User.username == name)
                                     .execution_options(populate_existing=True))).scalar_one_or_none()
    stored = user.password_hash if user is not None else _DUMMY_HASH
    try:
        await asyncio.to_thread(_hasher.verify, stored, password or "")
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return None
    if user is None:  # pragma: no cover - the dummy hash's password is random
        return None
    if master_key is not None:  # only once the password matched: a guesser learns nothing about the row
        try:
            crypto.unwrap_data_key(master_key, user.wrapped_key, user.id)
        except crypto.DecryptError:
            raise DataKeyDamaged(user.id) from None
    checked = user.password_hash
    rehashed = await asyncio.to_thread(_hasher.hash, password) if _hasher.check_needs_rehash(checked) else None
    async with db.begin():
        # a write first: on SQLite it takes the write lock, so nothing commits between the look below and the insert
        await db.execute(delete(Session).where(Session.user_id == user.id, Session.expires_at <= utcnow()))
        # The password was checked outside any transaction: it may have been changed (or the account deleted)
        # meanwhile. A session for a password that is no longer the account's would outlive "every other session
        # is logged out", and a rehash would put the old password back. FOR SHARE (PostgreSQL) holds a password
        # change off until this commits; it then deletes this session with the rest.
        current = (await db.execute(select(User.password_hash, User.device_epoch).where(User.id == user.id)
                                    .with_for_update(read=True))).first()
        if current is None:
            return None
        changed = current.password_hash != checked
        if not changed:
            row, new = _session_row(user.id, ttl_s, current.device_epoch)  # the epoch of the password just checked
            db.add(row)
            if rehashed is not None:
                await db.execute(update(User).where(User.id == user.id).values(password_hash=rehashed))
    if changed:
        # changed by a password change, or only rehashed by another login of the same password (argon2's parameters
        # were raised): check the password again against the hash now stored, a few times at most
        if _retries <= 0:
            return None
        return await login(db, username=username, password=password, ttl_s=ttl_s, master_key=master_key,
                           _retries=_retries - 1)
    await sweep_expired_sessions(db)
    return new


async def device_owner(db: AsyncSession, username: str) -> tuple[str, int] | None:
    """(user id, device epoch) of the account a login names, to check its device cookie by; None when there is
    no such account."""
    name = (username or "").strip().lower()
    if not USERNAME_RE.match(name):
        return None
    async with db.begin():
        row = (await db.execute(select(User.id, User.device_epoch).where(User.username == name))).first()
    return None if row is None else (row.id, row.device_epoch)


async def logout(db: AsyncSession, token: str) -> None:
    async with db.begin():
        await db.execute(delete(Session).where(Session.id == token_hash(token)))


async def session_user(db: AsyncSession, token: str) -> tuple[Session, User] | None:
    """The live session and its user for a cookie token, or None (unknown or expired)."""
    if not token or len(token) > 128:
        return None
    async with db.begin():
        row = (await db.execute(
            select(Session, User).join(User, User.id == Session.user_id).where(Session.id == token_hash(token))
        )).first()
    if row is None:
        return None
    sess, user = row
    expires = sess.expires_at if sess.expires_at.tzinfo else sess.expires_at.replace(tzinfo=timezone.utc)
    if expires <= utcnow():
        return None
    return sess, user


def csrf_matches(expected: str, given: str | None) -> bool:
    return bool(given) and secrets.compare_digest(expected.encode(), given.encode())
