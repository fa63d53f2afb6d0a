"""A per-user device epoch: device cookies are signed over it, and a password change moves it on.

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('device_epoch', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place. Batch mode's copy-and-drop of `users` would,
    # with foreign_keys=ON, cascade the drop of the old table to every row that references it
    with op.batch_alter_table('users', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('device_epoch')
