"""An index on sessions.expires_at: every signup and login sweeps a batch of expired sessions of any user
(accounts.sweep_expired_sessions), which without it reads the whole sessions table each time.

Revision ID: 0008
Revises: 0007
"""
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_sessions_expires_at', 'sessions', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_sessions_expires_at', table_name='sessions')
