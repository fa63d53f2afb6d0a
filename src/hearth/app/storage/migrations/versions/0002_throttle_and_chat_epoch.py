"""Login/signup throttle shared by all workers; a chat epoch so a clear wins over an in-flight turn.

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('auth_throttle',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_at', sa.Double(), nullable=False),
    sa.Column('blocked_until', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_auth_throttle'))
    )
    with op.batch_alter_table('auth_throttle', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_auth_throttle_last_at'), ['last_at'], unique=False)
    with op.batch_alter_table('companions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('chat_epoch', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place. Batch mode's copy-and-drop of `companions`
    # would, with foreign_keys=ON, cascade the drop of the old table to every message, memory, ... of it
    with op.batch_alter_table('companions', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('chat_epoch')
    with op.batch_alter_table('auth_throttle', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_auth_throttle_last_at'))
    op.drop_table('auth_throttle')
