"""The collectives' backend and device per rank: NCCL for CUDA ranks with a GPU each (when
torch has NCCL), gloo otherwise or when forced; CUDA ranks get one GPU each by local rank; the
tensors a backend cannot read where they are get staged. Gloo's collectives run for real here
(two ranks as threads over one in-memory store)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from backend.parallel.cluster import choose_collectives
from backend.parallel.group import RankGroup, choose_backend, rank_device, staging_device
from tests.support.parallel import parallel_config

pytestmark = pytest.mark.slow

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_auto_takes_nccl_only_for_cuda_ranks_with_a_gpu_each() -> None:
    assert choose_backend("auto", CUDA0, nccl_available=True) == "nccl"
    assert choose_backend("auto", CPU, nccl_available=True) == "gloo"
    assert choose_backend("auto", CUDA0, nccl_available=False) == "gloo"
    # two ranks on one GPU: NCCL cannot, gloo with CUDA tensors can
    assert choose_backend("auto", CUDA0, nccl_available=True, local_ranks_per_gpu=2) == "gloo"
    assert choose_backend("gloo", CUDA0, nccl_available=True) == "gloo"
    assert choose_backend("nccl", CUDA0, nccl_available=True) == "nccl"
    for device, available, per_gpu in ((CPU, True, 1), (CUDA0, False, 1), (CUDA0, True, 2)):
        with pytest.raises(ValueError, match="NCCL backend needs"):
            choose_backend("nccl", device, nccl_available=available, local_ranks_per_gpu=per_gpu)
    with pytest.raises(ValueError, match="must be one of"):
        choose_backend("mpi", CPU, nccl_available=True)


def test_cuda_ranks_get_one_gpu_each_by_local_rank() -> None:
    assert [rank_device("cuda", r, 8) for r in range(3)] == [
        torch.device("cuda", i) for i in range(3)
    ]
    assert rank_device("cuda:2", 1, 8) == torch.device("cuda", 3)
    assert rank_device("cuda", 9, 8) == torch.device("cuda", 1)  # a second node's rank 1
    assert rank_device("cuda", 1, 1) == CUDA0  # one GPU: every rank on it (gloo)
    assert rank_device("cpu", 3, 8) == CPU
    with pytest.raises(ValueError, match="no GPU"):
        rank_device("cuda", 0, 0)


def test_rank_zero_chooses_for_the_group() -> None:
    eight = parallel_config(8, device="cuda")
    assert choose_collectives(eight, num_gpus=8, nccl_available=True) == ("nccl", CUDA0)
    assert choose_collectives(eight, num_gpus=1, nccl_available=True) == ("gloo", CUDA0)
    assert choose_collectives(eight, num_gpus=8, nccl_available=False) == ("gloo", CUDA0)
    forced = parallel_config(8, device="cuda", parallel_backend="gloo")
    assert choose_collectives(forced, num_gpus=8, nccl_available=True) == ("gloo", CUDA0)
    on_cpu = parallel_config(2, device="cpu")
    assert choose_collectives(on_cpu, num_gpus=0, nccl_available=True) == ("gloo", CPU)
    with pytest.raises(ValueError, match="parallel_backend"):
        parallel_config(2, parallel_backend="mpi")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        RankGroup(dist.HashStore(), 0, 2, 1.0, backend="nccl", device="cpu")


def test_tensors_are_staged_where_the_backend_reads_them() -> None:
    on_gpu = torch.empty(3, device="meta")  # stands for a tensor on another device
    plan = torch.empty(3, dtype=torch.long)
    for collective in ("all_reduce", "broadcast", "gather", "all_to_all"):
        assert staging_device("nccl", collective, plan, CUDA0) == CUDA0
        assert staging_device("gloo", collective, plan, CPU) == CPU
    assert staging_device("gloo", "all_reduce", on_gpu, CUDA0) == on_gpu.device
    assert staging_device("gloo", "broadcast", on_gpu, CUDA0) == on_gpu.device
    assert staging_device("gloo", "gather", on_gpu, CUDA0) == CPU
    assert staging_device("gloo", "all_to_all", on_gpu, CUDA0) == CPU


def _on_two_ranks(body: Callable[[RankGroup], Any]) -> list[Any]:
    """``body(group)`` on ranks 0 and 1 (threads, one in-memory store); their results."""
    store = dist.HashStore()
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = RankGroup(store, r, 2, 20.0, backend="gloo", device="cpu")
            try:
                results[r] = body(group)
            finally:
                group.shutdown()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


def test_gloo_collectives_run() -> None:
    def body(
        group: RankGroup,
    ) -> tuple[list[float], list[int], list[list[float]] | None, list[int], list[list[float]]]:
        r = group.rank
        summed = group.all_reduce(torch.tensor([1.0, 2.0]) * (r + 1)).tolist()
        before = group.bytes_sent
        gathered = group.all_gather(torch.tensor([[1.0, 2.0]]) * (r + 1))
        assert group.bytes_sent - before == 8  # its one row of 2 fp32 to the other rank
        plan = group.broadcast(
            torch.tensor([7, 8, 9]) if r == 0 else torch.zeros(3, dtype=torch.long)
        )
        parts = group.gather_to_root(torch.tensor([float(r)]))
        # rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 1 to rank 0, none to itself
        sends = [[1, 2], [1, 0]][r]
        recvs = [[1, 1], [2, 0]][r]
        data = torch.arange(sum(sends), dtype=torch.long) + 10 * r
        out = group.all_to_all(torch.empty(sum(recvs), dtype=torch.long), data, recvs, sends)
        return (
            summed,
            plan.tolist(),
            None if parts is None else [p.tolist() for p in parts],
            out.tolist(),
            gathered.squeeze(1).tolist(),
        )

    zero, one = _on_two_ranks(body)
    assert zero[0] == one[0] == [3.0, 6.0]
    assert zero[1] == one[1] == [7, 8, 9]
    assert zero[2] == [[0.0], [1.0]] and one[2] is None
    assert zero[3] == [0, 10] and one[3] == [1, 2]
    assert zero[4] == one[4] == [[1.0, 2.0], [2.0, 4.0]]
