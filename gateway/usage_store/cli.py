"""`python -m gateway usage-store summary|records|export`: the admin API's usage reports from
the command line, straight on the usage store (`[usage] url`).

summary and records print JSON on stdout; export writes CSV (stdout or `--output`). Errors go
to stderr with exit status 1 (bad input: 2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import IO, Any

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from gateway.config.settings import Settings, load_settings
from gateway.observability.logging import configure_logging
from gateway.observability.redact import redact_text
from gateway.usage_store.export_sql import CSV_COLUMNS
from gateway.usage_store.queries import ExportQuery, RecordsQuery, SummaryQuery
from gateway.usage_store.store import UsageStore

_FILTERS = ("key", "model", "provider", "route", "thinking", "status", "error_code", "start", "end")


def register(subparsers: Any) -> None:
    """Add the `usage-store` command to an argparse subparsers object."""
    parser = subparsers.add_parser("usage-store", help="usage reports from the SQL usage store")
    verbs = parser.add_subparsers(dest="usage_store_command", required=True)
    summary = verbs.add_parser("summary", help="totals grouped by dimensions, per period")
    summary.add_argument("--group-by", default="", help="comma-separated: key,model,provider,"
                         "route,thinking,status,error_code")  # fmt: skip
    summary.add_argument("--interval", choices=["hour", "day", "month"])
    summary.add_argument("--no-latency", action="store_true", help="leave out p50/p95")
    records = verbs.add_parser("records", help="records newest first (one page)")
    records.add_argument("--limit", type=int, default=100)
    records.add_argument("--cursor", help="the previous page's next_cursor")
    export = verbs.add_parser("export", help="records as CSV, oldest first")
    export.add_argument("--output", help="file to write (default: stdout)")
    for verb in (summary, records, export):
        for name in _FILTERS:
            flag = "--" + name.replace("_", "-")
            verb.add_argument(flag, help="ISO 8601 time (UTC unless it has an offset)"
                              if name in ("start", "end") else None)  # fmt: skip
    for verb, action in ((summary, _summary), (records, _records), (export, _export)):
        verb.set_defaults(func=_runner(action))


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {name: value for name in _FILTERS if (value := getattr(args, name)) is not None}


async def _summary(store: UsageStore, settings: Settings, args: argparse.Namespace) -> Any:
    q = SummaryQuery.model_validate(
        {
            **_filters(args),
            "group_by": args.group_by,
            "interval": args.interval,
            "latency": not args.no_latency,
        }
    )
    return {"currency": settings.usage.currency, "data": await store.summary(q)}


async def _records(store: UsageStore, _: Settings, args: argparse.Namespace) -> Any:
    fields = {**_filters(args), "limit": args.limit}
    if args.cursor:
        fields["cursor"] = args.cursor
    rows, cursor = await store.records(RecordsQuery.model_validate(fields))
    return {"data": rows, "next_cursor": cursor}


async def _export(store: UsageStore, _: Settings, args: argparse.Namespace) -> None:
    q = ExportQuery.model_validate(_filters(args))
    out: IO[str] = args.out
    out.write(",".join(CSV_COLUMNS) + "\n")
    async for chunk in store.export_csv(q):
        out.write(chunk.decode())


def _runner(action: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        settings = load_settings(getattr(args, "config", None))
        configure_logging(settings.logging)
        if not settings.usage.enabled:
            print("error: the usage store is not enabled ([usage] enabled = true)", file=sys.stderr)
            return 1

        async def main() -> Any:
            store = await UsageStore.open(settings.usage.url)
            try:
                return await action(store, settings, args)
            finally:
                await store.aclose()

        output = getattr(args, "output", None)
        args.out = sys.stdout if output is None else open(output, "w", newline="")  # noqa: SIM115
        try:
            result = asyncio.run(main())
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            field = ".".join(str(part) for part in error["loc"]) or "query"
            print(f"error: invalid {field.replace('_', '-')}: {error['msg']}", file=sys.stderr)
            return 2
        except (SQLAlchemyError, OSError) as exc:
            print(f"error: the usage store did not answer: {redact_text(str(exc))}",
                  file=sys.stderr)  # fmt: skip
            return 1
        finally:
            if args.out is not sys.stdout:
                args.out.close()
        if result is not None:
            print(json.dumps(result, indent=2))
        return 0

    return run
