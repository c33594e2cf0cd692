from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.app import spin_for
from gateway.config.settings import load_settings
from plumbing.busy_wait import NO_SPIN, Spin

TOML = """
[server]
host = "127.0.0.1"
port = 8000
[redis]
url = "redis://127.0.0.1:6379/0"
[providers.mock]
kind = "openai"
base_url = "http://127.0.0.1:9000/v1"
api_key_env = "MOCK_API_KEY"
[models."my-model"]
routes = [{ provider = "mock", model = "upstream-model-id" }]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(TOML)
    return path


def test_reads_the_issue_shape(config: Path) -> None:
    s = load_settings(config)
    assert s.server.port == 8000
    assert s.providers["mock"].base_url == "http://127.0.0.1:9000/v1"
    assert s.models["my-model"].routes[0].model == "upstream-model-id"


def test_environment_overrides_file_and_nested_names(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_SERVER__PORT", "9123")
    monkeypatch.setenv("GATEWAY_ADMIN__API_KEY", "adm-secret")
    s = load_settings(config)
    assert s.server.port == 9123
    assert s.admin.api_key is not None and s.admin.api_key.get_secret_value() == "adm-secret"
    assert "adm-secret" not in repr(s)


def test_config_path_from_environment(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CONFIG", str(config))
    assert "my-model" in load_settings().models


def test_settings_are_frozen(config: Path) -> None:
    s = load_settings(config)
    with pytest.raises(ValidationError):
        s.server.port = 1  # type: ignore[misc]


def test_provider_key_is_read_from_its_env_var(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load_settings(config)
    assert s.providers["mock"].api_key() is None
    monkeypatch.setenv("MOCK_API_KEY", "up-key")
    assert s.providers["mock"].api_key() == "up-key"


def test_presets_are_live_only_with_their_key(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("TAOTOKEN_API_KEY", "DEEPSEEK_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-x")
    live, skipped = load_settings(config).live_providers()
    assert set(live) == {"mock", "deepseek"}
    assert live["deepseek"].base_url.startswith("https://api.deepseek.com")
    assert "TAOTOKEN_API_KEY" in skipped["taotoken"]
    assert "OPENAI_API_KEY" in skipped["openai"]


@pytest.mark.parametrize(
    "snippet, needle",
    [
        ('[models."x"]\nroutes = [{ provider = "nope", model = "m" }]\n', "unknown provider"),
        ('[providers.bad]\nkind = "openai"\nbase_url = "ftp://x"\n', "base_url"),
        ("[server]\nport = 99999\n", "port"),
        ("[server]\nprot = 1\n", "prot"),
    ],
)
def test_invalid_settings_fail_clearly(tmp_path: Path, snippet: str, needle: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(snippet)
    with pytest.raises(ValidationError, match=needle):
        load_settings(path)


def test_default_settings_file_loads() -> None:
    s = load_settings(Path(__file__).parents[3] / "settings.toml")
    assert s.providers["local"].kind == "local"
    assert {"deepseek-v3.1", "deepseek-chat", "deepseek-reasoner"} <= set(s.models)
    assert s.models["deepseek-reasoner"].routes[0].thinking is True


def test_engine_knobs_validate_into_the_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.engine.engine_config import EngineConfig  # torch-free

    assert load_settings().engine.config == EngineConfig()  # one set of defaults
    monkeypatch.setenv("GATEWAY_ENGINE__MAX_WAITING", "7")
    engine = load_settings(engine={"cache_memory_mb": 3, "dtype": "bfloat16"}).engine
    assert engine.config == EngineConfig(
        cache_memory_bytes=3 << 20, dtype="bfloat16", max_waiting=7
    )


@pytest.mark.parametrize(
    ("engine", "needle"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be positive"),
        ({"max_num_seqs": 64, "max_batch_tokens": 32}, "must cover one decode token"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"device": "tpu"}, "device must be"),
        ({"cache_memory": 5}, "unknown engine settings: cache_memory"),
        ({"spec_num_tokens": 4}, "spec_num_tokens must be in"),
        ({"spec_max_batch_size": 0}, "spec_max_batch_size must be positive"),
        ({"max_num_seqs": 64, "max_batch_tokens": 100}, "a decode and its 1 drafts"),
    ],
)
def test_engine_knobs_fail_at_load(engine: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        load_settings(engine=engine)


def test_cluster_needs_its_secret_from_the_environment(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_CLUSTER__ENABLED", "true")
    monkeypatch.setenv("GATEWAY_REDIS__EMBEDDED", "false")
    with pytest.raises(ValidationError, match="GATEWAY_CLUSTER__SECRET"):
        load_settings(config)
    monkeypatch.setenv("GATEWAY_CLUSTER__SECRET", "short")
    with pytest.raises(ValidationError, match="16"):
        load_settings(config)
    monkeypatch.setenv("GATEWAY_CLUSTER__SECRET", "s" * 24)
    monkeypatch.setenv("GATEWAY_CLUSTER__NODE_ID", "a")
    cluster = load_settings(config).cluster
    assert cluster.enabled and cluster.node_id == "a"
    assert "s" * 24 not in repr(cluster)
    monkeypatch.setenv("GATEWAY_CLUSTER__LIVENESS_TTL_S", "0.1")
    with pytest.raises(ValidationError, match="liveness_ttl_s"):
        load_settings(config)
    monkeypatch.delenv("GATEWAY_CLUSTER__LIVENESS_TTL_S")
    # a peer's keep-alive lines must come faster than the deadlines that watch for them
    monkeypatch.setenv("GATEWAY_CLUSTER__FORWARD_IDLE_TIMEOUT_S", "1")
    with pytest.raises(ValidationError, match="forward_keepalive_s must be below"):
        load_settings(config)
    monkeypatch.setenv("GATEWAY_CLUSTER__FORWARD_KEEPALIVE_S", "0.5")
    cluster = load_settings(config).cluster
    assert (cluster.forward_idle_timeout_s, cluster.forward_first_byte_timeout_s) == (1.0, 5.0)


def test_a_cluster_refuses_an_embedded_redis(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that could not reach the shared Redis must not start a private one."""
    monkeypatch.setenv("GATEWAY_CLUSTER__ENABLED", "true")
    monkeypatch.setenv("GATEWAY_CLUSTER__SECRET", "s" * 24)
    with pytest.raises(ValidationError, match="redis.embedded = false"):
        load_settings(config)  # embedded is on by default
    monkeypatch.setenv("GATEWAY_REDIS__EMBEDDED", "true")
    with pytest.raises(ValidationError, match="cluster.enabled needs the Redis every node"):
        load_settings(config)
    monkeypatch.setenv("GATEWAY_REDIS__EMBEDDED", "false")
    assert load_settings(config).cluster.enabled


def test_further_upstream_accounts_come_from_the_environment(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_PROVIDERS__MOCK__API_KEY_ENVS", '["MOCK_KEY_2", "MOCK_KEY_3"]')
    monkeypatch.setenv("MOCK_API_KEY", "sk-1")
    monkeypatch.setenv("MOCK_KEY_3", "sk-3")
    provider = load_settings(config).providers["mock"]
    assert provider.accounts() == (("MOCK_API_KEY", "sk-1"), ("MOCK_KEY_3", "sk-3"))


def test_speculation_knobs_validate_into_the_engine_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_ENGINE__SPEC_ENABLED", "false")
    engine = load_settings(engine={"spec_num_tokens": 3, "spec_max_batch_size": 4}).engine
    assert (engine.config.spec_enabled, engine.config.spec_num_tokens) == (False, 3)
    assert engine.config.spec_max_batch_size == 4


def test_answers_are_polled_for_except_beside_the_embedded_engine(
    config: Path,
) -> None:
    upstream_only = load_settings(config)
    assert spin_for(upstream_only, 0) == Spin(0.0002, 4)
    with_engine = load_settings(Path(__file__).parents[3] / "settings.toml")
    assert spin_for(with_engine, 0) == NO_SPIN  # this process runs the engine
    assert spin_for(with_engine, 1) == Spin(0.0002, 4)  # reaches worker 0's


def test_demo_weights_default_to_the_trained_demo_and_random_stays_available() -> None:
    engine = load_settings().engine
    assert (engine.demo_weights, engine.demo_preset) == ("trained", "tiny")
    assert load_settings(engine={"demo_weights": "random"}).engine.demo_weights == "random"
    with pytest.raises(ValidationError, match="demo_weights"):
        load_settings(engine={"demo_weights": "pretrained"})
    shipped = load_settings(Path(__file__).parents[3] / "settings.toml").engine
    assert (shipped.demo_weights, shipped.demo_preset) == ("trained", "tiny")
