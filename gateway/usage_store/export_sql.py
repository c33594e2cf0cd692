"""The CSV export's query, in each driver's own SQL: the database writes every record's CSV
line (text quoted, NULL empty, `created_at` the ISO moment to the millisecond), so Python only
joins them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String

from gateway.usage_store.queries import ExportQuery
from gateway.usage_store.schema import RECORD_COLUMNS, records

CSV_COLUMNS = ("created_at", *RECORD_COLUMNS)  # the export's: the settlement moment first


def csv_line(dialect: str) -> str:
    """The SQL expression of one record's CSV line. SQLite writes it with one `printf` (`%w`
    doubles the double quotes inside a quoted field), about twice as fast as concatenating
    the fields."""
    if dialect == "sqlite":
        formats = ["%s"]
        values = ["strftime('%Y-%m-%dT%H:%M:%f', ts_ms / 1000.0, 'unixepoch') || '+00:00'"]
        for column in records.columns:
            quoted = isinstance(column.type, String)
            if quoted and column.nullable:  # NULL: an empty field, not an empty quoted one
                formats.append("%s")
                values.append(f"""coalesce('"' || replace({column.name}, '"', '""') || '"', '')""")
            else:
                formats.append('"%w"' if quoted else "%s")  # %s: NULL as an empty field
                values.append(column.name)
        return f"printf('{','.join(formats)}', {', '.join(values)})"
    fields = [_PG_MOMENT]
    for column in records.columns:
        name = column.name
        if isinstance(column.type, String):
            value = f"'\"' || replace({name}, '\"', '\"\"') || '\"'"
        else:
            value = f"{name}::text"
        fields.append(value if not column.nullable else f"coalesce({value}, '')")
    return " || ',' || ".join(fields)


# PostgreSQL's `created_at`, the ISO moment to the millisecond
_PG_MOMENT = (
    "to_char(to_timestamp(ts_ms / 1000) AT TIME ZONE 'UTC', "
    "'YYYY-MM-DD\"T\"HH24:MI:SS') || '.' || lpad((ts_ms % 1000)::text, 3, '0') || "
    "'+00:00'"
)
# the CSV's quoted columns: every text column (the rest, numbers, as they are; NULL empty)
QUOTED = tuple(c.name for c in records.columns if isinstance(c.type, String))


def copy_sql(q: ExportQuery) -> str:
    """PostgreSQL: the export's query for `COPY (...) TO STDOUT (FORMAT csv, FORCE_QUOTE
    (QUOTED))`, whose lines are `csv_line`'s: the server writes them in its COPY code, and
    sends them in a few large messages, not a row at a time. Its values are written into it
    as literals (a COPY takes no parameters; the driver would ask the server to format them,
    a round trip more)."""
    sql, _ = export_sql("postgresql", q, inline=True)
    return sql.replace("SELECT ", f"SELECT {_PG_MOMENT} AS created_at, ", 1)


def _literal(value: Any) -> str:
    """A value as a PostgreSQL literal: a whole number as it is, text as an escape string
    (backslashes and quotes doubled: whatever `standard_conforming_strings` says)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no literal for {type(value).__name__}")
    if isinstance(value, int):
        return str(int(value))
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def export_sql(
    dialect: str, q: ExportQuery, *, lines: bool = False, inline: bool = False
) -> tuple[str, list[Any]]:
    """The export's query in the driver's own parameter style (`?` or `$n`), or with its
    values written in (`inline`, PostgreSQL: `_literal`; no parameters): the records'
    columns, or (`lines`) each record's CSV line."""
    conditions: list[str] = []
    params: list[Any] = []

    def condition(column: str, op: str, value: Any) -> None:
        if inline:
            conditions.append(f"{column} {op} {_literal(value)}")
            return
        params.append(value)
        mark = "?" if dialect == "sqlite" else f"${len(params)}"
        conditions.append(f"{column} {op} {mark}")

    for column, value in q.equalities().items():  # column names from queries.COLUMN
        condition(column, "=", value)
    if q.start is not None:
        condition("ts_ms", ">=", int(q.start.timestamp()) * 1000)
    if q.end is not None:
        condition("ts_ms", "<", int(q.end.timestamp()) * 1000)
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    columns = csv_line(dialect) if lines else ", ".join(RECORD_COLUMNS)
    return f"SELECT {columns} FROM usage_records{where} ORDER BY ts_ms, record_id", params


# SQLite's export over every key: one window of time at a time, each key's records of the
# window read as one range of the records table (in key order), the window's sorted by time.
# Read by the index by time instead, each record is a lookup of its own in the table: 2 to 3
# times slower. The keys: each found after the one before it (an index seek each).
WINDOW_MS = 86_400_000
SQLITE_KEYS = (
    "WITH RECURSIVE k(id) AS (SELECT min(key_id) FROM usage_records UNION ALL "
    "SELECT (SELECT min(key_id) FROM usage_records WHERE key_id > k.id) FROM k "
    "WHERE k.id IS NOT NULL) SELECT id FROM k WHERE id IS NOT NULL"
)
SQLITE_BOUNDS = "SELECT min(ts_ms), max(ts_ms) FROM usage_records"


def sqlite_window_sql(q: ExportQuery, *, lines: bool = False) -> tuple[str, list[Any]]:
    """SQLite, an export with no key: the query of one window's records (`export_sql`'s
    columns and order), and its parameters but the last two: the keys (a JSON array), the
    query's equalities; the window's start and end (epoch ms) follow."""
    conditions = ["usage_records.key_id = k.value", "ts_ms >= ?", "ts_ms < ?"]
    params: list[Any] = []
    for column, value in q.equalities().items():  # column names from queries.COLUMN
        conditions.insert(1, f"{column} = ?")
        params.insert(0, value)
    columns = csv_line("sqlite") if lines else ", ".join(RECORD_COLUMNS)
    return (
        f"SELECT {columns} FROM json_each(?) AS k CROSS JOIN usage_records "
        f"ON {' AND '.join(conditions)} ORDER BY ts_ms, record_id",
        params,
    )
