"""A gloo process group of the parallel engine's ranks, with a timeout on every collective.

Built without the global default group of ``torch.distributed`` (so several engines, or one
restarted, live in one process): a ``TCPStore`` rendezvous (rank 0 hosts it) and one
``ProcessGroupGloo``. Every collective waits at most ``timeout_s``; a worker waiting for rank
0's next command waits up to ``idle_timeout_s`` (an idle engine sends nothing). A failed or
timed-out collective raises ``RankFailure``: the group is then unusable and the engine is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from backend.engine.interface import EngineDown

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 365 * 24 * 3600.0


class RankFailure(EngineDown):
    """A collective failed or timed out: some rank died, hung or lost its connection."""


class RankGroup:
    """The ranks 0..world-1 of one engine. ``store`` is the rendezvous every rank opened."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world: int,
        timeout_s: float,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        join_timeout_s: float | None = None,
    ) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self.rank = rank
        self.world = world
        self.store = store
        self.timeout = timedelta(seconds=timeout_s)
        self.idle_timeout = timedelta(seconds=idle_timeout_s)
        # start-up collectives wait for the slowest rank's load
        self.join_timeout = timedelta(seconds=join_timeout_s or timeout_s)
        # the backend object itself (its collectives take a per-call timeout; the type stubs
        # do not list them)
        self._pg: Any = dist.ProcessGroupGloo(
            dist.PrefixStore("engine", store), rank, world, self.join_timeout
        )
        self.bytes_sent = 0  # payload bytes this rank put into collectives (for benchmarks)
        self.seconds = 0.0  # seconds spent inside collectives (for benchmarks)
        self.broken = False

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def _wait(self, work: dist.Work, what: str, sent: int, timeout: timedelta | None) -> None:
        started = time.perf_counter()
        try:
            work.wait(timeout or self.timeout)
        except Exception as exc:  # gloo raises RuntimeError subclasses for timeouts and resets
            self.broken = True
            raise RankFailure(f"rank {self.rank}: {what} failed: {exc}") from exc
        finally:
            self.seconds += time.perf_counter() - started
        self.bytes_sent += sent

    def _check(self) -> None:
        if self.broken:
            raise RankFailure(f"rank {self.rank}: the process group failed earlier")

    def all_reduce(self, tensor: Tensor, *, startup: bool = False) -> Tensor:
        """Sum ``tensor`` over ranks in place (every rank gets the same result); ``startup``
        waits up to the join timeout (the ranks are still loading)."""
        self._check()
        if self.world == 1:
            return tensor
        timeout = self.join_timeout if startup else self.timeout
        work = self._pg.allreduce([tensor], dist.ReduceOp.SUM, timeout)
        # ring all-reduce: each rank sends 2 (N - 1) / N of the tensor
        sent = 2 * (self.world - 1) * _nbytes(tensor) // self.world
        self._wait(work, "all_reduce", sent, timeout)
        return tensor

    def broadcast(self, tensor: Tensor, *, idle: bool = False) -> Tensor:
        """Rank 0's ``tensor`` into every rank's (same shape and dtype); ``idle`` waits up to
        the idle timeout (a worker waiting for the next command)."""
        self._check()
        timeout = self.idle_timeout if idle and not self.is_root else self.timeout
        work = self._pg.broadcast(tensor, 0, timeout)
        sent = _nbytes(tensor) * (self.world - 1) if self.is_root else 0
        self._wait(work, "broadcast", sent, timeout)
        return tensor

    def gather_to_root(self, tensor: Tensor) -> list[Tensor] | None:
        """Every rank's ``tensor`` (same shape) at rank 0, in rank order; None elsewhere."""
        self._check()
        outputs = [torch.empty_like(tensor) for _ in range(self.world)] if self.is_root else []
        work = self._pg.gather(outputs, tensor, 0, self.timeout)
        self._wait(work, "gather", 0 if self.is_root else _nbytes(tensor), None)
        return outputs if self.is_root else None

    def all_to_all(
        self,
        output: Tensor,
        input: Tensor,
        output_splits: Sequence[int],
        input_splits: Sequence[int],
    ) -> Tensor:
        """Rows ``input_splits[r]`` of ``input`` go to rank r; ``output`` receives rank r's
        ``output_splits[r]`` rows, in rank order (uneven splits allowed)."""
        self._check()
        work = self._pg.alltoall_base(
            output, input, list(output_splits), list(input_splits), self.timeout
        )
        row = _nbytes(input) // max(1, input.shape[0])
        sent = row * (sum(input_splits) - input_splits[self.rank])
        self._wait(work, "all_to_all", sent, None)
        return output

    def shutdown(self) -> None:
        """Drop the group's connections (peers blocked on it get an error)."""
        self.broken = True
        try:
            self._pg.shutdown()
        except RuntimeError as exc:
            logger.debug("process group shutdown: %s", exc)


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()
