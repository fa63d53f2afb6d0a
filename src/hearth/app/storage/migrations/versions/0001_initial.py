"""Initial schema: users, sessions, companions, messages, memories, feed, simulation, rehearsal.

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('users',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('username', sa.String(length=64), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('wrapped_key', sa.LargeBinary(), nullable=False),
    sa.Column('master_key_id', sa.String(length=16), nullable=False),
    sa.Column('shared_context_ct', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('username', name=op.f('uq_users_username'))
    )
    op.create_table('agents',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('name_ct', sa.LargeBinary(), nullable=False),
    sa.Column('personality_ct', sa.LargeBinary(), nullable=False),
    sa.Column('backstory_ct', sa.LargeBinary(), nullable=False),
    sa.Column('relationship_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_agents_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agents'))
    )
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_user_id'), ['user_id'], unique=False)

    op.create_table('companions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('name_ct', sa.LargeBinary(), nullable=False),
    sa.Column('persona_ct', sa.LargeBinary(), nullable=False),
    sa.Column('world_view', sa.String(length=32), nullable=False),
    sa.Column('share_context', sa.Boolean(), nullable=False),
    sa.Column('affection', sa.Integer(), nullable=False),
    sa.Column('trust', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_companions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_companions'))
    )
    with op.batch_alter_table('companions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_companions_user_id'), ['user_id'], unique=False)

    op.create_table('posts',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('body_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_posts_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_posts'))
    )
    with op.batch_alter_table('posts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_posts_user_id'), ['user_id'], unique=False)

    op.create_table('sessions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('csrf_token', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sessions'))
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sessions_user_id'), ['user_id'], unique=False)

    op.create_table('comments',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('post_id', sa.String(length=32), nullable=False),
    sa.Column('companion_id', sa.String(length=32), nullable=False),
    sa.Column('body_ct', sa.LargeBinary(), nullable=False),
    sa.Column('tone', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], name=op.f('fk_comments_companion_id_companions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['post_id'], ['posts.id'], name=op.f('fk_comments_post_id_posts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_comments_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_comments'))
    )
    with op.batch_alter_table('comments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_comments_post_id'), ['post_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_comments_user_id'), ['user_id'], unique=False)

    op.create_table('memories',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('companion_id', sa.String(length=32), nullable=False),
    sa.Column('text_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], name=op.f('fk_memories_companion_id_companions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_memories_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_memories'))
    )
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_memories_companion_id'), ['companion_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_memories_user_id'), ['user_id'], unique=False)

    op.create_table('messages',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('companion_id', sa.String(length=32), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('body_ct', sa.LargeBinary(), nullable=False),
    sa.Column('meta_ct', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], name=op.f('fk_messages_companion_id_companions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_messages_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_messages'))
    )
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_companion_created', ['companion_id', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_messages_user_id'), ['user_id'], unique=False)

    op.create_table('rehearsals',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('companion_id', sa.String(length=32), nullable=False),
    sa.Column('agent_id', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.id'], name=op.f('fk_rehearsals_agent_id_agents'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], name=op.f('fk_rehearsals_companion_id_companions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_rehearsals_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rehearsals'))
    )
    with op.batch_alter_table('rehearsals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rehearsals_companion_id'), ['companion_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rehearsals_user_id'), ['user_id'], unique=False)

    op.create_table('situations',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('companion_id', sa.String(length=32), nullable=False),
    sa.Column('text_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['companion_id'], ['companions.id'], name=op.f('fk_situations_companion_id_companions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_situations_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_situations'))
    )
    with op.batch_alter_table('situations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_situations_companion_id'), ['companion_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_situations_user_id'), ['user_id'], unique=False)

    op.create_table('rehearsal_turns',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('rehearsal_id', sa.String(length=32), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('body_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['rehearsal_id'], ['rehearsals.id'], name=op.f('fk_rehearsal_turns_rehearsal_id_rehearsals'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_rehearsal_turns_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rehearsal_turns'))
    )
    with op.batch_alter_table('rehearsal_turns', schema=None) as batch_op:
        batch_op.create_index('ix_rehearsal_turns_rehearsal_created', ['rehearsal_id', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_rehearsal_turns_user_id'), ['user_id'], unique=False)

    op.create_table('readings',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.String(length=32), nullable=False),
    sa.Column('situation_id', sa.String(length=32), nullable=True),
    sa.Column('turn_id', sa.String(length=32), nullable=True),
    sa.Column('analyst', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('body_ct', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['situation_id'], ['situations.id'], name=op.f('fk_readings_situation_id_situations'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['turn_id'], ['rehearsal_turns.id'], name=op.f('fk_readings_turn_id_rehearsal_turns'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_readings_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_readings'))
    )
    with op.batch_alter_table('readings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_readings_situation_id'), ['situation_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_readings_turn_id'), ['turn_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_readings_user_id'), ['user_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('readings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_readings_user_id'))
        batch_op.drop_index(batch_op.f('ix_readings_turn_id'))
        batch_op.drop_index(batch_op.f('ix_readings_situation_id'))

    op.drop_table('readings')
    with op.batch_alter_table('rehearsal_turns', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rehearsal_turns_user_id'))
        batch_op.drop_index('ix_rehearsal_turns_rehearsal_created')

    op.drop_table('rehearsal_turns')
    with op.batch_alter_table('situations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_situations_user_id'))
        batch_op.drop_index(batch_op.f('ix_situations_companion_id'))

    op.drop_table('situations')
    with op.batch_alter_table('rehearsals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rehearsals_user_id'))
        batch_op.drop_index(batch_op.f('ix_rehearsals_companion_id'))

    op.drop_table('rehearsals')
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_messages_user_id'))
        batch_op.drop_index('ix_messages_companion_created')

    op.drop_table('messages')
    with op.batch_alter_table('memories', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_memories_user_id'))
        batch_op.drop_index(batch_op.f('ix_memories_companion_id'))

    op.drop_table('memories')
    with op.batch_alter_table('comments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_comments_user_id'))
        batch_op.drop_index(batch_op.f('ix_comments_post_id'))

    op.drop_table('comments')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sessions_user_id'))

    op.drop_table('sessions')
    with op.batch_alter_table('posts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_posts_user_id'))

    op.drop_table('posts')
    with op.batch_alter_table('companions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_companions_user_id'))

    op.drop_table('companions')
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_user_id'))

    op.drop_table('agents')
    op.drop_table('users')
