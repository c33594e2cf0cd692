"""The local engine seen through the gateway: a tool for tool-call tests, and a wait until the
engine is idle."""

from __future__ import annotations

import asyncio

from tests.support.local_gateway import (
    TOOL_NAME,
    LocalGateway,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def wait_idle(gateway: LocalGateway) -> None:
    """Until nothing runs or waits and every KV block is free (cached blocks count as free)."""
    for _ in range(300):
        stats = gateway.provider.engine_stats()
        idle = stats.num_running == stats.num_waiting == 0
        if idle and stats.num_free_blocks == stats.num_total_blocks:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine not idle: {gateway.provider.engine_stats()}")
