"""Rules match the ask with word boundaries and context, and the judge decides what they leave
to the learned model: misleading words do not decide."""

from __future__ import annotations

import re

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
        "√2が無理数であることを証明してください。",
        "2의 제곱근이 무리수임을 증명하시오.",
        "Hallo! Beweise, dass es unendlich viele Primzahlen gibt.",
        "Démontrez que la somme de deux nombres impairs est paire.",
        "¿Puedes demostrar que hay infinitos números primos?",
        "Por favor, demonstre que todo inteiro maior que 1 tem um divisor primo.",
        "Докажите, что сумма углов треугольника равна 180 градусам.",
        "Muestra que la suma de dos números pares es par.",
        "Mostre que a soma de dois números pares é par.",
        "Pruebe que hay infinitos primos.",
        # a joke elsewhere in the ask leaves a real request standing
        "Prove that 0.999... = 1. My friends say it's a trick. Lol.",
    ],
)
def test_a_request_to_prove_is_decided_by_the_proof_rule(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(True, "rule:proof-request@2")


@pytest.mark.parametrize(
    "text",
    [
        "Can you prove you're an AI? haha just kidding. Good morning!",
        "Prove it? No, don't prove it, just state the theorem's name.",
        'My teacher wrote "prove it" in the margin. What does she mean?',
        "老师在作业上写了「证明它」，这是什么意思？",
        "Prove yourself worthy, said the knight. Who wrote that line?",
    ],
)
def test_a_dare_a_joke_a_negation_or_a_quotation_is_not_a_request_to_prove(
    judge: Judge, text: str
) -> None:
    assert decide(judge, text).reason not in ("rule:proof-request@2", "rule:proof-check@1")


@pytest.mark.parametrize(
    "text",
    [
        "Can you prove you're an AI? haha just kidding. Good morning!",
        "哈哈，我朋友说他能证明 1=2，你信不信？",
        "너 진짜 AI 맞는지 증명해 봐 ㅋㅋ 농담이야. 좋은 아침!",
        "Prouve-moi que tu n'es pas un humain ! Non je rigole.",
    ],
)
def test_banter_about_proving_goes_fast_by_the_proof_joke_rule(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(False, "rule:proof-joke@1")


@pytest.mark.parametrize(
    "text",
    [
        "Show me the deploy logs lol",
        "Muéstrame el menú jaja",
        "Tenho 3 provas amanhã kkkk, me dá uma dica de estudo",
    ],
)
def test_laughter_without_a_proof_word_is_left_to_the_model(judge: Judge, text: str) -> None:
    assert decide(judge, text).reason == "model"


def test_laughter_beside_a_request_to_prove_leaves_the_request_standing(judge: Judge) -> None:
    verdict = decide(judge, "Prove that 0.999... = 1. My friends say it's a trick. Lol.")
    assert verdict == Verdict(True, "rule:proof-request@2")
    assert decide(judge, "lol what a day. what's the capital of Peru?").reason == "model"


@pytest.mark.parametrize(
    "text",
    [
        "Format this proof in LaTeX without changing any wording:\n\nProve that sqrt(2) is "
        "irrational. Proof: suppose sqrt(2) = p/q in lowest terms; then p is even, ... QED",
        "Translate this proof into French: suppose n is even, then n = 2k and n^2 = 4k^2.",
        "把这个证明翻译成英文，不要改动内容。",
        "Typeset the proof below as a numbered list of steps.",
    ],
)
def test_laying_out_a_proof_goes_fast_by_the_proof_edit_rule(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(False, "rule:proof-edit@1")


@pytest.mark.parametrize(
    "text",
    [
        "Translate this proof into French and check each step for mistakes.",
        "Rewrite this proof rigorously: by induction every n > 1 has a prime factor.",
    ],
)
def test_laying_out_a_proof_that_must_also_be_checked_is_not_a_layout(
    judge: Judge, text: str
) -> None:
    assert decide(judge, text).reason != "rule:proof-edit@1"


@pytest.mark.parametrize(
    "text",
    [
        "Check my proof:\n\nClaim: every even number greater than 2 is the sum of two primes. "
        "Proof: by induction on n, the base case 4 = 2 + 2 holds, ... QED",
        "Is this proof correct? By induction, all horses are the same colour.",
        "Find the mistake in this argument that 1 = 2.",
        "检查一下我的证明对不对：",
        "Überprüfe bitte meinen Beweis, dass √3 irrational ist.",
    ],
)
def test_checking_a_proof_is_decided_by_the_proof_check_rule(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(True, "rule:proof-check@1")


@pytest.mark.parametrize(
    "text",
    [
        "Check my proof for typos before I hand it in.",
        "Can you check the LaTeX formatting of this proof?",
        "检查一下这个证明里的错别字。",
    ],
)
def test_checking_a_proofs_spelling_is_not_checking_the_proof(judge: Judge, text: str) -> None:
    assert decide(judge, text).reason != "rule:proof-check@1"


@pytest.mark.parametrize(
    "text",
    [
        "The logs show that the pod restarted twice. What image tag is it on?",
        "Who proved Fermat's Last Theorem, and in what year?",
        "This recipe has proven popular; rewrite the intro to be friendlier.",
        "黎曼猜想是谁证明的？",
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


@pytest.mark.parametrize(
    "text", ["Thanks!", "谢谢你！", "Danke schön!", "¡Hola!", "ありがとうございます！", "Спасибо!",
             "안녕하세요", "Merci beaucoup", "Obrigado!"],
)  # fmt: skip
def test_a_greeting_alone_goes_fast_in_any_language(judge: Judge, text: str) -> None:
    assert decide(judge, text) == Verdict(False, "rule:greeting-only@2")


def test_a_leading_thanks_leaves_a_hard_question_to_the_model(judge: Judge) -> None:
    assert decide(judge, "Danke! Wie viele Wege gibt es?").reason != "rule:greeting-only@2"
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


def test_an_operator_rule_reads_its_match_in_its_sentence() -> None:
    rules = [{"name": "deadlocks", "thinking": "on", "pattern": r"\bdeadlock", "unless": "joke"}]
    judge = Judge(RoutingSettings(rules=rules))
    assert decide(judge, "Why does this deadlock?") == Verdict(True, "rule:deadlocks@1")
    # the sentence after the match undoes it; a sentence further on does not
    assert decide(judge, "Why does this deadlock? Joke.").reason == "model"
    assert decide(judge, "Why does this deadlock? Tell me. No joke.").reason == "rule:deadlocks@1"
    # a quoted match counts only where the rule says so
    assert decide(judge, 'Who coined "deadlock"?').reason == "model"
    quoted = [{**rules[0], "quoted": True}]
    assert Judge(RoutingSettings(rules=quoted)).judge(
        ChatRequest(model="m", messages=(Message("user", 'Who coined "deadlock"?'),)), "chat", 9
    ) == Verdict(True, "rule:deadlocks@1")


def test_a_rule_requiring_words_searches_its_pattern_only_where_one_occurs() -> None:
    rules = [{"name": "sums", "thinking": "on", "pattern": r"\d\s*\+\s*\d", "requires": ["SUM"]}]
    judge = Judge(RoutingSettings(rules=rules))
    assert decide(judge, "What is the sum 2 + 2?") == Verdict(True, "rule:sums@1")
    assert decide(judge, "What is 2 + 2?").reason == "model"


def test_a_pattern_searched_behind_a_look_ahead_matches_where_it_would_alone() -> None:
    from gateway.routing.rules import _caseless, _first_chars

    assert _first_chars(r"\b(?:check|verify)\b") == {"c", "v"}
    assert _first_chars(r"(?<!no )\bprove|证明+") == {"p", "证"}
    for unknown in (r"^hi", r"a?b", r"(?:x|\w)", r"[^a]b", r"(?m)$", ""):
        assert _first_chars(unknown) is None, unknown
    texts = [
        "please check my proof. recheck it? no: verify the derivation, then prove it.",
        "format this proof in latex; 检查一下我的证明对不对。証明をチェックして",
        "show that the proof is wrong lol, je rigole, шучу 😂",
        "",
    ]
    for rule in RoutingSettings().rules:
        for pattern in (rule.pattern, rule.unless):
            if pattern is None:
                continue
            fast, plain = _caseless(pattern), re.compile(pattern)
            for text in texts:
                spans = [m.span() for m in plain.finditer(text)]
                assert [m.span() for m in fast.finditer(text)] == spans, (rule.name, text)
