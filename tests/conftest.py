"""Shared fixtures: a mock OpenAI-compatible upstream and a free local port; the fixtures of
`tests/support` are registered here as plugins, so every test module may use them."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from testkit.mock_upstream import MockUpstream

pytest_plugins = [
    "tests.support.fixtures",
    "tests.support.local_gateway",
    "tests.support.messages_gateway",
    "tests.support.console",
    "tests.support.browser",
]


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def mock_upstream() -> AsyncIterator[MockUpstream]:
    """A started mock upstream; its base URL (ending in /v1) is `mock_upstream.base_url`."""
    mock = MockUpstream()
    await mock.start()
    yield mock
    await mock.stop()
