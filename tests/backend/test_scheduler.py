from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.engine.blocks import BlockManager
from backend.engine.request import Request, RequestStatus
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput

EOS = 1


def next_token(token_ids: list[int]) -> int:
    """A deterministic stand-in for the model: the next token depends on the whole prefix."""
    return (sum(t * (i + 1) for i, t in enumerate(token_ids)) % 97) + 10


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_batch_tokens: int = 32,
    chunked_prefill: bool = True,
    max_model_len: int = 128,
    num_lookahead: int = 0,
) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, b"test")
    return Scheduler(
        max_num_seqs,
        max_batch_tokens,
        bm,
        chunked_prefill,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
        num_lookahead=num_lookahead,
    )


def make_seq(request_id: str, num_prompt: int, **params: Any) -> Request:
    base = sum(map(ord, request_id))
    prompt = [(base + i) % 50 + 100 for i in range(num_prompt)]
    return Request(request_id, prompt, SamplingParams(temperature=0, **params))


def check_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """What a runner relies on: budget, slots, and positions that continue the sequence."""
    assert out.num_batched_tokens <= scheduler.max_batch_tokens
    assert len(scheduler.running) <= scheduler.max_num_seqs
    assert len({s.seq.request_id for s in out.scheduled}) == len(out.scheduled)
    block_size = scheduler.block_manager.block_size
    for item in out.scheduled:
        seq = item.seq
        assert seq.status is RequestStatus.RUNNING
        assert item.start == seq.num_computed_tokens
        assert item.num_new_tokens >= 1
        assert item.start + item.num_new_tokens <= seq.num_tokens
        end = item.start + item.num_new_tokens + item.num_lookahead
        assert len(seq.block_table) * block_size >= end


def run_step(scheduler: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    out = scheduler.schedule()
    check_step(scheduler, out)
    assert not out.is_empty, "live requests but nothing scheduled"
    sampled = [greedy_tokens(item) if item.samples else [] for item in out.scheduled]
    drafts = [
        fake_drafts(item.seq.token_ids + tokens, out.num_spec_tokens) if tokens else []
        for item, tokens in zip(out.scheduled, sampled, strict=True)
    ]
    return out, scheduler.postprocess(out, sampled, drafts)


def greedy_tokens(item: ScheduledSeq) -> list[int]:
    """What greedy verification emits: the drafts that match the model's own tokens, then the
    model's token at the first mismatch (or after the last draft)."""
    tokens = list(item.seq.token_ids)
    for draft in item.draft_token_ids:
        target = next_token(tokens)
        tokens.append(target)
        if target != draft:
            return tokens[item.seq.num_tokens :]
    tokens.append(next_token(tokens))
    return tokens[item.seq.num_tokens :]


def fake_drafts(token_ids: list[int], depth: int) -> list[int]:
    """A drafter that is right most of the time: the model's next tokens, with some wrong."""
    tokens = list(token_ids)
    drafts: list[int] = []
    for j in range(depth):
        token = next_token(tokens)
        if (len(tokens) * 7 + j) % 3 == 0:
            token += 1
        tokens.append(token)
        drafts.append(token)
    return drafts


def run_to_end(scheduler: Scheduler, max_steps: int = 1000) -> list[SchedulerOutput]:
    outputs: list[SchedulerOutput] = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            return outputs
        out, _ = run_step(scheduler)
        outputs.append(out)
    raise AssertionError("scheduler did not finish")


def expected_output(seq: Request, max_tokens: int) -> list[int]:
    tokens = list(seq.prompt_token_ids)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[seq.num_prompt_tokens :]


def test_chunked_prefill_progresses_by_budget() -> None:
    scheduler = make_scheduler(max_batch_tokens=32)
    seq = make_seq("a", 100, max_tokens=2)
    scheduler.add(seq)
    chunks = []
    for _ in range(4):
        out, _ = run_step(scheduler)
        (item,) = out.scheduled
        chunks.append((item.start, item.num_new_tokens, item.samples))
    assert chunks == [(0, 32, False), (32, 32, False), (64, 32, False), (96, 4, True)]
    assert seq.num_output_tokens == 1 and seq.num_computed_tokens == 100
    out, finished = run_step(scheduler)
    assert [(s.start, s.num_new_tokens) for s in out.scheduled] == [(100, 1)]
    assert finished == [seq] and seq.finish_reason == "length"
    assert seq.output_token_ids == expected_output(seq, 2)


def test_decodes_first_and_long_prompt_does_not_starve_them() -> None:
    scheduler = make_scheduler(max_batch_tokens=16, max_model_len=256, num_blocks=128)
    short = [make_seq(f"s{i}", 3, max_tokens=30) for i in range(3)]
    for seq in short:
        scheduler.add(seq)
    run_step(scheduler)  # all three prefill in one step
    long = make_seq("long", 200, max_tokens=1)
    scheduler.add(long)
    for _ in range(10):
        out, _ = run_step(scheduler)
        kinds = [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled]
        assert kinds[:3] == [("s0", 1), ("s1", 1), ("s2", 1)]
        assert kinds[3:] == [("long", 13)]
        assert out.num_batched_tokens == 16
    assert long.num_computed_tokens == 130


def test_fcfs_head_of_line_blocks_later_requests() -> None:
    scheduler = make_scheduler(num_blocks=10, block_size=4, max_batch_tokens=64, max_model_len=40)
    first = make_seq("first", 30, max_tokens=4)  # 8 blocks
    big = make_seq("big", 30, max_tokens=4)  # 8 blocks: must wait
    small = make_seq("small", 2, max_tokens=4)  # would fit, but arrived later
    for seq in (first, big, small):
        scheduler.add(seq)
    out, _ = run_step(scheduler)
    assert [s.seq.request_id for s in out.scheduled] == ["first"]
    assert list(scheduler.waiting) == [big, small]
    run_to_end(scheduler)
    assert all(s.output_token_ids == expected_output(s, 4) for s in (first, big, small))


def test_max_num_seqs_is_respected() -> None:
    scheduler = make_scheduler(max_num_seqs=2, max_batch_tokens=64)
    seqs = [make_seq(f"r{i}", 3, max_tokens=3) for i in range(5)]
    for seq in seqs:
        scheduler.add(seq)
    for out in run_to_end(scheduler):
        assert len(out.scheduled) <= 2
    assert [s.finish_reason for s in seqs] == ["length"] * 5


def test_budget_respected_with_many_requests() -> None:
    scheduler = make_scheduler(max_batch_tokens=20, max_num_seqs=6, num_blocks=200)
    seqs = [make_seq(f"r{i}", 5 + 7 * i, max_tokens=5) for i in range(10)]
    for seq in seqs:
        scheduler.add(seq)
    outputs = run_to_end(scheduler)
    assert max(o.num_batched_tokens for o in outputs) == 20
    for seq in seqs:
        assert seq.output_token_ids == expected_output(seq, 5)
    assert scheduler.block_manager.num_used_blocks == 0


def test_preemption_recomputes_to_the_same_tokens() -> None:
    # 12 blocks of 4 tokens: three sequences growing to 30 tokens cannot all stay resident
    scheduler = make_scheduler(num_blocks=12, block_size=4, max_batch_tokens=32, max_model_len=48)
    seqs = [make_seq(f"r{i}", 10, max_tokens=20) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    outputs = run_to_end(scheduler)
    preempted = [p.request_id for o in outputs for p in o.preempted]
    assert preempted, "the pool was meant to run out"
    # the newest running sequence is the one preempted
    assert preempted[0] == "r2"
    for seq in seqs:
        assert seq.output_token_ids == expected_output(seq, 20)
    assert scheduler.block_manager.num_used_blocks == 0


def test_preempted_sequence_goes_to_the_front_and_restarts_from_its_cache() -> None:
    scheduler = make_scheduler(
        num_blocks=6, block_size=4, max_num_seqs=2, max_batch_tokens=32, max_model_len=24
    )
    old = make_seq("old", 7, max_tokens=12)
    new = make_seq("new", 7, max_tokens=12)
    later = make_seq("later", 2, max_tokens=1)  # waits: max_num_seqs is 2
    for seq in (old, new, later):
        scheduler.add(seq)
    while True:
        out, _ = run_step(scheduler)
        if out.preempted:
            break
    assert out.preempted == [new]
    assert new.status is RequestStatus.WAITING and new.block_table == []
    assert new.num_computed_tokens == 0
    assert list(scheduler.waiting) == [new, later]
    num_tokens_at_preemption = new.num_tokens
    while new.status is RequestStatus.WAITING:
        out, _ = run_step(scheduler)
    # recompute covers prompt + output so far, skipping what the prefix cache still holds
    (item,) = [s for s in out.scheduled if s.seq is new]
    assert item.start == new.num_cached_tokens
    assert item.start % 4 == 0 and item.start < num_tokens_at_preemption
    assert item.start + item.num_new_tokens == num_tokens_at_preemption
    run_to_end(scheduler)
    assert new.output_token_ids == expected_output(new, 12)


def test_abort_frees_blocks_anywhere() -> None:
    scheduler = make_scheduler(max_batch_tokens=16)
    running = make_seq("run", 40, max_tokens=5)
    waiting = make_seq("wait", 3, max_tokens=5)
    scheduler.add(running)
    scheduler.add(waiting)
    out, _ = run_step(scheduler)  # run takes the whole budget mid-prefill
    assert [s.seq for s in out.scheduled] == [running]
    assert scheduler.block_manager.num_used_blocks == 10
    assert scheduler.abort("run") is running
    assert running.finish_reason == "abort" and running.block_table == []
    assert scheduler.block_manager.num_used_blocks == 0
    assert scheduler.abort("wait") is waiting
    assert scheduler.abort("wait") is None
    assert not scheduler.has_unfinished
    # a result that arrives for an aborted sequence is ignored
    assert scheduler.postprocess(out, [[]]) == []
    assert running.num_computed_tokens == 0


def test_stop_token_eos_and_ignore_eos() -> None:
    scheduler = make_scheduler()
    prompt_a = make_seq("a", 3, max_tokens=10)
    stop = Request("stop", prompt_a.prompt_token_ids, SamplingParams(stop_token_ids=(42,)))
    eos = Request("eos", prompt_a.prompt_token_ids, SamplingParams())
    keep = Request("keep", prompt_a.prompt_token_ids, SamplingParams(ignore_eos=True))
    for seq in (stop, eos, keep):
        scheduler.add(seq)
    out = scheduler.schedule()
    finished = scheduler.postprocess(out, [[42], [EOS], [EOS]])
    assert finished == [stop, eos]
    assert stop.finish_reason == "stop" and stop.output_token_ids == [42]
    assert eos.finish_reason == "stop"
    assert keep.status is RequestStatus.RUNNING
    assert scheduler.block_manager.num_used_blocks == 1


def test_max_model_len_finishes_with_length() -> None:
    scheduler = make_scheduler(max_model_len=8)
    seq = make_seq("a", 6)
    scheduler.add(seq)
    run_to_end(scheduler)
    assert seq.num_tokens == 8 and seq.finish_reason == "length"


def test_finish_for_stop_strings() -> None:
    scheduler = make_scheduler()
    seq = make_seq("a", 3, max_tokens=10)
    scheduler.add(seq)
    run_step(scheduler)
    assert scheduler.finish("a", "stop") is seq
    assert seq.finish_reason == "stop" and seq.is_finished
    assert scheduler.block_manager.num_used_blocks == 0
    assert not scheduler.has_unfinished


def test_lookahead_reserves_slots_and_accepts_drafts() -> None:
    scheduler = make_scheduler(max_num_seqs=4, max_batch_tokens=16, num_lookahead=2)
    seq = make_seq("a", 3, max_tokens=10)
    scheduler.add(seq)
    out = scheduler.schedule()
    assert out.num_spec_tokens == 2
    scheduler.postprocess(out, [[19]], [[20, 21]])
    assert seq.draft_token_ids == [20, 21]
    out = scheduler.schedule()
    (item,) = out.scheduled
    assert (item.start, item.num_new_tokens, item.num_lookahead) == (3, 1, 2)
    assert item.draft_token_ids == (20, 21)
    assert out.num_batched_tokens == 3
    assert len(seq.block_table) == 2  # drafts up to position 5, a depth-2 draft at 6
    scheduler.postprocess(out, [[20, 21, 22]], [[30, 31]])  # two drafts accepted, one sampled
    assert seq.output_token_ids[-3:] == [20, 21, 22]
    assert seq.num_computed_tokens == 6 == seq.num_tokens - 1
    out = scheduler.schedule()
    assert out.scheduled[0].draft_token_ids == (30, 31)
    with pytest.raises(ValueError):
        scheduler.postprocess(out, [[1, 2, 3, 4]])


def test_rejected_drafts_give_their_blocks_back() -> None:
    scheduler = make_scheduler(block_size=4, max_num_seqs=4, max_batch_tokens=16, num_lookahead=3)
    seq = make_seq("a", 4, max_tokens=20)
    scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule(), [[50]], [[51, 52, 53]])
    out = scheduler.schedule()  # verifies positions 4..7, depth-2 and -3 drafts up to 9
    assert len(seq.block_table) == 3
    used = scheduler.block_manager.num_used_blocks
    scheduler.postprocess(out, [[60]], [[61, 62, 63]])  # every draft rejected
    assert seq.num_tokens == 6 and seq.num_computed_tokens == 5
    assert len(seq.block_table) == 2 and scheduler.block_manager.num_used_blocks == used - 1
    assert scheduler.block_manager.num_cached_blocks == 1  # only the prompt's full block


def test_speculation_pauses_above_the_batch_threshold() -> None:
    bm = BlockManager(64, 4, b"test")
    scheduler = Scheduler(
        8,
        32,
        bm,
        True,
        max_model_len=64,
        eos_token_ids=[EOS],
        num_lookahead=1,
        spec_max_batch_size=2,
    )
    seqs = [make_seq(f"s{i}", 3, max_tokens=8) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert out.num_spec_tokens == 0  # three expected, the threshold is two
    scheduler.postprocess(out, [[7]] * 3)
    assert all(not seq.draft_token_ids for seq in seqs)
    scheduler.abort("s2")
    out = scheduler.schedule()
    assert out.num_spec_tokens == 1 and all(not item.num_lookahead for item in out.scheduled)


def test_stop_inside_accepted_drafts_drops_the_rest() -> None:
    scheduler = make_scheduler(block_size=4, max_num_seqs=4, max_batch_tokens=16, num_lookahead=2)
    seq = make_seq("a", 5, max_tokens=10, stop_token_ids=(20,))
    scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule(), [[19]], [[20, 21]])
    out = scheduler.schedule()  # computes positions 5, 6, 7
    assert scheduler.postprocess(out, [[20, 21, 22]]) == [seq]
    assert seq.num_tokens == 7 and seq.output_token_ids[-1] == 20
    # only the first block is complete: position 7 holds a dropped draft, not a token of seq
    assert scheduler.block_manager.num_cached_blocks == 1


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_step() -> None:
    scheduler = make_scheduler(chunked_prefill=False, max_batch_tokens=40, max_model_len=40)
    first = make_seq("first", 30, max_tokens=3)
    second = make_seq("second", 30, max_tokens=3)
    scheduler.add(first)
    scheduler.add(second)
    out, _ = run_step(scheduler)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("first", 30)]
    outputs = run_to_end(scheduler)
    chunks = [(i.start, i.num_new_tokens) for o in outputs for i in o.scheduled if i.seq is second]
    assert chunks == [(0, 30), (30, 1), (31, 1)]
    assert second.output_token_ids == expected_output(second, 3)


def test_prefix_cache_hit_skips_computed_blocks() -> None:
    scheduler = make_scheduler(block_size=4)
    first = make_seq("same", 10, max_tokens=1)
    scheduler.add(first)
    run_to_end(scheduler)
    second = Request("again", first.prompt_token_ids, SamplingParams(temperature=0, max_tokens=1))
    scheduler.add(second)
    out, _ = run_step(scheduler)
    (item,) = out.scheduled
    assert (item.start, item.num_new_tokens) == (8, 2)
    assert second.num_cached_tokens == 8
    assert second.output_token_ids == first.output_token_ids


def test_invalid_configuration_and_requests() -> None:
    with pytest.raises(ValueError):
        make_scheduler(max_num_seqs=8, max_batch_tokens=7)
    with pytest.raises(ValueError):
        make_scheduler(num_blocks=4, block_size=4, max_model_len=17)
    with pytest.raises(ValueError):
        make_scheduler(chunked_prefill=False, max_batch_tokens=16, max_model_len=32)
    scheduler = make_scheduler(max_model_len=10)
    with pytest.raises(ValueError):
        scheduler.add(make_seq("long", 10))
    scheduler.add(make_seq("a", 3))
    with pytest.raises(ValueError):
        scheduler.add(make_seq("a", 3))


@settings(max_examples=40, deadline=None, database=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    max_tokens=st.lists(st.integers(1, 12), min_size=8, max_size=8),
    num_blocks=st.integers(14, 40),
    max_batch_tokens=st.integers(12, 48),
    aborts=st.sets(st.integers(0, 7), max_size=2),
    chunked=st.booleans(),
    num_lookahead=st.integers(0, 2),
)
def test_random_workloads_match_the_model(
    prompts: list[int],
    max_tokens: list[int],
    num_blocks: int,
    max_batch_tokens: int,
    aborts: set[int],
    chunked: bool,
    num_lookahead: int,
) -> None:
    max_model_len = 52 if chunked else max_batch_tokens
    scheduler = make_scheduler(
        num_blocks=num_blocks,
        block_size=4,
        max_num_seqs=4,
        max_batch_tokens=max_batch_tokens,
        chunked_prefill=chunked,
        max_model_len=max_model_len,
        num_lookahead=num_lookahead,
    )
    seqs = []
    for i, n in enumerate(prompts):
        n = min(n, max_model_len - 1)
        seq = make_seq(f"r{i % 3}-{i}", n, max_tokens=max_tokens[i])
        seqs.append(seq)
        scheduler.add(seq)
    for step in range(1000):
        if step == 3:
            for i in aborts:
                if i < len(seqs):
                    scheduler.abort(seqs[i].request_id)
        if not scheduler.has_unfinished:
            break
        run_step(scheduler)
    assert not scheduler.has_unfinished
    assert scheduler.block_manager.num_used_blocks == 0
    for seq in seqs:
        if seq.finish_reason == "abort":
            continue
        limit = min(seq.params.max_tokens or 0, max_model_len - seq.num_prompt_tokens)
        assert seq.output_token_ids == expected_output(seq, limit)


THINK_END = 99  # outside next_token's range (10..106 is fine: 99 is only forced by the budget)


@pytest.mark.parametrize("num_lookahead", [0, 2])
@pytest.mark.parametrize("budget", [1, 3, 7])
def test_reasoning_budget_forces_the_end_of_thinking(budget: int, num_lookahead: int) -> None:
    scheduler = make_scheduler(num_lookahead=num_lookahead, max_num_seqs=4, max_batch_tokens=16)
    seq = make_seq(
        "a", 3, max_tokens=12, max_reasoning_tokens=budget, reasoning_end_token_id=THINK_END
    )
    scheduler.add(seq)
    run_to_end(scheduler)
    out = seq.output_token_ids
    assert len(out) == 12  # the answer goes on after thinking ends
    assert out.index(THINK_END) == budget - 1  # budget - 1 thoughts, then the end of thinking
    assert seq.num_reasoning_tokens == budget and not seq.in_reasoning
    # after the forced token the model continues from it, like any other token
    tokens = list(seq.prompt_token_ids) + out[:budget]
    for token in out[budget:]:
        assert token == next_token(tokens)
        tokens.append(token)


def test_reasoning_that_ends_by_itself_is_not_cut() -> None:
    scheduler = make_scheduler()
    natural = expected_output(make_seq("a", 3), 6)
    end = natural[1]  # the model ends its reasoning by itself with its second token
    seq = make_seq("a", 3, max_tokens=6, max_reasoning_tokens=50, reasoning_end_token_id=end)
    scheduler.add(seq)
    run_to_end(scheduler)
    assert seq.output_token_ids == natural
    assert seq.num_reasoning_tokens == 2 and not seq.in_reasoning


def test_reasoning_budget_params_go_together() -> None:
    with pytest.raises(ValueError):
        SamplingParams(max_reasoning_tokens=3)
    with pytest.raises(ValueError):
        SamplingParams(max_reasoning_tokens=0, reasoning_end_token_id=5)
