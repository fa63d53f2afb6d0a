"""Spent situation submission ids: a situation's submission id is kept (no text) when the situation is deleted, so a
resend of it (the form posted again, the page's script asking again after a lost stream) does not ask the panel again
and save the deleted situation anew.

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

# A new table: nothing existing is copied or altered. Its rows go with their companion or their user (ON DELETE
# CASCADE, as every child row).


def upgrade() -> None:
    op.create_table(
        'spent_situation_submissions',
        sa.Column('companion_id', sa.String(length=32), nullable=False),
        sa.Column('submission_id', sa.String(length=32), nullable=False),
        sa.Column('user_id', sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], ondelete='CASCADE',
                                name=op.f('fk_spent_situation_submissions_companion_id_companions')),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE',
                                name=op.f('fk_spent_situation_submissions_user_id_users')),
        sa.PrimaryKeyConstraint('companion_id', 'submission_id', name=op.f('pk_spent_situation_submissions')),
    )
    op.create_index(op.f('ix_spent_situation_submissions_user_id'), 'spent_situation_submissions', ['user_id'],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_spent_situation_submissions_user_id'), table_name='spent_situation_submissions')
    op.drop_table('spent_situation_submissions')
