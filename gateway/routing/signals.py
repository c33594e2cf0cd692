"""Cheap signals of how hard a request is, read from its text in one pass of a few regexes.

Every signal is a number in [0, 1] (names in `SIGNALS`, the order of `Signals.values`):
  maths, proof, algorithm, debugging, design   markers of those kinds of question (EN and ZH)
  code_block    a fenced code block;  stack_trace  a traceback, panic or "at x.y(File:line)"
  reasoning_ask the user asks for steps, a derivation, an analysis or a reason ("why", 为什么)
  constraints   bounds and conditions ("n <= 10^5", "such that", 满足), as a matched count / 3
  length        log-scaled length of the last user turn (a CJK character counts as 3)
  depth         earlier user turns of the conversation, / 5
  easy          greetings, thanks, translation, rewriting, formatting, lookups
  cjk           share of the text in CJK (multi-byte) characters
Only the first `scan_chars` characters of the last user turn are read, so the cost is bounded
whatever the prompt's size.
"""

from __future__ import annotations

import math
import re

from gateway.routing.phrases import PhraseIndex
from plumbing.record import record
from providers.types import ChatRequest

SIGNALS = (
    "maths",
    "proof",
    "algorithm",
    "debugging",
    "design",
    "code_block",
    "stack_trace",
    "reasoning_ask",
    "constraints",
    "length",
    "depth",
    "easy",
    "cjk",
)


_WORD = re.compile(r"[a-z][a-z'-]*")


class Markers:
    """One kind of marker: whole English words (matched against the text's word set), and
    phrases, stems and CJK terms (matched as substrings of the lower-cased text, every kind's
    in one search: phrases.py). Set tests and that search run in C, which keeps a decision in
    microseconds whatever the number of phrases."""

    __slots__ = ("phrases", "words")

    def __init__(self, words: str, phrases: tuple[str, ...]) -> None:
        self.words = frozenset(words.split())
        self.phrases = phrases


_MATHS = Markers(
    "integral derivative equation equations polynomial prime primes integer integers modulo mod "
    "matrix eigenvalue eigenvalues triangle circle circles radius sequence remainder digits digit "
    "factorial perfect square reals",
    ("probabilit", "expected value", "inequalit", "divisib", "sum of", "real numbers",
     "real roots", "how many ways", "how many positive", "ordered pairs", "\\frac", "\\sqrt",
     "f(x)", "x^", "^2", "^3", "^n", "∫", "∑", "√", "≤", "≥", "≡", "π",
     "方程", "整数", "素数", "质数", "概率", "期望", "矩阵", "三角形", "半径", "数列", "不等式",
     "余数", "整除", "实数", "函数", "求和", "多项式", "积分", "最大值", "最小值"),
)  # fmt: skip
_PROOF = Markers(
    "prove proof lemma theorem induction contradiction",
    ("show that", "证明", "求证", "归纳", "反证"),
)
_ALGORITHM = Markers(
    "algorithm algorithms complexity dp greedy graph heap lru efficient efficiently deadlock "
    "concurrency concurrent",
    ("o(n", "o(log", "dynamic programming", "shortest path", "binary search", "data structure",
     "segment tree", "time limit", "race condition", "lock-free", "optimise the", "optimize the",
     "算法", "复杂度", "动态规划", "贪心", "最短路", "二分", "数据结构", "并发", "死锁", "竞态",
     "线程安全"),
)  # fmt: skip
_DEBUGGING = Markers(
    "bug debug debugging crash crashes fails failing flaky intermittent hangs timeout "
    "regression deadlocks leak leaks",
    ("doesn't work", "does not work", "not working", "wrong result", "wrong output",
     "memory leak", "root cause", "slower", "restarts", "exit code",
     "报错", "崩溃", "调试", "排查", "内存泄漏", "偶现", "卡死", "超时", "不生效", "结果不对",
     "定位", "重复消费"),
)  # fmt: skip
_DESIGN = Markers(
    "architecture tradeoffs trade-offs consistency sharding sharded scalable migrate migration",
    ("design a ", "design an ", "design the ", "trade-off", "scale to", "how would you build",
     "how would you design", "fault toleran", "exactly once", "zero downtime",
     "设计一个", "设计", "架构", "权衡", "扩展", "迁移", "一致性", "容错", "分片", "拆分"),
)  # fmt: skip
_STACK_TRACE = Markers(
    "",
    ("traceback (most recent call last)", "exception in thread", "panicked at",
     "segmentation fault", '", line ', "\n    at ", "\n\tat ", "error[e"),
)  # fmt: skip
_REASONING_ASK = Markers(
    "why derive analyse analyze determine justify",
    ("step by step", "explain how", "explain why", "reason about", "what is wrong", "find all",
     "find the minimum", "find the maximum", "find the smallest", "find the largest",
     "find the number", "walk through", "which is larger", "how do i reason",
     "为什么", "推导", "分析", "一步一步", "逐步", "找出所有", "求出", "判断", "推理", "说明理由",
     "哪个大", "原因"),
)  # fmt: skip
_EASY = Markers(
    "translate translation rewrite rephrase reword paraphrase proofread summarize summarise "
    "tl;dr synonym synonyms",
    ("fix the grammar", "fix the typos", "fix the spelling", "format this", "format the",
     "format as", "convert this", "convert the", "what is the capital", "who wrote",
     "who is the", "who painted", "when was", "what does", "what year", "one sentence",
     "翻译", "改写", "润色", "重写", "总结", "摘要", "格式", "首都", "是谁", "什么意思",
     "同义词", "怎么说", "是什么", "多少"),
)  # fmt: skip
_GREETINGS = ("hi", "hello", "hey", "thanks", "thank you", "good morning", "good night",
              "cheers", "你好", "您好", "谢谢", "早上好", "晚安", "嗨", "辛苦")  # fmt: skip
# every branch starts with a literal, so the search skips the positions where none can start
_CONSTRAINTS = re.compile(
    r"<=?\s*\d|>=?\s*\d|≤=?\s*\d|≥=?\s*\d|10\^\d|such that|subject to|at most|at least"
    r"|满足|至多|至少|不超过"
)
_KINDS = (_MATHS, _PROOF, _ALGORITHM, _DEBUGGING, _DESIGN)
_MARKERS = (*_KINDS, _STACK_TRACE, _REASONING_ASK, _EASY)  # in the order of their signals
_PHRASES = PhraseIndex(m.phrases for m in _MARKERS)


@record
class Signals:
    values: tuple[float, ...]  # in the order of SIGNALS

    def as_dict(self) -> dict[str, float]:
        return dict(zip(SIGNALS, self.values, strict=True))


def last_user_text(request: ChatRequest) -> str:
    """The text the difficulty is read from: the last user turn (the prompt of a completion)."""
    if request.prompt is not None:
        return request.prompt
    for message in reversed(request.messages):
        if message.role == "user":
            return message.text
    return ""


def user_turns(request: ChatRequest) -> int:
    return sum(1 for m in request.messages if m.role == "user")


def scanned_text(request: ChatRequest, scan_chars: int) -> str:
    """What rules and signals read: the first `scan_chars` characters of the last user turn."""
    return last_user_text(request)[:scan_chars]


def signals_of(text: str, turns: int = 1) -> Signals:
    """The signals of one user turn's text, `turns` user turns into its conversation."""
    lower = text.lower()
    words = set(_WORD.findall(lower))
    phrased = _PHRASES.kinds_in(lower, bool(words))  # a word: a letter a-z
    maths, proof, algorithm, debugging, design, trace, ask, easy = (
        1.0 if i in phrased or not m.words.isdisjoint(words) else 0.0
        for i, m in enumerate(_MARKERS)
    )
    code = 1.0 if "```" in text else 0.0
    constraints = min(len(_CONSTRAINTS.findall(lower)), 3) / 3
    num_bytes = len(text) if text.isascii() else len(text.encode("utf-8"))
    multibyte = (num_bytes - len(text)) / 2  # about one per CJK character (3 bytes each)
    cjk = multibyte / len(text) if text else 0.0
    effective = len(text) + 2 * multibyte  # a CJK character weighs like 3 Latin ones
    length = min(math.log2(1 + effective / 40) / 6, 1.0)
    depth = min(max(turns - 1, 0), 5) / 5
    if lower.lstrip().startswith(_GREETINGS):
        easy = 1.0
    kinds = (maths, proof, algorithm, debugging, design)
    return Signals((*kinds, code, trace, ask, constraints, length, depth, easy, min(cjk, 1.0)))
