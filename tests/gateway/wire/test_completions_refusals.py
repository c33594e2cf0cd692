"""What the completions API does not serve is refused by name, through the official openai SDK:
several candidates per answer (`best_of`, like `n`) and prompts given as token ids."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from testkit.gateway_app import Gateway


async def refusal(gateway: Gateway, **body: Any) -> dict[str, Any]:
    seen = len(gateway.mock.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.async_client().completions.create(model="echo-model", **body)
    assert caught.value.status_code == 400
    assert len(gateway.mock.requests) == seen  # nothing reached the upstream
    error = caught.value.body
    assert isinstance(error, dict)
    return error


@pytest.mark.parametrize("field", ["n", "best_of"])
async def test_more_than_one_candidate_is_a_400_naming_the_field(
    gateway: Gateway, field: str
) -> None:
    error = await refusal(gateway, prompt="def add(a, b):", **{field: 2})
    assert error["param"] == field
    assert error["message"] == f"Only {field}=1 is supported."
    assert error["code"] == "unsupported_value"


async def test_best_of_one_is_served(gateway: Gateway) -> None:
    answer = await gateway.async_client().completions.create(
        model="echo-model", prompt="alpha beta", best_of=1
    )
    assert answer.choices[0].text


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3, 4]], ["text", [5, 6]]])
async def test_token_id_prompts_are_refused_as_such(gateway: Gateway, prompt: Any) -> None:
    error = await refusal(gateway, prompt=prompt)
    assert error["param"] == "prompt"
    assert "token-id prompts are not supported" in error["message"].lower()
