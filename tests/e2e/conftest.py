"""Tiny checkpoints for end-to-end tests, and a live gateway serving them from the local engine.

`tiny_checkpoint`: the random-weight "tiny" demo preset (fp32), built once per session.
`scripted_checkpoint`: the same model rewired so greedy decoding after `</think>` (the end of
every non-thinking prompt) follows a fixed token chain that spells a V3.1 tool call: every
attention output and FFN down projection is zeroed, so the final hidden state is the normed
embedding of the current token; chain token i gets its own one-hot embedding direction, and the
lm_head row of token i + 1 points along that direction, so token i predicts token i + 1.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from aiohttp import web
from redis.asyncio import Redis
from safetensors.torch import load_file, save_file

from backend.demo_checkpoint import write_demo_checkpoint
from backend.text.tokenizer import Tokenizer
from gateway.appkeys import ROUTER
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.settings import Settings
from providers.local import LocalProvider
from tests.gateway.conftest import REDIS_URL, start_gateway

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city":"Paris"}'
TOOL_CALL_TEXT = (
    f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{TOOL_NAME}<｜tool▁sep｜>{TOOL_ARGUMENTS}"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
# lm_head weight of a chain token along its predecessor's direction. The normed one-hot input is
# sqrt(hidden) = 8 there, so the next chain token's logit is 32, far above the random rows' (std
# about 1): greedy and the default temperature 0.6 both follow the chain.
_CHAIN_LOGIT_SCALE = 4.0


def build_tiny_checkpoint(out_dir: Path) -> Path:
    return write_demo_checkpoint(out_dir, "tiny", seed=0, dtype=torch.float32)


def scripted_chain(tokenizer: Tokenizer) -> list[int]:
    """`</think>`, the tool call's tokens, then EOS: each token predicts the next."""
    chain = [tokenizer.special.think_end, *tokenizer.encode(TOOL_CALL_TEXT), tokenizer.special.eos]
    assert len(set(chain)) == len(chain), "a chain token may appear only once"
    return chain


def build_scripted_checkpoint(tiny_dir: Path, out_dir: Path) -> Path:
    """A copy of the tiny checkpoint whose greedy output after `</think>` is TOOL_CALL_TEXT."""
    config = json.loads((tiny_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    chain = scripted_chain(Tokenizer.from_dir(tiny_dir))
    assert len(chain) <= hidden, "each chain token needs its own embedding direction"
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in tiny_dir.iterdir():
        if path.suffix != ".safetensors":
            (out_dir / path.name).write_bytes(path.read_bytes())
            continue
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.zero_()
            elif name == "model.norm.weight":
                tensor.fill_(1.0)
            elif name == "model.embed_tokens.weight":
                for i, token in enumerate(chain):
                    tensor[token] = torch.nn.functional.one_hot(torch.tensor(i), hidden).float()
            elif name == "lm_head.weight":
                for i, token in enumerate(chain[1:]):
                    tensor[token].zero_()
                    tensor[token, i] = _CHAIN_LOGIT_SCALE
        save_file(tensors, out_dir / path.name, metadata={"format": "pt"})
    return out_dir


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("e2e-tiny"))


@pytest.fixture(scope="session")
def scripted_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    return build_scripted_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("e2e-scripted"))


def local_settings(prefix: str, model_path: Path, **engine: Any) -> Settings:
    """One local provider on `model_path` behind deepseek-chat (thinking off),
    deepseek-reasoner (on) and deepseek-v3.1 (the client's choice)."""
    route = {"provider": "local", "model": "deepseek-v3.1"}
    return Settings(
        server={"host": "127.0.0.1", "port": 0, "keepalive_s": 5},
        redis={"url": REDIS_URL, "embedded": False, "key_prefix": prefix},
        logging={"format": "json", "level": "warning"},
        use_presets=False,
        engine={
            "model_path": model_path,
            "dtype": "float32",
            "block_size": 16,
            "cache_memory_mb": 2,
            "max_num_seqs": 32,
            "max_batch_tokens": 1024,
            "num_threads": 1,
            **engine,
        },
        providers={"local": {"kind": "local"}},
        models={
            "deepseek-v3.1": {"routes": [route]},
            "deepseek-chat": {"routes": [{**route, "thinking": False}]},
            "deepseek-reasoner": {"routes": [{**route, "thinking": True}]},
        },
    )


@dataclass
class LocalGateway:
    root: str
    key: str
    app: web.Application

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def provider(self) -> LocalProvider:
        provider = self.app[ROUTER].providers["local"]
        assert isinstance(provider, LocalProvider)
        return provider


@asynccontextmanager
async def open_local_gateway(model_path: Path, **engine: Any) -> AsyncIterator[LocalGateway]:
    """A started gateway with one user key, on a unique Redis prefix removed afterwards."""
    prefix = f"test:{uuid.uuid4().hex}:"
    runner, root = await start_gateway(local_settings(prefix, model_path, **engine))
    redis = Redis.from_url(REDIS_URL)
    try:
        secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(name="e2e"))
        yield LocalGateway(root, secret, runner.app)
    finally:
        await runner.cleanup()
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local_gateway(tiny_checkpoint: Path) -> AsyncIterator[LocalGateway]:
    """Shared by a module's tests (their loop scope must be "module" too)."""
    async with open_local_gateway(tiny_checkpoint) as gateway:
        yield gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scripted_gateway(scripted_checkpoint: Path) -> AsyncIterator[LocalGateway]:
    async with open_local_gateway(scripted_checkpoint) as gateway:
        yield gateway
