"""The Live fragment's engine, breaker and cluster rows, rendered from the same snapshots the
page reads (an engine's `EngineStats`, readiness's provider health, membership's peers)."""

from __future__ import annotations

from backend.engine.interface import EngineStats
from gateway.admin.console.live_page import Rates, banner, engine_row
from gateway.admin.console.render import Static, environment


def _stats(generated: int) -> EngineStats:
    return EngineStats(
        num_waiting=3,
        num_running=5,
        num_free_blocks=60,
        num_total_blocks=100,
        prefix_cache_hit_tokens_total=300,
        prefix_cache_query_tokens_total=400,
        num_steps_total=10,
        num_preemptions_total=0,
        num_batched_tokens_total=1000,
        num_batched_seqs_total=50,
        num_generated_tokens_total=generated,
        last_batch_tokens=8,
        last_batch_seqs=5,
        last_step_seconds=0.01,
        spec_proposed_tokens_total=100,
        spec_accepted_tokens_total=60,
    )


def test_engine_rates_and_fragment() -> None:
    rates = Rates()
    assert rates.tokens_per_s("local", 1000, now=10.0) is None  # no earlier sample
    assert rates.tokens_per_s("local", 1500, now=12.0) == 250.0
    engine = engine_row("local", _stats(1500), 250.0)
    assert (engine["blocks_used"], engine["prefix_hit_rate"], engine["mtp_acceptance"]) == (
        40,
        0.75,
        0.6,
    )
    html = (
        environment(Static())
        .get_template("live_state.jinja")
        .render(
            ready=False,
            banner=banner(
                False,
                {"redis": True, "engine:local": False, "accepting": True},
                {"engine:local": "training demo 45%"},
            ),
            checks={"redis": True, "engine:local": False, "accepting": True},
            loading={"engine:local": "training demo 45%"},
            failing_models=["deepseek-chat"],
            serving_models=["gpt-4o", "claude"],
            engines=[engine],
            providers={
                "deepseek": {
                    "breakers": {
                        "deepseek-chat": {"state": "open", "probe_in_s": 4.5},
                        "deepseek-reasoner": {"state": "open", "probe_in_s": 0.0},
                    },
                    "rate_limited": {},
                    "last_success_age_s": None,
                    "last_error": "HTTP 502",
                    "last_error_age_s": 3.0,
                }
            },
            cluster={
                "node": "n1",
                "joined": True,
                "peers": [
                    {"node": "n2", "live": False},
                    {
                        "node": "n3",
                        "live": True,
                        "compatible": True,
                        "left_out": False,
                        "waiting": 2,
                        "running_tokens": 900,
                        "free_blocks": 10,
                        "total_blocks": 20,
                    },
                ],
            },
        )
    )
    assert "Not ready: engine:local training demo 45%" in html
    assert "engine:local loading" in html and "redis ok" in html
    assert "1 model down: deepseek-chat; the other 2 (gpt-4o, claude) serve." in html
    assert "40 / 100" in html and "75.0 %" in html and "60.0 %" in html and "250.0" in html
    assert "deepseek-chat: open" in html and "probe in 4.5 s" in html and "HTTP 502" in html
    # An open breaker whose probe is due waits for traffic: it probes on the next request.
    assert "deepseek-reasoner: open</span> (probes on the next request)" in html
    assert "probe in 0.0" not in html
    assert "n2" in html and "10 / 20" in html


def test_live_banner_names_what_is_loading_or_down() -> None:
    assert banner(True, {"redis": True, "accepting": True}, {}) == "Ready"
    assert banner(False, {"redis": False, "accepting": True}, {}) == "Not ready: redis down"
    assert banner(
        False,
        {"redis": True, "engine:local": False, "accepting": False},
        {"engine:local": "loading checkpoint 30%"},
    ) == ("Not ready: engine:local loading checkpoint 30%, accepting down")
