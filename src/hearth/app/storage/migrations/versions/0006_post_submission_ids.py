"""A submission id on feed posts: a post sent again (the page lost the connection while the companions commented,
after the commit) finds the post it saved instead of saving it and its comments twice.

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

# A unique INDEX, not a table constraint, as in 0004: SQLite creates and drops it in place, where batch mode's
# copy-and-drop of `posts` would (with foreign_keys=ON) cascade to every comment on a post. NULLs are distinct in
# both SQLite and PostgreSQL, so posts without an id never clash.


def upgrade() -> None:
    with op.batch_alter_table('posts', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('submission_id', sa.String(length=32), nullable=True))
        batch_op.create_index(batch_op.f('ix_posts_submission'), ['user_id', 'submission_id'], unique=True)


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops the column in place (see 0003)
    with op.batch_alter_table('posts', schema=None, recreate='never') as batch_op:
        batch_op.drop_index(batch_op.f('ix_posts_submission'))
        batch_op.drop_column('submission_id')
