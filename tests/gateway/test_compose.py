"""docker compose can't run here: check the file's structure the way `docker compose config`
would need it, and that it fits the Dockerfile and settings."""

from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def test_compose_file_structure() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    redis, gateway = services["redis"], services["gateway"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert redis["healthcheck"]["test"][:2] == ["CMD", "redis-cli"]
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert gateway["build"] == "."
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert ".env" in gateway["env_file"]
    assert gateway["environment"]["GATEWAY_REDIS__URL"].startswith("redis://redis:")
    mounts = gateway["volumes"]
    assert any(m.startswith("./settings.toml:/etc/gateway/settings.toml") for m in mounts)
    for volume in ("redis-data", "gateway-data"):
        assert volume in compose["volumes"]
    assert (ROOT / "Dockerfile").read_text().count("GATEWAY_CONFIG=/etc/gateway/settings.toml")
    assert (ROOT / ".env.example").exists()
