"""No URL's credentials in a log line or an answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from gateway.config.process import RedisSettings
from gateway.errors import UpstreamError
from gateway.observability.redact import redact_event, redact_text, redact_url
from gateway.server.redis_server import open_redis
from testkit.gateway_app import closed_port

SECRET = "s3cr3t-pa55"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        (f"rediss://default:{SECRET}@h:6380", "rediss://default:***@h:6380"),
        (f"https://{SECRET}@api.example/v1?x=a@b", "https://***@api.example/v1?x=a@b"),
        (f"redis://u:{SECRET}@with@at@h/0", "redis://u:***@h/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_every_url_in_a_text_and_a_log_event_is_redacted() -> None:
    text = f"a redis://:{SECRET}@h/0 and http://u:{SECRET}@x/ then me@example.com"
    assert SECRET not in redact_text(text) and "me@example.com" in redact_text(text)
    event = redact_event(None, "info", {"event": "x", "url": text, "n": 3})
    assert SECRET not in str(event) and event["n"] == 3


def test_an_error_message_never_carries_a_url_password() -> None:
    error = UpstreamError(f"cannot reach http://user:{SECRET}@10.0.0.5:8000/v1")
    assert SECRET not in error.message and SECRET not in str(error.body())
    assert "http://user:***@10.0.0.5:8000/v1" in error.message


async def test_the_startup_error_hides_the_redis_password() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    with pytest.raises(RuntimeError) as failure:
        async with open_redis(RedisSettings(url=url, embedded=False)):
            pass
    assert SECRET not in str(failure.value) and ":***@" in str(failure.value)


async def test_the_embedded_fallback_warning_hides_the_redis_password(tmp_path: Path) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    settings = RedisSettings(url=url, embedded=True, data_dir=tmp_path / "redis")
    with structlog.testing.capture_logs() as logs:
        async with open_redis(settings) as redis:
            assert await redis.ping()
    warnings = [e for e in logs if e["event"] == "redis_unreachable_starting_embedded"]
    assert warnings and SECRET not in str(logs)
