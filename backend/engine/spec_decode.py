"""Verification of draft tokens (speculative decoding) that keeps the target distribution.

For one sequence with k drafts x_1..x_k proposed from draft distributions q_i, and target
distributions p_1..p_{k+1} from the main model at the k+1 verified positions: accept x_i with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a token drawn from
norm(max(0, p_i - q_i)) and stop; if all are accepted, emit a bonus token drawn from p_{k+1}.
Each emitted token is then distributed exactly as p at its position. Greedy: accept while the
draft equals the target's argmax, then emit the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: Sequence[int],
    generator: torch.Generator | None,
) -> list[int]:
    """target_probs: [k+1, V], draft_probs: [k, V] -> accepted drafts then one more token."""
    k = len(draft_token_ids)
    if target_probs.shape[0] != k + 1 or draft_probs.shape[0] != k:
        raise ValueError(f"need {k + 1} target and {k} draft rows for {k} drafts")
    device = target_probs.device
    emitted: list[int] = []
    for i, token in enumerate(draft_token_ids):
        p, q = target_probs[i, token], draft_probs[i, token]
        u = torch.rand((), generator=generator, device=device)
        if bool(u * q < p):
            emitted.append(token)
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        if not bool(residual.sum() > 0):  # p == q up to rounding: p itself is the residual
            residual = target_probs[i]
        emitted.append(int(torch.multinomial(residual, 1, generator=generator)[0]))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[k], 1, generator=generator)[0]))
    return emitted


def greedy_verify(target_token_ids: Sequence[int], draft_token_ids: Sequence[int]) -> list[int]:
    """target_token_ids: argmax at the k+1 verified positions -> accepted drafts then the
    target's own token at the first mismatch (or the bonus token)."""
    k = len(draft_token_ids)
    if len(target_token_ids) != k + 1:
        raise ValueError(f"need {k + 1} target tokens for {k} drafts")
    emitted: list[int] = []
    for draft, target in zip(draft_token_ids, target_token_ids, strict=False):
        emitted.append(target)
        if draft != target:
            return emitted
    emitted.append(target_token_ids[k])
    return emitted
