"""The process group of the parallel engine's ranks, with a timeout on every collective.

Built without the global default group of ``torch.distributed`` (so several engines, or one
restarted, live in one process): a ``TCPStore`` rendezvous (rank 0 hosts it) and one backend,
``ProcessGroupNCCL`` or ``ProcessGroupGloo`` (``choose_backend``: NCCL for CUDA ranks when torch
has it, gloo otherwise or when asked). Every collective waits at most ``timeout_s``; a worker
waiting for rank 0's next command waits up to ``idle_timeout_s`` (an idle engine sends
nothing). A failed or timed-out collective raises ``RankFailure``: the group is then unusable
and the engine is down.

Tensors are staged where the backend needs them (``staging_device``): NCCL reads only the
rank's GPU (the step's plan, built on the CPU, is copied there and back); gloo reduces and
broadcasts CUDA tensors itself but gathers and exchanges (all-to-all) only CPU ones.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from backend.engine.interface import EngineDown

logger = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 365 * 24 * 3600.0

Backend = Literal["nccl", "gloo"]
BACKEND_SETTINGS = ("auto", "nccl", "gloo")
# A collective that fails under NCCL aborts the communicator and raises in the waiting thread;
# torch's default (3) would end the whole process, and rank 0's process is the gateway.
_NCCL_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")


class RankFailure(EngineDown):
    """A collective failed or timed out: some rank died, hung or lost its connection."""


def choose_backend(
    setting: str, device: torch.device, *, nccl_available: bool, local_ranks_per_gpu: int = 1
) -> Backend:
    """The collectives' backend for ranks on ``device``: ``setting`` "auto" takes NCCL when the
    device is CUDA, torch has NCCL and each rank has a GPU of its own (NCCL cannot put two ranks
    on one GPU), gloo otherwise; "nccl" and "gloo" force one (NCCL raises where it cannot run)."""
    if setting not in BACKEND_SETTINGS:
        raise ValueError(f"parallel backend must be one of {list(BACKEND_SETTINGS)}: {setting!r}")
    nccl_fits = device.type == "cuda" and nccl_available and local_ranks_per_gpu <= 1
    if setting == "gloo" or (setting == "auto" and not nccl_fits):
        return "gloo"
    if not nccl_fits:
        raise ValueError(
            "the NCCL backend needs CUDA ranks, torch built with NCCL and one GPU per rank "
            f"(device {device}, NCCL {'present' if nccl_available else 'absent'}, "
            f"{local_ranks_per_gpu} ranks per GPU)"
        )
    return "nccl"


def rank_device(device: str, local_rank: int, num_gpus: int) -> torch.device:
    """The device of the rank that is ``local_rank``-th on its node: CUDA ranks take one GPU
    each, counting from the configured one (``cuda`` is ``cuda:0``) and wrapping around when
    the node has fewer GPUs than ranks; other devices are shared as they are."""
    base = torch.device(device)
    if base.type != "cuda":
        return base
    if num_gpus < 1:
        raise ValueError(f"device {device} asked for, but no GPU is visible")
    return torch.device("cuda", ((base.index or 0) + local_rank) % num_gpus)


def staging_device(
    backend: Backend, collective: str, tensor: Tensor, device: torch.device
) -> torch.device:
    """Where ``tensor`` must be for ``collective`` on ``backend``: NCCL on the rank's GPU; gloo
    reduces and broadcasts CPU or CUDA tensors but gathers and exchanges CPU ones only."""
    if backend == "nccl":
        return device
    if collective in ("all_reduce", "broadcast"):
        return tensor.device
    return torch.device("cpu")


class RankGroup:
    """The ranks 0..world-1 of one engine. ``store`` is the rendezvous every rank opened;
    ``device`` is this rank's (a CUDA device for NCCL); ``backend`` "nccl" or "gloo"."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world: int,
        timeout_s: float,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        join_timeout_s: float | None = None,
        *,
        backend: Backend = "gloo",
        device: torch.device | str = "cpu",
    ) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside a world of {world}")
        self.rank = rank
        self.world = world
        self.store = store
        self.backend: Backend = backend
        self.device = torch.device(device)
        self.timeout = timedelta(seconds=timeout_s)
        self.idle_timeout = timedelta(seconds=idle_timeout_s)
        # start-up collectives wait for the slowest rank's load
        self.join_timeout = timedelta(seconds=join_timeout_s or timeout_s)
        # the backend object itself (its collectives take a per-call timeout; the type stubs
        # do not list them)
        self._pg: Any = self._open(dist.PrefixStore("engine", store))
        self.bytes_sent = 0  # payload bytes this rank put into collectives (for benchmarks)
        self.seconds = 0.0  # seconds spent inside collectives (for benchmarks)
        self.broken = False

    def _open(self, store: dist.Store) -> Any:
        if self.backend == "gloo":
            return dist.ProcessGroupGloo(store, self.rank, self.world, self.join_timeout)
        if self.device.type != "cuda":
            raise ValueError(f"the NCCL backend needs a CUDA device, got {self.device}")
        name, value = _NCCL_ERROR_HANDLING
        os.environ.setdefault(name, value)  # read when the communicator is made
        torch.cuda.set_device(self.device)  # NCCL runs on the current device
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = self.join_timeout  # the default; each collective passes its own
        return dist.ProcessGroupNCCL(store, self.rank, self.world, options)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def _staged(self, collective: str, tensor: Tensor) -> Tensor:
        """``tensor`` or its copy where the backend reads it (``staging_device``)."""
        return tensor.to(staging_device(self.backend, collective, tensor, self.device))

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
        staged = self._staged("all_reduce", tensor)
        work = self._pg.allreduce([staged], dist.ReduceOp.SUM, timeout)
        # ring all-reduce: each rank sends 2 (N - 1) / N of the tensor
        sent = 2 * (self.world - 1) * _nbytes(tensor) // self.world
        self._wait(work, "all_reduce", sent, timeout)
        return _unstage(staged, tensor)

    def broadcast(self, tensor: Tensor, *, idle: bool = False) -> Tensor:
        """Rank 0's ``tensor`` into every rank's (same shape and dtype); ``idle`` waits up to
        the idle timeout (a worker waiting for the next command)."""
        self._check()
        timeout = self.idle_timeout if idle and not self.is_root else self.timeout
        staged = self._staged("broadcast", tensor)
        work = self._pg.broadcast(staged, 0, timeout)
        sent = _nbytes(tensor) * (self.world - 1) if self.is_root else 0
        self._wait(work, "broadcast", sent, timeout)
        return _unstage(staged, tensor)

    def all_gather(self, tensor: Tensor) -> Tensor:
        """Every rank's ``tensor`` (same shape on every rank), stacked in rank order:
        [world, *shape], on ``tensor``'s device."""
        self._check()
        if self.world == 1:
            return tensor.unsqueeze(0)
        staged = self._staged("all_gather", tensor.contiguous())
        out = torch.empty((self.world, *staged.shape), dtype=staged.dtype, device=staged.device)
        work = self._pg.allgather(list(out.unbind(0)), staged, self.timeout)
        # ring all-gather: each rank passes on N - 1 chunks of the tensor's size
        self._wait(work, "all_gather", (self.world - 1) * _nbytes(tensor), None)
        return out.to(tensor.device)

    def gather_to_root(self, tensor: Tensor) -> list[Tensor] | None:
        """Every rank's ``tensor`` (same shape) at rank 0, in rank order; None elsewhere."""
        self._check()
        staged = self._staged("gather", tensor)
        outputs = [torch.empty_like(staged) for _ in range(self.world)] if self.is_root else []
        work = self._pg.gather(outputs, staged, 0, self.timeout)
        self._wait(work, "gather", 0 if self.is_root else _nbytes(tensor), None)
        return [out.to(tensor.device) for out in outputs] if self.is_root else None

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
        staged_out = self._staged("all_to_all", output)
        staged_in = self._staged("all_to_all", input)
        work = self._pg.alltoall_base(
            staged_out, staged_in, list(output_splits), list(input_splits), self.timeout
        )
        row = _nbytes(input) // max(1, input.shape[0])
        sent = row * (sum(input_splits) - input_splits[self.rank])
        self._wait(work, "all_to_all", sent, None)
        return _unstage(staged_out, output)

    def shutdown(self) -> None:
        """Drop the group's connections (peers blocked on it get an error)."""
        self.broken = True
        try:
            self._pg.shutdown()
        except RuntimeError as exc:
            logger.debug("process group shutdown: %s", exc)


def _unstage(staged: Tensor, tensor: Tensor) -> Tensor:
    """``tensor`` holding the collective's result (copied back when it was staged elsewhere)."""
    if staged is not tensor:
        tensor.copy_(staged)
    return tensor


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()
