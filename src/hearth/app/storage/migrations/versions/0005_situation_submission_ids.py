"""A submission id on situations: a situation asked of the panel again (the page lost the connection after the
commit) finds the situation it saved instead of saving it and its readings twice.

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

# A unique INDEX, not a table constraint, as in 0004: SQLite creates and drops it in place, where batch mode's
# copy-and-drop of `situations` would (with foreign_keys=ON) cascade to every reading of a situation. NULLs are
# distinct in both SQLite and PostgreSQL, so situations without an id never clash.


def upgrade() -> None:
    with op.batch_alter_table('situations', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('submission_id', sa.String(length=32), nullable=True))
        batch_op.create_index(batch_op.f('ix_situations_submission'), ['companion_id', 'submission_id'], unique=True)


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place (see 0003)
    with op.batch_alter_table('situations', schema=None, recreate='never') as batch_op:
        batch_op.drop_index(batch_op.f('ix_situations_submission'))
        batch_op.drop_column('submission_id')
