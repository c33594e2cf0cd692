"""The serving engine's own settings, validated once, and the facts derived from them.

Derived facts (pool size in blocks, the longest servable sequence) are returned by functions
and never written back into the config, so nothing depends on the order objects are built in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from backend.model.dtypes import DTYPE_NAMES, FP8_WEIGHT_MODES, FP8Weights, torch_dtype

if TYPE_CHECKING:  # torch-free at import: the gateway validates these settings without torch
    import torch

    from backend.model.config import ModelConfig

_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")

MAX_SPEC_TOKENS = 3

_T = TypeVar("_T")


def _knob(default: _T, description: str) -> _T:
    """A field with its meaning, for the generated settings reference (docs/configuration.md)."""
    return field(default=default, metadata={"description": description})


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches, how much latent cache it keeps and where it runs.

    `max_num_seqs` sequences and `max_batch_tokens` new tokens per step at most;
    `cache_memory_bytes` is the budget of the paged latent pool (all cache layers, MTP included)
    in blocks of `block_size` tokens; `max_waiting` bounds the queue of requests not yet
    running (more are refused with a retry hint); `dtype` names the weights' and the cache's
    torch dtype; `device` is "auto" (the GPU when one is visible), "cpu", "cuda[:N]" or "mps";
    `num_threads` is torch's intra-op threads, set once by whoever starts the process's engine
    (None keeps torch's default); `max_model_len` caps prompt + output below what the model and
    the pool allow (None: no cap); `fp8_weights` keeps an FP8 checkpoint's linears in FP8
    ("resident") or dequantizes them to `dtype` at load ("dequantize"). These defaults are the
    only ones: the gateway's `[engine]` settings validate into this class.

    Speculative decoding with the checkpoint's MTP layer (used only when it has one):
    `spec_enabled` turns it on, `spec_num_tokens` drafts per step (1 to 3: the layer feeds its
    own output for more than one), `spec_max_batch_size` is the largest expected batch a step
    may draft for (None: no cap), `spec_policy` "measured" drafts at a batch size only while
    drafting measures faster there (``spec_policy.SpecPolicy``), "fixed" always under the cap.

    Decode steps run padded to batch buckets over static buffers, captured as CUDA graphs on a
    GPU (`decode_graphs`, up to `decode_graph_max_batch` sequences; ``graph_runner``).
    """

    max_num_seqs: int = _knob(32, "Most sequences running in one step.")
    max_batch_tokens: int = _knob(
        2048, "Most new tokens in one step (prefill chunks and decodes together)."
    )
    block_size: int = _knob(
        64,
        "Tokens per block of the paged latent cache and of the prefix cache; the same on "
        "every node of a cluster.",
    )
    cache_memory_bytes: int = _knob(
        512 << 20,
        "Budget of the paged latent cache in bytes (every cache layer, the MTP layer's "
        "included); in the settings file also as `cache_memory_mb`.",
    )
    chunked_prefill: bool = _knob(
        True,
        "Split long prompts over steps, mixed with decodes; off, a prompt must fit one step's"
        " `max_batch_tokens`.",
    )
    max_waiting: int = _knob(
        256,
        "Requests queued and not yet running; more are refused with a retry hint (503 "
        "`overloaded`).",
    )
    dtype: str = _knob("float32", "Torch dtype of the weights and the cache (`bfloat16` on a GPU).")
    device: str = _knob("auto", "`auto` (the GPU when one is visible), `cpu`, `cuda[:N]` or `mps`.")
    num_threads: int | None = _knob(
        None,
        "Torch intra-op threads, set once by the process that starts the engine; unset: "
        "torch's default.",
    )
    max_model_len: int | None = _knob(
        None, "Cap on prompt + output below what the model and the cache pool allow; unset: no cap."
    )
    fp8_weights: FP8Weights = _knob(
        "resident",
        "An FP8 checkpoint's linears: `resident` keeps them FP8 in memory, `dequantize` "
        "converts them to `dtype` at load.",
    )
    spec_enabled: bool = _knob(
        True, "Speculative decoding with the checkpoint's MTP layer (ignored without one)."
    )
    spec_num_tokens: int = _knob(
        1, "Draft tokens per step, 1 to 3 (the MTP layer feeds its own output for more than one)."
    )
    spec_max_batch_size: int | None = _knob(
        None,
        "The largest expected batch (running plus waiting) a step may draft for; unset: "
        "no cap (the policy decides at every batch).",
    )
    spec_policy: str = _knob(
        "measured",
        "`measured`: a batch size drafts only while its drafting steps, timed on this "
        "device, emit tokens faster than its plain steps; `fixed`: every batch up to "
        "`spec_max_batch_size` drafts.",
    )
    decode_graphs: str = _knob(
        "auto",
        "Decode steps under CUDA graphs, one per batch-size bucket, captured at start-up: "
        "`auto` (on a CUDA device, one rank), `on` (static buffers and bucket padding on every "
        "device, tensor and expert parallel ranks included; capture only on CUDA with one "
        "rank), `off` (every step launched op by op).",
    )
    decode_graph_max_batch: int = _knob(
        64,
        "The largest decode batch run from a captured graph (buckets 1, 2, 4, 8, then every "
        "8 up to it, at most `max_num_seqs`); larger batches run eagerly.",
    )
    tensor_parallel: int = _knob(
        1,
        "Ranks the model is split over (attention heads, dense and shared-expert widths, the "
        "vocabulary); 1: one device, no other process. backend/parallel/ and docs/parallel.md.",
    )
    expert_parallel: bool = _knob(
        False,
        "With tensor_parallel > 1: each rank holds its share of the routed experts whole and "
        "tokens travel to them (all-to-all), instead of every expert's width being split.",
    )
    data_parallel_attention: bool = _knob(
        False,
        "With tensor_parallel > 1: each rank runs attention (every head) over its own share of "
        "the sequences, each kept in that rank's own latent pool (a node caches N times the "
        "tokens), a new sequence placed on the rank holding its longest cached prefix; dense "
        "MLPs, the vocabulary and the experts split as without it.",
    )
    parallel_local_ranks: int | None = _knob(
        None,
        "Ranks this node runs (0 .. N-1, rank 0 in the gateway process); the others join from "
        "other nodes with `python -m backend.parallel.worker`. Unset: all of them here.",
    )
    parallel_master_addr: str = _knob(
        "127.0.0.1", "Address of rank 0's rendezvous, as the ranks of other nodes reach it."
    )
    parallel_master_port: int = _knob(0, "Port of rank 0's rendezvous; 0: a free one (one node).")
    parallel_backend: str = _knob(
        "auto",
        "The ranks' collectives: `auto` (NCCL when the ranks run on GPUs, one GPU each, and "
        "torch has NCCL; gloo otherwise), `nccl` or `gloo` to force one.",
    )
    parallel_timeout_s: float = _knob(
        30.0,
        "Every collective's timeout: a rank that died or hangs fails the step within this, and "
        "the engine reports itself down instead of hanging.",
    )
    parallel_join_timeout_s: float = _knob(
        600.0, "How long start-up waits for every rank to join and load its slices."
    )

    def __post_init__(self) -> None:
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_batch_tokens": self.max_batch_tokens,
            "block_size": self.block_size,
            "cache_memory_bytes": self.cache_memory_bytes,
            "max_waiting": self.max_waiting,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_batch_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_batch_tokens {self.max_batch_tokens} must cover one decode token for each "
                f"of max_num_seqs {self.max_num_seqs}"
            )
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {list(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.fp8_weights not in FP8_WEIGHT_MODES:
            raise ValueError(
                f"fp8_weights must be one of {list(FP8_WEIGHT_MODES)}, got {self.fp8_weights!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be positive or None, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, cuda[:N] or mps, got {self.device!r}")
        if not 1 <= self.spec_num_tokens <= MAX_SPEC_TOKENS:
            raise ValueError(f"spec_num_tokens must be in [1, {MAX_SPEC_TOKENS}]")
        if self.spec_policy not in ("measured", "fixed"):
            raise ValueError(f"spec_policy must be measured or fixed, got {self.spec_policy!r}")
        if self.spec_max_batch_size is not None and self.spec_max_batch_size < 1:
            raise ValueError("spec_max_batch_size must be positive or None")
        if self.spec_enabled and self.max_batch_tokens < self.max_num_seqs * (
            1 + self.spec_num_tokens
        ):
            raise ValueError(
                f"max_batch_tokens {self.max_batch_tokens} must cover a decode and its "
                f"{self.spec_num_tokens} drafts for each of max_num_seqs {self.max_num_seqs}"
            )
        if self.decode_graphs not in ("auto", "on", "off"):
            raise ValueError(f"decode_graphs must be auto, on or off, got {self.decode_graphs!r}")
        if self.decode_graph_max_batch < 1:
            raise ValueError("decode_graph_max_batch must be positive")
        self._check_parallel()

    def _check_parallel(self) -> None:
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be positive, got {self.tensor_parallel}")
        if self.data_parallel_attention and self.tensor_parallel < 2:
            raise ValueError("data_parallel_attention needs tensor_parallel >= 2")
        local = self.parallel_local_ranks
        if local is not None and not 1 <= local <= self.tensor_parallel:
            raise ValueError(f"parallel_local_ranks must be in [1, tensor_parallel], got {local}")
        if not 0 <= self.parallel_master_port < 65536:
            raise ValueError(f"parallel_master_port out of range: {self.parallel_master_port}")
        if local is not None and local < self.tensor_parallel and not self.parallel_master_port:
            raise ValueError("ranks on other nodes need a fixed parallel_master_port")
        if self.parallel_backend not in ("auto", "nccl", "gloo"):
            raise ValueError(
                f"parallel_backend must be auto, nccl or gloo: {self.parallel_backend!r}"
            )
        if self.parallel_timeout_s <= 0 or self.parallel_join_timeout_s <= 0:
            raise ValueError("parallel_timeout_s and parallel_join_timeout_s must be positive")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def resolved_device(self) -> str:
        """The device to run on: "auto" becomes "cuda" when a GPU is visible, else "cpu"."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def cache_bytes_per_block(config: EngineConfig, model_config: ModelConfig, *, mtp: bool) -> int:
    """Bytes one block of `block_size` tokens takes over every cache layer (MTP ones if `mtp`)."""
    per_token = model_config.cache_bytes_per_token(config.torch_dtype, include_mtp=mtp)
    return per_token * config.block_size


def num_cache_blocks(config: EngineConfig, model_config: ModelConfig, *, mtp: bool) -> int:
    """Blocks the memory budget holds; raises when it cannot hold a single one."""
    per_block = cache_bytes_per_block(config, model_config, mtp=mtp)
    num_blocks = config.cache_memory_bytes // per_block
    if num_blocks < 1:
        raise ValueError(
            f"cache_memory_bytes {config.cache_memory_bytes} is below one block ({per_block} bytes)"
        )
    return num_blocks


def max_model_len(
    config: EngineConfig, model_config: ModelConfig, num_blocks: int, reserved_slots: int = 0
) -> int:
    """Longest prompt + output served: the model's positions, the whole pool less the
    `reserved_slots` a drafting step may use past a sequence's tokens, the configured cap, and
    without chunked prefill one step's token budget (a prompt must fit one step)."""
    limits = [
        model_config.max_position_embeddings,
        num_blocks * config.block_size - reserved_slots,
    ]
    if config.max_model_len is not None:
        limits.append(config.max_model_len)
    if not config.chunked_prefill:
        limits.append(config.max_batch_tokens)
    return min(limits)
