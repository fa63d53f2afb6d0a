"""The async engine and session factory.

SQLite (``sqlite+aiosqlite:///path``): WAL journal, ``synchronous=FULL`` (a commit that returned is on
disk even if the process is killed right after), foreign keys on (so ON DELETE CASCADE works), and a
busy timeout instead of "database is locked". PostgreSQL: ``postgresql+asyncpg://...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

SUPPORTED = ("sqlite+aiosqlite", "postgresql+asyncpg")


@dataclass
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    async def dispose(self) -> None:
        await self.engine.dispose()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # secure_delete: deleted rows are zeroed in their page, not left in free space (see scrub_deleted)
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=10000",
                   "secure_delete=ON"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


async def scrub_deleted(session: AsyncSession) -> None:
    """After a permanent delete on SQLite: checkpoint the WAL into the main file and truncate it, so the
    old page copies that still hold the deleted ciphertexts go too (the user's data key outlives them).
    Best effort: a reader still open elsewhere leaves the rest for the next checkpoint. PostgreSQL
    keeps dead rows until VACUUM; nothing to do here."""
    if session.get_bind().dialect.name != "sqlite":
        return
    async with session.begin():
        await session.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))


def normalise_url(url: str) -> str:
    """Accept ``sqlite:///x`` / ``postgresql://...`` too and pick the async driver.

    Raises ValueError naming ``database_url`` for other schemes.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with the reason
        raise ValueError(f"database_url: cannot parse {url!r}: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ValueError(f"database_url: unsupported backend {backend!r} (use SQLite or PostgreSQL)")
    return parsed.render_as_string(hide_password=False)


def create_database(url: str) -> Database:
    """Build the engine for ``url`` (SQLite parent folder created if missing)."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    else:
        engine = create_async_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)
    return Database(engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))
