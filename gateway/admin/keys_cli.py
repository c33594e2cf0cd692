"""`python -m gateway keys ...` and `python -m gateway usage ...`: the admin API's operations
from the command line, straight on Redis (the same store the gateway uses).

Each command prints JSON on stdout; errors go to stderr with exit status 1 (bad input: 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from gateway.config.settings import load_settings
from gateway.errors import GatewayError
from gateway.keys.records import KeyCreate, KeyUpdate, UsageQuery
from gateway.keys.store import KeyStore
from gateway.keys.usage import UsageReader
from gateway.observability.logging import configure_logging
from gateway.observability.redact import redact_text
from gateway.server.redis_server import RedisNotReady, open_redis

Action = Callable[[KeyStore, UsageReader, argparse.Namespace], Awaitable[Any]]


def register(subparsers: Any) -> None:
    """Add the `keys` and `usage` commands to an argparse subparsers object."""
    keys = subparsers.add_parser("keys", help="create, list, show, revoke and rotate API keys")
    verbs = keys.add_subparsers(dest="keys_command", required=True)

    create = verbs.add_parser("create", help="create a key and print its secret (shown once)")
    create.add_argument("--name", required=True)
    create.add_argument("--models", help="comma-separated models the key may use (default: all)")
    create.add_argument("--budget-tokens", type=int)
    create.add_argument("--budget-period", choices=["day", "month"])
    create.add_argument("--budget-cost", type=float, help="cost budget, in usage.currency")
    create.add_argument("--budget-cost-period", choices=["day", "month"])
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute")
    create.add_argument("--max-concurrency", type=int)
    _policy_arguments(create)
    create.set_defaults(func=_command(_create))

    policy = verbs.add_parser(
        "policy", help="set a key's routing policy (fields not given take their defaults)"
    )
    policy.add_argument("id")
    _policy_arguments(policy)
    policy.set_defaults(func=_command(_set_policy))

    verbs.add_parser("list", help="list keys").set_defaults(func=_command(_list))
    for verb, action, text in (
        ("show", _show, "show one key"),
        ("revoke", _revoke, "revoke a key on every replica"),
        ("rotate", _rotate, "replace a key's secret and print the new one (shown once)"),
    ):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("id")
        parser.set_defaults(func=_command(action))

    usage = subparsers.add_parser("usage", help="token usage totals")
    usage.add_argument("--key", dest="key_id")
    usage.add_argument("--model")
    usage.add_argument("--start", help="first UTC day, YYYY-MM-DD")
    usage.add_argument("--end", help="last UTC day, YYYY-MM-DD")
    usage.add_argument("--group-by", choices=["day", "model", "key"])
    usage.set_defaults(func=_command(_usage))


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thinking",
        choices=["off", "auto", "on", "client"],
        help="off/on: forced; auto: the model decides; client: the client's switch wins",
    )
    parser.add_argument("--max-reasoning-tokens", type=int, help="reasoning budget per request")
    parser.add_argument(
        "--providers", choices=["local", "any"], help="local: never an upstream provider"
    )
    parser.add_argument("--default-model", help="served when the model asked for is not")


def _policy(args: argparse.Namespace) -> dict[str, Any] | None:
    fields = {
        "thinking": args.thinking,
        "max_reasoning_tokens": args.max_reasoning_tokens,
        "providers": args.providers,
        "default_model": args.default_model,
    }
    given = {name: value for name, value in fields.items() if value is not None}
    return given or None


def _command(action: Action) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        settings = load_settings(getattr(args, "config", None))
        configure_logging(settings.logging)

        async def main() -> Any:
            async with open_redis(settings.redis) as redis:
                prefix = settings.redis.key_prefix
                store = KeyStore(redis, prefix=prefix)
                return await action(store, UsageReader(redis, prefix=prefix), args)

        try:
            result = asyncio.run(main())
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            field = ".".join(str(part) for part in error["loc"])
            print(f"error: invalid {field.replace('_', '-')}: {error['msg']}", file=sys.stderr)
            return 2
        except GatewayError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        except (RedisNotReady, RedisError) as exc:  # unreachable, or gone mid-command
            print(f"error: Redis did not answer: {redact_text(str(exc))}", file=sys.stderr)
            return 1
        print(json.dumps(result, indent=2))
        return 0

    return run


async def _create(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    fields = {
        "name": args.name,
        "models": None if args.models is None else [m.strip() for m in args.models.split(",")],
        "budget_tokens": args.budget_tokens,
        "budget_period": args.budget_period,
        "budget_cost": args.budget_cost,
        "budget_cost_period": args.budget_cost_period,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_concurrency": args.max_concurrency,
        "policy": _policy(args),
    }
    secret, record = await store.create(KeyCreate.model_validate(fields))
    print("Save this key now: it cannot be shown again.", file=sys.stderr)
    return {"id": record.id, "key": secret, **record.public()}


async def _set_policy(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    record = await store.update(args.id, KeyUpdate.model_validate({"policy": _policy(args)}))
    return record.public()


async def _list(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    return [record.public() for record in await store.list()]


async def _show(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    return (await store.get(args.id)).public()


async def _revoke(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    await store.revoke(args.id)
    return {"id": args.id, "deleted": True}


async def _rotate(store: KeyStore, _: UsageReader, args: argparse.Namespace) -> Any:
    secret, record = await store.rotate(args.id)
    print("Save this key now: it cannot be shown again.", file=sys.stderr)
    return {"id": record.id, "key": secret, **record.public()}


async def _usage(_: KeyStore, usage: UsageReader, args: argparse.Namespace) -> Any:
    fields = {"key_id": args.key_id, "model": args.model, "start": args.start, "end": args.end}
    query = UsageQuery.model_validate(
        {"group_by": args.group_by, **{k: v for k, v in fields.items() if v}}
    )
    return await usage.query(query)
