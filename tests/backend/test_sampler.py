import math
from typing import Any

import pytest
import torch

from backend.engine.sampler import (
    Sampler,
    SampleRow,
    _truncate_sorted,
    apply_penalties,
    make_generator,
    truncate,
)
from backend.engine.sampling_params import SamplingParams
from backend.engine.spec_decode import greedy_verify, rejection_sample

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def row(
    seed: int | None = None,
    prompt: tuple[int, ...] = (),
    output: tuple[int, ...] = (),
    **params: Any,
) -> SampleRow:
    full = SamplingParams(seed=seed, **params).with_defaults({"temperature": 1.0, "top_p": 1.0})
    return SampleRow(full, prompt, output, make_generator(seed, CPU))


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against expected probabilities (zero cells dropped)."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[keep].double() * counts.sum()
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), stat / 2))


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    rows = [row(temperature=0.0, seed=i) for i in range(5)]
    out = Sampler().sample(logits, rows)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))


def test_greedy_ignores_top_k_and_top_p_but_not_penalties() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    plain = Sampler().sample(logits, [row(temperature=0.0, top_k=1, top_p=0.1)])
    assert plain.token_ids.tolist() == [0]
    penalized = Sampler().sample(logits, [row(temperature=0.0, output=(0,), presence_penalty=1)])
    assert penalized.token_ids.tolist() == [1]


def test_top_k_keeps_the_k_best() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    masked = truncate(logits, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert torch.isinf(masked).tolist() == [[True, False, True, False, True]]
    assert masked[0, 1] == 5.0 and masked[0, 3] == 4.0


def test_top_k_breaks_ties_by_lower_id() -> None:
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0]])
    masked = truncate(logits, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert torch.isfinite(masked).tolist() == [[False, True, True, False]]


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    keep = {}
    for top_p in (0.4, 0.75, 0.85, 1.0):
        masked = truncate(logits, torch.tensor([0]), torch.tensor([top_p]), torch.tensor([0.0]))
        keep[top_p] = torch.isfinite(masked)[0].nonzero().flatten().tolist()
    assert keep == {0.4: [1], 0.75: [1, 3], 0.85: [1, 2, 3], 1.0: [0, 1, 2, 3]}


def test_min_p_drops_tokens_below_fraction_of_best() -> None:
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    masked = truncate(logits, torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.35]))
    assert torch.isfinite(masked)[0].tolist() == [False, True, False, True]


def test_truncation_is_per_row() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    masked = truncate(
        logits, torch.tensor([1, 0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])
    )
    assert torch.isfinite(masked).tolist() == [[False, False, True], [True, True, True]]


def test_probs_apply_temperature_then_truncation() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    probs = Sampler().probs(logits, [row(temperature=0.5, top_k=3)])
    expected = torch.tensor([[1.0, 2.0, 3.0, float("-inf")]]).div(0.5).softmax(-1)
    torch.testing.assert_close(probs, expected)
    greedy = Sampler().probs(logits, [row(temperature=0.0)])
    assert greedy.tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_seeded_sampling_is_deterministic_and_batch_invariant() -> None:
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(1, 64, generator=gen)
    others = torch.randn(5, 64, generator=gen)

    def draws(batch: torch.Tensor, where: int, seeds: list[int | None]) -> list[int]:
        rows = [row(seed=s, temperature=1.3, top_p=0.9) for s in seeds]
        tokens = []
        for _ in range(20):
            tokens.append(int(Sampler().sample(batch, rows).token_ids[where]))
        return tokens

    alone = draws(target, 0, [7])
    assert alone == draws(target, 0, [7])
    mixed = torch.cat([others[:2], target, others[2:]])
    assert draws(mixed, 2, [1, None, 7, 3, 4, None]) == alone
    assert draws(target, 0, [8]) != alone


def test_seeded_and_unseeded_rows_each_get_their_own_token() -> None:
    logits = torch.eye(4)[[1, 2, 0, 3, 1]] * 10
    rows = [
        row(temperature=0.0),
        row(top_k=1),
        row(seed=1, top_k=1),
        row(top_k=1),
        row(seed=2, top_k=1),
    ]
    assert Sampler().sample(logits, rows).token_ids.tolist() == [1, 2, 0, 3, 1]


def test_repetition_penalty_formula() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]])
    out = apply_penalties(logits, [row(prompt=(0, 1), output=(1, 2), repetition_penalty=2.0)])
    assert out.tolist() == [[1.0, -4.0, 0.5, -1.0, 0.5]]
    assert logits[0, 0] == 2.0  # the input is not modified


def test_presence_and_frequency_penalties_count_output_only() -> None:
    logits = torch.zeros(1, 4)
    rows = [row(prompt=(3, 3), output=(0, 0, 0, 1), presence_penalty=0.5, frequency_penalty=0.25)]
    out = apply_penalties(logits, rows)
    assert out.tolist() == [[-(0.5 + 0.75), -(0.5 + 0.25), 0.0, 0.0]]


def test_penalties_are_per_row() -> None:
    logits = torch.ones(2, 3)
    out = apply_penalties(logits, [row(output=(0,), presence_penalty=1.0), row(output=(0,))])
    assert out.tolist() == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


@pytest.mark.parametrize("seeded", [True, False])
def test_temperature_sampling_matches_softmax(seeded: bool) -> None:
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5])
    temperature, n = 0.7, 6000
    params = row(temperature=temperature).params
    generator = torch.Generator().manual_seed(123) if seeded else None
    rows = [SampleRow(params, (), (), generator) for _ in range(n)]
    with torch.random.fork_rng():
        torch.manual_seed(321)
        tokens = Sampler().sample(logits.expand(n, -1).contiguous(), rows).token_ids
    counts = torch.bincount(tokens, minlength=6)
    assert chi_square_pvalue(counts, (logits / temperature).softmax(-1)) > 1e-3
    # the test has power: the untempered distribution is rejected
    assert chi_square_pvalue(counts, logits.softmax(-1)) < 1e-6


def test_logprobs_are_raw_model_logprobs() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    rows = [
        row(seed=0, temperature=5.0, logprobs=True, top_logprobs=2, output=(1,), presence_penalty=2)
    ]
    out = Sampler().sample(logits, rows)
    raw = logits.log_softmax(-1)[0]
    info = out.logprobs[0]
    assert info is not None
    chosen = int(out.token_ids[0])
    assert math.isclose(info.logprob, float(raw[chosen]), rel_tol=1e-6)
    assert [t for t, _ in info.top] == [1, 2]
    assert math.isclose(info.top[0][1], float(raw[1]), rel_tol=1e-6)
    no_logprobs = Sampler().sample(logits, [row(temperature=0.0)])
    assert no_logprobs.logprobs == [None]


def test_rows_need_resolved_defaults() -> None:
    bare = SampleRow(SamplingParams(), (), (), None)
    with pytest.raises(ValueError, match="with_defaults"):
        Sampler().sample(torch.zeros(1, 3), [bare])
    with pytest.raises(ValueError):
        Sampler().sample(torch.zeros(2, 3), [row()])


def test_with_defaults_and_validation() -> None:
    config = {"temperature": 0.6, "top_p": 0.95}
    filled = SamplingParams().with_defaults(config)
    assert (filled.temperature, filled.top_p) == (0.6, 0.95)
    kept = SamplingParams(temperature=0.0, top_p=0.5).with_defaults(config)
    assert (kept.temperature, kept.top_p) == (0.0, 0.5)
    openai = SamplingParams().with_defaults({})
    assert (openai.temperature, openai.top_p) == (1.0, 1.0)
    bad: list[dict[str, Any]] = [
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_k": -1},
        {"min_p": 1.5},
        {"presence_penalty": 3},
        {"repetition_penalty": 0},
        {"max_tokens": 0},
        {"top_logprobs": 3},
        {"logprobs": True, "top_logprobs": 21},
        {"seed": -1},
        {"stop": ("",)},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


def test_greedy_verify_accepts_matching_prefix() -> None:
    assert greedy_verify([5, 6, 7], [5, 6]) == [5, 6, 7]
    assert greedy_verify([5, 6, 7], [5, 9]) == [5, 6]
    assert greedy_verify([5, 6, 7], [4, 6]) == [5]
    assert greedy_verify([5], []) == [5]


def test_rejection_sampling_with_one_hot_target_is_greedy_verify() -> None:
    target = torch.nn.functional.one_hot(torch.tensor([2, 0, 3]), 4).float()
    draft = torch.full((2, 4), 0.25)
    gen = torch.Generator().manual_seed(0)
    assert rejection_sample(target, draft, [2, 0], gen) == [2, 0, 3]
    assert rejection_sample(target, draft, [2, 1], gen) == [2, 0]
    assert rejection_sample(target, draft, [1, 0], gen) == [2]


def test_rejection_sampling_preserves_target_distribution() -> None:
    gen = torch.Generator().manual_seed(5)
    vocab, trials = 5, 5000
    target = torch.tensor(
        [[0.4, 0.3, 0.15, 0.1, 0.05], [0.05, 0.05, 0.2, 0.3, 0.4], [0.2, 0.2, 0.2, 0.2, 0.2]]
    )
    draft = torch.tensor([[0.1, 0.1, 0.5, 0.2, 0.1], [0.3, 0.3, 0.2, 0.1, 0.1]])
    first = torch.zeros(vocab, dtype=torch.long)
    second = torch.zeros(vocab, dtype=torch.long)
    for _ in range(trials):
        drafts = [int(torch.multinomial(draft[i], 1, generator=gen)) for i in range(2)]
        emitted = rejection_sample(target, draft, drafts, gen)
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    assert chi_square_pvalue(first, target[0]) > 1e-3
    assert chi_square_pvalue(second, target[1]) > 1e-3
    # the test has power: always accepting the draft would show the draft distribution
    assert chi_square_pvalue(first, draft[0]) < 1e-6


def test_truncate_fast_path_equals_full_sort() -> None:
    """The candidate fast path keeps exactly the tokens the full sort keeps, on peaked rows
    (decided among the candidates) and flat rows (falling back to the sort) alike."""
    gen = torch.Generator().manual_seed(7)
    vocab = 5000
    flat = torch.randn(6, vocab, generator=gen)
    peaked = flat.clone()
    peaked[:, :40] += 12.0
    logits = torch.cat([flat, peaked])
    top_k = torch.tensor([0, 50, 0, 0, 3000, 0] * 2)
    top_p = torch.tensor([0.9, 1.0, 0.5, 1.0, 0.95, 1.0] * 2)
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.2, 0.0, 0.0] * 2)
    fast = truncate(logits, top_k, top_p, min_p)
    full = _truncate_sorted(logits, top_k, top_p, min_p)
    assert torch.equal(fast.isinf(), full.isinf())
    assert torch.equal(fast[~fast.isinf()], full[~full.isinf()])
    assert torch.equal(fast[5], logits[5]) and torch.equal(fast[11], logits[11])
