"""What a bulk load (`UsageStore.bulk`) does apart from the insert path: the records table's
secondary indexes (by record id, by time) are dropped at its start and built again at its end,
in its transaction: one sort each at the end instead of an index entry a record in time order
while the records go in in key order. The records go in without the insert path's check for
ids stored before (the load is into an empty store; the unique index, built again at the end,
refuses a duplicate id), and every rollup by the insert path's own statements."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateIndex

from gateway.usage_store.schema import RECORD_COLUMNS, records

_DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}


def drop_indexes() -> list[str]:
    """The statements that drop the records table's secondary indexes."""
    return [f"DROP INDEX IF EXISTS {index.name}" for index in sorted(records.indexes, key=_name)]


def create_indexes(dialect: str) -> list[str]:
    """The statements that build them again, as the schema defines them."""
    return [
        str(CreateIndex(index).compile(dialect=_DIALECTS[dialect]))
        for index in sorted(records.indexes, key=_name)
    ]


def insert_records(source: str) -> str:
    """The statement that moves the staged records (in `source`) into the records table, in
    the stage's order."""
    names = ", ".join(RECORD_COLUMNS)
    return f"INSERT INTO {records.name} ({names}) SELECT {names} FROM {source}"


def _name(index: object) -> str:
    return str(getattr(index, "name", ""))
