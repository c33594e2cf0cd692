"""The learned scorer: its lookups by prefix (and its words' cached weights) sum exactly the
weights of the features, a model file is checked when it loads, and training is deterministic."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from gateway.config.routing import ScorerSettings
from gateway.routing.features import features
from gateway.routing.scorer import Scorer, load_model, save_model
from gateway.routing.train import Design, choose_threshold, fit, scored_ask
from testkit.routing_eval import TRAIN, load


def test_the_score_is_the_sigmoid_of_the_weights_of_the_features_present() -> None:
    scorer = Scorer(ScorerSettings())
    for item in load(TRAIN)[::20]:
        ask = scored_ask(item.request())
        present = features(ask)  # each occurrence counts
        z = scorer.bias + sum(scorer.weights.get(f, 0.0) for f in present)
        assert scorer.score(ask) == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-12)
        assert scorer.score(ask) == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-12)  # cached


def test_a_model_file_is_checked_when_it_loads(tmp_path: Path) -> None:
    path = tmp_path / "m.json.gz"
    save_model(path, -0.5, 0.4, {"w|prove": 2.0}, {"items": 1})
    first = path.read_bytes()
    other = tmp_path / "other.json.gz"
    save_model(other, -0.5, 0.4, {"w|prove": 2.0}, {"items": 1})
    assert other.read_bytes() == first  # the same model writes the same bytes
    assert load_model(path)["weights"] == {"w|prove": 2.0}
    scorer = Scorer(ScorerSettings(weights_file=path, threshold=0.7))
    assert (scorer.bias, scorer.threshold) == (-0.5, 0.7)
    with gzip.open(path, "wt") as fh:
        fh.write('{"format": 99}')
    with pytest.raises(ValueError, match="not a format-2 model"):
        load_model(path)
    path.write_text("plain text")
    with pytest.raises(ValueError, match="not a readable model"):
        load_model(path)


def test_training_is_deterministic_and_fits_separable_data() -> None:
    rows = [{"w|prove", "w|lemma"}, {"w|translate"}, {"w|prove"}, {"w|rewrite", "w|translate"}]
    y = np.array([1.0, 0.0, 1.0, 0.0])
    w1, b1 = fit(Design(rows), y, l2=1e-3, steps=100)
    w2, b2 = fit(Design(rows), y, l2=1e-3, steps=100)
    assert np.array_equal(w1, w2) and b1 == b2
    scores = 1 / (1 + np.exp(-Design(rows).margins(w1, b1)))
    assert list(scores >= 0.5) == [True, False, True, False]
    # the threshold keeps fast asks sent to thinking within the bound
    labels = np.array([0.0, 0.0, 1.0, 1.0])
    assert choose_threshold(np.array([0.3, 0.6, 0.55, 0.9]), labels, 0.0) > 0.6
