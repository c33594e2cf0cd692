"""The learned scorer: a logistic model over the ask's features (`features.py`).

score = sigmoid(bias + sum of the weights of the features, each as often as it occurs), in
(0, 1), the features looked up by prefix (`features.groups`), a word together with its 3-grams:
their summed weight is kept per distinct word (at most `WORD_CACHE` words, then forgotten all at
once), so a word seen before costs one lookup. Thinking goes on at the threshold and above.
Weights, bias and threshold are read once, at start, from a gzipped JSON file: `{"format": 2,
"bias": float, "threshold": float, "weights": {feature: weight}, "trained": {...}}`. The shipped
file (`ask_weights.json.gz`, beside this module) is written by `python -m gateway.routing.train`
from testkit/routing_eval/train.jsonl and train_extra.jsonl; settings may name another file and
override the threshold.
"""

from __future__ import annotations

import gzip
import json
import math
from itertools import repeat
from pathlib import Path
from typing import Any

from gateway.config.routing import ScorerSettings
from gateway.routing.ask import Ask
from gateway.routing.features import groups, word_grams

SHIPPED = Path(__file__).with_name("ask_weights.json.gz")
FORMAT = 2  # 2: every occurrence of a feature counts, words with their 3-grams
WORD_CACHE = 65_536  # distinct words whose weight (with their 3-grams') is kept


class Scorer:
    def __init__(self, settings: ScorerSettings) -> None:
        path = settings.weights_file or SHIPPED
        model = load_model(path)
        self.bias: float = model["bias"]
        self.weights: dict[str, float] = model["weights"]
        # one table a prefix ("w|" -> {word: weight}), looked up without joining strings
        self._tables: dict[str, dict[str, float]] = {}
        for name, weight in self.weights.items():
            prefix, _, key = name.partition("|")
            self._tables.setdefault(prefix + "|", {})[key] = weight
        threshold = settings.threshold
        self.threshold: float = model["threshold"] if threshold is None else threshold
        self._word_table = self._tables.get("w|", {})
        self._gram_table = self._tables.get("g|", {})
        self._words: dict[str, float] = {}  # word -> its weight and its 3-grams'

    def score(self, ask: Ask) -> float:
        z = self.bias
        tables = self._tables
        for prefix, keys in groups(ask):
            if prefix == "w|":
                known = self._words.get
                for word in keys:
                    weight = known(word)
                    z += self._word_weight(word) if weight is None else weight
                continue
            table = tables.get(prefix)
            if table is not None and keys:
                z += sum(map(table.get, keys, repeat(0.0, len(keys))))
        if z < -40:  # exp overflow guard; the score is 0 to double precision anyway
            return 0.0
        return 1.0 / (1.0 + math.exp(-z))

    def _word_weight(self, word: str) -> float:
        grams = self._gram_table.get
        weight = self._word_table.get(word, 0.0) + sum(
            [grams(gram, 0.0) for gram in word_grams(word)]
        )
        if len(self._words) >= WORD_CACHE:
            self._words.clear()
        self._words[word] = weight
        return weight

    def thinks(self, score: float) -> bool:
        return score >= self.threshold


def load_model(path: Path) -> dict[str, Any]:
    """The model file's content, checked; a clear error names the file when it is unusable."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            model = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"routing.scorer.weights_file {path}: not a readable model ({exc})"
        ) from None
    if not isinstance(model, dict) or model.get("format") != FORMAT:
        raise ValueError(f"routing.scorer.weights_file {path}: not a format-{FORMAT} model")
    weights = model.get("weights")
    if not isinstance(weights, dict) or not all(
        isinstance(v, int | float) for v in weights.values()
    ):
        raise ValueError(f"routing.scorer.weights_file {path}: weights must map names to numbers")
    model["weights"] = {str(k): float(v) for k, v in weights.items()}
    model["bias"] = float(model.get("bias", 0.0))
    model["threshold"] = float(model.get("threshold", 0.5))
    return model


def save_model(
    path: Path, bias: float, threshold: float, weights: dict[str, float], trained: dict[str, Any]
) -> None:
    body = {
        "format": FORMAT,
        "bias": bias,
        "threshold": threshold,
        "trained": trained,
        "weights": weights,
    }
    # no name and no time in the gzip header: the same model writes the same bytes
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as fh:
        fh.write(
            json.dumps(body, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
        )
