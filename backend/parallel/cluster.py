"""Rank 0's side of the parallel engine: the rendezvous, the local worker processes, the load.

``start_parallel_model`` hosts the rendezvous (a ``TCPStore`` at the configured address and
port), publishes the setup every worker reads (checkpoint path, engine config, pool size),
starts the local worker ranks as processes (``python -m backend.parallel.worker``), joins the
group, loads rank 0's shard and collects every rank's load report. Ranks on other nodes run
the same command with the address, port, rank and world size (see ``backend.parallel.worker``).

Each worker bumps a heartbeat counter in the store twice a second; when a collective fails,
``Cluster.diagnose`` names the ranks whose process exited or whose heartbeat stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import backend
from backend.engine.engine_config import EngineConfig, num_cache_blocks
from backend.model.config import ModelConfig
from backend.parallel.group import Backend, RankFailure, RankGroup, choose_backend, rank_device
from backend.parallel.layout import Layout
from backend.parallel.loader import LoadReport, load_shard
from backend.parallel.model import ShardedCausalLM

logger = logging.getLogger(__name__)

SETUP_KEY = "setup"
HEARTBEAT_S = 0.5
_STOP_GRACE_S = 5.0


def heartbeat_key(rank: int) -> str:
    return f"heartbeat/{rank}"


class Cluster:
    """The worker ranks this node started and the rendezvous store; names failed ranks."""

    def __init__(
        self, store: dist.TCPStore, world: int, processes: dict[int, subprocess.Popen[bytes]]
    ) -> None:
        self.store = store
        self.world = world
        self.processes = processes
        self.reports: list[LoadReport] = []

    @property
    def worker_pids(self) -> dict[int, int]:
        """Process id of each local worker rank."""
        return {rank: process.pid for rank, process in self.processes.items()}

    def diagnose(self, failure: RankFailure) -> RankFailure:
        """A RankFailure naming the ranks that exited or stopped their heartbeat (logged)."""
        silent = self._silent_ranks()  # also gives a killed process time to be reaped
        exited = {
            rank: process.returncode
            for rank, process in self.processes.items()
            if process.poll() is not None
        }
        ranks = {rank: f"exited with code {code}" for rank, code in sorted(exited.items())}
        ranks.update((rank, "stopped responding") for rank in silent if rank not in exited)
        named = "; ".join(f"rank {r} {cause}" for r, cause in ranks.items())
        named = named or "no rank named (a connection failed)"
        logger.error("parallel engine down: %s (%s)", named, failure)
        return RankFailure(f"parallel engine down: {named}", ranks)

    def _silent_ranks(self) -> list[int]:
        """Ranks whose heartbeat does not move over three beats."""
        try:
            before = {r: self.store.add(heartbeat_key(r), 0) for r in range(1, self.world)}
            time.sleep(3 * HEARTBEAT_S)
            after = {r: self.store.add(heartbeat_key(r), 0) for r in range(1, self.world)}
        except (RuntimeError, dist.DistStoreError):
            return []
        return [r for r in before if before[r] == after[r]]

    def stop(self) -> None:
        """Wait briefly for the local workers to exit, then kill those left."""
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in self.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def choose_collectives(
    config: EngineConfig, *, num_gpus: int, nccl_available: bool
) -> tuple[Backend, torch.device]:
    """Rank 0's choice for the whole group: the backend every rank uses, and rank 0's device
    (on CUDA one GPU per local rank, ``rank_device``)."""
    device = rank_device(config.resolved_device(), 0, num_gpus)
    local = config.parallel_local_ranks or config.tensor_parallel
    per_gpu = -(-local // num_gpus) if device.type == "cuda" else 1
    backend = choose_backend(
        config.parallel_backend, device, nccl_available=nccl_available, local_ranks_per_gpu=per_gpu
    )
    return backend, device


def start_parallel_model(
    model_dir: str | Path, config: EngineConfig
) -> tuple[ShardedCausalLM, Cluster]:
    """Rank 0 of a ``config.tensor_parallel``-rank engine, loaded, with its workers running."""
    world = config.tensor_parallel
    if world < 2:
        raise ValueError("the parallel engine needs tensor_parallel >= 2")
    model_config = ModelConfig.from_file(model_dir)
    Layout(0, world, config.expert_parallel, config.data_parallel_attention).check(model_config)
    mtp = model_config.num_nextn_predict_layers > 0
    num_blocks = num_cache_blocks(config, model_config, mtp=mtp)
    backend, device = choose_collectives(
        config, num_gpus=torch.cuda.device_count(), nccl_available=dist.is_nccl_available()
    )
    port = config.parallel_master_port or _free_port(config.parallel_master_addr)
    store = dist.TCPStore(
        config.parallel_master_addr,
        port,
        world,
        is_master=True,
        timeout=timedelta(seconds=config.parallel_join_timeout_s),
        wait_for_workers=False,
    )
    setup = {
        "model_dir": str(Path(model_dir).resolve()),
        "config": dataclasses.asdict(config),
        "num_blocks": num_blocks,
        "backend": backend,
    }
    store.set(SETUP_KEY, json.dumps(setup))
    local = config.parallel_local_ranks or world
    processes = {
        rank: _spawn_worker(rank, world, config.parallel_master_addr, port)
        for rank in range(1, local)
    }
    cluster = Cluster(store, world, processes)
    group: RankGroup | None = None
    try:
        group = RankGroup(
            store,
            0,
            world,
            config.parallel_timeout_s,
            join_timeout_s=config.parallel_join_timeout_s,
            backend=backend,
            device=device,
        )
        model, report = load_shard(
            model_dir,
            group,
            Layout(0, world, config.expert_parallel, config.data_parallel_attention),
            dtype=config.torch_dtype,
            device=device,
            fp8_weights=config.fp8_weights,
        )
        cluster.reports = collect_reports(group, report)
        model.set_attention_pools(num_blocks)
    except BaseException as exc:
        if group is not None:
            group.shutdown()
        cluster.stop()
        if isinstance(exc, RankFailure):
            raise cluster.diagnose(exc) from exc
        raise
    model.on_failure = cluster.diagnose
    model.on_close = cluster.stop
    logger.info("parallel engine: %d ranks over %s, rank 0 on %s", world, backend, device)
    for each in cluster.reports:
        logger.info(
            "parallel rank %d: %.1f MiB of weights, load peak %.1f MiB",
            each.rank, each.weight_bytes / 2**20, each.peak_bytes / 2**20,
            extra={"rank": each.rank, "weight_bytes": each.weight_bytes,
                   "peak_bytes": each.peak_bytes},
        )  # fmt: skip
    return model, cluster


def collect_reports(group: RankGroup, report: LoadReport) -> list[LoadReport]:
    """Every rank's load report at rank 0 (one all-reduce; every rank must call it)."""
    table = torch.zeros(group.world, 2, dtype=torch.float64)
    table[group.rank] = torch.tensor([report.weight_bytes, report.peak_bytes])
    group.all_reduce(table, startup=True)
    return [LoadReport(rank, int(w), int(p)) for rank, (w, p) in enumerate(table.tolist())]


def _spawn_worker(rank: int, world: int, addr: str, port: int) -> subprocess.Popen[bytes]:
    """A local worker rank; it finds this package on PYTHONPATH."""
    root = str(Path(backend.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    command = [
        sys.executable, "-m", "backend.parallel.worker",
        "--rank", str(rank), "--local-rank", str(rank), "--world", str(world),
        "--master-addr", addr, "--master-port", str(port),
    ]  # fmt: skip
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((addr, 0))
        return int(probe.getsockname()[1])
