"""Fixtures of the usage store tests: a store URL on SQLite (a file of the test's own) and on
a real PostgreSQL server the tests start (one per session, a database per test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.postgres import PrivatePostgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}"
    server: PrivatePostgres = request.getfixturevalue("postgres_server")
    name = f"usage_{uuid.uuid4().hex[:12]}"
    server.create_database(name)
    return server.url(name)
