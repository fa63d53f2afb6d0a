"""Fixtures for the app tests: a database per test (SQLite file, and PostgreSQL when
HEARTH_TEST_POSTGRES_URL is set; under CI=true its absence is a failure, not a skip), settings,
and an in-process app client with the lifespan run."""

from __future__ import annotations

import os
import uuid
from contextlib import asynccontextmanager

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from hearth.app.crypto import new_master_key_text, parse_master_key
from hearth.app.main import create_app
from hearth.app.settings import load_settings
from hearth.app.storage import create_database, upgrade
from tests.app.app_fakes import FakeModel

PG_ENV = "HEARTH_TEST_POSTGRES_URL"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _pg_connect_args(url: str) -> dict:
    u = make_url(url)
    return dict(host=u.host, port=u.port, user=u.username, password=u.password, database=u.database)


async def _pg_admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(**_pg_connect_args(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def pg_base_url() -> str | None:
    url = os.environ.get(PG_ENV)
    if not url:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{PG_ENV} is not set under CI=true: the PostgreSQL storage tests must run in CI")
        pytest.skip(f"{PG_ENV} not set (start a PostgreSQL server the way .ci/run does)")
    return url


@pytest.fixture
async def db(database_url):
    """An upgraded database (SQLite, and PostgreSQL when available) for the storage-level tests."""
    database = create_database(database_url)
    await upgrade(database.engine)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request, tmp_path):
    """A fresh, empty database for one test, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'hearth.sqlite3'}"
        return
    base = pg_base_url()
    name = f"hearth_t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(base, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        await _pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite+aiosqlite:///{tmp_path / 'hearth.sqlite3'}"


@pytest.fixture
def master_key_text() -> str:
    return new_master_key_text()


@pytest.fixture
def master_key(master_key_text) -> bytes:
    return parse_master_key(master_key_text)


@pytest.fixture
def make_settings(tmp_path, master_key_text):
    def make(database_url: str, **overrides):
        env = {"HEARTH_MASTER_KEY": master_key_text}
        return load_settings(None, env=env, overrides={"var_dir": str(tmp_path / "var"),
                                                        "database_url": database_url, **overrides})
    return make


@asynccontextmanager
async def running_app(settings, model="fake", base_url: str = "http://testserver"):
    """(app, client) with the lifespan run (migrations, chain start) around the block.

    model: "fake" (default) an in-process FakeModel; None the real gateway chain from the settings' TOML.
    """
    app = create_app(settings, model=FakeModel() if model == "fake" else model)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url,
                                     follow_redirects=False) as client:
            yield app, client


@asynccontextmanager
async def running_app_on_chain(tmp_path, master_key_text: str, base_url: str):
    """(app, client) as running_app with model=None: the real gateway chain of a hearth.toml (app_server.write_config,
    10 s a provider call) whose provider is the OpenAI-compatible server at base_url (a loopback fake), on a SQLite
    file under tmp_path."""
    from tests.app.app_server import write_config

    cfg = write_config(tmp_path / "hearth.toml", base_url, total_s=10.0)
    settings = load_settings(cfg, env={"HEARTH_MASTER_KEY": master_key_text},
                             overrides={"database_url": f"sqlite:///{tmp_path / 'chain.sqlite3'}"})
    async with running_app(settings, model=None) as (app, client):
        yield app, client


async def count_rows(app, model, *where) -> int:
    """How many rows of ``model`` (matching ``where``) the running app's database holds."""
    async with app.state.hearth.db.sessions() as s:
        return (await s.execute(select(func.count()).select_from(model).where(*where))).scalar_one()


@pytest.fixture
def serve_env(tmp_path, monkeypatch):
    """`hearth serve` (hearth.app.main.serve) called in-process from a scratch folder: no HEARTH_* setting taken from
    the environment but a fresh master key; returns the folder."""
    from hearth.app import main
    from hearth.app.crypto import new_master_key_text

    for var in ("HEARTH_ENV", "HEARTH_DATABASE_URL", "HEARTH_VAR_DIR", "HEARTH_MASTER_KEY_FILE",
                "HEARTH_PREVIOUS_MASTER_KEY", main.SERVE_ARGS_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HEARTH_MASTER_KEY", new_master_key_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def save_rehearsal_turn(db, cipher, rehearsal_id: str, text: str, reply: str, results, submission_id=None):
    """A rehearsal turn saved in both of its phases at once, for a test that has the panel's readings already:
    simulation.save_rehearsal_exchange, then (unless that found the turn saved with ``submission_id``, which comes
    back as saved) simulation.save_turn_readings."""
    from hearth.app import simulation

    turn = await simulation.save_rehearsal_exchange(db, cipher, rehearsal_id, text, reply, submission_id)
    if not turn.replayed:
        await simulation.save_turn_readings(db, cipher, turn, results)
    return turn
