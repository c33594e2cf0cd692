"""Run Lua scripts on one pipelined Redis connection of their own.

Every request admits and settles with a script, so this is the hot path to Redis. All script
calls issued in one event-loop tick go out as one write (packed by hiredis, in C) on a connection
this batcher owns. A call made `at_once` while nothing is in flight or queued on the connection
goes out at once instead: the admission and the settlement of a request that is the only one
under way, which nothing would join (about 0.01 ms off a keyed request at one client, within
the noise of one run). Only then: with other requests under way more calls are coming, and one
write for them all costs less (with every call on a quiet connection sent at once, Redis spent
about 5% more CPU per request for two workers at 16 clients). Replies are parsed (by hiredis)
as they arrive and handed to their callers in order (the connection is `script_channel.py`'s
`Channel`). Going through redis-py's pool instead
costs, per call, a pool checkout under a lock, a health check and a timeout task: several times
the CPU of the call itself on a gateway that serves thousands of requests a second. Each script
still runs atomically on its own.

- A `BatchedScript` takes many calls (items) in one script call: the items of one loop tick
  go to Redis as one EVALSHA, with the keys of each item passed once for all the items that
  name the same ones, and the items' args packed in one MessagePack argument; the script
  answers with one reply per item, in order (see admit.lua and settle.lua, which read once what
  several items read, and write once what they write). Redis pays for each argument about what
  it pays for a small command, and for a number passed as text its parsing: packed, a keyed
  request costs Redis about a quarter less CPU than with an argument per value
  (benchmarks/trees/redis.py).
- Scripts missing from the server's cache (a restart, SCRIPT FLUSH) are sent again as EVAL.
- A script's error reply fails only its caller (`ResponseError`): every item of a batched
  call, and no other call.
- A caller may pass `parse`, which turns the raw reply (or the error the call failed with) into
  the future's result, or raises: it runs as the reply is read, so the caller's own work on the
  reply costs no extra turn of the event loop.
- Waiting for replies, the event loop keeps turning instead of sleeping, as the process's
  `BusyWait` (plumbing/busy_wait.py) says: each call awaited is one answer it waits for.
- No reply within `timeout_s` fails every call waiting on the connection with a redis-py
  `TimeoutError` and closes it; a lost connection fails them with `ConnectionError`. The next
  call opens a new connection. Both are `RedisError`s, which the gateway answers with a 503.
  Such a call may still have run (or may run later: a stalled Redis runs what it had read);
  a call that never reached Redis (no connection could be opened) fails with `Unsent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from msgpack import packb
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import InvalidResponse

from gateway.keys.script_channel import Arg, Call, Channel, Parse, Script, Unsent, resolve
from plumbing.busy_wait import BusyWait
from plumbing.record import record

__all__ = [
    "Arg",
    "BatchedScript",
    "Item",
    "Parse",
    "Script",
    "ScriptBatcher",
    "Unsent",
    "batch_call",
]


@record
class BatchedScript:
    """A script that runs many items per call, each with its keys and args as `batch_call`
    lays them out, after `head` (arguments shared by every item); it replies with a list of
    one reply per item. At most `max_items` go in one call. Args are what MessagePack packs
    (str, int, bytes, and lists and dicts of them)."""

    script: Script
    head: tuple[Arg, ...] = ()
    max_items: int = 256


@dataclass(slots=True)
class Item:
    """One caller's part of a batched call."""

    keys: tuple[str, ...]
    args: Sequence[Any]
    future: asyncio.Future[Any]
    parse: Parse | None


def _fan_out(items: Sequence[Item], reply: Any) -> None:
    """A batched call's reply (or failure) handed to its items, each its own."""
    if not isinstance(reply, BaseException) and (
        not isinstance(reply, list) or len(reply) != len(items)
    ):
        reply = InvalidResponse(f"a batch of {len(items)} got the reply {reply!r}")
    for i, item in enumerate(items):
        resolve(item, reply if isinstance(reply, BaseException) else reply[i])


def batch_call(script: BatchedScript, items: Sequence[Item], future: asyncio.Future[Any]) -> Call:
    """One call of `script` for `items`. KEYS: the keys of each item, once for all the items
    with the same keys. ARGV: the script's head, then one MessagePack array with an array per
    item: where its keys start in KEYS (0-based, so its j-th key is `KEYS[start + j]`), then
    its args."""
    start: dict[tuple[str, ...], int] = {}
    keys: list[str] = []
    packed: list[list[Any]] = []
    for item in items:
        at = start.get(item.keys)
        if at is None:
            at = start[item.keys] = len(keys)
            keys += item.keys
        packed.append([at, *item.args])
    inner = script.script
    command = ("EVALSHA", inner.sha, len(keys), *keys, *script.head, packb(packed))
    return Call(command, future, inner, 0.0, partial(_fan_out, items))


@dataclass(slots=True)
class _Batch:
    """A batched script's items of one loop tick, in the queue where the first came."""

    script: BatchedScript
    items: list[Item]
    loop: asyncio.AbstractEventLoop

    def call(self) -> Call:
        return batch_call(self.script, self.items, self.loop.create_future())


class ScriptBatcher:
    """Runs scripts for many callers on one connection opened from `redis`'s settings."""

    def __init__(
        self, redis: Redis, *, timeout_s: float = 5.0, busy: BusyWait | None = None
    ) -> None:
        """`busy`: the process's `BusyWait` (default: one of its own that never spins)."""
        pool = redis.connection_pool
        self._busy = busy or BusyWait()
        self._kwargs = dict(pool.connection_kwargs)
        self._tls = issubclass(pool.connection_class, SSLConnection)
        self._timeout_s = timeout_s
        self._queue: list[Call | _Batch] = []  # the calls of this loop tick, in order
        self._batches: dict[Script, _Batch] = {}  # this tick's batch of each batched script
        self._waiting: list[Call] = []  # flushed while a connection is being opened
        self._channel: Channel | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False

    def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        parse: Parse | None = None,
        *,
        at_once: bool = False,
    ) -> asyncio.Future[Any]:
        """The script's result (through `parse`, if given), sent with whatever else this loop
        tick runs; or, `at_once`, at once if the connection is quiet."""
        channel = self._channel
        loop = channel.loop if channel is not None and channel.open else None
        loop = loop or asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = Call.evalsha(script, keys, args, future, parse)
        if self._closed:
            resolve(call, Unsent("The script connection is closed."))
            return future
        if not self._queue:
            if at_once and channel is not None and channel.quiet():
                channel.send([call])  # alone: nothing to batch it with, no tick to wait for
                return future
            loop.call_soon(self._flush)
        self._queue.append(call)
        return future

    def run_item(
        self,
        script: BatchedScript,
        keys: tuple[str, ...],
        args: Sequence[Any],
        parse: Parse | None = None,
        *,
        at_once: bool = False,
    ) -> asyncio.Future[Any]:
        """One item's reply from `script` (through `parse`, if given), sent in one call with
        the other items of this loop tick; or, `at_once`, at once (alone) if the connection
        is quiet."""
        channel = self._channel
        loop = channel.loop if channel is not None and channel.open else None
        loop = loop or asyncio.get_running_loop()
        item = Item(keys, args, loop.create_future(), parse)
        if self._closed:
            resolve(item, Unsent("The script connection is closed."))
            return item.future
        if not self._queue:
            if at_once and channel is not None and channel.quiet():
                channel.send([batch_call(script, [item], loop.create_future())])
                return item.future
            loop.call_soon(self._flush)
        batch = self._batches.get(script.script)
        if batch is None or len(batch.items) >= script.max_items:
            batch = self._batches[script.script] = _Batch(script, [], loop)
            self._queue.append(batch)
        batch.items.append(item)
        return item.future

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _flush(self) -> None:
        queued, self._queue = self._queue, []
        self._batches.clear()
        batch = [q if isinstance(q, Call) else q.call() for q in queued]
        channel = self._channel
        if channel is not None and channel.open:
            channel.send(batch)
            return
        self._waiting += batch
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            channel = await asyncio.wait_for(self._open(), self._timeout_s)
            self._channel = channel
            waiting, self._waiting = self._waiting, []
            channel.send(waiting)
        except BaseException as exc:
            error = Unsent(f"Could not connect to Redis: {exc!r}")
            waiting, self._waiting = self._waiting, []
            for call in waiting:
                resolve(call, error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._connecting = None

    async def _open(self) -> Channel:
        loop = asyncio.get_running_loop()
        kw = self._kwargs

        def channel() -> Channel:
            return Channel(self._timeout_s, loop, self._busy)

        if "path" in kw:
            _, ch = await loop.create_unix_connection(channel, kw["path"])
        else:
            ssl = SSLConnection(**kw).ssl_context.get() if self._tls else None
            host = kw.get("host", "localhost")
            _, ch = await loop.create_connection(channel, host, kw.get("port", 6379), ssl=ssl)
        handshake: list[tuple[Arg, ...]] = []
        if kw.get("password"):
            user = (kw["username"],) if kw.get("username") else ()
            handshake.append(("AUTH", *user, kw["password"]))
        if kw.get("db"):
            handshake.append(("SELECT", kw["db"]))
        if handshake:
            calls = [Call(command, loop.create_future()) for command in handshake]
            ch.send(calls)
            try:
                for call in calls:
                    await call.future
            except BaseException:
                ch.close()
                raise
        return ch
