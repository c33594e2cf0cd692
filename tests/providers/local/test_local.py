"""LocalProvider over a real tiny engine (random weights, fp32, CPU), and its stop matcher."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from structlog.testing import capture_logs

from backend.demo_checkpoint import write_demo_checkpoint
from backend.engine.engine_config import EngineConfig
from backend.text.tokenizer import Tokenizer
from providers.errors import InvalidRequest
from providers.local.deferred import LoadProgress
from providers.local.provider import LocalProvider
from providers.local.setup import demo_checkpoint_dir, load_local_provider, resolve_checkpoint
from providers.local.stream import StopMatcher
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    ReasoningDelta,
    Sampling,
    TextDelta,
    Tool,
    ToolCallDelta,
    Usage,
)

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(
        tmp_path_factory.mktemp("local-tiny"), "tiny", seed=0, dtype=torch.float32
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provider(checkpoint: Path) -> AsyncIterator[LocalProvider]:
    config = EngineConfig(
        max_num_seqs=8,
        max_batch_tokens=512,
        block_size=BLOCK_SIZE,
        cache_memory_bytes=1 << 20,
        dtype="float32",
        num_threads=1,
    )
    async with load_local_provider("local", config, model_path=checkpoint) as opened:
        yield opened


def chat(text: str, *, thinking: bool | None = None, **sampling: object) -> ChatRequest:
    return ChatRequest(
        model="deepseek-v3.1",
        messages=(Message(role="user", content=text),),
        sampling=Sampling(**{"temperature": 0.0, "max_tokens": 8, **sampling}),  # type: ignore[arg-type]
        thinking=thinking,
    )


async def collect(provider: LocalProvider, request: ChatRequest) -> list[Event]:
    return [event async for event in provider.chat(request)]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def usage_of(events: list[Event]) -> Usage:
    (usage,) = [e for e in events if isinstance(e, Usage)]
    return usage


async def wait_idle(provider: LocalProvider) -> int:
    """Wait until no request runs and every block is free again (cached or empty); the pool's
    block count. (Stats are published after each step, so they may lag an output briefly.)"""
    for _ in range(200):
        stats = provider.engine_stats()
        idle = stats.num_running == stats.num_waiting == 0
        if idle and stats.num_free_blocks == stats.num_total_blocks:
            return stats.num_total_blocks
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not go idle: {provider.engine_stats()}")


async def until_running(provider: LocalProvider) -> None:
    for _ in range(200):
        if provider.engine_stats().num_running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request never showed as running")


@pytest.mark.asyncio(loop_scope="module")
class TestOverTinyEngine:
    """Share one engine (module-scoped fixture, so the tests run on the module's loop)."""

    async def test_thinking_off_by_default_yields_content_usage_finish(
        self, provider: LocalProvider
    ) -> None:
        request = chat("Hello there")
        events = await collect(provider, request)
        assert not any(isinstance(e, ReasoningDelta) for e in events)
        assert text_of(events)
        usage = usage_of(events)
        assert usage.prompt_tokens == (await provider.prepare(request)).num_tokens
        assert usage.completion_tokens == 8 and usage.reasoning_tokens == 0
        assert events[-1] == Finish("length")
        assert isinstance(events[-2], Usage)

    async def test_thinking_on_streams_reasoning_and_counts_it(
        self, provider: LocalProvider
    ) -> None:
        events = await collect(provider, chat("Hello there", thinking=True))
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        assert reasoning
        usage = usage_of(events)
        # random weights: everything up to a `</think>` (if any) is reasoning
        assert 0 < usage.reasoning_tokens <= usage.completion_tokens == 8

    async def test_prepared_prompt_is_exact_with_tools(
        self, provider: LocalProvider, checkpoint: Path
    ) -> None:
        tool = Tool(name="lookup", description="Find a word", parameters={"type": "object"})
        request = ChatRequest(
            model="m", messages=(Message(role="user", content="define gateway"),), tools=(tool,)
        )
        tokenizer = Tokenizer.from_dir(checkpoint)
        expected = tokenizer.encode_chat(
            [{"role": "user", "content": "define gateway"}],
            thinking=False,
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "description": "Find a word",
                        "parameters": {"type": "object"},
                    },
                }
            ],
        )
        assert (await provider.prepare(request)).ids == expected
        no_tools = ChatRequest(
            model="m", messages=request.messages, tools=(tool,), tool_choice="none"
        )
        assert (await provider.prepare(no_tools)).num_tokens < len(expected)

    @pytest.mark.parametrize("thinking", [False, True])
    async def test_a_prepared_prompt_is_retargeted_not_tokenized_again(
        self, provider: LocalProvider, checkpoint: Path, thinking: bool
    ) -> None:
        history = (
            Message(role="system", content="Be brief."),
            Message(role="user", content="first"),
            Message(role="assistant", content="ok"),
            Message(role="user", content="second"),
        )
        request = ChatRequest(model="m", messages=history, sampling=Sampling(max_tokens=3))
        prepared = await provider.prepare(request)  # prepared with thinking off
        tokenizer = Tokenizer.from_dir(checkpoint)
        wanted = [m.openai_dict() for m in history]
        events = await collect(
            provider, dataclasses.replace(request, thinking=thinking, prepared=prepared)
        )
        assert usage_of(events).prompt_tokens == prepared.num_tokens
        assert provider._with_thinking(prepared, thinking).ids == tokenizer.encode_chat(
            wanted, thinking=thinking
        )
        assert any(isinstance(e, ReasoningDelta) for e in events) == thinking

    async def test_reasoning_budget_ends_thinking_and_the_answer_follows(
        self, provider: LocalProvider
    ) -> None:
        request = chat("Hello there", thinking=True, max_tokens=12, max_reasoning_tokens=3)
        events = await collect(provider, request)
        usage = usage_of(events)
        assert usage.reasoning_tokens == 3 and usage.completion_tokens == 12
        assert text_of(events)

    async def test_repeated_prompt_reports_cached_tokens(self, provider: LocalProvider) -> None:
        request = chat("The same long question, " * 12, max_tokens=2)
        first = usage_of(await collect(provider, request))
        second = usage_of(await collect(provider, request))
        assert first.cached_prompt_tokens == 0
        assert second.cached_prompt_tokens >= BLOCK_SIZE
        assert second.cached_prompt_tokens % BLOCK_SIZE == 0
        assert second.cached_prompt_tokens < second.prompt_tokens == first.prompt_tokens

    async def test_stop_string_cuts_content_and_finishes_engine_request(
        self, provider: LocalProvider
    ) -> None:
        free = await wait_idle(provider)
        full = text_of(await collect(provider, chat("Tell me a story", max_tokens=24)))
        assert len(full) > 6
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        events = await collect(provider, chat("Tell me a story", max_tokens=24, stop=(stop,)))
        assert text_of(events) == full[: full.index(stop)]
        assert events[-1] == Finish("stop", stop)
        assert usage_of(events).completion_tokens < 24
        assert await wait_idle(provider) == free

    async def test_max_tokens_finishes_with_length(self, provider: LocalProvider) -> None:
        events = await collect(provider, chat("Count", max_tokens=3))
        assert usage_of(events).completion_tokens == 3
        assert events[-1] == Finish("length")

    async def test_cancelled_consumer_frees_blocks(self, provider: LocalProvider) -> None:
        free = await wait_idle(provider)
        stream = provider.chat(chat("Go on and on", max_tokens=1000))
        first = await anext(stream)
        assert isinstance(first, TextDelta)
        await until_running(provider)
        assert provider.engine_stats().num_free_blocks < free
        await stream.aclose()
        assert await wait_idle(provider) == free

    async def test_cancelled_task_frees_blocks(self, provider: LocalProvider) -> None:
        free = await wait_idle(provider)
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in provider.chat(chat("Go on and on", max_tokens=1000)):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        await until_running(provider)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_idle(provider) == free

    async def test_completion_prompt_is_raw_text(
        self, provider: LocalProvider, checkpoint: Path
    ) -> None:
        request = ChatRequest(
            model="m", messages=(), prompt="<think>Once upon", sampling=Sampling(max_tokens=4)
        )
        events = await collect(provider, request)
        assert all(isinstance(e, TextDelta | Usage | Finish) for e in events)
        tokenizer = Tokenizer.from_dir(checkpoint)
        expected = tokenizer.encode("<think>Once upon", add_bos=True)
        prepared = await provider.prepare(request)
        assert usage_of(events).prompt_tokens == len(expected) == prepared.num_tokens
        assert usage_of(events).reasoning_tokens == 0

    async def test_logprobs_ride_with_content(self, provider: LocalProvider) -> None:
        events = await collect(provider, chat("Hi", max_tokens=5, logprobs=True, top_logprobs=2))
        entries = [entry for e in events if isinstance(e, TextDelta) for entry in e.logprobs or []]
        assert len(entries) == 5
        assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
        assert all(entry["logprob"] <= 0 for entry in entries)

    async def test_prompt_too_long_is_invalid_request(self, provider: LocalProvider) -> None:
        with pytest.raises(InvalidRequest) as info:
            await collect(provider, chat("word " * 3000))
        assert info.value.param == "messages"

    async def test_bad_sampling_is_invalid_request(self, provider: LocalProvider) -> None:
        with pytest.raises(InvalidRequest):
            await collect(provider, chat("Hi", top_p=1.5))

    async def test_models_and_health(self, provider: LocalProvider) -> None:
        (card,) = await provider.models()
        assert card.id == "deepseek-v3.1" and card.owned_by == "local"
        assert await provider.health()

    async def test_tool_markup_without_tools_is_content(self, provider: LocalProvider) -> None:
        events = await collect(provider, chat("Hi", max_tokens=4))
        assert not any(isinstance(e, ToolCallDelta) for e in events)


def test_resolve_checkpoint_prefers_model_path(checkpoint: Path, tmp_path: Path) -> None:
    assert resolve_checkpoint(checkpoint, tmp_path, "tiny") == checkpoint
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(tmp_path / "missing", tmp_path, "tiny")


def test_demo_checkpoint_is_built_once_then_reused(tmp_path: Path) -> None:
    built = resolve_checkpoint(None, tmp_path, "tiny")
    assert built == tmp_path / "tiny"
    assert (built / "config.json").is_file() and (built / "tokenizer.json").is_file()
    stamp = (built / "config.json").stat().st_mtime_ns
    assert resolve_checkpoint(None, tmp_path, "tiny") == built
    assert (built / "config.json").stat().st_mtime_ns == stamp
    # no staging directory left; the build's lock file stays for the next start
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny.lock", "tiny"]


def test_trained_demo_is_kept_apart_and_reused(checkpoint: Path, tmp_path: Path) -> None:
    # A trained demo already built (here a copy of the tiny checkpoint) is served as it is.
    target = demo_checkpoint_dir(tmp_path, "tiny", trained=True)
    assert target == tmp_path / "tiny-trained"
    shutil.copytree(checkpoint, target)
    assert resolve_checkpoint(None, tmp_path, "tiny", trained=True) == target
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-trained"]


def test_stop_matcher_holds_back_a_possible_stop_prefix() -> None:
    matcher = StopMatcher(["END", "xyz"])
    assert matcher.feed("abc E") == "abc "
    assert matcher.feed("N") == ""
    assert matcher.feed("Dtail") == ""
    assert matcher.hit
    assert matcher.feed("more") == "" and matcher.flush() == ""


def test_stop_matcher_releases_a_false_start() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("aE") == "a"
    assert matcher.feed("Nx") == "ENx"
    assert matcher.feed("E") == ""
    assert matcher.flush() == "E"
    assert not matcher.hit


def test_stop_matcher_picks_the_earliest_stop() -> None:
    matcher = StopMatcher(["cd", "b"])
    assert matcher.feed("abcd") == "a"


async def test_loading_reports_its_progress(checkpoint: Path) -> None:
    """What readiness and the log say while the weights load: the share of tensors loaded,
    then the engine starting; a log event at each tenth."""
    config = EngineConfig(
        max_num_seqs=2, block_size=BLOCK_SIZE, cache_memory_bytes=1 << 20, num_threads=1
    )
    progress = LoadProgress()
    seen: list[str] = []
    real_set = progress.set

    def noting(phase: str, fraction: float | None = None) -> None:
        real_set(phase, fraction)
        seen.append(progress.describe())

    progress.set = noting  # type: ignore[method-assign]
    with capture_logs() as logs:
        async with load_local_provider("local", config, model_path=checkpoint, progress=progress):
            pass
    loading = [s for s in seen if s.startswith("loading checkpoint ")]
    assert loading[-1] == "loading checkpoint 100%" and seen[-1] == "starting engine"
    percents = [e["percent"] for e in logs if e["event"] == "engine_load_progress"]
    assert percents == sorted(percents) and percents[-1] == 100 and len(percents) <= 11
