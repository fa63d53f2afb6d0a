"""Run the packaged alembic migrations programmatically (no alembic.ini, no CLI)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` inside one transaction (PostgreSQL DDL is transactional)."""
    async with engine.begin() as conn:
        await conn.run_sync(lambda sync_conn: command.upgrade(alembic_config(sync_conn), revision))


async def unknown_revisions(engine: AsyncEngine) -> list[str]:
    """The revisions the database is stamped with that the packaged migrations do not hold ([] for a new database or
    one of this version or older): a newer hearth migrated it, and ``upgrade`` cannot tell where it stands."""
    known = {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    async with engine.connect() as conn:
        current = await conn.run_sync(lambda sync_conn: MigrationContext.configure(sync_conn).get_current_heads())
    return [rev for rev in current if rev not in known]
