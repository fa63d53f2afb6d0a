"""Login and signup throttling, kept in the database so that every app worker shares it.

What is limited (the "bucket"):

    login   (account, client): the client is the request's device cookie when it carries a valid one
            for that account (a browser that logged in as that account before), else the client address
    login   (client address), failed logins across all accounts: a budget (``Budget``), not a backoff;
            skipped when the request carries a valid device cookie for the account it logs in to
    signup  (client address)

The client address is the TCP peer, or, when the peer is in ``forwarded_allow_ips`` (a trusted reverse
proxy), the right-most address in ``X-Forwarded-For`` that is not itself a trusted proxy; an IPv6 client counts
as its /64 (``client_key``: one host holds a whole /64). With the default (trust none) the header is
ignored, so nobody can pick their own address by sending it.

Policy (OWASP's authentication guidance: throttle with a growing delay, do not lock accounts): a bucket
allows ``free`` attempts; after that each attempt must come ``base_s * 2**k`` seconds after the previous
one (k = attempts past ``free``), capped at ``max_s``. Attempts older than ``window_s`` are forgotten.
Someone guessing one account's password from one address therefore slows only that pair: the account's
owner on another address, or on a browser holding its device cookie, logs in as usual.

The per-address budget (``spend`` / ``refund``) stops password spraying: one address trying a common password
against thousands of accounts gets each account's free attempts, but every try costs an argon2 hash. An
address may fail ``failures`` logins in a burst; the budget refills at ``failures`` per ``window_s`` (GCRA: the
row's ``blocked_until`` is when the next failure may come; each one moves it on by ``window_s / failures``, from
no earlier than ``now - window_s + window_s / failures``). A login spends one unit BEFORE its password is checked
(the same atomic update, so a parallel burst cannot overdraw it and a refused try costs no hash) and a login that
turns out to be right, or that the (account, client) backoff refuses unchecked, gives it back (``refund``: the
exact inverse, whatever ran in between), so only failed logins use it up.

An attempt is counted BEFORE the password is checked, in one atomic ``UPDATE ... RETURNING``, so a burst
of parallel guesses cannot all pass the check; a successful login deletes its bucket. Bucket names are
stored as HMAC-SHA256 under ``throttle_secret`` (derived from the master key, never stored): the table holds
no usernames or addresses, and a copy of it cannot be read back into them by hashing the users table's names
against the 2**32 IPv4 addresses, as an unkeyed hash could. (A master-key rotation starts every bucket afresh.)
The app holds that key in one place, a :class:`Throttle`, whose methods are these functions with it bound.

A login bucket also records its account's name (``AuthThrottle.account``: an HMAC of the name under the same key,
so it names no one either), one value for every client's bucket of that name: deleting the account deletes them all
(``forget_account``, in the deletion's transaction), so an account signed up again under the name does not inherit
the old one's backoff.

Device cookies are signed (``device_secret``) over the account's user id and its ``device_epoch``: a password
change moves the epoch on, so every device cookie issued before it stops counting as that account's browser (a
stolen one included), and an account deleted and signed up again under the same name is a new id.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Iterable

from sqlalchemy import Double, bindparam, case, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hearth.app.storage.models import AuthThrottle

DEVICE_COOKIE = "hearth_device"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


_DOUBLINGS = 60  # a backoff stops doubling after this many steps (no float overflow), capped or not


@dataclass(frozen=True)
class Policy:
    free: int
    base_s: float
    max_s: float
    window_s: float

    def __post_init__(self) -> None:
        if self.free < 1:
            raise ValueError(f"free: must be >= 1, got {self.free}")
        for name in ("base_s", "max_s", "window_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name}: must be a finite number of seconds, got {getattr(self, name)}")
        if not 0 < self.base_s <= self.max_s <= self.window_s:
            raise ValueError(f"backoff: need 0 < base_s <= max_s <= window_s, got {self.base_s}, {self.max_s}, "
                             f"{self.window_s}")

    def delay_after(self, attempts: int) -> float:
        """Seconds the next attempt must wait after ``attempts`` attempts in a row."""
        if attempts < self.free:
            return 0.0
        return min(self.base_s * 2 ** min(attempts - self.free, _DOUBLINGS), self.max_s)

    @property
    def _last_delay(self) -> float:
        """The delay every attempt past the tiers waits: the cap, or where the doubling stops short of it."""
        return self.delay_after(self.free + _DOUBLINGS)

    def _tiers(self) -> list[tuple[int, float]]:
        # up to the last delay, not the cap: a base so small that _DOUBLINGS doublings stay under the cap
        # (login_backoff_base_s = 1e-16) never reaches it, and the loop hung the event loop at the first login
        tiers, n, last = [], self.free, self._last_delay
        while (d := self.delay_after(n)) < last:
            tiers.append((n, d))
            n += 1
        return tiers

    def delay_sql(self, attempts):
        """``delay_after`` as a SQL expression of the column expression ``attempts``."""
        whens = [(attempts < self.free, 0.0)] + [(attempts == n, d) for n, d in self._tiers()]
        return case(*whens, else_=self._last_delay)


@dataclass(frozen=True)
class Budget:
    """``failures`` failed logins in a burst, refilled at ``failures`` per ``window_s``."""
    failures: int
    window_s: float

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"failures: must be >= 1, got {self.failures}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s: must be a positive finite number of seconds, got {self.window_s}")

    @property
    def interval_s(self) -> float:
        """What one failure costs: the budget gains one back every ``interval_s`` seconds."""
        return self.window_s / self.failures


def _derived_key(master_key: bytes, label: bytes) -> bytes:
    """A key for one purpose (``label``), derived from the master key and never stored."""
    return hmac.new(master_key, label, hashlib.sha256).digest()


def throttle_secret(master_key: bytes) -> bytes:
    """The key of the bucket names' HMAC."""
    return _derived_key(master_key, b"hearth/throttle-key/v1")


def bucket_hash(bucket: str, secret: bytes = b"") -> str:
    """The stored name of ``bucket``: HMAC-SHA256 under ``secret`` (the app always passes its
    ``throttle_secret``; without one, a plain SHA-256, which anyone can recompute from a guess)."""
    data = b"hearth/throttle|" + bucket.encode("utf-8", "surrogatepass")
    return hmac.new(secret, data, hashlib.sha256).hexdigest() if secret else hashlib.sha256(data).hexdigest()


def _insert_missing(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


_TRIES = 3


def account_hash(name: str, secret: bytes = b"") -> str:
    """The stored name (``AuthThrottle.account``) of the account ``name``, shared by its login buckets."""
    return bucket_hash("login-account|" + name, secret)


async def _take(db: AsyncSession, create, take, key: str) -> float | None:
    """Run ``create`` (insert the bucket's row unless there is one) then ``take`` (the conditional
    ``UPDATE ... RETURNING``) in the open transaction. None when ``take`` matched (the attempt may go ahead),
    else the row's ``blocked_until``.

    Another worker may delete the row between the statements (``sweep`` dropping an idle bucket, ``forget``
    after a right password): the update then matches nothing although nothing blocks. A vanished row is a
    fresh bucket, so the insert and the update run again; a row that keeps vanishing is still a fresh bucket,
    and a fresh bucket lets its first attempt through (``free`` and ``failures`` are at least 1)."""
    t = AuthThrottle
    for _ in range(_TRIES):
        await db.execute(create)
        if (await db.execute(take)).first() is not None:
            return None
        blocked = (await db.execute(select(t.blocked_until).where(t.key == key))).scalar_one_or_none()
        if blocked is not None:
            return blocked
    return None


async def attempt(db: AsyncSession, bucket: str, policy: Policy, *, now: float | None = None,
                  secret: bytes = b"", account: str | None = None) -> float:
    """Count one attempt in ``bucket``. Returns 0.0 when it may go ahead (it is then counted), else the
    seconds to wait (and it is not counted). ``account``: the name of the account a login bucket counts against
    (``forget_account`` deletes the bucket with it)."""
    now = time.time() if now is None else now
    key = bucket_hash(bucket, secret)
    # set by the update too: a row counted before the column was there gets it from its next counted attempt
    owner = {} if account is None else {"account": account_hash(account, secret)}
    insert = _insert_missing(db.get_bind().dialect.name)
    t = AuthThrottle
    now_p = bindparam("now", now, type_=Double())
    # SET expressions read the row's old values: a bucket idle for window_s starts again at 1
    counted = case((t.last_at < now - policy.window_s, 1), else_=t.attempts + 1)
    take = (update(t).where(t.key == key, t.blocked_until <= now_p)
            # (a free attempt leaves blocked_until alone: a parallel one that read the clock a moment
            # later must not make it refuse itself)
            .values(attempts=counted, last_at=now_p,
                    blocked_until=case((counted < policy.free, t.blocked_until),
                                       else_=now_p + policy.delay_sql(counted)), **owner)
            .returning(t.attempts))
    async with db.begin():
        blocked = await _take(db, insert(t).values(key=key, attempts=0, last_at=now, blocked_until=0.0, **owner)
                              .on_conflict_do_nothing(index_elements=[t.key]), take, key)
    return 0.0 if blocked is None else max(blocked - now, 0.001)


async def spend(db: AsyncSession, bucket: str, budget: Budget, *, now: float | None = None,
                secret: bytes = b"") -> float:
    """Take one unit of ``bucket``'s budget. Returns 0.0 when it may go ahead (it is then taken), else the seconds
    until one is there (and nothing is taken)."""
    now = time.time() if now is None else now
    key = bucket_hash(bucket, secret)
    insert = _insert_missing(db.get_bind().dialect.name)
    t = AuthThrottle
    now_p = bindparam("now", now, type_=Double())
    # the bucket's clock never runs back: a spend that read the clock a moment before a parallel one that got in
    # first counts as at that one's time (else, with the budget half spent, it would refuse itself for a moment)
    at = case((t.last_at > now_p, t.last_at), else_=now_p)
    full = at - (budget.window_s - budget.interval_s)  # the earliest blocked_until that matters: a full budget
    take = (update(t).where(t.key == key, t.blocked_until <= at)
            .values(attempts=case((t.last_at < now_p - budget.window_s, 1), else_=t.attempts + 1), last_at=at,
                    blocked_until=case((t.blocked_until > full, t.blocked_until), else_=full) + budget.interval_s)
            .returning(t.attempts))
    async with db.begin():
        blocked = await _take(db, insert(t).values(key=key, attempts=0, last_at=now, blocked_until=0.0)
                              .on_conflict_do_nothing(index_elements=[t.key]), take, key)
    return 0.0 if blocked is None else max(blocked - now, 0.001)


async def refund(db: AsyncSession, bucket: str, budget: Budget, *, secret: bytes = b"") -> None:
    """Give back the unit a ``spend`` took (the login was right, or was refused before its password was checked).
    Exact whatever was spent or refunded in between: both only move ``blocked_until`` by ``interval_s``. A row
    another worker deleted meanwhile (a sweep) is a full budget: nothing to give back, the update matches nothing."""
    t = AuthThrottle
    async with db.begin():
        await db.execute(update(t).where(t.key == bucket_hash(bucket, secret))
                         .values(attempts=case((t.attempts > 0, t.attempts - 1), else_=0),
                                 blocked_until=t.blocked_until - budget.interval_s))


async def uncount(db: AsyncSession, bucket: str, at: float, *, secret: bytes = b"") -> None:
    """Give back the attempt ``attempt(..., now=at)`` counted (it ended on an error before its password was judged):
    one attempt fewer, and no delay from it. Only while that attempt is still the bucket's last: one counted after it
    keeps its delay, and this one then stays counted (as it was before there was an uncount). A row another worker
    deleted meanwhile is a fresh bucket: the update matches nothing."""
    t = AuthThrottle
    at_p = bindparam("at", at, type_=Double())
    async with db.begin():
        await db.execute(update(t).where(t.key == bucket_hash(bucket, secret), t.last_at == at_p)
                         .values(attempts=case((t.attempts > 0, t.attempts - 1), else_=0),
                                 # it went ahead at ``at``: nothing blocked the bucket then
                                 blocked_until=case((t.blocked_until > at_p, at_p), else_=t.blocked_until)))


async def forget(db: AsyncSession, bucket: str, *, secret: bytes = b"") -> None:
    """A successful login: the bucket starts from zero."""
    async with db.begin():
        await db.execute(delete(AuthThrottle).where(AuthThrottle.key == bucket_hash(bucket, secret)))


async def forget_account(db: AsyncSession, name: str, *, secret: bytes = b"") -> None:
    """The account ``name`` is deleted: delete its login buckets, every client's. Runs in the caller's OPEN
    transaction (the deletion's), so the buckets go exactly when the account does."""
    await db.execute(delete(AuthThrottle).where(AuthThrottle.account == account_hash(name, secret)))


async def sweep(db: AsyncSession, *policies: Policy | Budget, now: float | None = None) -> int:
    """Delete buckets idle for longer than the longest window (they would start from zero anyway; a budget idle
    for its window is full)."""
    now = time.time() if now is None else now
    window = max(p.window_s for p in policies)
    async with db.begin():
        gone = await db.execute(delete(AuthThrottle).where(AuthThrottle.last_at < now - window,
                                                           AuthThrottle.blocked_until < now))
    return gone.rowcount


# ------------------------------------------------------------------------------ client address
def parse_networks(values: Iterable[str], field: str = "forwarded_allow_ips") -> list[Network]:
    """IP addresses / CIDR networks; ValueError naming ``field`` for a bad entry."""
    out = []
    for v in values:
        try:
            out.append(ipaddress.ip_network(str(v).strip(), strict=False))
        except ValueError:
            raise ValueError(f"{field}: {v!r} is not an IP address or network") from None
    return out


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address, an IPv4-mapped IPv6 one (``::ffff:a.b.c.d``, a dual-stack socket's peer) as its IPv4."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip


def _trusted(address: str, trusted: list[Network]) -> bool:
    ip = _ip(address)
    return ip is not None and any(ip in net for net in trusted)


IPV6_CLIENT_PREFIX = 64


def client_key(address: str) -> str:
    """What a client address counts as in a bucket: an IPv4 address itself, an IPv6 address its /64 (one host
    is handed a whole /64: keyed by the full address, a guesser takes a fresh one per guess and is never slowed),
    an IPv4-mapped IPv6 address its IPv4. Anything else (not an IP) as it is."""
    ip = _ip(address)
    if ip is None:
        return address
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(ip)


def client_address(peer: str, forwarded_for: str | None, trusted: list[Network]) -> str:
    """The client's address: ``peer`` unless it is a trusted proxy, then the right-most untrusted
    ``X-Forwarded-For`` hop (left-most when every hop is trusted)."""
    if not trusted or not forwarded_for or not _trusted(peer, trusted):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop
    return hops[0] if hops else peer


# ------------------------------------------------------------------------------ device cookie
def _device_mac(secret: bytes, user_id: str, epoch: int, nonce: str) -> str:
    return hmac.new(secret, f"hearth/device/v2|{user_id}|{epoch}|{nonce}".encode(), hashlib.sha256).hexdigest()[:32]


def device_secret(master_key: bytes) -> bytes:
    """The key that signs device cookies."""
    return _derived_key(master_key, b"hearth/device-cookie-key/v1")


def new_device_cookie(secret: bytes, user_id: str, epoch: int) -> str:
    """A device cookie for a browser that logged in as the account ``user_id`` while its device epoch was ``epoch``."""
    nonce = secrets.token_urlsafe(16)
    return f"{nonce}.{_device_mac(secret, user_id, epoch, nonce)}"


def known_device(secret: bytes, user_id: str, epoch: int, cookie: str | None) -> str | None:
    """The device id when ``cookie`` was issued to a browser that logged in as the account ``user_id`` since its
    device epoch became ``epoch`` (its last password change), else None."""
    if not cookie or len(cookie) > 100 or "." not in cookie:
        return None
    nonce, mac = cookie.rsplit(".", 1)
    if hmac.compare_digest(mac.encode(), _device_mac(secret, user_id, epoch, nonce).encode()):
        return nonce
    return None


# ------------------------------------------------------------------------------ the app's keys, in one place
@dataclass(frozen=True)
class Throttle:
    """The functions above with the app's two keys bound (both derived from the master key): the routes call
    these, so no call site passes a key, and none can forget one."""
    secret: bytes = field(repr=False)  # keys the bucket names (throttle_secret)
    device_key: bytes = field(repr=False)  # signs device cookies (device_secret)

    @classmethod
    def for_master_key(cls, master_key: bytes) -> "Throttle":
        return cls(secret=throttle_secret(master_key), device_key=device_secret(master_key))

    async def attempt(self, db: AsyncSession, bucket: str, policy: Policy, *, now: float | None = None,
                      account: str | None = None) -> float:
        return await attempt(db, bucket, policy, now=now, secret=self.secret, account=account)

    async def forget_account(self, db: AsyncSession, name: str) -> None:
        await forget_account(db, name, secret=self.secret)

    async def forget(self, db: AsyncSession, bucket: str) -> None:
        await forget(db, bucket, secret=self.secret)

    async def uncount(self, db: AsyncSession, bucket: str, at: float) -> None:
        await uncount(db, bucket, at, secret=self.secret)

    async def spend(self, db: AsyncSession, bucket: str, budget: Budget, *, now: float | None = None) -> float:
        return await spend(db, bucket, budget, now=now, secret=self.secret)

    async def refund(self, db: AsyncSession, bucket: str, budget: Budget) -> None:
        await refund(db, bucket, budget, secret=self.secret)

    def new_device_cookie(self, user_id: str, epoch: int) -> str:
        return new_device_cookie(self.device_key, user_id, epoch)

    def known_device(self, user_id: str, epoch: int, cookie: str | None) -> str | None:
        return known_device(self.device_key, user_id, epoch, cookie)
