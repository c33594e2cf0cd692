"""Usage records as the settlement script writes them to the stream, for usage-store tests."""

from __future__ import annotations

from typing import Any


def stream_fields(i: int, ts_s: float, **over: Any) -> dict[str, str]:
    """A usage stream entry's fields as settlement writes them (gateway/keys/usage.py)."""
    from datetime import UTC, datetime

    fields = {
        "charged_tokens": "30",
        "ts": datetime.fromtimestamp(ts_s, UTC).isoformat(),
        "request_id": f"req-{i}",
        "key_id": f"key{i % 3}",
        "model": f"model{i % 2}",
        "provider": "mock",
        "route_model": "echo",
        "thinking": "off",
        "route_reason": "route",
        "route": "provider=mock",
        "prompt_tokens": "20",
        "completion_tokens": "10",
        "reasoning_tokens": "2",
        "cached_tokens": "5",
        "max_tokens": "50",
        "reserved_tokens": "70",
        "latency_ms": f"{10 + i % 100}.0",
        "ttft_ms": f"{1 + i % 10}.0",
        "status": "200",
        "error_code": "",
        "cost": "0.001",
    }
    fields.update({k: str(v) for k, v in over.items()})
    return fields
