"""Grammar-constrained decoding through the engine on random weights: the output follows the
grammar, the grammar waits for the end of thinking, and MTP drafting changes nothing in greedy
output (forbidden drafts are rejected like any mismatch)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from backend.engine.grammar import GrammarCompiler, GrammarError, json_grammar
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.model import DeepseekV3ForCausalLM
from backend.text.structured import Constraint, build_constraint, grammar_starts_after
from backend.text.tokenizer import Tokenizer
from backend.text.tokenizer_assets import write_tokenizer_files
from tests.support.engine import engine_config, make_engine, random_prompts, tokens_of

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("grammar-tokenizer")
    write_tokenizer_files(path)
    return Tokenizer.from_dir(path)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer, tiny_model: DeepseekV3ForCausalLM) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tiny_model.config.vocab_size)


def run(
    engine: LLMEngine,
    compiler: GrammarCompiler,
    prompts: dict[str, list[int]],
    params: SamplingParams,
) -> dict[str, list[int]]:
    assert params.grammar is not None
    compiled = compiler.compile(params.grammar)
    outputs: dict[str, list[int]] = {}
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params, compiled)
        outputs[request_id] = []
    while engine.has_unfinished:
        for output in engine.step():
            outputs[output.request_id] += tokens_of([output])
    return outputs


def schema_params(tokenizer: Tokenizer, **overrides: Any) -> SamplingParams:
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    constraint = build_constraint(rf, [], None, None)
    assert constraint is not None
    return SamplingParams(max_tokens=60, grammar=constraint.text, **overrides)


def check_answer(tokenizer: Tokenizer, tokens: list[int]) -> dict[str, Any]:
    assert tokens[-1] == tokenizer.special.eos, tokenizer.decode(tokens)  # ended by the grammar
    value = json.loads(tokenizer.decode(tokens))
    assert set(value) == {"city", "days", "unit"} and len(value["city"]) <= 8
    assert 1 <= value["days"] <= 14 and value["unit"] in ("c", "f")
    return dict(value)


def test_sampled_and_greedy_answers_follow_the_schema(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    tokenizer: Tokenizer,
    compiler: GrammarCompiler,
) -> None:
    engine = make_engine(tiny_model, tiny_dir, engine_config(spec_enabled=False))
    prompts = random_prompts(3, 3, 30, seed=5)
    for params in (
        schema_params(tokenizer, temperature=1.0, top_p=1.0),
        schema_params(tokenizer, temperature=0.8, top_k=50, repetition_penalty=1.3),
        schema_params(tokenizer, temperature=0.0),
    ):
        for tokens in run(engine, compiler, prompts, params).values():
            check_answer(tokenizer, tokens)


def test_grammar_starts_after_the_end_of_thinking(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    tokenizer: Tokenizer,
    compiler: GrammarCompiler,
) -> None:
    engine = make_engine(tiny_model, tiny_dir, engine_config(spec_enabled=False))
    think_end = tokenizer.special.think_end
    base = schema_params(tokenizer, temperature=1.0, top_p=1.0, seed=3)
    # a reasoning budget of 4 makes the engine close the thinking itself
    params = replace(
        base,
        max_reasoning_tokens=4,
        reasoning_end_token_id=think_end,
        grammar_after=(think_end,),
    )
    for tokens in run(engine, compiler, random_prompts(3, 3, 20, seed=6), params).values():
        assert tokens[3] == think_end and think_end not in tokens[:3]
        check_answer(tokenizer, tokens[4:])


def test_forced_tool_call_in_v31_format(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    tokenizer: Tokenizer,
    compiler: GrammarCompiler,
) -> None:
    engine = make_engine(tiny_model, tiny_dir, engine_config(spec_enabled=False))
    tools = [("get_weather", SCHEMA, True), ("get_time", {"type": "object"}, False)]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    constraint = build_constraint(None, tools, choice, None)
    assert constraint is not None and constraint.force_call
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=60, grammar=constraint.text)
    special = tokenizer.special
    for tokens in run(engine, compiler, random_prompts(4, 3, 20, seed=7), params).values():
        head = [special.tool_calls_begin, special.tool_call_begin]
        assert tokens[:2] == head
        tail = [special.tool_call_end, special.tool_calls_end, special.eos]
        assert tokens[-3:] == tail
        name, args = tokenizer.decode(tokens[2:-3]).split("<｜tool▁sep｜>")
        assert name == "get_weather"
        check_answer(tokenizer, tokenizer.encode(args) + [special.eos])


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_greedy_with_drafting_equals_greedy_without(
    tiny_model: DeepseekV3ForCausalLM,
    tiny_dir: Path,
    tokenizer: Tokenizer,
    compiler: GrammarCompiler,
    num_tokens: int,
) -> None:
    think_end = tokenizer.special.think_end
    params = schema_params(
        tokenizer,
        temperature=0.0,
        max_reasoning_tokens=3,
        reasoning_end_token_id=think_end,
        grammar_after=(think_end,),
    )
    prompts = random_prompts(3, 3, 30, seed=8)
    plain = make_engine(tiny_model, tiny_dir, engine_config(spec_enabled=False))
    reference = run(plain, compiler, prompts, params)
    config = engine_config(spec_num_tokens=num_tokens, spec_max_batch_size=None)
    drafting = make_engine(tiny_model, tiny_dir, config)
    # drafts the grammar allows (the reference's next tokens) and forbids (token 5 is a
    # control character, never in JSON) in turn, so acceptance and grammar rejection both happen
    runner = drafting.runner
    propose = runner._draft

    def drafts(*args: Any) -> list[list[int]]:
        out = propose(*args)
        scheduled, emitted = args[2], args[3]
        for i, item in enumerate(scheduled):
            done = len(item.seq.output_token_ids) + len(emitted[i])
            ref = reference[item.seq.request_id]
            wanted = range(done, done + len(out[i]))
            out[i] = [ref[n] if n < len(ref) and n % 3 != 2 else 5 for n in wanted]
        return out

    runner._draft = drafts  # type: ignore[method-assign]
    assert run(drafting, compiler, prompts, params) == reference
    stats = drafting.stats()
    assert 0 < stats.spec_accepted_tokens_total < stats.spec_verified_tokens_total
    for tokens in reference.values():
        check_answer(tokenizer, tokens[3:])
    assert not runner.grammar._states  # released with their requests


def test_what_does_not_compile_names_its_part(compiler: GrammarCompiler) -> None:
    bad = Constraint({"type": "object", "properties": {"a": {"type": "strin"}}}, (), False, True)
    with pytest.raises(GrammarError) as caught:
        compiler.compile(bad.text)
    assert caught.value.param == "response_format.json_schema.schema"
    pattern = {"type": "string", "pattern": "[a-"}
    call = Constraint(None, (("f", pattern, "tools[2].function.parameters"),), True, True)
    with pytest.raises(GrammarError) as caught:
        compiler.compile(call.text)
    assert caught.value.param == "tools[2].function.parameters"


def test_compiled_grammars_are_cached_by_constraint(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    text = schema_params(tokenizer).grammar
    assert text is not None
    first = compiler.compile(text)
    assert compiler.cached(text) is first and compiler.compile(text) is first
    other = build_constraint({"type": "json_object"}, [], None, None)
    assert other is not None and compiler.cached(other.text) is None
    assert grammar_starts_after(other, tokenizer.special, True) == (tokenizer.special.think_end,)


@pytest.mark.parametrize("bound", [{}, {"maxLength": 12}, {"minLength": 1, "maxLength": 3}])
def test_json_strings_refuse_unescaped_control_characters(bound: dict[str, Any]) -> None:
    """JSON forbids U+0000-U+001F unescaped in a string, with a length bound or without."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", **bound}},
        "required": ["city"],
        "additionalProperties": False,
    }
    grammar = xgr.Grammar.from_ebnf(json_grammar(schema, "schema").grammar)
    assert _is_grammar_accept_string(grammar, '{"city":"Rio"}')
    for control in ("\x05", "\x00", "\t", "\n", "\x1f"):
        assert not _is_grammar_accept_string(grammar, '{"city":"O' + control + '"}')
