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
from dataclasses import dataclass

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

_I = re.IGNORECASE
_MATHS = re.compile(
    r"integral|derivative|equation|polynomial|prime|integers?\b|modulo|\bmod\b|probabilit|"
    r"expected value|matrix|eigen|triangle|circle|radius|sequence|inequalit|remainder|divisib|"
    r"\bsum of\b|digits|real numbers|real roots|how many (?:ways|positive|ordered|integers)|"
    r"\\frac|\\sqrt|\^\s*\d|\bx\^|\bf\(x\)|[∫∑√≤≥≡π]|"
    r"方程|整数|素数|质数|概率|期望|矩阵|三角形|半径|数列|不等式|余数|整除|实数|函数|求和|多项式",
    _I,
)
_PROOF = re.compile(
    r"\bprove\b|\bproof\b|show that|lemma|theorem|induction|contradiction|证明|求证|归纳|反证", _I
)
_ALGORITHM = re.compile(
    r"algorithm|complexity|\bo\(n|dynamic programming|\bdp\b|greedy|shortest path|graph|"
    r"binary search|data structure|optimi[sz]e (?:the|this|a)|lru|heap|segment tree|"
    r"time limit|efficient(?:ly)?|concurren|race condition|deadlock|"
    r"算法|复杂度|动态规划|贪心|最短路|二分|数据结构|并发|死锁|竞态",
    _I,
)
_DEBUGGING = re.compile(
    r"\bbug\b|debug|doesn'?t work|not working|fails?\b|failing|crash|"
    r"wrong (?:result|output|answer)|"
    r"memory leak|flaky|intermittent|hangs?\b|timeout|regression|root cause|"
    r"报错|崩溃|调试|排查|内存泄漏|偶现|卡死|超时|不生效|结果不对",
    _I,
)
_DESIGN = re.compile(
    r"design (?:a|an|the)|architecture|trade-?offs?|scal(?:e|able|ing) to|migrat|"
    r"how would you (?:build|design|structure)|consistency|fault.toleran|sharding|"
    r"设计一个|架构|权衡|扩展到|迁移|一致性|容错|分片",
    _I,
)
_CODE_BLOCK = re.compile(r"```")
_STACK_TRACE = re.compile(
    r"traceback \(most recent call last\)|exception in thread|panicked at|segmentation fault|"
    r"\bat [\w$.<>]+\([\w.]+:\d+\)|File \"[^\"]+\", line \d+|error\[E\d+\]|^\s+at .+:\d+:\d+",
    _I | re.MULTILINE,
)
_REASONING_ASK = re.compile(
    r"step by step|\bwhy\b|derive|explain (?:how|why)|analy[sz]e|reason about|compare .+ and|"
    r"what is wrong|find (?:all|the (?:minimum|maximum|smallest|largest|number))|determine|"
    r"为什么|推导|分析|一步一步|逐步|找出所有|求出|最小值|最大值|判断",
    _I,
)
_CONSTRAINTS = re.compile(
    r"[<>≤≥]=?\s*\d|10\^\d|such that|subject to|at most|at least|where \w+ (?:is|are)|"
    r"满足|至多|至少|不超过|其中",
    _I,
)
_EASY = re.compile(
    r"^\s*(?:hi|hello|hey|thanks|thank you|good (?:morning|night))\b|translate|translation|"
    r"rewrite|rephrase|reword|paraphrase|proofread|fix (?:the )?(?:grammar|typos?|spelling)|"
    r"format (?:this|the|as)|convert (?:this|the) .{0,30}(?:to|into) (?:json|yaml|csv|a table)|"
    r"summari[sz]e|tl;?dr|what is the capital|who (?:wrote|is|was)|when (?:was|did)|"
    r"what does .{1,30} (?:mean|stand for)|synonym|spell|"
    r"^\s*(?:你好|您好|谢谢|早上好)|翻译|改写|润色|重写|总结|摘要|格式化|首都|是谁|什么意思|同义词",
    _I,
)
_MARKERS = (_MATHS, _PROOF, _ALGORITHM, _DEBUGGING, _DESIGN, _CODE_BLOCK, _STACK_TRACE)


@dataclass(frozen=True, slots=True)
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


def extract(request: ChatRequest, scan_chars: int) -> Signals:
    text = last_user_text(request)[:scan_chars]
    return signals_of(text, user_turns(request))


def signals_of(text: str, turns: int = 1) -> Signals:
    """The signals of one user turn's text, `turns` user turns into its conversation."""
    markers = [1.0 if p.search(text) else 0.0 for p in _MARKERS]
    ask = 1.0 if _REASONING_ASK.search(text) else 0.0
    constraints = min(len(_CONSTRAINTS.findall(text)), 3) / 3
    num_bytes = len(text.encode("utf-8"))
    multibyte = (num_bytes - len(text)) / 2  # about one per CJK character (3 bytes each)
    cjk = multibyte / len(text) if text else 0.0
    effective = len(text) + 2 * multibyte  # a CJK character weighs like 3 Latin ones
    length = min(math.log2(1 + effective / 40) / 6, 1.0)
    depth = min(max(turns - 1, 0), 5) / 5
    easy = 1.0 if _EASY.search(text) else 0.0
    return Signals((*markers, ask, constraints, length, depth, easy, min(cjk, 1.0)))
