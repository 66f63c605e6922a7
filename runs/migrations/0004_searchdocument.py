"""Search: a document per settled run, and each vendor's full-text index over it (docs/search.md).

Django's ORM describes the table; the index is hand-written SQL run only on its vendor:
- PostgreSQL: a stored generated `tsvector` column (prompt A, answer B, tool titles C) with a GIN
  index. ASCII punctuation is read as spaces, as FTS5 does: else the parser keeps `parser.py` or
  `v1.2` as one word (and drops `<Button …>` as an HTML tag), and `parser` would not find it.
- SQLite: an external-content FTS5 table over the same rows (rowid = the document's id), kept in
  step by triggers. A later migration that alters `runs_searchdocument` on SQLite rebuilds the
  table and so drops these triggers: it must create them again (then `reindex_search`).
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class VendorSQL(migrations.RunSQL):
    """RunSQL on one database vendor only; a no-op on the others."""

    def __init__(self, vendor: str, sql: list[str], reverse_sql: list[str]) -> None:
        super().__init__(sql, reverse_sql)
        self.vendor = vendor

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.vendor, self.sql, self.reverse_sql], {})

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == self.vendor:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == self.vendor:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


# The 32 ASCII punctuation characters (runs.search.PUNCTUATION) as four ranges; regexp_replace
# is immutable, and five times faster than translate() with the 32 listed.
PUNCTUATION_CLASS = "[!-/:-@[-`{-~]"


def _weighted(column: str, weight: str) -> str:
    words = f"regexp_replace({column}, '{PUNCTUATION_CLASS}', ' ', 'g')"
    return f"setweight(to_tsvector('english'::regconfig, {words}), '{weight}')"


POSTGRESQL = VendorSQL(
    "postgresql",
    [
        "ALTER TABLE runs_searchdocument ADD COLUMN document tsvector GENERATED ALWAYS AS ("
        + " || ".join([_weighted("prompt", "A"), _weighted("answer", "B"), _weighted("tools", "C")])
        + ") STORED",
        "CREATE INDEX runs_searchdocument_document_gin ON runs_searchdocument USING gin (document)",
    ],
    [
        "DROP INDEX IF EXISTS runs_searchdocument_document_gin",
        "ALTER TABLE runs_searchdocument DROP COLUMN IF EXISTS document",
    ],
)

_FTS_DELETE = (
    "INSERT INTO runs_searchdocument_fts(runs_searchdocument_fts, rowid, prompt, answer, tools) "
    "VALUES ('delete', old.id, old.prompt, old.answer, old.tools);"
)
_FTS_INSERT = (
    "INSERT INTO runs_searchdocument_fts(rowid, prompt, answer, tools) "
    "VALUES (new.id, new.prompt, new.answer, new.tools);"
)

SQLITE = VendorSQL(
    "sqlite",
    [
        # porter: English stemming, as PostgreSQL's 'english' configuration does.
        "CREATE VIRTUAL TABLE runs_searchdocument_fts USING fts5("
        "prompt, answer, tools, content='runs_searchdocument', content_rowid='id', "
        "tokenize='porter unicode61 remove_diacritics 2')",
        f"CREATE TRIGGER runs_searchdocument_fts_insert AFTER INSERT ON runs_searchdocument BEGIN {_FTS_INSERT} END",
        f"CREATE TRIGGER runs_searchdocument_fts_delete AFTER DELETE ON runs_searchdocument BEGIN {_FTS_DELETE} END",
        "CREATE TRIGGER runs_searchdocument_fts_update AFTER UPDATE ON runs_searchdocument "
        f"BEGIN {_FTS_DELETE} {_FTS_INSERT} END",
    ],
    [
        "DROP TRIGGER IF EXISTS runs_searchdocument_fts_update",
        "DROP TRIGGER IF EXISTS runs_searchdocument_fts_delete",
        "DROP TRIGGER IF EXISTS runs_searchdocument_fts_insert",
        "DROP TABLE IF EXISTS runs_searchdocument_fts",
    ],
)


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0001_initial"),
        ("runs", "0003_fk_indexes_covered"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SearchDocument",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("prompt", models.TextField(blank=True)),
                (
                    "answer",
                    models.TextField(blank=True, help_text="The run's text (its answer), as materialized."),
                ),
                ("tools", models.TextField(blank=True, help_text="Its tool calls' titles, one per line.")),
                ("created_at", models.DateTimeField(help_text="The run's.")),
                ("indexed_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "owner",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="search_document",
                        to="runs.run",
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="projects.session"
                    ),
                ),
            ],
        ),
        POSTGRESQL,
        SQLITE,
    ]
