"""Reads over a list of a user's ids (the comments of their posts, the readings of their situations and of a
rehearsal's turns: what the export lists) go IN_CHUNK ids a statement (common.rows_in). PostgreSQL binds at most
32767 parameters a statement (asyncpg refuses more) and SQLite's default build 32766, so with one ``IN`` over every
id a user with some 33000 posts could no longer export. Both backends (PostgreSQL with HEARTH_TEST_POSTGRES_URL).

- a small chunk gives exactly what one statement gives: the export, the feed, the situations and a rehearsal, for
  no id, one, a chunk, a chunk and one more, two chunks and more (and each chunk is its own statement);
- 33000 ids, more than either backend binds in one statement (SQLite held to its default limit here, as a
  Debian build allows far more): the export of a user with 33000 posts, and readings of 33000 situation ids;
- the memory trim deletes the oldest through a subquery: its DELETE binds no id, however many it removes.
"""

from __future__ import annotations

import math
import re
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.util.concurrency import await_

from hearth.app import account, common, companions, feed, simulation
from hearth.app.common import rows_in, seal, seal_json
from hearth.app.storage.models import (Agent, Comment, Companion, Memory, Post, Reading, Rehearsal, RehearsalTurn,
                                       Situation)
from tests.app.app_fakes import FakeModel
from tests.app.app_users import signed_up

pytestmark = pytest.mark.anyio

ALL = account.ALL
PG_MAX_PARAMS = 32767  # PostgreSQL's wire protocol (a 16-bit count); asyncpg refuses a statement with more
SQLITE_DEFAULT_MAX_VARIABLES = 32766  # SQLITE_MAX_VARIABLE_NUMBER of a default build since 3.32
BIG = 33000
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
IN_CLAUSE = re.compile(r"\bIN \(", re.IGNORECASE)


def _id(kind: str, i: int) -> str:
    return f"{kind}{i:0{32 - len(kind)}d}"  # in creation order: a later row's id sorts after an earlier one's


def _sealed(cipher, model, fields: dict, **columns) -> dict:
    """The insert parameters of one ``model`` row: ``columns`` as they are, each of ``fields`` sealed (a dict:
    as JSON)."""
    row = model(**columns)
    for field, value in fields.items():
        columns[field] = (seal_json if isinstance(value, dict) else seal)(cipher, row, field, value)
    return columns


def _reading(cipher, i: int, *, situation_id=None, turn_id=None, analyst="anxious", at: datetime,
             tag: str = "") -> dict:
    return _sealed(cipher, Reading, {"body_ct": {"reading": f"reading {i} {analyst}", "advice": "breathe",
                                                 "risk": "low", "error": ""}},
                   id=_id(tag + "r" + analyst[0], i), user_id=cipher.user_id, situation_id=situation_id,
                   turn_id=turn_id, analyst=analyst, status="ok", created_at=at)


async def _insert(db, model, rows: list[dict]) -> None:
    if rows:
        async with db.sessions() as s, s.begin():
            await s.execute(insert(model), rows)


async def _seed(db, cipher, n: int, *, with_children=True, tag: str = "") -> tuple[str, str]:
    """For ``cipher``'s user: two companions, one agent, ``n`` posts, ``n`` situations of the first companion and
    a rehearsal of ``n`` turns, with (``with_children``) two comments or readings on each. The comments and
    readings of one parent are saved newest first, and the parents' times interleave, so their order comes from
    the ORDER BY / the sort, not from how they were inserted. Each id starts with ``tag``. (companion id,
    rehearsal id)"""
    uid = cipher.user_id
    comps = [_sealed(cipher, Companion, {"name_ct": name, "persona_ct": f"{name} is kind"}, id=_id(tag + "c", k),
                     user_id=uid, world_view="stoic", created_at=T0 + timedelta(seconds=k))
             for k, name in enumerate(("Wren", "Juno"))]
    await _insert(db, Companion, comps)
    agent = _sealed(cipher, Agent, {"name_ct": "Dana", "personality_ct": "blunt", "backstory_ct": "a sister",
                                    "relationship_ct": "sibling"}, id=_id(tag + "a", 0), user_id=uid, created_at=T0)
    await _insert(db, Agent, [agent])
    rehearsal_id = _id(tag + "h", 0)
    await _insert(db, Rehearsal, [dict(id=rehearsal_id, user_id=uid, companion_id=comps[0]["id"],
                                       agent_id=agent["id"], created_at=T0)])
    posts, situations, turns = [], [], []
    comments, readings = [], []
    for i in range(n):
        at = T0 + timedelta(minutes=i + 1)
        posts.append(_sealed(cipher, Post, {"body_ct": f"post {i}"}, id=_id(tag + "p", i), user_id=uid, created_at=at))
        situations.append(_sealed(cipher, Situation, {"text_ct": f"situation {i}"}, id=_id(tag + "s", i), user_id=uid,
                                  companion_id=comps[0]["id"], created_at=at))
        role = "user" if i % 2 == 0 else "agent"
        turns.append(_sealed(cipher, RehearsalTurn, {"body_ct": f"turn {i}", **({"meta_ct": {
            "mood": "calm", "suggested_actions": [f"hint {i}"]}} if role == "agent" else {})},
            id=_id(tag + "t", i), user_id=uid, rehearsal_id=rehearsal_id, role=role, created_at=at))
        if not with_children:
            continue
        # children: the later one first, and 2n - i seconds after the parent, so a later parent's children come
        # before an earlier parent's
        for j in (1, 0):
            cat = at + timedelta(seconds=2 * n - i + j)
            comp = comps[j]
            if j:  # the sealed {comment, tone} of today
                comments.append(_sealed(cipher, Comment, {"body_ct": {"comment": f"comment {i}.{j}",
                                                                      "tone": "warm"}},
                                        id=_id(tag + "m", 2 * i + j), user_id=uid, post_id=posts[-1]["id"],
                                        companion_id=comp["id"], tone="", created_at=cat))
            else:  # one saved before the tone was sealed: the bare text, the tone in the clear
                comments.append(_sealed(cipher, Comment, {"body_ct": f"comment {i}.{j}"}, id=_id(tag + "m", 2 * i + j),
                                        user_id=uid, post_id=posts[-1]["id"], companion_id=comp["id"], tone="dry",
                                        created_at=cat))
            analyst = ("anxious", "secure")[j]
            readings.append(_reading(cipher, i, situation_id=situations[-1]["id"], analyst=analyst, at=cat, tag=tag))
            readings.append(_reading(cipher, i + n, turn_id=turns[-1]["id"], analyst=analyst, at=cat, tag=tag))
    for model, rows in ((Post, posts), (Situation, situations), (RehearsalTurn, turns), (Comment, comments),
                        (Reading, readings)):
        await _insert(db, model, rows)
    return comps[0]["id"], rehearsal_id


class Statements:
    """The statements the engine runs, with how many parameters each binds."""

    def __init__(self, engine):
        self.engine, self.seen = engine.sync_engine, []

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        self.seen.append((statement, len(parameters) if parameters is not None else 0))

    def __enter__(self):
        event.listen(self.engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *exc):
        event.remove(self.engine, "before_cursor_execute", self._before)

    def with_in(self) -> list[tuple[str, int]]:
        return [(sql, count) for sql, count in self.seen if IN_CLAUSE.search(sql)]


async def _reads(db, cipher, user, companion_id, rehearsal_id):
    async with db.sessions() as s:
        return dict(export=await account.export(s, cipher, user),
                    posts=await feed.posts_page(s, cipher, limit=ALL),
                    situations=await simulation.situations_page(s, cipher, companion_id, limit=ALL),
                    rehearsal=await simulation.get_rehearsal(s, cipher, rehearsal_id))


async def _seed_someone_else(db, master_key) -> None:
    """Another user with rows of their own, which no read of alice's may show."""
    _, other = await signed_up(db, master_key, "bob")
    await _seed(db, other, 2, tag="z")


@pytest.mark.parametrize("n", [0, 1, 3, 4, 6, 7])
async def test_a_small_chunk_reads_exactly_what_one_statement_reads(db, master_key, monkeypatch, n):
    user, cipher = await signed_up(db, master_key)
    companion_id, rehearsal_id = await _seed(db, cipher, n)
    await _seed_someone_else(db, master_key)

    monkeypatch.setattr(common, "IN_CHUNK", 10**6)
    with Statements(db.engine) as whole:
        one = await _reads(db, cipher, user, companion_id, rehearsal_id)
    monkeypatch.setattr(common, "IN_CHUNK", 3)
    with Statements(db.engine) as chunked:
        small = await _reads(db, cipher, user, companion_id, rehearsal_id)

    assert small == one
    # and what one statement read is what was seeded, in order (the equality above compares real rows)
    posts, older = one["posts"]
    assert older is None and [p.text for p in posts] == [f"post {i}" for i in reversed(range(n))]
    for p in posts:
        i = int(p.text.split()[1])
        assert [(c.text, c.tone, c.companion_name) for c in p.comments] == [
            (f"comment {i}.0", "dry", "Wren"), (f"comment {i}.1", "warm", "Juno")]
    situations, _ = one["situations"]
    assert [[r.reading for r in sit.results] for sit in situations] == [
        [f"reading {i} anxious", f"reading {i} secure"] for i in reversed(range(n))]
    turns = one["rehearsal"].turns
    assert [t.text for t in turns] == [f"turn {i}" for i in range(n)]
    assert [[r.reading for r in t.results] for t in turns] == [
        [f"reading {i + n} anxious", f"reading {i + n} secure"] for i in range(n)]
    assert [t.suggestions for t in turns if t.role == "agent"] == [[f"hint {i}"] for i in range(1, n, 2)]
    (exported,) = [c for c in one["export"]["companions"] if c["name"] == "Wren"]
    assert len(exported["situations"]) == n and len(one["export"]["posts"]) == n
    assert len(exported["rehearsals"][0]["turns"]) == n

    # each chunk was a statement of its own: the export and the three reads each ask for posts, situations and
    # turns (ceil(n / 3) statements each with a chunk of 3, one with a chunk of them all; none without ids)
    assert len(whole.with_in()) == 2 * 3 * min(n, 1)
    assert len(chunked.with_in()) == 2 * 3 * math.ceil(n / 3)
    assert max((count for _, count in chunked.with_in()), default=0) <= 3 + 1  # the ids and the user id


async def test_rows_in_counts_a_repeated_id_once_and_asks_nothing_for_no_ids(db, master_key, monkeypatch):
    _, cipher = await signed_up(db, master_key)
    await _seed(db, cipher, 5, with_children=False)
    monkeypatch.setattr(common, "IN_CHUNK", 2)
    ids = [_id("p", i) for i in (4, 0, 4, 2, 0, 1, 3)]  # ids repeated across chunks of the list as given
    query = select(Post.id).order_by(Post.id)
    async with db.sessions() as s, s.begin():
        with Statements(db.engine) as seen:
            got = await rows_in(s, query, Post.id, ids, scalars=True)
            assert await rows_in(s, query, Post.id, []) == []
        rows = await rows_in(s, select(Post.id, Post.user_id), Post.id, ids)
    # five distinct ids in chunks of two: (4, 0), (2, 1), (3), each ordered by id within its chunk
    assert got == [_id("p", 0), _id("p", 4), _id("p", 1), _id("p", 2), _id("p", 3)]
    assert len(seen.with_in()) == 3
    assert sorted(tuple(r) for r in rows) == [(_id("p", i), cipher.user_id) for i in range(5)]


def _variable_limit(dbapi_conn, new: int = -1) -> int:
    """The limit on bound parameters of an aiosqlite connection (set to ``new`` unless -1), as it was. Its sqlite3
    connection lives in aiosqlite's thread: asked there."""
    conn = dbapi_conn.driver_connection
    return await_(conn._execute(lambda: conn._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, new)))


async def _hold_sqlite_to_the_default_limit(engine) -> None:
    """Hold every SQLite connection to a default build's limit on bound parameters (SQLITE_MAX_VARIABLE_NUMBER
    32766): Debian's sqlite3 allows 250000, which would let one IN over 33000 ids through."""
    event.listen(engine.sync_engine, "connect",
                 lambda dbapi_conn, _record: _variable_limit(dbapi_conn, SQLITE_DEFAULT_MAX_VARIABLES))
    await engine.dispose()  # the connections open already were made without it
    async with engine.connect() as conn:
        held = await conn.run_sync(lambda c: _variable_limit(c.connection.dbapi_connection))
    assert held == SQLITE_DEFAULT_MAX_VARIABLES


async def test_more_ids_than_one_statement_may_bind(db, master_key):
    """The export of a user with BIG posts (one IN over their ids is more than either backend binds), and the
    readings of BIG situation ids asked for at once."""
    if db.engine.dialect.name == "sqlite":
        await _hold_sqlite_to_the_default_limit(db.engine)
    assert BIG > max(PG_MAX_PARAMS, SQLITE_DEFAULT_MAX_VARIABLES)
    user, cipher = await signed_up(db, master_key)
    companion_id, _ = await _seed(db, cipher, 2)  # two situations with their readings, two posts of its own
    await _insert(db, Post, [_sealed(cipher, Post, {"body_ct": f"many {i}"}, id=_id("q", i), user_id=cipher.user_id,
                                     created_at=T0 + timedelta(days=1, seconds=i)) for i in range(BIG)])
    first, last = 0, BIG - 1  # a comment in the first chunk and one in the last
    await _insert(db, Comment, [_sealed(cipher, Comment, {"body_ct": {"comment": f"on {i}", "tone": "warm"}},
                                        id=_id("n", i), user_id=cipher.user_id, post_id=_id("q", i),
                                        companion_id=companion_id, tone="", created_at=T0 + timedelta(days=2))
                                for i in (first, last)])

    with Statements(db.engine) as seen:
        async with db.sessions() as s:
            exported = await account.export(s, cipher, user)
            async with s.begin():  # the two real situations among BIG ids: first, in the middle, last
                ids = [_id("s", 0)] + [_id("x", i) for i in range(BIG)] + [_id("s", 1)]
                readings = await rows_in(s, select(Reading).where(Reading.user_id == cipher.user_id),
                                         Reading.situation_id, ids, scalars=True)
    assert max(count for _, count in seen.with_in()) <= common.IN_CHUNK + 1

    posts = exported["posts"]
    assert len(posts) == BIG + 2 and posts[0]["text"] == f"many {last}" and posts[BIG - 1]["text"] == f"many {first}"
    assert [(p["text"], [c["text"] for c in p["comments"]]) for p in posts[:BIG] if p["comments"]] == [
        (f"many {last}", [f"on {last}"]), (f"many {first}", [f"on {first}"])]
    assert [len(p["comments"]) for p in posts[BIG:]] == [2, 2]  # the seeded posts, oldest, keep theirs
    assert sorted(r.id for r in readings) == sorted(
        _id("r" + a, i) for a in "as" for i in (0, 1))


async def test_the_memory_trim_binds_no_id_of_what_it_deletes(db, master_key, monkeypatch):
    monkeypatch.setattr(companions, "MAX_MEMORIES_KEPT", 2)
    _, cipher = await signed_up(db, master_key)
    async with db.sessions() as s:
        comp = await companions.create_companion(s, cipher, persona="wren")
    await _insert(db, Memory, [_sealed(cipher, Memory, {"text_ct": f"old memory {i}"}, id=_id("o", i),
                                       user_id=cipher.user_id, companion_id=comp.id,
                                       created_at=T0 + timedelta(seconds=i)) for i in range(50)])
    async with db.sessions() as s:
        with Statements(db.engine) as seen:
            await companions.chat_turn(s, FakeModel(), cipher, comp.id, "my name is Ann", max_chars=4000, turns=20,
                                       prompt_memories=30, deadline_s=5.0)
        kept = await companions.memories(s, cipher, comp.id)
    (trim,) = [(sql, count) for sql, count in seen.seen if sql.lstrip().upper().startswith("DELETE FROM MEMORIES")]
    assert trim[1] <= 3  # the companion id and the LIMIT, not the ids of the 49 it deletes
    assert kept == ["old memory 49", "The user's name is Ann"]
