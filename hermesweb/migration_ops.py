"""Migration operations Django's own get wrong for this schema.

Used by the migrations that take the index off foreign keys an index or unique constraint
already leads with (each index costs every insert: a journal row, a run, a session touch).
"""

from __future__ import annotations

from django.db import migrations, models


def drop_covered_fk_index(
    model_name: str, name: str, field: models.ForeignKey, table: str, index: str
) -> migrations.SeparateDatabaseAndState:
    """`AlterField` to `db_index=False`, dropping the foreign key's own index and nothing else.

    Django's `AlterField` drops every plain index on the column it finds, and takes the
    partial unique indexes of conditional constraints for plain ones: it dropped
    `journal_one_terminal_per_run` and `one_active_run_per_session` with them. The name is
    Django's for the index it made, the same on PostgreSQL and SQLite.
    """
    column = f"{name}_id"
    return migrations.SeparateDatabaseAndState(
        state_operations=[migrations.AlterField(model_name=model_name, name=name, field=field)],
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX IF NOT EXISTS "{index}" ON "{table}" ("{column}")',
            )
        ],
    )
