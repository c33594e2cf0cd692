"""The cheap-signal scorer: a logistic model over `signals.SIGNALS` with weights from settings.

score = sigmoid(bias + sum(weight_i * signal_i)), in (0, 1); thinking goes on at `threshold` and
above. The default weights were fitted on the tuning half of tests/gateway/routing_eval and the
threshold chosen there (`benchmarks/routing.py --fit` prints both); the held-out half
reports agreement.
"""

from __future__ import annotations

import math

from gateway.config.routing import ScorerSettings
from gateway.routing.signals import SIGNALS, Signals


class Scorer:
    def __init__(self, settings: ScorerSettings) -> None:
        unknown = set(settings.weights) - set(SIGNALS)
        if unknown:
            raise ValueError(
                f"routing.scorer.weights names unknown signals {sorted(unknown)}; "
                f"known: {', '.join(SIGNALS)}"
            )
        self.bias = settings.bias
        self.weights = tuple(settings.weights.get(name, 0.0) for name in SIGNALS)
        self.threshold = settings.threshold
        self.scan_chars = settings.scan_chars

    def score(self, signals: Signals) -> float:
        z = self.bias
        for weight, value in zip(self.weights, signals.values, strict=True):
            z += weight * value
        if z < -40:  # exp overflow guard; the score is 0 to double precision anyway
            return 0.0
        return 1.0 / (1.0 + math.exp(-z))

    def thinks(self, score: float) -> bool:
        return score >= self.threshold
