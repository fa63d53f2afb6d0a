"""Storage: SQLAlchemy 2 async engine (SQLite file by default, PostgreSQL by URL), models and the
alembic migrations that ship inside the package and run at start-up."""

from hearth.app.storage.db import Database, create_database
from hearth.app.storage.migrate import unknown_revisions, upgrade

__all__ = ["Database", "create_database", "unknown_revisions", "upgrade"]
