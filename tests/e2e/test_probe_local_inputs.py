"""Values the public API allows, met by the local engine (which has narrower conventions of its
own): each is served or refused as the API documents, never refused in the engine's terms."""

from __future__ import annotations

import openai
import pytest

from tests.support.local_gateway import LocalGateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

USER = [{"role": "user", "content": "Say something about the sea."}]


def client(gateway: LocalGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0)


async def test_vllm_style_top_k_off_and_negative_seeds_are_served(
    local_gateway: LocalGateway,
) -> None:
    """README: top_k -1 to 2^31-1 (-1: off, vLLM's convention), seed a signed 64-bit integer."""
    c = client(local_gateway)
    for seed in (-5, -(2**63)):
        answers = [
            await c.chat.completions.create(
                model="deepseek-chat",
                messages=USER,  # type: ignore[arg-type]
                max_tokens=4,
                seed=seed,
                extra_body={"top_k": -1},
            )
            for _ in range(2)
        ]
        first, again = (a.choices[0].message.content for a in answers)
        assert first and first == again  # a seed still fixes the sample


async def test_a_text_part_without_string_text_is_a_400_saying_so(
    local_gateway: LocalGateway,
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client(local_gateway).chat.completions.create(
            model="deepseek-chat",
            messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}],  # type: ignore[list-item]
            max_tokens=4,
        )
    assert "string 'text'" in bad.value.message
