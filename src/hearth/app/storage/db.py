"""The async engine and session factory.

SQLite (``sqlite+aiosqlite:///path``): WAL journal, ``synchronous=FULL`` (a commit that returned is on
disk even if the process is killed right after), foreign keys on (so ON DELETE CASCADE works), and a
busy timeout instead of "database is locked". PostgreSQL: ``postgresql+asyncpg://...``.

Both engines hide bound parameters from their errors: a statement that fails would otherwise carry an
argon2 hash, a wrapped data key, a CSRF token or ciphertexts into the traceback of a 500 in the server's log.
"""

from __future__ import annotations

import os
import re
import stat
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


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700; an existing folder is left as it is."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def make_private_sqlite_file(path: Path) -> None:
    """Create the SQLite file 0600 before SQLite opens it (SQLite gives its -wal and -shm files the
    main file's mode), and take group/other access away from an existing one and its companions."""
    make_private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = stat.S_IMODE(p.stat().st_mode)
            if mode & 0o077:
                os.chmod(p, mode & 0o700)
        except FileNotFoundError:
            pass


def _in_memory(parsed) -> bool:
    """An SQLite URL naming no file: no path, ``:memory:``, or a URI (``uri=true``) that opens memory."""
    database = parsed.database or ""
    if database in ("", ":memory:"):
        return True
    if str(parsed.query.get("uri", "")).lower() in ("true", "1"):
        return parsed.query.get("mode") == "memory" or database.removeprefix("file:").startswith(":memory:")
    return False


_PASSWORD = re.compile(r"(://[^:/@\s]*:)\S*@")  # scheme://user:PASSWORD@ (to the last @: a password may hold one)


def _unparsable(url: str, exc: Exception) -> ValueError:
    """The start-up error for a database URL that does not parse, which goes to the console and the logs: the URL
    with its password shown as ***, and the parser's reason only where no password could be part of it (a
    password with an unencoded @ or : is itself what breaks the parse, and the reason quotes that piece)."""
    if _PASSWORD.search(url):
        shown = _PASSWORD.sub(r"\1***@", url)
        return ValueError(f"database_url: cannot parse {shown!r}: check its form, "
                          "scheme://user:password@host:port/database, with special characters in the password "
                          "percent-encoded (@ as %40, : as %3A, / as %2F)")
    return ValueError(f"database_url: cannot parse {url!r}: {exc}")


def normalise_url(url: str) -> str:
    """Accept ``sqlite:///x`` / ``postgresql://...`` too and pick the async driver.

    Raises ValueError naming ``database_url`` for other schemes.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with the reason
        raise _unparsable(url, exc) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if _in_memory(parsed):
            # each connection (the start-up check's, each worker's) gets an empty database of its own, and all of it
            # goes with the process: `hearth serve` migrated one, served another (every request a 500)
            raise ValueError("database_url: an in-memory SQLite database keeps nothing past a restart and is not the "
                             "one the start-up check prepares; give a file, e.g. sqlite:///var/hearth.sqlite3")
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ValueError(f"database_url: unsupported backend {backend!r} (use SQLite or PostgreSQL)")
    return parsed.render_as_string(hide_password=False)


def create_database(url: str) -> Database:
    """Build the engine for ``url`` (SQLite: a missing folder is created 0700 and the file 0600; ValueError naming
    database_url when they cannot be)."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            try:
                make_private_sqlite_file(Path(parsed.database))
            except OSError as exc:  # a file where the folder would be, no permission, ...: not a traceback
                raise ValueError(f"database_url: cannot create the SQLite file {parsed.database}: "
                                 f"{exc.strerror or exc}") from None
        engine = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    else:
        engine = create_async_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, hide_parameters=True)
    return Database(engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))
