"""A rehearsal turn's meta (sealed JSON: the agent's mood and the suggested actions, which the page shows as coaching
for the user's next line), as a chat message's meta_ct holds a companion reply's.

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

# In place (recreate="never"), as in 0006: batch mode's copy-and-drop of `rehearsal_turns` would (with
# foreign_keys=ON) cascade to every reading of a turn. Turns saved before it have no meta: no mood, no hints.


def upgrade() -> None:
    with op.batch_alter_table('rehearsal_turns', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('meta_ct', sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place (see 0003)
    with op.batch_alter_table('rehearsal_turns', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('meta_ct')
