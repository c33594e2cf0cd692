"""Shared fixtures: a mock OpenAI-compatible upstream and a free local port; the fixtures of
`tests/support` are registered here as plugins, so every test module may use them."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from testkit.mock_upstream import MockUpstream

# Outside the quick loop (`scripts/test.sh --quick`): end-to-end runs of the engine behind the
# gateway, the engine against its references at length, several processes or ranks, Triton under
# the interpreter, fuzzers, fault drills with servers of their own, timers that must run out.
# The whole suite still runs them.
SLOW = (
    "tests/e2e/",
    "tests/backend/kernels/",
    "tests/backend/test_parallel",
    "tests/backend/test_spec_engine.py",
    "tests/backend/test_native_kernels.py",
    "tests/backend/test_engine.py",
    "tests/backend/test_triton_optional.py",
    "tests/backend/test_demo_train.py",
    "tests/backend/test_paged_cache.py",
    "tests/backend/test_mla.py",
    "tests/backend/test_async_engine.py",
    "tests/backend/test_model_parity.py",
    "tests/backend/test_plan.py",
    "tests/backend/test_generate.py",
    "tests/gateway/test_fuzz_openapi.py",
    "tests/gateway/server/test_fuzz_http.py",
    "tests/gateway/usage_store/test_fuzz_usage.py",
    "tests/gateway/usage_store/test_consumer.py",
    "tests/gateway/test_faults_",
    "tests/gateway/test_probe_",
    "tests/gateway/server/test_sse_stream.py",
    "tests/gateway/server/test_workers.py",
    "tests/gateway/server/test_serve.py",
    "tests/gateway/server/test_embedded_redis.py",
    "tests/providers/local/test_remote_engine.py",
    "tests/testkit/",
    "tests/test_compose.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix()
        if path.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


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
