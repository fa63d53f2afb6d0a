"""Account control: change the password, export everything (decrypted JSON), delete the account.

    new = await change_password(db, user, current=..., new=..., ttl_s=...)   # every other session ends
    data = await export(db, cipher)                                          # a JSON-ready dict
    await delete_account(db, user, password=...)                             # every row and the data key

Deleting removes the user row; every other row of the user goes with it (ON DELETE CASCADE), including
the wrapped data key, so any copy of a ciphertext left anywhere (a backup, a free database page) can no
longer be decrypted even with the master key. On SQLite the deleted pages are zeroed (secure_delete) and
the WAL is checkpointed and truncated. On PostgreSQL the deleted rows stay in the table files as dead
tuples until VACUUM marks their space free, and their bytes remain until the space is reused (VACUUM
FULL rewrites the table); WAL archives and backups keep them as long as they are kept. What they hold
is ciphertext plus the wrapped data key: see docs/app.md for the operator's side.
"""

from __future__ import annotations

import asyncio
from datetime import timezone
from typing import Any

from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, select, update

from hearth.app import accounts
from hearth.app.companions import history, list_companions, memories, get_shared_context
from hearth.app.crypto import UserCipher
from hearth.app.feed import list_posts
from hearth.app.simulation import get_rehearsal, list_agents, list_rehearsals, list_situations
from hearth.app.storage.db import scrub_deleted
from hearth.app.storage.models import Session, User
from hearth.app.throttle import Throttle

ALL = 10**9  # "no limit" for the list functions


async def _password_ok(user: User, password: str) -> bool:
    try:
        return await asyncio.to_thread(accounts._hasher.verify, user.password_hash, password or "")
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def change_password(db, user: User, *, current: str, new: str, ttl_s: int) -> accounts.NewSession:
    """Set a new password after checking the current one. Every session of the user ends and one new
    session (for the browser that asked) is returned; the device epoch moves on, so every device cookie issued
    before stops counting as the account's browser (hearth.app.throttle). AccountError naming the field otherwise."""
    checked = user.password_hash  # loaded with the session, before the slow check: it may be stale by the write
    if not await _password_ok(user, current):
        raise accounts.AccountError("current_password", "is not your current password")
    try:
        accounts._check_password(new)
    except accounts.AccountError as exc:
        raise accounts.AccountError("new_password", exc.reason) from None
    if new == current:
        raise accounts.AccountError("new_password", "is the same as the current one")
    pw_hash = await asyncio.to_thread(accounts._hasher.hash, new)
    async with db.begin():
        # only over the hash just checked: a password changed meanwhile (by the owner, ending this very session) must
        # not be replaced by whoever still knows the old one; nothing is written then (and the viewer's rows stay
        # loaded for the error page, as no rollback expires them)
        epoch = (await db.execute(update(User).where(User.id == user.id, User.password_hash == checked)
                                  .values(password_hash=pw_hash, device_epoch=User.device_epoch + 1)
                                  .returning(User.device_epoch))).scalar_one_or_none()
        if epoch is not None:
            await db.execute(delete(Session).where(Session.user_id == user.id))
            row, fresh = accounts._session_row(user.id, ttl_s, epoch)
            db.add(row)
    if epoch is None:
        raise accounts.AccountError("current_password", "was changed meanwhile (or the account deleted): log in again")
    return fresh


async def delete_account(db, user: User, *, password: str, throttle: Throttle | None = None) -> None:
    """Delete the user and every row they own, for good (see the module docstring). With ``throttle`` (the app's),
    the login throttle buckets of the username go in the same transaction: an account signed up again under the
    name starts with none."""
    checked = user.password_hash  # loaded with the session, before the slow check: it may be stale by the delete
    name = user.username
    if not await _password_ok(user, password):
        raise accounts.AccountError("password", "is not your password")
    async with db.begin():
        # only while the hash just checked is the account's: a password changed meanwhile (by the owner, ending this
        # very session) must not let whoever still knows the old one delete the account
        gone = await db.execute(delete(User).where(User.id == user.id, User.password_hash == checked))
        still = None
        if gone.rowcount != 1:
            still = (await db.execute(select(User.id).where(User.id == user.id))).scalar_one_or_none()
        elif throttle is not None:
            await throttle.forget_account(db, name)
    if gone.rowcount != 1:
        if still is not None:  # raised after the (empty) transaction: no rollback expires the viewer's rows
            raise accounts.AccountError("password", "was changed meanwhile: log in again")
        raise accounts.AccountError("account", "no longer exists")
    await scrub_deleted(db)


def _when(dt) -> str:
    """ISO 8601 with the UTC offset: SQLite hands the stored UTC times back without their zone (PostgreSQL
    keeps it), and a time without one is read as local time by whatever imports it."""
    if dt is None:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).isoformat()


def _reading(r) -> dict:
    return {"analyst": r.analyst, "ok": r.ok, "reading": r.reading, "advice": r.advice, "risk": r.risk,
            "error": r.error}


async def export(db, cipher: UserCipher, user: User) -> dict[str, Any]:
    """Everything the user wrote or was written for them, decrypted, as one JSON-ready dict."""
    out: dict[str, Any] = {"format": "hearth-export/1", "username": user.username,
                           "created_at": _when(user.created_at), "shared_context": await get_shared_context(db, cipher),
                           "companions": [], "agents": [], "posts": []}
    for c in await list_companions(db, cipher):
        rehearsals = []
        for rid, _name in await list_rehearsals(db, cipher, c.id):
            view = await get_rehearsal(db, cipher, rid)
            rehearsals.append({"id": rid, "agent_id": view.agent.id, "turns": [
                {"role": t.role, "text": t.text, "created_at": _when(t.created_at),
                 **({"mood": t.mood, "suggested_actions": t.suggestions} if t.role == "agent" else {}),
                 "panel": [_reading(r) for r in t.results]} for t in view.turns]})
        out["companions"].append({
            "id": c.id, "name": c.name, "persona": c.persona, "world_view": c.world_view,
            "share_context": c.share_context, "affection": c.affection, "trust": c.trust,
            "messages": [{"role": m.role, "text": m.text, "mood": m.mood, "suggested_actions": m.suggestions,
                          "created_at": _when(m.created_at)} for m in await history(db, cipher, c.id, limit=ALL)],
            "memories": await memories(db, cipher, c.id),
            "situations": [{"text": s.text, "created_at": _when(s.created_at), "panel": [_reading(r) for r in s.results]}
                           for s in await list_situations(db, cipher, c.id, limit=ALL)],
            "rehearsals": rehearsals})
    out["agents"] = [{"id": a.id, "name": a.name, "personality": a.personality, "backstory": a.backstory,
                      "relationship": a.relationship} for a in await list_agents(db, cipher)]
    out["posts"] = [{"text": p.text, "created_at": _when(p.created_at), "comments": [
        {"companion_id": cm.companion_id, "companion": cm.companion_name, "text": cm.text, "tone": cm.tone}
        for cm in p.comments]} for p in await list_posts(db, cipher, limit=ALL)]
    return out
