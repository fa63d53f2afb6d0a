"""A submission id on chat messages and rehearsal turns: a resent turn (the page lost the connection after the
commit) finds the turn it saved instead of saving it twice.

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# A unique INDEX, not a table constraint: SQLite creates and drops an index in place, where a constraint would
# need batch mode's copy-and-drop of the table (with foreign_keys=ON, dropping the old `rehearsal_turns` cascades
# to every reading of it). NULLs are distinct in both SQLite and PostgreSQL, so rows without an id never clash.
_TABLES = (('messages', 'companion_id'), ('rehearsal_turns', 'rehearsal_id'))


def upgrade() -> None:
    for table, parent in _TABLES:
        with op.batch_alter_table(table, schema=None, recreate='never') as batch_op:
            batch_op.add_column(sa.Column('submission_id', sa.String(length=32), nullable=True))
            batch_op.create_index(batch_op.f(f'ix_{table}_submission'), [parent, 'submission_id', 'role'], unique=True)


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place (see 0003)
    for table, _ in reversed(_TABLES):
        with op.batch_alter_table(table, schema=None, recreate='never') as batch_op:
            batch_op.drop_index(batch_op.f(f'ix_{table}_submission'))
            batch_op.drop_column('submission_id')
