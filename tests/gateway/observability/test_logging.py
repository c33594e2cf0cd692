"""One log stream: standard-library records (the engine's) render like structlog's own."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from gateway.config.process import LoggingSettings
from gateway.observability.logging import configure_logging


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_root_logging")
def test_json_mode_renders_stdlib_records_as_json_with_their_extra_fields() -> None:
    out = io.StringIO()
    configure_logging(LoggingSettings(format="json", level="info"), stream=out)
    configure_logging(LoggingSettings(format="json", level="info"), stream=out)  # no stacking
    structlog.get_logger("gateway.test").info("gateway_line", port=8000)
    logging.getLogger("backend.engine.runner").info(
        "latent pool: %s", "kv_blocks=12", extra={"kv_blocks": 12, "dtype": "float32"}
    )
    logging.getLogger("backend.engine.runner").debug("below the level")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["gateway_line", "latent pool: kv_blocks=12"]
    engine_line = lines[1]
    assert engine_line["kv_blocks"] == 12 and engine_line["dtype"] == "float32"
    assert engine_line["level"] == "info" and engine_line["logger"] == "backend.engine.runner"
    assert "timestamp" in engine_line


@pytest.mark.usefixtures("restore_root_logging")
def test_a_worker_names_itself_on_every_line() -> None:
    out = io.StringIO()
    configure_logging(LoggingSettings(format="json", level="info"), stream=out, worker=3)
    structlog.get_logger("gateway.test").info("gateway_line")
    logging.getLogger("backend.engine.runner").info("engine_line")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line["worker"]) for line in lines] == [
        ("gateway_line", 3),
        ("engine_line", 3),
    ]
    configure_logging(LoggingSettings(format="json", level="info"), stream=out)
    structlog.get_logger("gateway.test").info("single_process")
    assert "worker" not in json.loads(out.getvalue().splitlines()[-1])


class _Writes(io.StringIO):
    """A stream that keeps what each write call got."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.mark.usefixtures("restore_root_logging")
def test_every_line_goes_out_in_one_write_so_workers_sharing_stderr_do_not_interleave() -> None:
    """With PYTHONUNBUFFERED (common in containers) each write is a system call on the stderr
    that `[server] workers` share: a line written in two parts can have another worker's line
    land between them."""
    out = _Writes()
    configure_logging(LoggingSettings(format="json", level="info"), stream=out, worker=1)
    structlog.get_logger("gateway.test").info("shutting_down", grace_period_s=30.0)
    logging.getLogger("backend.engine.runner").info("an engine line")
    assert len(out.calls) == 2
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in out.calls)
    assert json.loads(out.calls[0])["worker"] == 1
