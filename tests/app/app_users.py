"""A user signed up straight through the account service (no HTTP, no page): the stored row and the user's cipher,
for the storage and service tests on either backend; sqlite_user: a fresh database with one, for the corpus tests that
run the app's own code."""

from __future__ import annotations

import contextlib
import os

from sqlalchemy import select

from hearth.app import accounts, crypto
from hearth.app.storage import create_database, upgrade
from hearth.app.storage.models import User

PASSWORD = "correct horse battery"


async def signed_up(db, master_key, name: str = "alice", ttl_s: int = 3600) -> tuple[User, crypto.UserCipher]:
    """Sign `name` up on `db` (its own transaction), then read the user back in another: (User, UserCipher)."""
    async with db.sessions() as s:
        new = await accounts.signup(s, username=name, password=PASSWORD, master_key=master_key, ttl_s=ttl_s)
    async with db.sessions() as s:
        user = (await s.execute(select(User).where(User.id == new.user_id))).scalar_one()
    return user, crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)


@contextlib.asynccontextmanager
async def sqlite_user(tmp_path, name: str = "alice"):
    """A fresh SQLite file under tmp_path at the newest schema, a new master key and one user signed up on it: yields
    (database, the user's cipher); the database is disposed of on the way out."""
    db = create_database(f"sqlite+aiosqlite:///{tmp_path / 'hearth.sqlite3'}")
    try:
        await upgrade(db.engine)
        key = crypto.parse_master_key(crypto.new_master_key_text())
        yield db, (await signed_up(db, key, name))[1]
    finally:
        await db.dispose()


def left_in_sqlite_files(db, blobs) -> list:
    """The ciphertexts among ``blobs`` of which a 32-byte slice of the body is still in the SQLite file or its -wal
    (what a deleted or overwritten text must not leave behind; SQLite only)."""
    path = db.engine.url.database
    on_disk = b"".join(open(p, "rb").read() for p in (path, path + "-wal") if os.path.exists(p))
    return [b for b in blobs if bytes(b[13:45]) in on_disk]
