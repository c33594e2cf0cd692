"""`python -m gateway` with parts of the keyed path replaced by answers made in the process, to
measure what each part costs a request (benchmarks/keyed_breakdown.py). For benchmarks only:
with a part replaced, usage is not recorded and limits are not kept.

    python -m benchmarks.stand_ins admit,settle serve --config FILE

Parts (comma-separated):
- `admit`: the admission is a grant made at once, with the rate-limit headers a real one
  carries; no Redis call. (The real settlement then finds no reservation and returns early in
  Redis; its work in the gateway is unchanged.)
- `settle`: the settlement is done at once: nothing is built or sent.
- `send`: the settlement is built as for Redis (usage record, script arguments, packed by
  hiredis) but not sent: what `settle` saves, less the write and the reply.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from hiredis import pack_command

from gateway.access import Grant, Outcome, Ticket
from gateway.cli import main as gateway_main
from gateway.keys import access, limiter, script_batch
from gateway.keys.store import batched_lua

PARTS = ("admit", "settle", "send")


def _done(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _instant_admission(self: access.RedisAccessControl, ticket: Ticket) -> asyncio.Future[Grant]:
    now_ms = int(time.time() * 1000)
    minute = now_ms // 60_000
    reset_ms = (minute + 1) * 60_000 - now_ms
    need = ticket.prompt_tokens + ticket.max_tokens
    headers = {
        **limiter.ratelimit_headers("requests", 10**8, 10**8 - 1, reset_ms),
        **limiter.ratelimit_headers("tokens", 10**11, 10**11 - need, reset_ms),
    }
    grant = Grant(ticket, ticket.max_tokens, need, headers, f"stand-in.{minute}")
    return _done(grant)


def _instant_settlement(
    self: access.RedisAccessControl, grant: Grant, outcome: Outcome
) -> asyncio.Future[None]:
    return _done(None)


def _unsent_settlements() -> None:
    """Settlements are packed as for the wire (each a batch of one), then answered at once."""
    settle_sha = script_batch.Script.of(batched_lua("settle.lua")).sha
    run_item = script_batch.ScriptBatcher.run_item

    def packed_only(
        self: script_batch.ScriptBatcher,
        script: script_batch.BatchedScript,
        keys: tuple[str, ...],
        args: Sequence[Any],
        parse: script_batch.Parse | None = None,
        *,
        at_once: bool = False,
    ) -> asyncio.Future[Any]:
        if script.script.sha != settle_sha:
            return run_item(self, script, keys, args, parse, at_once=at_once)
        done = _done(1)
        item = script_batch.Item(keys, args, done, None)
        pack_command(script_batch.batch_call(script, [item], done).command)
        return done

    script_batch.ScriptBatcher.run_item = packed_only  # type: ignore[method-assign]


def replace(parts: set[str]) -> None:
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")
    if "admit" in parts:
        access.RedisAccessControl.admit = _instant_admission  # type: ignore[method-assign]
    if "settle" in parts:
        access.RedisAccessControl.settle = _instant_settlement  # type: ignore[method-assign]
    if "send" in parts:
        _unsent_settlements()


if __name__ == "__main__":
    replace({part for part in sys.argv[1].split(",") if part})
    sys.exit(gateway_main(sys.argv[2:]))
