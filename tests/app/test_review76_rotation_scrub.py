"""A master-key rotation re-wraps every user's data key, but left the data keys wrapped under the OLD master key in
the SQLite files: the users rows' page copies stayed in the WAL (and the overwritten cells in their pages) until
SQLite's next automatic checkpoint happened to go over them. A rotation is done because the old key may be known to
someone; whoever has it and a copy of the files still opened every user's data key, so every text. Every other write
that overwrites what protects a user's text scrubs the files (hearth.app.storage.db.scrub_deleted); the rotation now
does too."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from hearth.app import crypto
from hearth.app.keys import rotate_master_key
from hearth.app.storage.models import User
from tests.app.app_users import left_in_sqlite_files, signed_up

pytestmark = pytest.mark.anyio


async def test_rotation_leaves_no_key_wrapped_under_the_old_master_key(db, master_key):
    if db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite file layout only")
    for name in ("alice", "bob", "carol"):
        await signed_up(db, master_key, name)
    async with db.sessions() as s:
        old = (await s.execute(select(User.wrapped_key))).scalars().all()
    assert len(old) == 3 and left_in_sqlite_files(db, old)  # written: found in the files before the rotation
    new_master = crypto.parse_master_key(crypto.new_master_key_text())
    assert await rotate_master_key(db, master_key, new_master) == 3
    async with db.sessions() as s:
        users = (await s.execute(select(User))).scalars().all()
    for user in users:  # every data key opens under the new master key, as before
        crypto.unwrap_data_key(new_master, user.wrapped_key, user.id)
    assert not left_in_sqlite_files(db, old), "data keys wrapped under the old master key are still in the files"
