"""Continuous batching: what runs each step under one token budget. No torch.

Each step: decodes first (running sequences with one uncomputed token: 1 token each plus the
draft tokens the MTP layer proposed for it, with their slots reserved), then prefill chunks of
running, partially prefilled sequences and then of waiting ones, first come first served, until
the token budget or `max_num_seqs` is reached. With `chunked_prefill` a prompt is split across
steps, so a long prompt never stalls running decodes. When a decode cannot get a block, the
newest running sequence is preempted: its blocks are freed and it goes back to the front of the
waiting queue, where its prompt and output so far are recomputed (its computed full blocks stay
in the prefix cache while they last).

Speculation: with `num_lookahead` k > 0 a step "drafts" unless the expected batch (running plus
waiting sequences, at most `max_num_seqs`) exceeds `spec_max_batch_size`; then every pending
draft is dropped and the step is plain. A drafting step verifies each decode's pending drafts
(at most k, fewer near its length limits) and reserves k - 1 more slots for the next drafts
of depth 2..k. After the step a sequence keeps only the blocks its tokens need: blocks that
held nothing but rejected drafts go back to the pool, and `num_computed_tokens` never counts an
unverified token, so the prefix cache never registers one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from backend.engine.blocks import BlockPool
from backend.engine.request import FinishReason, Request, RequestStatus


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """seq computes tokens [start, start + num_new_tokens) this step, followed by its
    `num_lookahead` draft tokens `draft_token_ids` at the next positions (their slots are
    reserved). `samples`: this step ends at seq's last token, so the runner samples a next
    token for it (after verifying the drafts)."""

    seq: Request
    start: int
    num_new_tokens: int
    num_lookahead: int
    samples: bool
    draft_token_ids: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, seq: Request, num_new_tokens: int, draft_token_ids: Sequence[int] = ()
    ) -> ScheduledSeq:
        start = seq.num_computed_tokens
        samples = start + num_new_tokens == seq.num_tokens
        drafts = tuple(draft_token_ids)
        return cls(seq, start, num_new_tokens, len(drafts), samples, drafts)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """One step's work, decodes first. `preempted` lost their blocks in this step.
    `num_spec_tokens`: drafts to propose per sequence after the step (0: the step drafts none)."""

    scheduled: list[ScheduledSeq]
    preempted: list[Request]
    num_spec_tokens: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens + s.num_lookahead for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides which sequences run each step; owns the waiting and running queues.

    `max_model_len` bounds prompt + output (a sequence reaching it finishes with "length"); the
    pool must hold one such sequence plus its lookahead, so a lone sequence always progresses.
    Without chunked prefill a whole (re)computed sequence must fit one step's budget.
    `eos_token_ids` stop a sequence unless its params say `ignore_eos`. `num_lookahead`: draft
    tokens per step (0: no speculation); `spec_max_batch_size`: the largest expected batch that
    may draft (None: any); `draft_policy`, given the expected batch, decides under that cap
    (None: always draft).
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_batch_tokens: int,
        block_manager: BlockPool,
        chunked_prefill: bool,
        *,
        max_model_len: int,
        eos_token_ids: Iterable[int],
        num_lookahead: int = 0,
        spec_max_batch_size: int | None = None,
        draft_policy: Callable[[int], bool] | None = None,
    ) -> None:
        if max_num_seqs < 1 or num_lookahead < 0 or max_model_len < 2:
            raise ValueError("need max_num_seqs >= 1, num_lookahead >= 0, max_model_len >= 2")
        if max_batch_tokens < max_num_seqs * (1 + num_lookahead):
            raise ValueError("max_batch_tokens must cover one decode step of max_num_seqs")
        capacity = block_manager.num_blocks * block_manager.block_size
        if max_model_len + self.num_lookahead_slots(num_lookahead) > capacity:
            raise ValueError(f"max_model_len {max_model_len} exceeds the pool ({capacity} tokens)")
        if not chunked_prefill and max_model_len > max_batch_tokens:
            raise ValueError("without chunked prefill, max_model_len must fit max_batch_tokens")
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.block_manager = block_manager
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.num_lookahead = num_lookahead
        self.spec_max_batch_size = spec_max_batch_size
        self.draft_policy = draft_policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._live: dict[str, Request] = {}
        self._next_arrival = 0

    @staticmethod
    def num_lookahead_slots(num_lookahead: int) -> int:
        """Slots past a sequence's tokens a drafting step may use: its drafts, then the
        positions of the next drafts of depth 2 and more."""
        return max(0, 2 * num_lookahead - 1)

    @property
    def has_unfinished(self) -> bool:
        return bool(self._live)

    def add(self, seq: Request) -> None:
        if seq.request_id in self._live:
            raise ValueError(f"duplicate request id {seq.request_id}")
        if seq.status is not RequestStatus.WAITING or seq.block_table:
            raise ValueError(f"{seq.request_id} is not a fresh sequence")
        if seq.num_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt of {seq.num_tokens} tokens leaves no room under {self.max_model_len}"
            )
        seq.arrival = self._next_arrival
        self._next_arrival += 1
        self._live[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Request | None:
        """Finish a request at any point, freeing its blocks; None if it is not live."""
        return self.finish(request_id, "abort")

    def finish(self, request_id: str, reason: FinishReason) -> Request | None:
        """Finish a live request (e.g. the caller matched a stop string); None if not live."""
        seq = self._live.get(request_id)
        if seq is None:
            return None
        if seq.status is RequestStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._finish(seq, reason)
        return seq

    def schedule(self) -> SchedulerOutput:
        budget = self.max_batch_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Request] = []
        picked: set[str] = set()
        depth = self.num_lookahead if self._drafts_this_step() else 0
        if not depth:
            for seq in self.running:
                seq.draft_token_ids = []

        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq.num_uncomputed_tokens != 1 or seq.status is not RequestStatus.RUNNING:
                continue
            drafts = self._drafts_to_verify(seq, depth)
            slots = len(drafts) + max(0, depth - 1)
            while not self.block_manager.can_append(seq, slots):
                victim = max(
                    (
                        s
                        for s in self.running
                        if s.request_id not in picked and self.block_manager.shares_pool(seq, s)
                    ),
                    key=lambda s: s.arrival,
                )
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not RequestStatus.RUNNING:
                continue
            self.block_manager.append_slot(seq, slots)
            scheduled.append(ScheduledSeq.of(seq, 1, drafts))
            picked.add(seq.request_id)
            budget -= 1 + len(drafts)

        for seq in sorted(self.running, key=lambda s: s.arrival):
            if budget == 0:
                break
            if seq.request_id in picked:
                continue
            num_new = self._chunk(seq, budget)
            if num_new:
                scheduled.append(self._prefill(seq, num_new, depth))
                picked.add(seq.request_id)
                budget -= num_new

        # no admission in a step that preempted: blocks are short, readmission would thrash
        while (
            not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                break
            if not self.chunked_prefill:
                cached = self.block_manager.num_cacheable_tokens(seq)
                if seq.num_tokens - cached > budget:
                    break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = RequestStatus.RUNNING
            self.running.append(seq)
            num_new = self._chunk(seq, budget)
            scheduled.append(self._prefill(seq, num_new, depth))
            picked.add(seq.request_id)
            budget -= num_new

        return SchedulerOutput(scheduled, preempted, depth)

    def postprocess(
        self,
        output: SchedulerOutput,
        sampled_tokens: Sequence[Sequence[int]],
        draft_tokens: Sequence[Sequence[int]] | None = None,
    ) -> list[Request]:
        """Apply one step's results; returns the sequences that finished in it.

        `sampled_tokens[i]` belongs to `output.scheduled[i]`: empty for a prefill chunk that
        does not reach the last token, else the accepted draft tokens followed by one sampled
        token (just the sampled token without speculation). Stop tokens are kept in the output.
        `draft_tokens[i]` (at most `output.num_spec_tokens`) are the drafts proposed to follow
        them. Sequences finished or aborted since `schedule` are skipped.
        """
        if len(sampled_tokens) != len(output.scheduled):
            raise ValueError("one list of sampled tokens per scheduled sequence")
        if draft_tokens is not None and len(draft_tokens) != len(output.scheduled):
            raise ValueError("one list of draft tokens per scheduled sequence")
        finished: list[Request] = []
        for i, (item, tokens) in enumerate(zip(output.scheduled, sampled_tokens, strict=True)):
            seq = item.seq
            if seq.status is not RequestStatus.RUNNING:
                continue
            if seq.num_computed_tokens != item.start:
                raise ValueError(f"{seq.request_id} changed since it was scheduled")
            if bool(tokens) != item.samples or len(tokens) > 1 + item.num_lookahead:
                raise ValueError(f"{seq.request_id}: {len(tokens)} tokens do not fit its step")
            # the step's tokens plus accepted drafts are computed; the last sampled one is not
            seq.num_computed_tokens += item.num_new_tokens + max(0, len(tokens) - 1)
            reason: FinishReason | None = None
            for sampled in tokens:
                token = self._within_reasoning_budget(seq, sampled)
                seq.token_ids.append(token)
                reason = self._stop_reason(seq, token)
                if reason is not None or token != sampled:  # later drafts followed `sampled`
                    break
            seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
            self.block_manager.cache_full_blocks(seq)
            if reason is not None:
                self.running.remove(seq)
                self._finish(seq, reason)
                finished.append(seq)
                continue
            drafts = list(draft_tokens[i]) if draft_tokens is not None else []
            if len(drafts) > output.num_spec_tokens:
                raise ValueError(f"{seq.request_id}: more drafts than the step proposes")
            seq.draft_token_ids = drafts
            self.block_manager.release_tail(seq)
        return finished

    def _drafts_this_step(self) -> bool:
        if not self.num_lookahead:
            return False
        expected = min(self.max_num_seqs, len(self.running) + len(self.waiting))
        if self.spec_max_batch_size is not None and expected > self.spec_max_batch_size:
            return False
        return self.draft_policy is None or self.draft_policy(max(1, expected))

    def _drafts_to_verify(self, seq: Request, depth: int) -> list[int]:
        """seq's pending drafts that may still be emitted under its length limits."""
        if seq.params.is_seeded_sample:
            return []
        room = self.max_model_len - seq.num_tokens - 1
        max_tokens = seq.params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - seq.num_output_tokens - 1)
        return seq.draft_token_ids[: max(0, min(depth, room))]

    def _prefill(self, seq: Request, num_new: int, depth: int) -> ScheduledSeq:
        """A prefill chunk; one that reaches the last token gets slots for deeper drafts
        when the pool has them (the runner drafts less deep where it has not)."""
        item = ScheduledSeq.of(seq, num_new)
        if item.samples and depth > 1 and self.block_manager.can_append(seq, depth - 1):
            self.block_manager.append_slot(seq, depth - 1)
        return item

    def _chunk(self, seq: Request, budget: int) -> int:
        """Tokens of seq to compute this step: all it lacks, or with chunked prefill as many as
        the budget allows; 0 when it does not fit."""
        num = seq.num_uncomputed_tokens
        if num <= budget:
            return num
        return budget if self.chunked_prefill else 0

    @staticmethod
    def _within_reasoning_budget(seq: Request, token: int) -> int:
        """`token`, or the end-of-thinking token when it is the last the reasoning budget
        allows (SamplingParams.max_reasoning_tokens counts the end-of-thinking token too)."""
        if not seq.in_reasoning:
            return token
        end = seq.params.reasoning_end_token_id
        budget = seq.params.max_reasoning_tokens
        assert end is not None and budget is not None  # in_reasoning only with a budget
        seq.num_reasoning_tokens += 1
        if seq.num_reasoning_tokens >= budget:
            token = end
        seq.in_reasoning = token != end
        return token

    def _stop_reason(self, seq: Request, token: int) -> FinishReason | None:
        params = seq.params
        if token in params.stop_token_ids or (
            not params.ignore_eos and token in self.eos_token_ids
        ):
            return "stop"
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _preempt(self, seq: Request) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.draft_token_ids = []
        seq.status = RequestStatus.WAITING
        self.waiting.appendleft(seq)

    def _finish(self, seq: Request, reason: FinishReason) -> None:
        if seq.block_table:
            self.block_manager.free(seq)
        seq.draft_token_ids = []
        seq.status = RequestStatus.FINISHED
        seq.finish_reason = reason
        del self._live[seq.request_id]
