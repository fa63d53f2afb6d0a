"""What the migration tests do around a schema step: a user signed up at an older revision, rows written there
with raw SQL (the models already have the newer columns), the upgrade compared with the models, the downgrade,
and the rows left."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import datetime

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from hearth.app import accounts, crypto
from hearth.app.storage import create_database, upgrade
from hearth.app.storage.migrate import alembic_config
from hearth.app.storage.models import Base, User

# the newest schema revision: what every upgrade test expects to reach (each new migration moves it)
HEAD = "0010"


@asynccontextmanager
async def database_at(database_url: str, revision: str, master_key: bytes):
    """The empty database at ``database_url`` upgraded to ``revision``, with alice signed up there: yields (the
    database, her id, her cipher); the database is disposed of on exit."""
    database = create_database(database_url)
    try:
        await upgrade(database.engine, revision)
        async with database.sessions() as s:
            new = await accounts.signup(s, username="alice", password="correct horse battery", master_key=master_key,
                                        ttl_s=60)
        async with database.sessions() as s:
            user = (await s.execute(select(User).where(User.id == new.user_id))).scalar_one()
        yield database, user.id, crypto.UserCipher.from_wrapped(master_key, user.wrapped_key, user.id)
    finally:
        await database.dispose()


async def insert_companion(conn, user_id: str, companion_id: str, now: datetime) -> None:
    """A companion row by raw SQL on ``conn`` (sealed fields b"x": the tests count its rows, never open them)."""
    await conn.execute(text("INSERT INTO companions (id, user_id, name_ct, persona_ct, world_view, share_context,"
                            " affection, trust, chat_epoch, created_at) VALUES (:c, :u, :b, :b, 'grounded',"
                            " true, 0, 0, 0, :now)"), dict(c=companion_id, u=user_id, b=b"x", now=now))


async def upgrade_and_compare(database) -> tuple[list, str]:
    """Upgrade to the newest revision; (what alembic finds between that schema and the models, the version)."""
    await upgrade(database.engine)
    async with database.engine.connect() as conn:
        diff = await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
        version = (await conn.execute(text("select version_num from alembic_version"))).scalar_one()
    return diff, version


async def downgrade(database, revision: str) -> None:
    async with database.engine.begin() as conn:
        await conn.run_sync(lambda c: command.downgrade(alembic_config(c), revision))


async def scalars(database, *queries: str) -> list:
    """The one value each SQL query returns (e.g. counts), in order."""
    async with database.engine.connect() as conn:
        return [(await conn.execute(text(q))).scalar_one() for q in queries]
