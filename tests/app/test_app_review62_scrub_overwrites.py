"""Every write that deletes or overwrites a user's text scrubs the SQLite files as a permanent delete does: clearing
or rewriting the shared context, rewriting a companion's persona or name, and the memory cap dropping the oldest
memories left the old ciphertexts in the WAL (and its page copies) until SQLite's next automatic checkpoint."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from hearth.app import companions
from hearth.app.storage.models import Companion, Memory, User
from tests.app.app_fakes import FakeModel
from tests.app.app_users import left_in_sqlite_files, signed_up

pytestmark = pytest.mark.anyio

TURN = dict(max_chars=4000, turns=20, prompt_memories=30, deadline_s=5.0)


def _sqlite_only(db) -> None:
    if db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite file layout only")


async def _shared_context_ct(db, user_id: str) -> bytes | None:
    async with db.sessions() as s:
        return (await s.execute(select(User.shared_context_ct).where(User.id == user_id))).scalar_one()


@pytest.mark.parametrize("new_text", ["", "something else entirely, and longer than before"])
async def test_replaced_shared_context_does_not_linger(db, master_key, new_text):
    _sqlite_only(db)
    cipher = (await signed_up(db, master_key))[1]
    async with db.sessions() as s:
        await companions.set_shared_context(s, cipher, "my sister's name is Ada and I am afraid of her")
    old = await _shared_context_ct(db, cipher.user_id)
    assert old and left_in_sqlite_files(db, [old])  # written: found in the files before the change
    async with db.sessions() as s:
        await companions.set_shared_context(s, cipher, new_text)
        assert await companions.get_shared_context(s, cipher) == new_text
    assert not left_in_sqlite_files(db, [old]), "the old shared context is still in the database files"


async def test_rewritten_persona_and_name_do_not_linger(db, master_key):
    _sqlite_only(db)
    cipher = (await signed_up(db, master_key))[1]
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="a friend who knows about my divorce",
                                                 name="Confidant")
    async with db.sessions() as s:
        old = list((await s.execute(select(Companion.persona_ct, Companion.name_ct)
                                    .where(Companion.id == comp.id))).one())
    assert left_in_sqlite_files(db, old)
    async with db.sessions() as s:
        await companions.update_companion(s, cipher, comp.id, world_view="grounded", share_context=True,
                                          persona="a cheerful neighbour", name="Neighbour")
        view = await companions.get_companion(s, cipher, comp.id)
    assert (view.persona, view.name) == ("a cheerful neighbour", "Neighbour")
    assert not left_in_sqlite_files(db, old), "the old persona or name is still in the database files"


async def test_memories_dropped_by_the_cap_do_not_linger(db, master_key, monkeypatch):
    _sqlite_only(db)
    monkeypatch.setattr(companions, "MAX_MEMORIES_KEPT", 2)
    cipher = (await signed_up(db, master_key))[1]
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        await companions.chat_turn(s, FakeModel(), cipher, comp.id, "my name is Ann", **TURN)
    async with db.sessions() as s:
        first = (await s.execute(select(Memory.text_ct).where(Memory.companion_id == comp.id))).scalars().all()
    assert len(first) == 1 and left_in_sqlite_files(db, first)
    async with db.sessions() as s:
        for name in ("Bo", "Cy"):
            await companions.chat_turn(s, FakeModel(), cipher, comp.id, f"my name is {name}", **TURN)
        assert await companions.memories(s, cipher, comp.id) == ["The user's name is Bo", "The user's name is Cy"]
    assert not left_in_sqlite_files(db, first), "the memory the cap dropped is still in the database files"
