"""Review 52a: the chat turn, the situation and the rehearsal turn save a resend once through one helper
(common.once_per_submission). These call each save as a resend that raced the first does, after the look-up
found nothing: the unique index refuses the rows and the saved answer comes back, or a 409 for another text."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from hearth.app import companions, simulation
from hearth.app.common import InputError, once_per_submission
from hearth.app.storage.models import Companion, Message, Reading, RehearsalTurn, Situation, new_id, utcnow
from tests.app.app_fakes import FakeModel
from tests.app.app_users import signed_up
from tests.app.conftest import save_rehearsal_turn

pytestmark = pytest.mark.anyio


async def _user(db, master_key):
    return (await signed_up(db, master_key))[1]


async def _count(db, model) -> int:
    async with db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model))).scalar_one()


async def _reply():
    return (await FakeModel().complete([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}],
                                       kind="chat")).envelope


async def test_a_chat_turn_saved_again_with_its_id_comes_back_replayed_and_counts_once(db, master_key):
    cipher, sid = await _user(db, master_key), uuid.uuid4().hex
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        ctx = await companions.load_chat_context(s, cipher, comp.id, 10)
    reply = await _reply()
    async with db.sessions() as s:
        first = await companions.save_turn(s, cipher, ctx, "hello", reply, "fake", sid)
    async with db.sessions() as s:
        again = await companions.save_turn(s, cipher, ctx, "hello", reply, "other", sid)
        assert again.replayed and not first.replayed and again.new_memories == []
        assert (again.user_message.id, again.reply.id, again.provider) == (first.user_message.id, first.reply.id,
                                                                           "fake")
        assert again.standing == first.standing
        with pytest.raises(InputError, match="submission_id: was already used for another message"):
            await companions.save_turn(s, cipher, ctx, "goodbye", reply, "fake", sid)
        # the session is still usable after the refused transactions
        assert await companions.saved_turn(s, cipher, comp.id, sid, "hello") == again
    assert await _count(db, Message) == 2
    async with db.sessions() as s:  # the refused turns' affection/trust rolled back with them
        assert (await s.execute(select(Companion.affection).where(Companion.id == comp.id))).scalar_one() == \
            reply.affection


async def test_a_situation_saved_again_with_its_id_comes_back_replayed(db, master_key):
    cipher, sid = await _user(db, master_key), uuid.uuid4().hex
    results = await simulation.run_panel(FakeModel(), "", "x", 5.0)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        first = await simulation.store_situation(s, cipher, comp.id, "Priya ignored me.", results, sid)
    async with db.sessions() as s:
        again = await simulation.store_situation(s, cipher, comp.id, "Priya ignored me.", results[:2], sid)
        assert again.replayed and not first.replayed
        assert (again.id, again.text, [r.analyst for r in again.results]) == (
            first.id, "Priya ignored me.", [r.analyst for r in results])
        with pytest.raises(InputError, match="submission_id"):
            await simulation.store_situation(s, cipher, comp.id, "Priya emailed me.", results, sid)
        assert await simulation.saved_situation(s, cipher, comp.id, sid, "Priya ignored me.") == again
    assert (await _count(db, Situation), await _count(db, Reading)) == (1, len(results))


async def test_a_rehearsal_turn_saved_again_with_its_id_comes_back_replayed(db, master_key):
    cipher, sid = await _user(db, master_key), uuid.uuid4().hex
    results = await simulation.run_panel(FakeModel(), "", "x", 5.0)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        agent = await simulation.create_agent(s, cipher, name="Sam", personality="p", backstory="b", relationship="r")
        rid = await simulation.start_rehearsal(s, cipher, comp.id, agent.id)
        first = await save_rehearsal_turn(s, cipher, rid, "hi", "hello", results, sid)
    async with db.sessions() as s:
        again = await save_rehearsal_turn(s, cipher, rid, "hi", "another reply", [], sid)
        assert again.replayed and not first.replayed
        assert (again.id, again.role, again.text, len(again.results)) == (first.id, "agent", "hello", len(results))
        with pytest.raises(InputError, match="submission_id"):
            await save_rehearsal_turn(s, cipher, rid, "hey", "hello", results, sid)
        assert await simulation.saved_rehearsal_turn(s, cipher, rid, sid, "hi") == again
    assert (await _count(db, RehearsalTurn), await _count(db, Reading)) == (2, len(results))


async def test_an_integrity_error_with_nothing_saved_under_the_id_propagates(db, master_key):
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
    looked_up = []

    async def find(sid):
        looked_up.append(sid)
        return None

    def clash():  # a row whose primary key is taken: another constraint than the submission's index
        row = Message(id=new_id(), user_id=cipher.user_id, companion_id=comp.id, role="user", created_at=utcnow())
        row.body_ct = b"x"
        return row

    taken = clash()
    async with db.sessions() as s:
        async with s.begin():
            s.add(taken)

    for sid in (None, uuid.uuid4().hex):
        async with db.sessions() as s:
            async def write():
                twin = clash()
                twin.id = taken.id
                s.add(twin)
                await s.flush()

            with pytest.raises(IntegrityError):
                await once_per_submission(s, sid, "x", find, write)
            assert await once_per_submission(s, sid, "x", find) is None  # the session is usable again
    assert looked_up == [looked_up[0]] * 2 and looked_up[0] is not None  # no id: nothing to look up
    assert await _count(db, Message) == 1
