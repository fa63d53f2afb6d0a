"""Alembic environment: always handed a live connection by hearth.app.storage.migrate."""

from alembic import context

from hearth.app.storage.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the alembic CLI
    raise RuntimeError("run migrations through hearth.app.storage.migrate.upgrade")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
