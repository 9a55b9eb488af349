"""The first schema of the history store: runs, drill_runs, figures (issue 32).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_key", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("plan", sa.String(200), nullable=False),
        sa.Column("plan_path", sa.Text),
        sa.Column("target_key", sa.String(400), nullable=False),
        sa.Column("target", sa.JSON),
        sa.Column("started_at", sa.String(40), nullable=False),
        sa.Column("started_unix", sa.Float, nullable=False),
        sa.Column("ended_at", sa.String(40)),
        sa.Column("verdict", sa.String(20)),
        sa.Column("complete", sa.Boolean),
        sa.Column("engine", sa.String(200)),
        sa.Column("product_version", sa.String(40)),
        sa.Column("tool", sa.JSON),
        sa.Column("source", sa.Text),
    )
    op.create_index("ix_runs_started_unix", "runs", ["started_unix"])
    op.create_table(
        "drill_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("drill", sa.String(100), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("reasons", sa.JSON),
        sa.Column("settings_hash", sa.String(16), nullable=False),
        sa.Column("settings", sa.JSON),
        sa.Column("costs", sa.JSON),
        sa.Column("windows", sa.JSON),
        sa.Column("figures", sa.JSON),
    )
    op.create_index("ix_drill_runs_drill", "drill_runs", ["drill"])
    op.create_table(
        "figures",
        sa.Column(
            "drill_run_id",
            sa.Integer,
            sa.ForeignKey("drill_runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("value", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("figures")
    op.drop_table("drill_runs")
    op.drop_index("ix_runs_started_unix", "runs")
    op.drop_table("runs")
