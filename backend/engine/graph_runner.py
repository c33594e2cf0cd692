"""Decode steps from captured CUDA graphs, one per batch-size bucket, over static input buffers.

A decode step (every sequence brings one token, or one token and the same number of drafts to
verify) is padded up to the smallest bucket that holds its batch: its token ids, positions and
slots are copied into the leading rows of static buffers, its block tables and the attention
kernel's layout (each token's sequence and visible length) likewise, and the rows after them
describe padding sequences that write and read only a padding block of the latent pool, which
no request owns. On a CUDA device each (bucket, tokens per sequence) is captured once at
start-up and a step replays its graph; elsewhere the same buffers and padding run eagerly, so
the CPU suite checks everything but capture and replay. Steps of other shapes (prefill chunks,
mixed or larger batches) run eagerly, unpadded.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from backend.engine.engine_config import MAX_SPEC_TOKENS, EngineConfig
from backend.model.cache import DecodeTensors, ForwardBatch, PagedLatentCache
from backend.model.model import DeepseekV3ForCausalLM

logger = logging.getLogger(__name__)


def bucket_sizes(max_batch: int, max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes captured: 1, 2, 4, 8, then every 8, up to min(max_batch, max_num_seqs)
    (which is itself a bucket)."""
    top = min(max_batch, max_num_seqs)
    if top < 1:
        raise ValueError(f"the largest bucket must be positive, got {top}")
    sizes = [size for size in (1, 2, 4) if size < top]
    sizes.extend(range(8, top, 8))
    sizes.append(top)
    return tuple(sizes)


def choose_bucket(buckets: Sequence[int], num_seqs: int) -> int | None:
    """The smallest bucket holding ``num_seqs`` sequences; None beyond the largest."""
    at = bisect.bisect_left(buckets, num_seqs)
    return buckets[at] if at < len(buckets) else None


class DecodeBuffers:
    """Static inputs of every padded decode step, sized for ``max_seqs`` sequences of up to
    ``max_q`` new tokens each, with block tables ``max_blocks`` wide.

    ``pad_blocks``: blocks of the pool that padding sequences write and read (they own nothing
    else); ``max_len``: the longest context a token may see (it bounds the kernel's splits).
    """

    def __init__(
        self,
        max_seqs: int,
        max_q: int,
        max_blocks: int,
        block_size: int,
        pad_blocks: Sequence[int],
        max_len: int,
        device: torch.device,
    ) -> None:
        if len(pad_blocks) * block_size < max_q:
            raise ValueError(f"{len(pad_blocks)} padding blocks cannot hold {max_q} tokens")
        rows = max_seqs * max_q
        self.max_seqs, self.max_q, self.max_blocks = max_seqs, max_q, max_blocks
        self.block_size = block_size
        self.pad_table = list(pad_blocks)
        self.max_len = max_len
        self.device = device
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)  # [rows]
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)  # [rows]
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=device)  # [rows]
        self.block_tables = torch.zeros(max_seqs, max_blocks, dtype=torch.int32, device=device)
        self.token_seq = torch.zeros(rows, dtype=torch.int32, device=device)  # [rows]
        self.token_len = torch.zeros(rows, dtype=torch.int32, device=device)  # [rows]
        self.rows = torch.arange(rows, dtype=torch.long, device=device)  # logits of every row

    @property
    def nbytes(self) -> int:
        tensors = (
            self.input_ids, self.positions, self.slot_mapping, self.block_tables,
            self.token_seq, self.token_len, self.rows,
        )  # fmt: skip
        return sum(t.numel() * t.element_size() for t in tensors)

    def fits(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` is a decode step these buffers can hold: at most max_seqs
        sequences, each with the same number (<= max_q) of new tokens, tables within width."""
        if not batch.num_seqs or batch.num_seqs > self.max_seqs:
            return False
        q_len = batch.seq_lens_q[0]
        return (
            q_len <= self.max_q
            and all(n == q_len for n in batch.seq_lens_q)
            and all(len(table) <= self.max_blocks for table in batch.block_tables)
            and max(batch.context_lens) <= self.max_len
        )

    def fill(self, batch: ForwardBatch | None, bucket: int, q_len: int) -> ForwardBatch:
        """Copy ``batch`` (None: no real sequence) into the leading rows, padding sequences
        after it up to ``bucket``; returns the padded batch, whose tensors view the buffers."""
        num_real = batch.num_seqs if batch is not None else 0
        if batch is not None and not self.fits(batch):
            raise ValueError("the batch is not a decode step these buffers hold")
        if num_real > bucket or bucket > self.max_seqs or not 1 <= q_len <= self.max_q:
            raise ValueError(f"{num_real} sequences do not pad to {bucket} x {q_len}")
        real_rows, rows = num_real * q_len, bucket * q_len
        contexts = list(batch.context_lens) if batch is not None else []
        tables = list(batch.block_tables) if batch is not None else []
        num_pad = bucket - num_real
        contexts += [q_len] * num_pad
        tables += [self.pad_table] * num_pad
        pad_positions = list(range(q_len)) * num_pad
        pad_slots = ForwardBatch.slots_for(self.pad_table, 0, q_len, self.block_size) * num_pad
        token_seq = [s for s in range(bucket) for _ in range(q_len)]
        token_len = [ctx - q_len + 1 + j for ctx in contexts for j in range(q_len)]
        table_rows = [list(t) + [0] * (self.max_blocks - len(t)) for t in tables]
        if batch is not None:
            self.input_ids[:real_rows].copy_(batch.input_ids)
            self.positions[:real_rows].copy_(batch.positions)
            self.slot_mapping[:real_rows].copy_(batch.slot_mapping)
        self.input_ids[real_rows:rows].zero_()
        if num_pad:
            self.positions[real_rows:rows].copy_(_host(pad_positions, torch.long))
            self.slot_mapping[real_rows:rows].copy_(_host(pad_slots, torch.long))
        self.token_seq[:rows].copy_(_host(token_seq, torch.int32))
        self.token_len[:rows].copy_(_host(token_len, torch.int32))
        self.block_tables[:bucket].copy_(_host(table_rows, torch.int32))
        return ForwardBatch(
            input_ids=self.input_ids[:rows],
            positions=self.positions[:rows],
            seq_lens_q=[q_len] * bucket,
            context_lens=contexts,
            block_tables=tables,
            slot_mapping=self.slot_mapping[:rows],
            decode=DecodeTensors(
                self.block_tables[:bucket], self.token_seq[:rows], self.token_len[:rows],
                self.max_len,
            ),
        )  # fmt: skip


def _host(values: list[int] | list[list[int]], dtype: torch.dtype) -> Tensor:
    return torch.tensor(values, dtype=dtype)


@dataclass(frozen=True, slots=True)
class GraphReport:
    """What start-up captured: the buckets, tokens per sequence, graphs made, those whose
    capture failed (they run eagerly, padded), bytes of the static buffers and of the graphs'
    memory pool, and the seconds it took."""

    buckets: tuple[int, ...]
    q_lens: tuple[int, ...]
    num_graphs: int
    buffer_bytes: int
    graph_bytes: int
    seconds: float
    failed: list[tuple[int, int]] = field(default_factory=list)

    def log_fields(self) -> dict[str, object]:
        return {
            "buckets": ",".join(map(str, self.buckets)),
            "tokens_per_seq": ",".join(map(str, self.q_lens)),
            "graphs": self.num_graphs,
            "failed": len(self.failed),
            "buffer_mib": round(self.buffer_bytes / 2**20, 2),
            "graph_mib": round(self.graph_bytes / 2**20, 1),
            "seconds": round(self.seconds, 2),
        }


class DecodeGraphRunner:
    """Runs a decode step padded to its bucket: from its captured graph where one exists, else
    eagerly over the same buffers. ``q_lens``: the tokens per sequence captured (1, and 1 + k
    when the engine verifies k drafts)."""

    def __init__(
        self,
        model: DeepseekV3ForCausalLM,
        cache: PagedLatentCache,
        buffers: DecodeBuffers,
        buckets: Sequence[int],
        q_lens: Sequence[int],
        *,
        capture: bool,
    ) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[-1] > buffers.max_seqs:
            raise ValueError(f"buckets must be increasing and at most {buffers.max_seqs}")
        if not q_lens or max(q_lens) > buffers.max_q:
            raise ValueError(f"tokens per sequence must be at most {buffers.max_q}")
        self.model = model
        self.cache = cache
        self.buffers = buffers
        self.buckets = tuple(buckets)
        self.q_lens = tuple(sorted(set(q_lens)))
        self.capture_enabled = capture
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        self.num_replays = 0
        self.num_padded_eager = 0

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def bucket_for(self, batch: ForwardBatch, num_sampled_rows: int) -> int | None:
        """The bucket a step runs in, or None to run it eagerly as it is: it must be a decode
        step whose every row is sampled, with a captured width of tokens per sequence."""
        if num_sampled_rows != batch.num_tokens or not self.buffers.fits(batch):
            return None
        if batch.seq_lens_q[0] not in self.q_lens:
            return None
        return choose_bucket(self.buckets, batch.num_seqs)

    def run(self, batch: ForwardBatch, bucket: int) -> tuple[Tensor, Tensor]:
        """The step's hidden states [T, D] and logits [T, vocab] fp32 (views of the graph's
        outputs when replayed: read them before the next step)."""
        q_len = batch.seq_lens_q[0]
        padded = self.buffers.fill(batch, bucket, q_len)
        rows = batch.num_tokens
        graph = self._graphs.get((bucket, q_len))
        if graph is not None:
            graph.replay()
            self.num_replays += 1
            hidden, logits = self._outputs[(bucket, q_len)]
        else:
            self.num_padded_eager += 1
            hidden, logits = self.model.forward_with_logits(
                padded, self.cache, self.buffers.rows[: padded.num_tokens]
            )
        return hidden[:rows], logits[:rows]

    def capture(self) -> GraphReport:
        """Capture every (bucket, tokens per sequence), largest first, sharing one memory pool;
        a capture that fails is logged and that shape runs eagerly. Nothing to capture off
        CUDA: the report then counts the buffers alone."""
        started = time.perf_counter()
        failed: list[tuple[int, int]] = []
        graph_bytes = 0
        if self.capture_enabled:
            torch.cuda.synchronize()
            free_before = torch.cuda.mem_get_info()[0]
            pool = torch.cuda.graph_pool_handle()
            for q_len in self.q_lens:
                for bucket in reversed(self.buckets):
                    if not self._capture_one(bucket, q_len, pool):
                        failed.append((bucket, q_len))
            torch.cuda.synchronize()
            graph_bytes = max(0, free_before - torch.cuda.mem_get_info()[0])
        return GraphReport(
            self.buckets, self.q_lens, len(self._graphs), self.buffers.nbytes, graph_bytes,
            time.perf_counter() - started, failed,
        )  # fmt: skip

    def _capture_one(self, bucket: int, q_len: int, pool: Any) -> bool:  # a graph pool handle
        padded = self.buffers.fill(None, bucket, q_len)
        rows = self.buffers.rows[: padded.num_tokens]
        try:
            with torch.inference_mode():
                # an eager run first: kernels compiled, per-device constants made
                self.model.forward_with_logits(padded, self.cache, rows)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outputs = self.model.forward_with_logits(padded, self.cache, rows)
        except RuntimeError as exc:
            logger.warning("decode graph %d x %d not captured: %s", bucket, q_len, exc)
            return False
        self._graphs[(bucket, q_len)] = graph
        self._outputs[(bucket, q_len)] = outputs
        return True


def graph_modes(config: EngineConfig, device: torch.device) -> tuple[bool, bool]:
    """(pad decode steps to buckets over static buffers, capture them as CUDA graphs) for
    ``config`` on ``device``. A parallel engine is never captured (its ranks would have to
    capture their collectives and replay in step); with ``decode_graphs = "on"`` and tensor or
    expert parallel its decode steps are padded all the same (every rank runs the padded plan
    rank 0 sends, and sizes its pool with the padding blocks), not with data-parallel
    attention, whose ranks own block ids by range."""
    if config.decode_graphs == "off":
        return False, False
    if config.tensor_parallel > 1:
        padded = config.decode_graphs == "on" and not config.data_parallel_attention
        return padded, False
    cuda = device.type == "cuda"
    if config.decode_graphs == "auto":
        return cuda, cuda
    return True, cuda


def num_pad_blocks(block_size: int) -> int:
    """Blocks the padding sequences need: a decode and the most drafts it may verify."""
    return -(-(1 + MAX_SPEC_TOKENS) // block_size)
