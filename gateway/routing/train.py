"""Train the learned scorer: `python -m gateway.routing.train [--train F ...] [--out F]`.

Reads labelled conversations (testkit/routing_eval/train.jsonl and train_extra.jsonl, written by
different people: one JSON object a line with `messages`, the chat messages as a client sends
them, and `label`, think | fast, for the last turn), takes each one's ask as the judge would
score it (`ask.ask_of`; a tool or continue turn scores the ask it continues), and fits a
logistic regression (L2, full-batch Adam, numpy only, deterministic for a seed) over the
features of `features.py`, hashed into 2^18 buckets by CRC-32. The words' 3-grams are held
`--gram-l2` times more strongly to 0 than the other features (fitted on train.jsonl alone and
scored on train_extra.jsonl, another author's, that carried better across authors than one
strength for all).

The L2 strength is chosen by k-fold cross-validation on the training set; the threshold on the
out-of-fold scores of the training set together with the scores of the `tune` split of
--tune (the evaluation file: its `heldout` split is never read here), as the one whose larger
error rate, each against its target (`--fast-on-target` of the fast asks sent to thinking,
`--think-off-target` of the hard asks sent to fast), is the smallest: the margin to both
targets is kept alike, rather than one spent to widen the other.
Writes the model file (scorer.py's format) with the features seen in training, the
`--keep` heaviest, and prints the cross-validated agreement.
"""

from __future__ import annotations

import argparse
import json
import zlib
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.routing.ask import Ask, ask_of
from gateway.routing.features import features
from gateway.routing.scorer import SHIPPED, save_model
from providers.types import ChatRequest, Message, ToolCall

BUCKETS = 1 << 18
EVAL_DIR = Path(__file__).resolve().parents[2] / "testkit" / "routing_eval"


def request_of(messages: list[dict[str, Any]]) -> ChatRequest:
    """A chat request of the data set's messages (as a client sends them)."""
    out = []
    for m in messages:
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in m.get("tool_calls") or ()
        )
        out.append(Message(m["role"], m.get("content"), tool_calls=calls,
                           tool_call_id=m.get("tool_call_id")))  # fmt: skip
    return ChatRequest(model="auto", messages=tuple(out))


def scored_ask(request: ChatRequest) -> Ask:
    """The ask the judge's model scores for a request with no stored conversation mode."""
    ask = ask_of(request)
    return ask.anchor if ask.turn != "new" and ask.anchor is not None else ask


def read_items(path: Path, splits: Iterable[str]) -> list[dict[str, Any]]:
    wanted = set(splits)
    with path.open(encoding="utf-8") as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    return [i for i in items if i["split"] in wanted]


def group_of(messages: list[dict[str, Any]]) -> str:
    """The conversation's opening: its first user message's head, without the client's
    wrapper (rows sharing it are variants of one prompt)."""
    ask = ask_of(request_of([m for m in messages if m["role"] == "user"][:1]))
    return ask.instruction[:40] or "-"


def bucket(feature: str) -> int:
    return zlib.crc32(feature.encode()) & (BUCKETS - 1)


class Design:
    """The training rows as sparse bucket indices: row `rows[k]` has bucket `cols[k]`."""

    def __init__(self, feature_lists: Sequence[Collection[str]]) -> None:
        """A feature occurring k times in a row is k entries of its bucket (its count)."""
        rows: list[int] = []
        cols: list[int] = []
        for r, fs in enumerate(feature_lists):
            buckets = [bucket(f) for f in fs]
            rows.extend([r] * len(buckets))
            cols.extend(buckets)
        self.rows = np.array(rows, dtype=np.int64)
        self.cols = np.array(cols, dtype=np.int64)
        self.n = len(feature_lists)

    def subset(self, index: np.ndarray) -> Design:
        keep = np.isin(self.rows, index)
        renumber = np.full(self.n, -1, dtype=np.int64)
        renumber[index] = np.arange(len(index))
        out = Design([])
        out.rows, out.cols, out.n = renumber[self.rows[keep]], self.cols[keep], len(index)
        return out

    def margins(self, w: np.ndarray, b: float) -> np.ndarray:
        return np.bincount(self.rows, weights=w[self.cols], minlength=self.n) + b


def l2_of(feature_sets: Iterable[Collection[str]], l2: float, gram_factor: float) -> np.ndarray:
    """The L2 strength of each bucket: `l2`, times `gram_factor` for the buckets of the words'
    3-grams (g|): shared by many words, they are held closer to 0 than the words themselves."""
    out = np.full(BUCKETS, l2)
    grams = {bucket(f) for fs in feature_sets for f in fs if f.startswith("g|")}
    out[list(grams)] = l2 * gram_factor
    return out


def fit(
    x: Design, y: np.ndarray, l2: float | np.ndarray, steps: int = 400, lr: float = 0.05
) -> tuple[np.ndarray, float]:
    """Minimise mean log-loss + 1/2 sum(l2 * w^2) by full-batch Adam (deterministic); `l2` a
    strength, or one a bucket (`l2_of`)."""
    w = np.zeros(BUCKETS)
    b = 0.0
    m_w, v_w = np.zeros(BUCKETS), np.zeros(BUCKETS)
    m_b = v_b = 0.0
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        p = 1.0 / (1.0 + np.exp(-x.margins(w, b)))
        g = (p - y) / x.n
        grad_w = np.bincount(x.cols, weights=g[x.rows], minlength=BUCKETS) + l2 * w
        grad_b = float(g.sum())
        m_w = beta1 * m_w + (1 - beta1) * grad_w
        v_w = beta2 * v_w + (1 - beta2) * grad_w * grad_w
        m_b = beta1 * m_b + (1 - beta1) * grad_b
        v_b = beta2 * v_b + (1 - beta2) * grad_b * grad_b
        corr1, corr2 = 1 - beta1**t, 1 - beta2**t
        w -= lr * (m_w / corr1) / (np.sqrt(v_w / corr2) + eps)
        b -= lr * (m_b / corr1) / (np.sqrt(v_b / corr2) + eps)
    return w, b


def folds(groups: list[str], k: int, seed: int) -> list[np.ndarray]:
    """k folds of row indices; rows of one group (the same conversation opening: the data set
    varies one opening many ways) stay in one fold, so a fold is scored on openings it did not
    see."""
    names = sorted(set(groups))
    order = np.random.default_rng(seed).permutation(len(names))
    fold_of = {names[j]: n % k for n, j in enumerate(order)}
    return [np.array([r for r, g in enumerate(groups) if fold_of[g] == i]) for i in range(k)]


def out_of_fold(
    x: Design, y: np.ndarray, groups: list[str], l2: float | np.ndarray, k: int, seed: int
) -> np.ndarray:
    scores = np.zeros(x.n)
    for held in folds(groups, k, seed):
        train = np.setdiff1d(np.arange(x.n), held)
        w, b = fit(x.subset(train), y[train], l2)
        scores[held] = 1 / (1 + np.exp(-x.subset(held).margins(w, b)))
    return scores


def choose_threshold(
    scores: np.ndarray, y: np.ndarray, fast_on_target: float, think_off_target: float
) -> float:
    """The threshold whose larger error rate against its target (fast sent to thinking over
    `fast_on_target`, think sent to fast over `think_off_target`) is the smallest (ties: the
    higher agreement, then nearest 0.5)."""
    best: tuple[float, float, float] | None = None
    chosen = 0.5
    fast, think = y == 0, y == 1
    for t in np.round(np.arange(0.05, 0.951, 0.01), 2):
        on = scores >= t
        fast_on = float(on[fast].mean()) if fast.any() else 0.0
        think_off = float((~on)[think].mean()) if think.any() else 0.0
        worst = max(fast_on / fast_on_target, think_off / think_off_target)
        key = (-round(worst, 6), float((on == think).mean()), -abs(float(t) - 0.5))
        if best is None or key > best:
            best, chosen = key, float(t)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train",
        type=Path,
        nargs="+",
        default=[EVAL_DIR / "train.jsonl", EVAL_DIR / "train_extra.jsonl"],
    )
    parser.add_argument("--tune", type=Path, default=EVAL_DIR / "eval.jsonl")
    parser.add_argument("--out", type=Path, default=SHIPPED)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--l2", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4])
    parser.add_argument("--gram-l2", type=float, default=10.0)
    parser.add_argument("--fast-on-target", type=float, default=0.07)
    parser.add_argument("--think-off-target", type=float, default=0.08)
    parser.add_argument("--keep", type=int, default=40_000)
    args = parser.parse_args()

    items = [item for path in args.train for item in read_items(path, ["train"])]
    feature_sets = [features(scored_ask(request_of(i["messages"]))) for i in items]
    y = np.array([i["label"] == "think" for i in items], dtype=float)
    x = Design(feature_sets)
    groups = [group_of(i["messages"]) for i in items]
    cv: dict[float, float] = {}
    oof: dict[float, np.ndarray] = {}
    for l2 in args.l2:
        strengths = l2_of(feature_sets, l2, args.gram_l2)
        oof[l2] = out_of_fold(x, y, groups, strengths, args.folds, args.seed)
        cv[l2] = float(((oof[l2] >= 0.5) == (y == 1)).mean())
        print(f"l2={l2:g}: {args.folds}-fold cross-validated agreement {cv[l2]:.1%}")
    l2 = max(args.l2, key=lambda v: (cv[v], -v))
    w, b = fit(x, y, l2_of(feature_sets, l2, args.gram_l2))

    tune = read_items(args.tune, ["tune"]) if args.tune.exists() else []
    tune_sets = [features(scored_ask(request_of(i["messages"]))) for i in tune]
    tune_scores = 1 / (1 + np.exp(-Design(tune_sets).margins(w, b))) if tune else np.zeros(0)
    tune_y = np.array([i["label"] == "think" for i in tune], dtype=float)
    scores = np.concatenate([oof[l2], tune_scores])
    labels = np.concatenate([y, tune_y])
    threshold = choose_threshold(scores, labels, args.fast_on_target, args.think_off_target)
    cv_at = float(((oof[l2] >= threshold) == (y == 1)).mean())
    print(f"chosen l2={l2:g}, threshold {threshold:.2f} (out-of-fold train + {len(tune)} tune)")
    print(f"cross-validated agreement at that threshold: {cv_at:.1%}")

    seen = {f: float(w[bucket(f)]) for fs in feature_sets for f in fs}
    heaviest = sorted(seen, key=lambda f: (-abs(seen[f]), f))[: args.keep]
    weights = {f: round(seen[f], 4) for f in sorted(heaviest) if round(seen[f], 4) != 0}
    trained = {"items": len(items), "l2": l2, "gram_l2": args.gram_l2, "folds": args.folds,
               "seed": args.seed,
               "cv_agreement": round(cv_at, 4), "buckets": BUCKETS}  # fmt: skip
    save_model(args.out, round(b, 4), threshold, weights, trained)
    print(f"wrote {args.out}: {len(weights)} features")


if __name__ == "__main__":
    main()
