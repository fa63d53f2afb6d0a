"""Storage and services on both backends (SQLite file and PostgreSQL): migrations, atomic signup,
atomic chat turns, permanent clearing, ciphertexts bound to their row, key rotation, the panel,
rehearsal and the feed."""

from __future__ import annotations

import asyncio
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import func, select, text, update

from hearth import prompts
from hearth.app import accounts, companions, crypto, feed, simulation
from hearth.app.common import NotFound
from hearth.app.keys import rotate_master_key
from hearth.app.storage import upgrade
from hearth.app.storage.migrate import alembic_config
from hearth.app.storage.models import Base, Companion, Memory, Message, Reading, RehearsalTurn, Session, User
from tests.app.app_fakes import FakeModel, analyst_of
from tests.app.app_users import left_in_sqlite_files, signed_up

pytestmark = pytest.mark.anyio


async def _user(db, master_key, name="alice"):
    return (await signed_up(db, master_key, name))[1]


async def _count(db, model, *where) -> int:
    async with db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model).where(*where))).scalar_one()


TURN = dict(max_chars=4000, turns=20, prompt_memories=30, deadline_s=5.0)


async def test_migrations_match_models_and_are_idempotent(db):
    await upgrade(db.engine)  # second run: nothing to do, no error
    async with db.engine.connect() as conn:
        diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
        version = (await conn.execute(text("select version_num from alembic_version"))).scalar_one()
    assert diff == [], f"migrations and models disagree: {diff}"
    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head() == "0010"


async def test_signup_is_atomic_and_login_works(db, master_key):
    await _user(db, master_key, "alice")
    assert await _count(db, User) == 1 and await _count(db, Session) == 1
    async with db.sessions() as s:
        with pytest.raises(accounts.AccountError, match="username: is taken"):
            await accounts.signup(s, username="Alice", password="another password!", master_key=master_key, ttl_s=60)
    # the failed signup left nothing behind: no user without a session, no session without a user
    assert await _count(db, User) == 1 and await _count(db, Session) == 1
    async with db.sessions() as s:
        assert await accounts.login(s, username="alice", password="wrong password", ttl_s=60) is None
        new = await accounts.login(s, username="ALICE ", password="correct horse battery", ttl_s=60)
    assert new is not None
    async with db.sessions() as s:
        found = await accounts.session_user(s, new.token)
    assert found is not None and found[1].username == "alice"
    async with db.sessions() as s:
        await accounts.logout(s, new.token)
        assert await accounts.session_user(s, new.token) is None


@pytest.mark.parametrize("username,password,field", [("ab", "long enough pw", "username"),
                                                     ("ok_name", "short", "password"),
                                                     ("bad name!", "long enough pw", "username")])
async def test_signup_rejects_bad_input_naming_the_field(db, master_key, username, password, field):
    async with db.sessions() as s:
        with pytest.raises(accounts.AccountError) as info:
            await accounts.signup(s, username=username, password=password, master_key=master_key, ttl_s=60)
    assert info.value.field == field
    assert await _count(db, User) == 0


async def test_chat_turn_saves_everything_in_one_transaction(db, master_key):
    cipher = await _user(db, master_key)
    model = FakeModel()
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren", world_view="playful")
        await companions.set_shared_context(s, cipher, "I work night shifts at a bakery.")
        turn = await companions.chat_turn(s, model, cipher, comp.id, "Hi, my name is Robin", **TURN)
    assert turn.reply.text == "Echo: Hi, my name is Robin"
    assert turn.new_memories == ["The user's name is Robin"]
    # the prompt the model saw: the production companion prompt with the shared context and stage
    kind, messages = model.calls[-1]
    assert kind == "chat" and "night shifts at a bakery" in messages[0]["content"]
    assert prompts.STAGES["stranger"] in messages[0]["content"]
    async with db.sessions() as s:
        hist = await companions.history(s, cipher, comp.id)
        mems = await companions.memories(s, cipher, comp.id)
        second = await companions.chat_turn(s, model, cipher, comp.id, "And again", **TURN)
        comp2 = await companions.get_companion(s, cipher, comp.id)
    assert [(m.role, m.text) for m in hist] == [("user", "Hi, my name is Robin"),
                                                ("companion", "Echo: Hi, my name is Robin")]
    assert mems == ["The user's name is Robin"]
    assert second.new_memories == []
    assert (comp2.affection, comp2.trust) == (2, 2)
    # the second prompt carries the memory and the earlier turns
    _, messages = model.calls[-1]
    assert "The user's name is Robin" in messages[0]["content"]
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]


async def test_two_turns_at_once_that_learn_the_same_thing_keep_it_once(db, master_key):
    # both turns read the memories before either saved (two tabs, a double send): each saw none and each saved
    # "The user's name is Robin", which then filled two of the chat's memory slots and the prompt twice
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        ctx = await companions.load_chat_context(s, cipher, comp.id, 10)
    reply = (await FakeModel().complete([{"role": "system", "content": "x"},
                                         {"role": "user", "content": "Hi, my name is Robin"}], kind="chat")).envelope
    assert list(reply.memories) == ["The user's name is Robin"]

    async def save(text):
        async with db.sessions() as s:
            return await companions.save_turn(s, cipher, ctx, text, reply, "fake")

    results = await asyncio.gather(save("Hi, my name is Robin"), save("Hi again, I'm Robin"))
    assert sorted(len(r.new_memories) for r in results) == [0, 1]
    async with db.sessions() as s:
        assert await companions.memories(s, cipher, comp.id) == ["The user's name is Robin"]
    assert await _count(db, Message) == 4  # both turns were saved, only the memory is not doubled


async def test_failed_reply_writes_nothing(db, master_key):
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="sol")
        with pytest.raises(RuntimeError, match="fake failure"):
            await companions.chat_turn(s, FakeModel(fail={"chat"}), cipher, comp.id, "hello", **TURN)
    assert await _count(db, Message) == 0
    assert (await _count(db, Companion, Companion.affection != 0)) == 0


async def test_turn_for_a_companion_deleted_meanwhile_is_rolled_back(db, master_key):
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="juno")
        ctx = await companions.load_chat_context(s, cipher, comp.id, 10)
        await companions.delete_companion(s, cipher.user_id, comp.id)
        reply = (await FakeModel().complete([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}],
                                            kind="chat")).envelope
        with pytest.raises(NotFound):
            await companions.save_turn(s, cipher, ctx, "hi", reply, "fake")
    assert await _count(db, Message) == 0


async def test_clear_chat_deletes_rows_for_good(db, master_key):
    cipher = await _user(db, master_key)
    model = FakeModel()
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="mina")
        other = await companions.create_companion(s, cipher, persona="sol")
        for i in range(3):
            await companions.chat_turn(s, model, cipher, comp.id, f"my name is N{i}", **TURN)
        await companions.chat_turn(s, model, cipher, other.id, "kept", **TURN)
        assert await companions.clear_chat(s, cipher.user_id, comp.id) == 6
    assert await _count(db, Message, Message.companion_id == comp.id) == 0
    assert await _count(db, Memory, Memory.companion_id == comp.id) == 0
    assert await _count(db, Message, Message.companion_id == other.id) == 2  # other chats untouched
    async with db.sessions() as s:
        with pytest.raises(NotFound):
            await companions.clear_chat(s, "0" * 32, comp.id)


@pytest.mark.parametrize("how", ["clear chat", "delete companion"])
async def test_cleared_ciphertexts_do_not_linger_in_the_sqlite_files(db, master_key, how):
    # the data key outlives the chat, so a deleted ciphertext left in a free page would still decrypt
    if db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite file layout only")
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="mina")
        for i in range(3):
            await companions.chat_turn(s, FakeModel(), cipher, comp.id, f"secret number {i}", **TURN)
    async with db.sessions() as s:
        blobs = (await s.execute(select(Message.body_ct).where(Message.companion_id == comp.id))).scalars().all()
        blobs += (await s.execute(select(Memory.text_ct).where(Memory.companion_id == comp.id))).scalars().all()
    assert len(blobs) >= 6
    async with db.sessions() as s:
        if how == "clear chat":
            await companions.clear_chat(s, cipher.user_id, comp.id)
        else:
            await companions.delete_companion(s, cipher.user_id, comp.id)
    assert await _count(db, Message) == 0
    left = left_in_sqlite_files(db, blobs)
    assert not left, f"{len(left)} of {len(blobs)} cleared ciphertexts still in the database files"


async def test_ciphertexts_are_bound_to_their_row_and_user(db, master_key):
    alice = await _user(db, master_key, "alice")
    bob = await _user(db, master_key, "bob")
    model = FakeModel()
    async with db.sessions() as s:
        a = await companions.create_companion(s, alice, persona="wren")
        b = await companions.create_companion(s, bob, persona="wren")
        await companions.chat_turn(s, model, alice, a.id, "alice secret one", **TURN)
        await companions.chat_turn(s, model, bob, b.id, "bob secret", **TURN)
    async with db.sessions() as s, s.begin():
        a_msgs = (await s.execute(select(Message).where(Message.user_id == alice.user_id)
                                  .order_by(Message.created_at))).scalars().all()
        b_msg = (await s.execute(select(Message).where(Message.user_id == bob.user_id))).scalars().first()
        raw = [bytes(m.body_ct) for m in a_msgs]
        # swap two of alice's rows, and copy bob's ciphertext into one of alice's rows
        await s.execute(update(Message).where(Message.id == a_msgs[0].id).values(body_ct=raw[1]))
        await s.execute(update(Message).where(Message.id == a_msgs[1].id).values(body_ct=bytes(b_msg.body_ct)))
    async with db.sessions() as s:
        # moved ciphertexts do not open under their new rows: the history shows them unreadable, never as the text
        # of the row (or the user) they came from
        assert [m.text for m in await companions.history(s, alice, a.id)][:2] == [None, None]
    with pytest.raises(crypto.DecryptError):
        alice.decrypt("messages", a_msgs[0].id, "body_ct", raw[1])
    # bob's key cannot read alice's (original) ciphertext under alice's row id either
    with pytest.raises(crypto.DecryptError):
        bob.decrypt("messages", a_msgs[0].id, "body_ct", raw[0])
    assert alice.decrypt("messages", a_msgs[0].id, "body_ct", raw[0]) == "alice secret one"


async def test_key_rotation_rewraps_every_data_key(db, master_key):
    alice = await _user(db, master_key, "alice")
    await _user(db, master_key, "bob")
    async with db.sessions() as s:
        comp = await companions.create_companion(s, alice, persona="wren")
    new_key = crypto.parse_master_key(crypto.new_master_key_text())
    assert await rotate_master_key(db, master_key, new_key) == 2
    assert await rotate_master_key(db, master_key, new_key) == 0  # idempotent
    async with db.sessions() as s:
        user = (await s.execute(select(User).where(User.id == alice.user_id))).scalar_one()
    with pytest.raises(crypto.DecryptError):
        crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
    rotated = crypto.UserCipher.from_wrapped(new_key, user.wrapped_key, user.id)
    assert user.master_key_id == crypto.master_key_id(new_key)
    async with db.sessions() as s:  # data sealed before the rotation still opens
        assert (await companions.get_companion(s, rotated, comp.id)).name == "Wren"
    with pytest.raises(ValueError, match="new_master_key"):
        await rotate_master_key(db, new_key, new_key)


async def test_panel_runs_concurrently_and_one_failure_does_not_block_the_rest(db, master_key):
    cipher = await _user(db, master_key)
    model = FakeModel(fail={"cynic"}, hang={"gossiper"}, delay_s=0.2)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        await companions.set_shared_context(s, cipher, "My manager is called Priya.")
        shared = await simulation.panel_context(s, cipher, comp.id)
    # timeout_s 1.0: the FakeModel ignores deadline_s, so the hung gossiper is ended by run_panel's backstop at
    # timeout_s + 1.0 = 2 s; the 0.2 s answers keep 1.8 s of room for a stall on a loaded CI box
    timeout_s = 1.0
    t0 = time.monotonic()
    results = await simulation.run_panel(model, shared, "Priya ignored my email.", timeout_s=timeout_s)
    elapsed = time.monotonic() - t0
    assert [r.analyst for r in results] == list(prompts.ANALYSTS)
    status = {r.analyst: (r.ok, r.error) for r in results}
    assert status["cynic"] == (False, "Something went wrong while asking the model.")  # (class name: log)
    assert status["gossiper"] == (False, "The model took too long to answer.")
    assert all(status[a][0] for a in ("optimist", "mentor", "status_observer"))
    # structure, not the clock: all five were in flight at once (not one after another), each analyst was asked
    # exactly once (a timed-out call is not retried), and no call is left running (the hung one was cancelled)
    assert model.max_in_flight == 5
    assert sorted(analyst_of(m) for _, m in model.calls) == sorted(prompts.ANALYSTS)
    assert model.in_flight == 0
    # bounded by the per-call timeout, not by the hung call (which never ends by itself): a generous bound, the
    # backstop (2 s) plus 3 s for a stalled event loop
    assert elapsed < timeout_s + 1.0 + 3.0
    assert all("Priya" in m[0]["content"] for _, m in model.calls)  # each saw the shared context
    async with db.sessions() as s:
        sid = await simulation.save_situation(s, cipher, comp.id, "Priya ignored my email.", results)
        saved = await simulation.list_situations(s, cipher, comp.id)
    assert saved[0].id == sid and [r.ok for r in saved[0].results] == [r.ok for r in results]


async def test_panel_does_not_see_context_the_user_did_not_share(db, master_key):
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren", share_context=False)
        await companions.set_shared_context(s, cipher, "PRIVATE-DETAIL")
        assert await simulation.panel_context(s, cipher, comp.id) == ""


async def test_rehearsal_and_companion_threads_are_independent(db, master_key):
    cipher = await _user(db, master_key)
    model = FakeModel()
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        agent = await simulation.create_agent(s, cipher, name="Dana", personality="blunt, busy",
                                              backstory="my team lead for two years", relationship="manager")
        rid = await simulation.start_rehearsal(s, cipher, comp.id, agent.id)
        kw = dict(max_chars=4000, turns=10, deadline_s=5.0, analyst_timeout_s=5.0)
        await simulation.rehearsal_turn(s, model, cipher, rid, "I want to ask for a raise", **kw)
        await companions.chat_turn(s, model, cipher, comp.id, "I'm nervous about it", **TURN)
        await simulation.rehearsal_turn(s, model, cipher, rid, "I've led two launches", **kw)
        view = await simulation.get_rehearsal(s, cipher, rid)
        hist = await companions.history(s, cipher, comp.id)
    assert [t.text for t in view.turns] == ["I want to ask for a raise", "Echo: I want to ask for a raise",
                                            "I've led two launches", "Echo: I've led two launches"]
    assert [len(t.results) for t in view.turns] == [0, 5, 0, 5]  # the panel read each exchange
    assert [m.text for m in hist] == ["I'm nervous about it", "Echo: I'm nervous about it"]
    # the model played Dana with the production rehearsal prompt, with the earlier turns
    chat_calls = [m for k, m in model.calls if k == "chat" and "This is a rehearsal" in m[0]["content"]]
    assert "Dana" in chat_calls[-1][0]["content"] and len(chat_calls[-1]) == 4
    assert await _count(db, RehearsalTurn) == 4 and await _count(db, Reading) == 10


async def test_feed_post_saved_with_the_comments_that_arrived(db, master_key):
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        await companions.create_companion(s, cipher, persona="wren")
        await companions.create_companion(s, cipher, persona="juno")
        result = await feed.create_post(s, FakeModel(), cipher, "Ran my first 5k", max_chars=4000,
                                        max_commenters=3, timeout_s=5.0)
        posts = await feed.list_posts(s, cipher)
    assert result.failed == []
    assert [c.text for c in posts[0].comments] == ["Proud of you for: Ran my first 5k"] * 2
    assert {c.companion_name for c in posts[0].comments} == {"Wren", "Juno"}

    class HalfBroken(FakeModel):
        async def complete(self, messages, *, kind, **kw):
            if "Juno" in messages[0]["content"]:
                await asyncio.Event().wait()  # hangs: the per-call timeout must fire
            return await super().complete(messages, kind=kind, **kw)

    async with db.sessions() as s:
        result = await feed.create_post(s, HalfBroken(), cipher, "Second post", max_chars=4000, max_commenters=3,
                                        timeout_s=1.5)  # Wren's answer has 2.5 s of room (the backstop: +1 s)
        posts = await feed.list_posts(s, cipher)
    assert result.failed == ["Juno"]
    assert posts[0].text == "Second post" and [c.companion_name for c in posts[0].comments] == ["Wren"]


async def test_memories_are_capped_oldest_first(db, master_key, monkeypatch):
    monkeypatch.setattr(companions, "MAX_MEMORIES_KEPT", 2)
    cipher = await _user(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
        for name in ("Ann", "Bo", "Cy"):
            await companions.chat_turn(s, FakeModel(), cipher, comp.id, f"my name is {name}", **TURN)
        kept = await companions.memories(s, cipher, comp.id)
    assert kept == ["The user's name is Bo", "The user's name is Cy"]
