"""Master-key rotation: re-wrap every user's data key under a new master key.

Only the small wrapped data keys change; no message, post or memory is re-encrypted, because they
are sealed under the per-user data keys, which stay the same. All users are re-wrapped in ONE
transaction, so a crash leaves either every key under the old master or every key under the new one. On SQLite the
files are then scrubbed (storage.db.scrub_deleted): the keys wrapped under the old master key, which the rotation is
done to retire, must not stay behind in the WAL's page copies.

    n = await rotate_master_key(db, old_master_key, new_master_key)

At start-up the app calls it when HEARTH_PREVIOUS_MASTER_KEY is set (idempotent: only rows still
wrapped under the previous key are touched).
"""

from __future__ import annotations

from sqlalchemy import select

from hearth.app import crypto
from hearth.app.storage.db import Database, scrub_deleted
from hearth.app.storage.models import User


async def rotate_master_key(db: Database, old_master_key: bytes, new_master_key: bytes) -> int:
    """Re-wrap the data keys wrapped under ``old_master_key``; returns how many users were rotated.

    Raises DecryptError (and changes nothing) if any of those keys does not unwrap under the old key.
    """
    old_id, new_id = crypto.master_key_id(old_master_key), crypto.master_key_id(new_master_key)
    if old_id == new_id:
        raise ValueError("new_master_key: is the same key as old_master_key")
    async with db.sessions() as session:
        async with session.begin():
            users = (await session.execute(select(User).where(User.master_key_id == old_id))).scalars().all()
            for user in users:
                user.wrapped_key = crypto.rewrap_data_key(old_master_key, new_master_key, user.wrapped_key, user.id)
                user.master_key_id = new_id
        if users:  # the old page copies in SQLite's WAL still hold the keys wrapped under the old master key
            await scrub_deleted(session)
        return len(users)
