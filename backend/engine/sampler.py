"""Next-token sampling: penalties, temperature, top-k / top-p / min-p, seeded draws, logprobs.

Order per row: penalties on the raw logits, then (unless greedy) temperature, top-k, top-p and
min-p, then one draw. A row with its own generator (a seeded request) takes its randomness from
it alone, so it gets the same tokens whatever else shares the batch; unseeded rows share torch's
default generator.

Reported logprobs are the raw model's: log_softmax of the logits before penalties, temperature
and truncation (what OpenAI reports, independent of the sampling settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from backend.engine.interface import TokenLogprobs
from backend.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One logits row's request: settings, token history and random source (None: torch's
    default generator). Repetition penalty looks at prompt + output, presence and frequency
    penalties at output only."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [N] int64
    logprobs: list[TokenLogprobs | None]  # per row; None where not requested


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A request's own generator on `device`, or None for an unseeded request."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def apply_penalties(logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """logits: [N, V] -> penalized copy (the input itself when no row has penalties).

    Each row reads only its own history, so the result does not depend on the batch.
    """
    penalized = [i for i, row in enumerate(rows) if row.params.has_penalties]
    if not penalized:
        return logits
    device = logits.device
    index = torch.tensor(penalized, device=device)
    sub = logits[index]  # [P, V]
    counts = torch.zeros_like(sub)  # output token counts
    seen = torch.zeros_like(sub, dtype=torch.bool)  # prompt or output tokens
    _scatter(counts, [rows[i].output_token_ids for i in penalized], accumulate=True)
    _scatter(seen, [rows[i].prompt_token_ids for i in penalized], accumulate=False)
    seen |= counts > 0
    params = [rows[i].params for i in penalized]
    repetition = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    repeated = torch.where(sub > 0, sub / repetition, sub * repetition)
    sub = torch.where(seen, repeated, sub) - frequency * counts - presence * (counts > 0)
    logits = logits.clone()
    logits[index] = sub
    return logits


def _scatter(out: torch.Tensor, ids: Sequence[Sequence[int]], accumulate: bool) -> None:
    """out[j, t] += 1 (or = True) for every t in ids[j]; out: [P, V]."""
    row_index = [j for j, row_ids in enumerate(ids) for _ in row_ids]
    if not row_index:
        return
    flat = [t for row_ids in ids for t in row_ids]
    rows_t = torch.tensor(row_index, device=out.device)
    ids_t = torch.tensor(flat, device=out.device)
    out.index_put_((rows_t, ids_t), torch.ones_like(ids_t, dtype=out.dtype), accumulate=accumulate)


def draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """probs: [M, V] -> [M] int64, row j drawn in proportion to probs[j].

    The exponential race: argmax(probs / E) with E ~ Exp(1) i.i.d. picks token i with
    probability probs[i] / sum(probs). A row with a generator takes its noise from it alone;
    the other rows share torch's default generator.
    """
    noise = torch.empty_like(probs)
    unseeded = [j for j, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    elif unseeded:
        at = torch.tensor(unseeded, device=probs.device)
        noise[at] = torch.empty_like(noise[at]).exponential_()
    for j, generator in enumerate(generators):
        if generator is not None:
            noise[j].exponential_(generator=generator)
    return probs.div(noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


# Candidates examined before falling back to sorting the whole vocabulary.
_CANDIDATES = 1024


def truncate(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Mask to -inf what top-k, top-p and min-p exclude, row by row.

    logits: [M, V] after temperature; top_k: [M] int (0 = off); top_p, min_p: [M] float.
    top-k keeps the k best (ties by lower id); top-p keeps the smallest best-first set whose
    probability reaches top_p; min-p drops tokens below min_p times the best token's probability.

    Rows that truncate nothing pass through untouched. The others are first decided on their
    best `_CANDIDATES` tokens (one `topk`, no sort of the vocabulary); a row whose kept set
    provably lies among them is done there, the rest take the full sort. Both paths keep the
    same tokens.
    """
    vocab = logits.shape[-1]
    active = (top_k > 0) & (top_k < vocab) | (top_p < 1) | (min_p > 0)
    if not bool(active.any()):
        return logits
    out = logits.clone()
    rows = active.nonzero().squeeze(-1)
    if vocab <= _CANDIDATES:
        out[rows] = _truncate_sorted(logits[rows], top_k[rows], top_p[rows], min_p[rows])
        return out
    values, order = _best(logits[rows], _CANDIDATES + 1)
    # A tie across the candidates' edge could order differently from the full sort: fall back.
    untied = values[:, -2] > values[:, -1]
    values, order = values[:, :-1], order[:, :-1]
    kept, exact = _keep_among(values, logits[rows], top_k[rows], top_p[rows], min_p[rows])
    exact &= untied
    fast = rows[exact]
    if fast.numel():
        masked = torch.full_like(logits[fast], float("-inf"))
        vals = values[exact].masked_fill(~kept[exact], float("-inf"))
        out[fast] = masked.scatter_(-1, order[exact], vals)
    slow = rows[~exact]
    if slow.numel():
        out[slow] = _truncate_sorted(logits[slow], top_k[slow], top_p[slow], min_p[slow])
    return out


def _best(logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` best logits per row, descending, ties by lower id (as a stable sort)."""
    values, order = logits.topk(count, dim=-1)
    order, by_id = order.sort(dim=-1)
    values, by_value = values.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    return values, order.gather(-1, by_value)


def _keep_among(
    values: torch.Tensor,
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """values: [M, C] the best C logits, descending. Returns kept [M, C] (bool) and exact [M]:
    whether every token outside the candidates is excluded anyway."""
    cap = values.shape[-1]
    ranks = torch.arange(cap, device=values.device)
    k_on = top_k > 0
    masked = k_on[:, None] & (ranks[None, :] >= top_k[:, None])
    # Probabilities as the full sort computes them: over the top-k when set, else the vocab.
    norm = torch.where(
        k_on,
        values.masked_fill(masked, float("-inf")).logsumexp(-1),
        logits.logsumexp(-1),
    )
    probs = (values - norm[:, None]).exp().masked_fill(masked, 0.0)
    mass = probs.cumsum(dim=-1)
    masked |= ((mass - probs) >= top_p[:, None]) & (top_p[:, None] < 1)
    masked |= probs < min_p[:, None] * probs[:, :1]
    # Outside tokens rank after every candidate: excluded by top-k when k <= C, by top-p when
    # the candidates already reach it, by min-p when the weakest candidate already fails it.
    # A top-k beyond the candidates normalizes over tokens not seen here: never exact.
    outside_out = (
        (k_on & (top_k <= cap))
        | ((top_p < 1) & (mass[:, -1] >= top_p))
        | (probs[:, -1] < min_p * probs[:, 0])
    )
    return ~masked, outside_out & ~(k_on & (top_k > cap))


def _truncate_sorted(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    masked = ranks[None, :] >= k[:, None]
    probs = sorted_logits.masked_fill(masked, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    masked |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    masked |= probs < min_p[:, None] * probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(masked, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    """Turns one step's logits into tokens; stateless."""

    def probs(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """logits: [N, V] fp32 -> [N, V] distribution each row samples from (one-hot at the
        argmax for greedy rows). Used as the target distribution when verifying drafts."""
        _check(logits, rows)
        logits = apply_penalties(logits, rows)
        out = torch.zeros_like(logits)
        greedy = [i for i, row in enumerate(rows) if _temperature(row.params) == 0]
        random = [i for i, row in enumerate(rows) if _temperature(row.params) > 0]
        if greedy:
            index = torch.tensor(greedy, device=logits.device)
            out[index] = torch.nn.functional.one_hot(
                logits[index].argmax(dim=-1), logits.shape[-1]
            ).to(out.dtype)
        if random:
            index = torch.tensor(random, device=logits.device)
            out[index] = self._random_logits(logits[index], [rows[i] for i in random]).softmax(-1)
        return out

    def sample(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> SamplerOutput:
        """logits: [N, V] fp32 -> one token per row, plus logprobs where requested."""
        _check(logits, rows)
        penalized = apply_penalties(logits, rows)
        token_ids = penalized.argmax(dim=-1)
        random = [i for i, row in enumerate(rows) if _temperature(row.params) > 0]
        if random:
            index = torch.tensor(random, device=logits.device)
            probs = self._random_logits(penalized[index], [rows[i] for i in random]).softmax(-1)
            token_ids[index] = draw(probs, [rows[i].generator for i in random])
        return SamplerOutput(token_ids, _logprobs(logits, token_ids, rows))

    def logprobs(
        self, logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SampleRow]
    ) -> list[TokenLogprobs | None]:
        """logits: [N, V] fp32, token_ids: [N] -> raw-model logprobs of those tokens for the
        rows that asked for them (None elsewhere)."""
        _check(logits, rows)
        return _logprobs(logits, token_ids, rows)

    def _random_logits(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """logits: [M, V] penalized -> [M, V] scaled by temperature and truncated."""
        device = logits.device
        temperature = torch.tensor([_temperature(r.params) for r in rows], device=device)
        top_k = torch.tensor([r.params.top_k for r in rows], device=device)
        top_p = torch.tensor([_top_p(r.params) for r in rows], device=device)
        min_p = torch.tensor([r.params.min_p for r in rows], device=device)
        return truncate(logits / temperature[:, None], top_k, top_p, min_p)


def _check(logits: torch.Tensor, rows: Sequence[SampleRow]) -> None:
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
    if logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32, got {logits.dtype}")


def _temperature(params: SamplingParams) -> float:
    if params.temperature is None:
        raise ValueError("temperature unset: call SamplingParams.with_defaults first")
    return params.temperature


def _top_p(params: SamplingParams) -> float:
    if params.top_p is None:
        raise ValueError("top_p unset: call SamplingParams.with_defaults first")
    return params.top_p


def _logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SampleRow]
) -> list[TokenLogprobs | None]:
    """Raw-model logprobs of the chosen tokens for rows that asked for them."""
    out: list[TokenLogprobs | None] = [None] * len(rows)
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs]
    if not wanted:
        return out
    index = torch.tensor(wanted, device=logits.device)
    logprobs = logits[index].log_softmax(dim=-1)
    chosen = logprobs.gather(-1, token_ids[index][:, None])[:, 0].tolist()
    num_top = max(1, *(rows[i].params.top_logprobs for i in wanted))
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    for j, i in enumerate(wanted):
        n = rows[i].params.top_logprobs
        top = list(zip(top_ids[j, :n].tolist(), top_values[j, :n].tolist(), strict=True))
        out[i] = TokenLogprobs(chosen[j], top)
    return out


def with_drafts(row: SampleRow, drafts: Sequence[int]) -> list[SampleRow]:
    """The rows of a sequence's last token and each draft: draft j's row has seen drafts < j
    (penalties read the history)."""
    if not row.params.has_penalties:
        return [row] * (1 + len(drafts))
    output = list(row.output_token_ids)
    return [
        replace(row, output_token_ids=output + list(drafts[:j])) for j in range(len(drafts) + 1)
    ]
