"""The [engine] fp8_weights setting reaches the engine's config; unknown values are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config.settings import load_settings


def test_fp8_weights_setting_reaches_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().engine.config.fp8_weights == "resident"
    with pytest.raises(ValidationError, match="fp8_weights"):
        load_settings(engine={"fp8_weights": "int4"})
    monkeypatch.setenv("GATEWAY_ENGINE__FP8_WEIGHTS", "dequantize")
    assert load_settings().engine.config.fp8_weights == "dequantize"
