"""Review 61: a database that cannot be reached at start-up is a configuration error named in one line.

A PostgreSQL database_url whose server is down, or whose host, port, user, password or database name is wrong, made
``hearth serve`` print a traceback of several hundred lines (the asyncpg / SQLAlchemy connect stack) and exit 1,
where an unreachable gateway state store (test_app_review) or a wrong master key (test_app_startup) is one line
naming the setting, exit 2. The start-up check (hearth.app.startup.prepare) now opens one connection before it
migrates and refuses the start naming database_url, the URL shown without its password."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hearth.app.crypto import new_master_key_text
from hearth.app.settings import load_settings
from hearth.app.startup import StartupError, prepare
from hearth.app.storage import create_database

pytestmark = pytest.mark.anyio
SRC = Path(__file__).resolve().parents[2] / "src"  # `hearth serve` below runs this checkout's code


def _closed_port() -> tuple[socket.socket, int]:
    """A bound socket that never listens: a connection to its port is refused while it is open."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


async def test_prepare_names_database_url_when_the_server_refuses_the_connection(tmp_path):
    sock, port = _closed_port()
    with sock:
        url = f"postgresql://hearth:s3cret-pw@127.0.0.1:{port}/hearth"
        settings = load_settings(None, env={"HEARTH_MASTER_KEY": new_master_key_text()},
                                 overrides={"database_url": url, "var_dir": str(tmp_path / "var")})
        db = create_database(settings.database_url)
        try:
            with pytest.raises(StartupError) as info:
                await prepare(settings, db)
        finally:
            await db.dispose()
    msg = str(info.value)
    assert msg.startswith("database_url: ") and f"127.0.0.1:{port}" in msg, msg
    assert "s3cret-pw" not in msg, msg
    assert not (tmp_path / "var" / "master.key").exists()  # nothing written for a start that cannot run


def test_hearth_serve_reports_an_unreachable_database_in_one_line(tmp_path):
    env = {**os.environ, "HEARTH_MASTER_KEY": new_master_key_text(), "HEARTH_ENV": "", "HEARTH_DATABASE_URL": "",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH", ""))))}
    sock, port = _closed_port()
    with sock:
        url = f"postgresql://hearth:s3cret-pw@127.0.0.1:{port}/hearth"
        proc = subprocess.run([sys.executable, "-m", "hearth.cli", "serve", "--database-url", url, "--port", "0"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    # before: a traceback of the connect stack, exit 1
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "database_url" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "s3cret-pw" not in proc.stderr + proc.stdout
    assert "serving on" not in proc.stdout


# A database migrated by a newer hearth (its alembic_version names a revision these migrations do not hold: the app
# was rolled back after an upgrade) made the start-up check's migration step raise alembic's CommandError "Can't
# locate revision" at the end of a traceback of some 360 lines, exit 1. It is refused in one line naming the
# revision and what to do, exit 2, and the database is left as it was.
def _stamped_by_a_newer_hearth(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0099_from_the_future')")


async def test_prepare_refuses_a_database_migrated_by_a_newer_hearth(tmp_path):
    _stamped_by_a_newer_hearth(tmp_path / "h.sqlite3")
    settings = load_settings(None, env={"HEARTH_MASTER_KEY": new_master_key_text()},
                             overrides={"database_url": f"sqlite:///{tmp_path / 'h.sqlite3'}",
                                        "var_dir": str(tmp_path / "var")})
    db = create_database(settings.database_url)
    try:
        with pytest.raises(StartupError) as info:
            await prepare(settings, db)
    finally:
        await db.dispose()
    msg = str(info.value)
    assert msg.startswith("database_url: ") and "0099_from_the_future" in msg and "newer" in msg, msg


def test_hearth_serve_reports_a_database_of_a_newer_hearth_in_one_line(tmp_path):
    _stamped_by_a_newer_hearth(tmp_path / "h.sqlite3")
    env = {**os.environ, "HEARTH_MASTER_KEY": new_master_key_text(), "HEARTH_ENV": "", "HEARTH_DATABASE_URL": "",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH", ""))))}
    proc = subprocess.run([sys.executable, "-m", "hearth.cli", "serve", "--database-url",
                           f"sqlite:///{tmp_path / 'h.sqlite3'}", "--port", "0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    # before: alembic's CommandError at the end of a traceback, exit 1
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "refusing to start: database_url" in proc.stderr and "0099_from_the_future" in proc.stderr
    assert "Traceback" not in proc.stderr and "serving on" not in proc.stdout
