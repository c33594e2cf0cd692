"""Upstream affinity: a conversation keeps to one account over its turns; conversations spread
over the accounts; the chosen key is the one sent upstream."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from providers.types import ChatRequest, Message, Placed
from providers.upstream.affinity import conversation_key, pick, rank
from providers.upstream.openai import OpenAIUpstream, UpstreamConfig
from testkit.mock_upstream import MockUpstream

ACCOUNTS = ("KEY_A", "KEY_B", "KEY_C")


def turn(conversation: int, n: int) -> ChatRequest:
    messages = [Message("system", "be brief"), Message("user", f"conversation {conversation}")]
    for i in range(n):
        messages += [Message("assistant", f"answer {i}"), Message("user", f"question {i}")]
    return ChatRequest(model="echo", messages=tuple(messages), stream=True)


def test_a_conversation_keeps_its_account_over_its_turns() -> None:
    for c in range(20):
        first = pick(ACCOUNTS, conversation_key(turn(c, 0)))
        assert all(pick(ACCOUNTS, conversation_key(turn(c, n))) == first for n in range(1, 6))


def test_conversations_spread_and_few_move_when_an_account_is_added() -> None:
    keys = [conversation_key(turn(c, 0)) for c in range(300)]
    spread = Counter(pick(ACCOUNTS, k) for k in keys)
    assert set(spread) == {0, 1, 2} and min(spread.values()) > 60
    more = (*ACCOUNTS, "KEY_D")
    moved = [k for k in keys if pick(more, k) != pick(ACCOUNTS, k)]
    assert all(pick(more, k) == 3 for k in moved)  # only to the new account
    assert 40 < len(moved) < 120
    with pytest.raises(ValueError):
        pick((), keys[0])


@pytest.fixture
async def upstream(mock_upstream: MockUpstream) -> AsyncIterator[OpenAIUpstream]:
    accounts = tuple((name, f"sk-{name.lower()}") for name in ACCOUNTS)
    config = UpstreamConfig(
        name="mock", base_url=mock_upstream.base_url, api_key="sk-key_a", accounts=accounts
    )
    provider = OpenAIUpstream(config)
    yield provider
    await provider.close()


async def test_the_conversations_key_is_sent_upstream(
    upstream: OpenAIUpstream, mock_upstream: MockUpstream
) -> None:
    sent: dict[int, set[str]] = {}
    for c in range(6):
        for n in range(3):
            request = turn(c, n)
            events = [event async for event in upstream.chat(request)]
            sent.setdefault(c, set()).add(mock_upstream.requests[-1].headers["Authorization"])
            index = pick(ACCOUNTS, conversation_key(request))
            assert events[0] == Placed(f"account={index + 1}/3")  # before the answer
    assert all(len(keys) == 1 for keys in sent.values())
    assert len(set().union(*sent.values())) > 1


def test_a_conversations_accounts_are_ranked_its_own_first_and_stably() -> None:
    for c in range(20):
        key = conversation_key(turn(c, 0))
        order = rank(ACCOUNTS, key)
        assert sorted(order) == list(range(len(ACCOUNTS))) and order[0] == pick(ACCOUNTS, key)
        assert rank(ACCOUNTS, key) == order
        # Without its own account, the conversation keeps the order of the others.
        rest = [ACCOUNTS[i] for i in order[1:]]
        assert [rest[i] for i in rank(rest, key)] == rest


async def test_the_account_the_gateway_chose_is_the_one_sent(
    upstream: OpenAIUpstream, mock_upstream: MockUpstream
) -> None:
    for chosen in range(len(ACCOUNTS)):
        request = replace(turn(0, 0), account=chosen)
        events = [event async for event in upstream.chat(request)]
        assert events[0] == Placed(f"account={chosen + 1}/3")
        sent = mock_upstream.requests[-1].headers["Authorization"]
        assert sent == f"Bearer sk-{ACCOUNTS[chosen].lower()}"
