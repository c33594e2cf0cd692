"""`keys` and `usage` commands, run in-process on the real Redis under a unique prefix."""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from gateway.access.contract import Outcome, Ticket
from gateway.admin import keys_cli
from gateway.keys.redis_access import RedisAccessControl
from providers.types import Usage


@pytest.fixture
def prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    prefix = f"test:{uuid.uuid4().hex}:"
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    monkeypatch.setenv("GATEWAY_REDIS__URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("GATEWAY_REDIS__EMBEDDED", "false")
    monkeypatch.setenv("GATEWAY_REDIS__KEY_PREFIX", prefix)
    logging_config = structlog.get_config()
    yield prefix
    structlog.configure(**logging_config)
    client = SyncRedis()
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """Run one command; its exit status, parsed stdout (None when empty) and stderr."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    keys_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, json.loads(out) if out else None, err


def test_key_lifecycle(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, created, err = run(
        capsys, "keys", "create", "--name", "ci", "--models", "b,a", "--budget-tokens", "500",
        "--budget-period", "month", "--rpm", "5", "--tpm", "900", "--max-concurrency", "2",
        "--budget-cost", "12.5", "--budget-cost-period", "day",
    )  # fmt: skip
    assert status == 0 and "cannot be shown again" in err
    secret, key_id = created["key"], created["id"]
    assert secret.startswith("sk-") and len(secret) >= 35 and secret not in err
    assert created["models"] == ["a", "b"] and created["budget_period"] == "month"
    assert (created["rpm"], created["tpm"], created["max_concurrency"]) == (5, 900, 2)
    assert (created["budget_cost"], created["budget_cost_period"]) == (12.5, "day")

    status, shown, _ = run(capsys, "keys", "show", key_id)
    assert status == 0 and "key" not in shown and secret not in json.dumps(shown)
    assert shown == {k: v for k, v in created.items() if k != "key"}
    status, listed, _ = run(capsys, "keys", "list")
    assert [k["id"] for k in listed] == [key_id]

    status, rotated, _ = run(capsys, "keys", "rotate", key_id)
    assert status == 0 and rotated["id"] == key_id and rotated["key"] != secret
    assert rotated["hint"] == rotated["key"][-4:]

    status, revoked, _ = run(capsys, "keys", "revoke", key_id)
    assert status == 0 and revoked == {"id": key_id, "deleted": True}
    status, out, err = run(capsys, "keys", "show", key_id)
    assert status == 1 and out is None and key_id in err
    assert run(capsys, "keys", "list")[1] == []


def test_bad_input_creates_nothing(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "keys", "create", "--name", "x", "--rpm", "-1")
    assert status == 2 and out is None and "rpm" in err
    status, out, err = run(capsys, "keys", "create", "--name", "  ")
    assert status == 2 and "name" in err
    status, out, err = run(capsys, "keys", "create", "--name", "x", "--budget-cost", "-1")
    assert status == 2 and "budget-cost" in err
    assert run(capsys, "keys", "list")[1] == []
    with pytest.raises(SystemExit):
        run(capsys, "keys", "create", "--name", "x", "--budget-period", "week")


def test_usage_totals(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    created = run(capsys, "keys", "create", "--name", "u")[1]
    key_id = created["id"]

    async def spend() -> None:
        redis = Redis()
        access = RedisAccessControl(redis, prefix=prefix, usage_stream_maxlen=10)
        principal = await access.authenticate(created["key"])
        for model, completion in (("a", 5), ("b", 7), ("b", 1)):
            grant = await access.admit(Ticket(principal, model, "req", 3, 10))
            await access.settle(grant, Outcome(Usage(3, completion), 200))
        await access.aclose()
        await redis.aclose()

    asyncio.run(spend())
    status, report, _ = run(capsys, "usage", "--key", key_id, "--group-by", "model")
    assert status == 0 and report["totals"]["requests"] == 3
    assert [(r["model"], r["completion_tokens"]) for r in report["data"]] == [("a", 5), ("b", 8)]
    assert run(capsys, "usage", "--key", "key_other")[1]["totals"]["requests"] == 0


def test_routing_policy_from_the_command_line(
    prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, created, _ = run(
        capsys, "keys", "create", "--name", "p", "--thinking", "auto",
        "--max-reasoning-tokens", "256", "--providers", "local",
    )  # fmt: skip
    assert status == 0
    assert created["policy"] == {
        "thinking": "auto",
        "max_reasoning_tokens": 256,
        "providers": "local",
        "default_model": None,
    }
    status, changed, _ = run(
        capsys, "keys", "policy", created["id"], "--thinking", "off", "--default-model", "m"
    )
    assert status == 0
    assert changed["policy"]["thinking"] == "off" and changed["policy"]["default_model"] == "m"
    assert changed["policy"]["max_reasoning_tokens"] is None  # fields not given: defaults
    status, _, err = run(capsys, "keys", "policy", created["id"], "--max-reasoning-tokens", "0")
    assert status == 2 and "max-reasoning-tokens" in err
    status, shown, _ = run(capsys, "keys", "show", created["id"])
    assert shown["policy"] == changed["policy"]
    status, plain, _ = run(capsys, "keys", "create", "--name", "plain")
    assert plain["policy"] is None  # the default policy


def test_an_unreachable_redis_is_one_line_not_a_traceback(
    prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS__URL", "redis://:hunter2@127.0.0.1:1/0")
    status, out, err = run(capsys, "keys", "list")
    assert status == 1 and out is None
    assert err.startswith("error: Redis did not answer") and "Traceback" not in err
    assert "hunter2" not in err
