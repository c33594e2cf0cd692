"""Rules match the ask with word boundaries and context, and the judge decides what they leave
to the learned model: misleading words do not decide."""

from __future__ import annotations

import pytest

from gateway.config.routing import RoutingSettings
from gateway.routing.judge import Judge, Verdict
from providers.types import ChatRequest, Message

LOG = "\n".join(
    f"2025-11-22 03:14:0{i}.221 ERROR [worker-{i}] Scheduler - possible deadlock, prove lock "
    f"ordering; lock wait exceeded 5000ms for key=job-{i}"
    for i in range(8)
)


@pytest.fixture(scope="module")
def judge() -> Judge:
    return Judge(RoutingSettings())


def decide(judge: Judge, *texts: str) -> Verdict:
    """The verdict on the last of `texts`, user turns with answers between them."""
    messages: list[Message] = []
    for text in texts:
        if messages:
            messages.append(Message("assistant", "Sure."))
        messages.append(Message("user", text))
    return judge.judge(ChatRequest(model="m", messages=tuple(messages)), "chat", 100)


@pytest.mark.parametrize(
    "text",
    [
        "Prove that there are infinitely many primes.",
        "Thanks! Can you prove that sqrt(2) is irrational?",
        "Show that every tree with n vertices has n - 1 edges.",
        "问一下：证明：任意三个连续整数的乘积能被6整除。",
        "请证明素数有无穷多个。",
    ],
)
def test_a_request_to_prove_is_decided_by_the_proof_rule(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(True, "rule:proof-request@1")


@pytest.mark.parametrize(
    "text",
    [
        "The logs show that the pod restarted twice. What image tag is it on?",
        "Who proved Fermat's Last Theorem, and in what year?",
        "This recipe has proven popular; rewrite the intro to be friendlier.",
        "黎曼猜想是谁证明的？",
        "哈哈，我朋友说他能证明 1=2，你信不信？",
        "My friend says he can prove 1 = 2. Funny, right?",
    ],
)
def test_proof_words_in_an_ordinary_sentence_are_left_to_the_model(judge: Judge, text: str) -> None:
    assert decide(judge, text).reason == "model"


@pytest.mark.parametrize(
    "text",
    [
        "Who proved Fermat's Last Theorem, and in what year?",
        "黎曼猜想是谁证明的？",
        "Our dashboards show that traffic doubled. Rewrite this sentence in French.",
    ],
)
def test_questions_about_proofs_and_ordinary_show_that_go_fast(judge: Judge, text: str) -> None:
    verdict = decide(judge, text)
    assert (verdict.thinking, verdict.reason) == (False, "model")


def test_a_leading_thanks_leaves_a_hard_question_to_the_model(judge: Judge) -> None:
    assert decide(judge, "Thanks!") == Verdict(False, "rule:greeting-only@1")
    assert decide(judge, "谢谢你！") == Verdict(False, "rule:greeting-only@1")
    verdict = decide(
        judge,
        "Thanks! Three points are chosen uniformly at random on a circle. What's the "
        "probability that the triangle they form contains the centre?",
    )
    assert (verdict.thinking, verdict.reason) == (True, "model")


def test_chinese_function_and_how_much_words_do_not_mislead(judge: Judge) -> None:
    rename = decide(judge, "把这个函数名 fetch_user_data 改成驼峰命名，别的都不要动。")
    assert (rename.thinking, rename.reason) == (False, "model")
    puzzle = decide(
        judge,
        "甲乙丙三人中只有一个人说了真话。甲说：“乙在说谎。”乙说：“丙在说谎。”丙说：“甲和乙都在"
        "说谎。”谁说了真话？这道题用英语怎么说，答案是多少？",
    )
    assert (puzzle.thinking, puzzle.reason) == (True, "model")


def test_operator_rules_match_the_ask_not_the_pasted_material() -> None:
    rules = [{"name": "deadlocks", "thinking": "on", "pattern": r"\bdeadlock"}]
    judge = Judge(RoutingSettings(rules=rules))
    verdict = decide(judge, f"Translate the last log line into French.\n\n{LOG}")
    assert (verdict.thinking, verdict.reason) == (False, "model")
    asked = decide(judge, f"Why does this deadlock?\n\n{LOG}")
    assert asked == Verdict(True, "rule:deadlocks@1")


def test_a_rule_may_be_limited_to_turns_of_a_kind() -> None:
    rules = [{"name": "carry-on", "thinking": "off", "turns": ["continue"]}]
    judge = Judge(RoutingSettings(rules=rules))
    hard = "How many ordered pairs (a, b) of positive integers have a + b = 1000 and no zero digit?"
    assert decide(judge, hard, "continue").reason == "rule:carry-on@1"
    assert decide(judge, hard).reason == "model"


def test_a_rule_requiring_words_searches_its_pattern_only_where_one_occurs() -> None:
    rules = [{"name": "sums", "thinking": "on", "pattern": r"\d\s*\+\s*\d", "requires": ["SUM"]}]
    judge = Judge(RoutingSettings(rules=rules))
    assert decide(judge, "What is the sum 2 + 2?") == Verdict(True, "rule:sums@1")
    assert decide(judge, "What is 2 + 2?").reason == "model"
