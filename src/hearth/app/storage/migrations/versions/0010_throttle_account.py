"""A login throttle bucket records its account's name (a keyed hash, as its key is): deleting the account deletes
every client's bucket of the name, so an account signed up again under it does not inherit the old one's backoff.

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

# A nullable column: existing rows are kept (NULL until their next counted attempt sets it).


def upgrade() -> None:
    with op.batch_alter_table('auth_throttle', schema=None) as batch_op:
        batch_op.add_column(sa.Column('account', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_auth_throttle_account'), ['account'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('auth_throttle', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_auth_throttle_account'))
        batch_op.drop_column('account')
