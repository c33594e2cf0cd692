"""A worker rank of the parallel engine: joins rank 0, loads its shard, runs rank 0's steps.

Rank 0 (the gateway's engine, ``[engine] tensor_parallel = N``) starts the ranks of its own node
itself. A rank on another node joins with the same checkpoint path readable there::

    python -m backend.parallel.worker --rank R --world N \\
        --master-addr RANK0_HOST --master-port PORT

where PORT is ``[engine] parallel_master_port`` and rank 0's node runs
``parallel_local_ranks`` ranks (0 .. local - 1). ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` in the environment stand in for the flags; ``--local-rank``
(default: the rank modulo the node's GPUs) picks the rank's GPU, one per rank. The collectives'
backend (NCCL or gloo) is rank 0's choice. The engine settings and the pool size
come from rank 0. The process exits 0 when rank 0 stops the engine, 1 when the group fails;
restart it (a supervisor's job) to rejoin a restarted engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from backend.engine.engine_config import EngineConfig
from backend.engine.graph_runner import graph_modes, num_pad_blocks
from backend.model.cache import PagedLatentCache
from backend.parallel.cluster import HEARTBEAT_S, SETUP_KEY, collect_reports, heartbeat_key
from backend.parallel.group import RankFailure, RankGroup, rank_device
from backend.parallel.layout import Layout
from backend.parallel.loader import load_shard

logger = logging.getLogger("backend.parallel.worker")


def _heartbeat(addr: str, port: int, rank: int, stop: threading.Event) -> None:
    """Bump this rank's heartbeat counter until ``stop`` (its own store connection)."""
    try:
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=10))
        while not stop.wait(HEARTBEAT_S):
            store.add(heartbeat_key(rank), 1)
    except (RuntimeError, dist.DistStoreError) as exc:
        logger.debug("rank %d heartbeat ended: %s", rank, exc)


def run(rank: int, world: int, addr: str, port: int, local_rank: int | None = None) -> int:
    """Join, load, serve; the exit status. ``local_rank`` (default: ``rank`` modulo the GPUs
    visible) picks this rank's GPU on a CUDA node."""
    store = dist.TCPStore(addr, port, world, is_master=False, timeout=timedelta(seconds=600))
    setup = json.loads(store.get(SETUP_KEY))
    config = EngineConfig(**setup["config"])
    torch.set_num_threads(config.num_threads or 1)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(addr, port, rank, stop), daemon=True)
    beat.start()
    num_gpus = torch.cuda.device_count()
    device = rank_device(
        config.resolved_device(), rank if local_rank is None else local_rank, num_gpus
    )
    group = RankGroup(
        store,
        rank,
        world,
        config.parallel_timeout_s,
        join_timeout_s=config.parallel_join_timeout_s,
        backend=setup["backend"],
        device=device,
    )
    try:
        layout = Layout(rank, world, config.expert_parallel, config.data_parallel_attention)
        model, report = load_shard(
            setup["model_dir"],
            group,
            layout,
            dtype=config.torch_dtype,
            device=device,
            fp8_weights=config.fp8_weights,
        )
        collect_reports(group, report)
        model.set_attention_pools(int(setup["num_blocks"]))
        padded = graph_modes(config, model.device)[0]  # rank 0's runner pads as this says
        num_pad = num_pad_blocks(config.block_size) if padded else 0
        cache = PagedLatentCache(
            num_layers=model.num_cache_layers,
            num_blocks=int(setup["num_blocks"]) + num_pad,
            block_size=config.block_size,
            latent_dim=model.config.latent_dim,
            dtype=config.torch_dtype,
            device=model.device,
        )
        model.serve(cache)
    except RankFailure as exc:
        logger.error("rank %d leaves the parallel engine: %s", rank, exc)
        return 1
    finally:
        stop.set()
        group.shutdown()
    return 0


def main(argv: list[str] | None = None) -> None:
    env = os.environ
    parser = argparse.ArgumentParser(description="A worker rank of the parallel engine.")
    parser.add_argument("--rank", type=int, default=env.get("RANK"))
    parser.add_argument("--local-rank", type=int, default=env.get("LOCAL_RANK"))
    parser.add_argument("--world", type=int, default=env.get("WORLD_SIZE"))
    parser.add_argument("--master-addr", default=env.get("MASTER_ADDR", "127.0.0.1"))
    parser.add_argument("--master-port", type=int, default=env.get("MASTER_PORT"))
    args = parser.parse_args(argv)
    if args.rank is None or args.world is None or args.master_port is None:
        parser.error("--rank, --world and --master-port (or RANK, WORLD_SIZE, MASTER_PORT)")
    logging.basicConfig(level=logging.INFO, format=f"rank {args.rank} %(levelname)s %(message)s")
    sys.exit(run(args.rank, args.world, args.master_addr, args.master_port, args.local_rank))


if __name__ == "__main__":
    main()
