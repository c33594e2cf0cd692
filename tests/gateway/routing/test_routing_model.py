"""The learned scorer: its lookups by prefix (and its words' cached weights) sum exactly the
weights of the features, a model file is checked when it loads, and training is deterministic."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from gateway.config.routing import ScorerSettings
from gateway.routing.ask import Ask
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
    # the threshold keeps both error rates within their targets where it can ...
    labels = np.array([0.0, 0.0, 1.0, 1.0])
    assert 0.4 < choose_threshold(np.array([0.3, 0.4, 0.55, 0.9]), labels, 0.1, 0.1) <= 0.55
    # ... and where it cannot, errs the way whose target has more room: a fast ask scored above
    # a hard one goes to thinking where fast asks may go there twice as often, else the hard
    # one goes to fast
    labels = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    scores = np.array([0.1, 0.2, 0.3, 0.7, 0.6, 0.8, 0.85, 0.9])
    assert 0.3 < choose_threshold(scores, labels, 0.5, 0.25) <= 0.6
    assert 0.7 < choose_threshold(scores, labels, 0.25, 0.5) <= 0.8


def _plain(instruction: str) -> Ask:
    return Ask(instruction, (), 0, "plain", "new", 0)


def test_full_width_letters_digits_and_symbols_read_as_their_ordinary_forms() -> None:
    wide = features(_plain("Ｐｒｏｖｅ ｔｈａｔ ｘ＋１２ ＞ ５？"))
    assert wide == features(_plain("Prove that x+12 > 5?"))
    assert {"w|prove", "s|nums=2", "y|+", "y|>", "s|q", "s|qend"} <= set(wide)
    # CJK punctuation is left as it is, and a full-width question mark is a question
    chinese = set(features(_plain("这个证明对吗？")))
    assert {"s|q", "s|qend", "s|script=han"} <= chinese


def test_a_long_instruction_is_read_to_its_first_40_tokens_either_way() -> None:
    names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"]
    text = " ".join(names[n % 7] for n in range(80))  # its 40th token ends past the head
    words = [f for f in features(_plain(text)) if f.startswith("w|")]
    assert words == [f"w|{names[n % 7]}" for n in range(40)]
    short = "step " * 10 + "a" * 200 + " end"  # the head holds too few tokens
    assert [f for f in features(_plain(short)) if f.startswith("w|")][-2:] == [
        "w|" + "a" * 200,
        "w|end",
    ]


def test_ascii_asks_are_tokenized_as_the_unicode_rule_would() -> None:
    from gateway.routing import features as module

    for text in ["what's 15% of 3.14, x_y = 2^10 <= 5?", "rock'n'roll 1,000,000 a+b", ""]:
        assert module._tokens(text) == module._TOKEN.findall(text)[:40]
    assert module._tokens("über 3 straße") == ["über", "3", "straße"]
