"""Train a demo checkpoint's model and its MTP layer on the Python standard library's source.

Every machine with Python has that text, so a demo checkpoint can learn something real offline:
the model then writes Python-flavoured text instead of random multilingual tokens, and the MTP
layer's drafts are accepted often enough to measure speculative decoding. The loss is DeepSeek's:
next-token cross-entropy of the main model plus ``mtp_weight`` times the MTP layer's cross-entropy
on the token after next (DeepSeek-V3 used 0.3 early in training).

Only the vocabulary rows the corpus uses are trained (a few percent of V3.1's 129,280). The other
rows of both output heads are zero, so their logits are exactly 0 for every input: the training
loss includes them as one constant ``log(num_unused)`` column, which makes it the exact
full-vocabulary loss of the model that is written out.

With ``fim_rate`` > 0 that share of the windows is rearranged for fill in the middle, DeepSeek's
prefix-suffix-middle layout: a window ``p m s`` cut at two random points becomes
``<｜fim▁begin｜> p <｜fim▁hole｜> s <｜fim▁end｜> m`` (same length: three tokens fewer of text), so
the model learns to write the middle after a FIM prompt (``Tokenizer.encode_fim``).
"""

from __future__ import annotations

import math
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from backend.model.cache import ForwardBatch, PagedLatentCache
from backend.model.config import ModelConfig
from backend.model.model import DecoderLayer, DeepseekV3ForCausalLM, MTPLayer
from backend.model.moe import MoE
from backend.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class TrainOptions:
    """`steps` optimizer steps of `batch_size` windows of `seq_len` tokens, drawn from the first
    `max_chars` characters of the standard library's ``.py`` files (sorted by path); a
    `fim_rate` share of the windows in the fill-in-the-middle layout (module docstring)."""

    steps: int = 400
    batch_size: int = 8
    seq_len: int = 64
    lr: float = 5e-3
    warmup_steps: int = 10
    mtp_weight: float = 0.3
    fim_rate: float = 0.0
    max_chars: int = 3_000_000
    seed: int = 0
    progress: bool = True  # where stderr is a terminal: a progress bar and a closing line
    # torch threads while training (None: as set). One suits the tiny preset: its matrices are
    # too small to share, and two threads on a busy 2-core machine ran 10x slower than one.
    threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size, self.max_chars) < 1 or self.seq_len < 4:
            raise ValueError("steps, batch_size and max_chars must be positive, seq_len >= 4")
        if self.lr <= 0 or self.mtp_weight < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be positive, mtp_weight and warmup_steps non-negative")
        if not 0.0 <= self.fim_rate <= 1.0:
            raise ValueError("fim_rate must be within [0, 1]")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be positive")


def stdlib_texts(max_chars: int) -> Iterator[str]:
    """Source of the running interpreter's standard library, file by file, up to `max_chars`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text[: max_chars - total]
        total += len(text)
        if total >= max_chars:
            return


def corpus_ids(tokenizer: Tokenizer, max_chars: int) -> Tensor:
    """[N] long: the corpus tokenized, one EOS after each file."""
    ids: list[int] = []
    for text in stdlib_texts(max_chars):
        ids.extend(tokenizer.encode(text, allow_special=False))
        ids.append(tokenizer.special.eos)
    return torch.tensor(ids, dtype=torch.long)


def _moe(moe: MoE, x: Tensor) -> Tensor:
    """The MoE block's output, differentiably (the serving forward writes into buffers)."""
    weights, ids = moe.gate(x)  # [T, k] each
    out = moe.shared_experts(x) if moe.shared_experts is not None else torch.zeros_like(x)
    for expert_id, expert in enumerate(moe.experts):
        token_index, slot = (ids == expert_id).nonzero(as_tuple=True)
        if token_index.numel():
            scale = weights[token_index, slot, None].to(x.dtype)
            out = out.index_add(0, token_index, expert(x[token_index]) * scale)
    return out


def _layer(
    layer: DecoderLayer,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    batch: ForwardBatch,
    cache: PagedLatentCache,
    index: int,
) -> Tensor:
    """``DecoderLayer.forward`` with a differentiable MoE."""
    h = x + layer.self_attn(layer.input_layernorm(x), cos, sin, batch, cache, index)
    normed = layer.post_attention_layernorm(h)
    return h + (_moe(layer.mlp, normed) if isinstance(layer.mlp, MoE) else layer.mlp(normed))


class _Trainable(torch.nn.Module):
    """The model's decoder and MTP blocks plus compact copies of the used vocabulary rows."""

    def __init__(self, model: DeepseekV3ForCausalLM, used: Tensor) -> None:
        super().__init__()
        self.model = model
        mtp = model.model.layers[model.config.num_hidden_layers]
        assert isinstance(mtp, MTPLayer)
        self.mtp = mtp
        self.embed = torch.nn.Parameter(model.model.embed_tokens.weight[used].clone())
        self.head = torch.nn.Parameter(model.lm_head.weight[used].clone())
        self.mtp_head = torch.nn.Parameter(mtp.shared_head.head.weight[used].clone())
        for p in (model.model.embed_tokens.weight, model.lm_head.weight):
            p.requires_grad_(False)
        mtp.shared_head.head.weight.requires_grad_(False)
        self.log_unused = math.log(model.config.vocab_size - used.numel())

    def _loss(self, hidden: Tensor, head: Tensor, targets: Tensor) -> Tensor:
        logits = hidden @ head.T  # [N, U]
        rest = logits.new_full((logits.shape[0], 1), self.log_unused)
        return F.cross_entropy(torch.cat((logits, rest), dim=-1), targets)

    def forward(self, windows: Tensor, mtp_weight: float) -> tuple[Tensor, Tensor]:
        """windows: [B, T] compact ids -> (main loss, MTP loss)."""
        config = self.model.config
        num_seqs, length = windows.shape
        batch = ForwardBatch.build(
            windows.tolist(), [0] * num_seqs, [[s] for s in range(num_seqs)], length
        )
        cache = PagedLatentCache(
            self.model.num_cache_layers, num_seqs, length, config.latent_dim, torch.float32, "cpu"
        )
        cos, sin = self.model.rotary.cos_sin(batch.positions)
        x = F.embedding(batch.input_ids, self.embed)  # [B * T, D]
        for index in range(config.num_hidden_layers):
            layer = self.model.model.layers[index]
            assert isinstance(layer, DecoderLayer)
            x = _layer(layer, x, cos, sin, batch, cache, index)
        hidden = self.model.model.norm(x).view(num_seqs, length, -1)
        main = self._loss(
            hidden[:, :-1].reshape(-1, x.shape[-1]), self.head, windows[:, 1:].flatten()
        )
        if mtp_weight == 0:
            return main, main.new_zeros(())
        # position t sees token t+1 and predicts t+2; the last position gets a repeat (unused)
        shifted = torch.cat((windows[:, 1:], windows[:, -1:]), dim=1).flatten()
        mtp = self.mtp
        embedded = mtp.enorm(F.embedding(shifted, self.embed))
        y = mtp.eh_proj(torch.cat((embedded, mtp.hnorm(hidden.flatten(0, 1))), dim=-1))
        y = mtp.shared_head.norm(_layer(mtp, y, cos, sin, batch, cache, config.num_hidden_layers))
        y = y.view(num_seqs, length, -1)[:, :-2].reshape(-1, x.shape[-1])
        return main, self._loss(y, self.mtp_head, windows[:, 2:].flatten())

    @torch.no_grad()
    def write_back(self, used: Tensor) -> None:
        """Put the trained rows into the full matrices; zero the heads' unused rows."""
        self.model.model.embed_tokens.weight[used] = self.embed
        for full, rows in (
            (self.model.lm_head.weight, self.head),
            (self.mtp.shared_head.head.weight, self.mtp_head),
        ):
            full.zero_()
            full[used] = rows


# Told of each step done: (steps done, steps in all, the main loss). It may raise to stop
# training (the exception propagates out of `train_weights`).
StepReport = Callable[[int, int, float], None]


def train_weights(
    config: ModelConfig,
    tensors: dict[str, Tensor],
    tokenizer: Tokenizer,
    options: TrainOptions,
    report: StepReport | None = None,
) -> dict[str, Tensor]:
    """Start from `tensors` (fp32, every name of the model and its MTP layer); return trained
    fp32 tensors under the same names. `report` hears of every step."""
    if config.num_nextn_predict_layers < 1:
        raise ValueError("the model has no MTP layer to train")
    threads = torch.get_num_threads()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    try:
        return _train(config, tensors, tokenizer, options, report)
    finally:
        torch.set_num_threads(threads)


def _train(
    config: ModelConfig,
    tensors: dict[str, Tensor],
    tokenizer: Tokenizer,
    options: TrainOptions,
    report: StepReport | None,
) -> dict[str, Tensor]:
    torch.manual_seed(options.seed)
    model = DeepseekV3ForCausalLM(config, dtype=torch.float32, include_mtp=True)
    model.load_state_dict(tensors)
    ids = corpus_ids(tokenizer, options.max_chars)
    s = tokenizer.special
    fim_ids = torch.tensor([s.fim_begin, s.fim_hole, s.fim_end], dtype=torch.long)
    specials = torch.tensor([s.bos, s.eos], dtype=torch.long)
    parts = (ids, specials, fim_ids) if options.fim_rate > 0 else (ids, specials)
    used = torch.unique(torch.cat(parts))  # sorted
    compact = torch.searchsorted(used, ids)
    fim_compact = torch.searchsorted(used, fim_ids).tolist()
    trainable = _Trainable(model, used)
    params = [p for p in trainable.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(options.seed)
    span = compact.numel() - options.seq_len
    if span < 1:
        raise ValueError("the corpus is shorter than one training window")
    started = time.monotonic()
    # The bar's carriage returns belong on a terminal only (not in a log stream).
    shown = options.progress and sys.stderr.isatty()
    bar = tqdm(range(options.steps), desc="training", unit="step", disable=not shown)
    model.train()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, options)
        windows = _windows(compact, span, options, fim_compact, generator)
        main, mtp = trainable(windows, options.mtp_weight)
        loss = main + options.mtp_weight * mtp
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        main_loss = main.item()
        bar.set_postfix(loss=f"{main_loss:.2f}", mtp=f"{mtp.item():.2f}")
        if report is not None:
            report(step + 1, options.steps, main_loss)
    bar.close()
    trainable.write_back(used)
    if shown:
        print(
            f"trained {options.steps} steps on {compact.numel()} corpus tokens "
            f"({used.numel()} distinct) in {time.monotonic() - started:.0f} s"
        )
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _windows(
    compact: Tensor, span: int, options: TrainOptions, fim: list[int], generator: torch.Generator
) -> Tensor:
    """[batch_size, seq_len] compact ids: corpus windows, a `fim_rate` share of them in the
    FIM layout (`fim`: the compact ids of fim_begin, fim_hole, fim_end)."""
    length = options.seq_len
    starts = torch.randint(0, span, (options.batch_size,), generator=generator).tolist()
    draws = (  # no draws without FIM: the plain run's windows do not depend on fim_rate
        torch.rand(options.batch_size, generator=generator).tolist()
        if options.fim_rate > 0
        else [1.0] * options.batch_size
    )
    rows: list[Tensor] = []
    for start, draw in zip(starts, draws, strict=True):
        window = compact[start : start + length]
        if draw < options.fim_rate and length > 4:
            text = window[: length - 3]
            cut = torch.randint(0, text.numel() + 1, (2,), generator=generator).sort().values
            i, j = int(cut[0]), int(cut[1])
            begin, hole, end = (window.new_tensor([t]) for t in fim)
            window = torch.cat((begin, text[:i], hole, text[j:], end, text[i:j]))
        rows.append(window)
    return torch.stack(rows)


def _lr(step: int, options: TrainOptions) -> float:
    """Linear warmup, then cosine decay to a tenth."""
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    progress = (step - options.warmup_steps) / max(1, options.steps - options.warmup_steps)
    return options.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
