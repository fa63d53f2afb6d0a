"""Alembic migrations of the app schema (a package so that wheels ship them)."""
