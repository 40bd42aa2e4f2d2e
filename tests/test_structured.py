"""Structured output and tool calls: a grammar constrains every verified row along its drafted
path, so output under json_schema validates and equals grammar-constrained plain decoding,
whatever k, tree or proposer runs; tool calls are rendered by the template, forced by a grammar
or parsed from free text, in the hermes and llama3 formats."""

from __future__ import annotations

import contextlib
import json
import re

import jsonschema
import numpy as np
import pytest

from edge_eagle import EdgeEagle, EdgeEagleError
from edge_eagle.grammar import Grammar, int_range_rule, json_schema_grammar
from edge_eagle.proposal import Proposal
from edge_eagle.sampling import Sampler, SamplingParams
from edge_eagle.tools import HERMES, LLAMA3, ToolStream, parse_calls, template_style
from edge_eagle.verify import verify
from tests import chat_templates as CT
from tests.drafters import OracleOverlay
from tests.tiny_models import write_tiny_target

# bounded, so a random tiny model finishes it: enums, booleans, short strings, short arrays
SCHEMA = {"type": "object", "properties": {
    "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
    "name": {"type": "string", "maxLength": 8}, "count": {"type": "integer", "minimum": -3, "maximum": 250},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["color", "ok", "name", "count", "tags"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a thing as JSON."}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"key": {"enum": ["x", "y"]}}, "required": ["key"]}}},
]


@pytest.fixture(scope="module")
def engine(served_engine):
    return served_engine


def _chat(ee: EdgeEagle, **kw) -> str:
    r = ee.create_chat_completion(MESSAGES, response_format=FORMAT, max_tokens=160, **kw)
    assert r["choices"][0]["finish_reason"] == "stop", r
    return r["choices"][0]["message"]["content"]


@contextlib.contextmanager
def oracle(engine: EdgeEagle, reference: list[int]):
    """The engine's EAGLE drafter with `reference` planted on random prefixes and tree paths, so
    drafts are accepted, cut at the grammar and rejected in every pattern."""
    inner = engine.drafter
    engine.drafter = OracleOverlay(inner, reference, seed=len(reference))
    engine.controller = None  # as swap_drafter does: `auto` estimates a new drafter's acceptance afresh
    try:
        yield
    finally:
        engine.drafter = inner
        engine.controller = None


def _prompt(engine: EdgeEagle) -> list[int]:
    return engine.target.tokenize(engine.apply_chat_template(MESSAGES), add_special=False)


@pytest.mark.parametrize("k,tree", [(3, None), ("auto", None), (3, 6)])
def test_json_schema_output_validates_and_equals_constrained_plain_decoding(engine, k, tree):
    ids, grammar = _prompt(engine), json_schema_grammar(SCHEMA)
    plain = engine.generate(ids, max_tokens=160, grammar=grammar, speculative=False).result()
    assert plain.finish_reason == "stop"
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    assert engine.generate(ids, max_tokens=160, grammar=grammar, k=k, tree=tree).result().text == plain.text
    with oracle(engine, ids + plain.tokens):
        gen = engine.generate(ids, max_tokens=160, grammar=grammar, k=k, tree=tree).result()
    assert gen.text == plain.text
    assert gen.stats.accepted > 0  # drafts were verified along the grammar's paths


def test_sampled_json_schema_validates_and_a_seed_fixes_it_across_k_and_trees(engine):
    ids, grammar = _prompt(engine), json_schema_grammar(SCHEMA)
    plain = engine.generate(ids, max_tokens=160, grammar=grammar, temperature=0.7, seed=11, speculative=False).result()
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    for kw in ({"k": 3}, {"k": "auto"}, {"k": 3, "tree": 6}):
        with oracle(engine, ids + plain.tokens):
            gen = engine.generate(ids, max_tokens=160, grammar=grammar, temperature=0.7, seed=11, **kw).result()
        assert gen.text == plain.text, kw
    for _ in range(3):  # unseeded rejection sampling stays within the grammar too
        with oracle(engine, ids + plain.tokens):
            jsonschema.validate(json.loads(_chat(engine, temperature=0.9, seed=None)), SCHEMA)


def test_json_object_gives_an_object_and_create_completion_takes_a_llama_grammar(engine):
    from llama_cpp import LlamaGrammar

    r = engine.create_chat_completion(MESSAGES, response_format={"type": "json_object"}, max_tokens=60,
                                      temperature=0, logit_bias={})
    text = r["choices"][0]["message"]["content"]
    if r["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")
    grammar = LlamaGrammar.from_string('root ::= ("yes" | "no") "."')
    out = engine.create_completion("Is the sea blue?", grammar=grammar, max_tokens=8, temperature=0)
    assert out["choices"][0]["text"] in ("yes.", "no.")


@pytest.mark.parametrize("lo,hi", [(0, 99), (5, 123), (-17, 42), (-300, -12), (7, 7), (-5, None), (None, 7),
                                   (997, 1003)])
def test_integer_bounds_become_exact_grammar_ranges(lo, hi):
    # the alternatives are plain digit sequences and classes: as a regex they must match
    # exactly the integers in range, written without leading zeros
    rule = int_range_rule(lo, hi).replace('"-"', "-")
    regex = re.compile("^(" + re.sub(r'"(\d)"', r"\1", rule).replace(" ", "") + ")$")
    low, high = (-2000 if lo is None else lo), (20000 if hi is None else hi)
    for v in range(low - 60, high + 60):
        assert bool(regex.match(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    assert not regex.match("007") and not regex.match("-0")
    with pytest.raises(EdgeEagleError, match="range is empty"):
        json_schema_grammar({"type": "integer", "minimum": 5, "maximum": 4})


@pytest.mark.parametrize("schema,prefix", [
    ({"type": "string"}, '"'), ({"type": "string", "maxLength": 8}, '"ab'), ({"type": "object"}, '{"'),
    (SCHEMA, '{"color": "red", "ok": true, "name": "')])
def test_json_strings_hold_no_raw_control_character(engine, schema, prefix):
    """JSON forbids unescaped control characters inside strings (strict parsers reject them), so
    inside a string the grammar allows a newline, tab or carriage return only escaped."""
    target = engine.target
    grammar = Grammar(target, json_schema_grammar(schema))
    try:
        path = target.tokenize(prefix, add_special=False)
        for raw in ("\n", "\t", "\r", "\x01", "\x7f"):
            ids = target.tokenize(raw, add_special=False)
            assert len(ids) == 1 and not grammar.allows(ids[0], path), repr(raw)
        for text in ("a", "\\", "\\n"):  # a letter; a backslash, then an escaped newline
            for t in target.tokenize(text, add_special=False):
                assert grammar.allows(t, path), text
                path = path + [t]
    finally:
        grammar.close()


def test_a_draft_the_grammar_forbids_is_never_accepted(engine):
    target = engine.target
    grammar = Grammar(target, 'root ::= "yes" | "no"')
    try:
        allowed = np.flatnonzero(grammar.allowed())
        banned = next(t for t in range(target.n_vocab) if t not in set(allowed.tolist()) and not target.is_eog(t))
        logits = np.zeros((2, target.n_vocab), dtype=np.float32)
        logits[:, banned] = 50.0  # the target would pick the banned token by far
        for params in (SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, seed=3)):
            n, bonus = verify(Sampler(params, grammar), logits, Proposal.chain([banned]), pos=10)
            assert n == 0 and bonus in set(allowed.tolist()), params
    finally:
        grammar.close()


def test_top_k_under_a_grammar_keeps_what_masking_the_whole_vocabulary_keeps(engine, monkeypatch):
    """Top-k under a grammar checks the best candidates one at a time instead of masking the
    whole vocabulary; the weights are the same, ties with the k-th included, and so is the
    fallback where the grammar forbids most of the candidates."""
    target = engine.target
    rng = np.random.default_rng(7)
    scan = Sampler._top_k_allowed
    outcomes: list[bool] = []  # whether the scan settled it (else the whole vocabulary was masked)

    def recorded(self, z, path):
        found = scan(self, z, path)
        outcomes.append(found is not None)
        return found

    monkeypatch.setattr(Sampler, "_top_k_allowed", recorded)
    for gbnf in ('root ::= "yes" | "no"', 'root ::= [a-z]+ " " [0-9]+', "root ::= [^x]+"):
        grammar = Grammar(target, gbnf)
        try:
            allowed = grammar.allowed()
            for k in (1, 3, 40, int(allowed.sum()) + 5):
                for row in range(6):
                    z = rng.standard_normal(target.n_vocab).astype(np.float32) * 3
                    if row % 2:
                        z = np.round(z)  # many ties, some of them at the k-th
                    if row == 5:
                        z[allowed] -= 20.0  # the grammar forbids the model's favourites
                    sampler = Sampler(SamplingParams(temperature=0.8, top_k=k, top_p=0.95), grammar)
                    scanned = sampler.log_weights(z, path=())
                    sampler.TOP_K_SCAN = 0  # this sampler masks the whole vocabulary
                    masked = sampler.log_weights(z, path=())
                    assert np.array_equal(scanned, masked), (gbnf, k, row)
        finally:
            grammar.close()
    assert any(outcomes) and not all(outcomes)


def test_an_untruncated_sample_under_a_grammar_follows_the_constrained_distribution(engine, monkeypatch):
    """Unseeded and untruncated, a row's token is drawn without the grammar and kept when the
    grammar allows it, else drawn within the grammar: chi-square against the masked
    distribution over 20k draws, p > 1e-3 required; most draws never mask the vocabulary."""
    from scipy import stats as st

    target = engine.target
    grammar = Grammar(target, "root ::= [a-z]+")
    try:
        allowed = grammar.allowed()
        rng = np.random.default_rng(4)
        logits = rng.standard_normal(target.n_vocab).astype(np.float32)
        logits[np.flatnonzero(allowed)[:6]] += 6.0  # likely and allowed ...
        logits[np.flatnonzero(~allowed)[:3]] += 6.5  # ... and likely but forbidden
        sampler = Sampler(SamplingParams(temperature=1.0, seed=None), grammar)
        sampler.rng = np.random.default_rng(0)
        p = sampler.probs(logits, path=())
        masked: list[int] = []  # whole-vocabulary masks
        constrain = grammar.constrain
        monkeypatch.setattr(grammar, "constrain", lambda z, path=(): (masked.append(1), constrain(z, path))[1])
        draws = 20_000
        counts = np.bincount([sampler.sample(logits, path=()) for _ in range(draws)], minlength=target.n_vocab)
        assert counts[~allowed].sum() == 0
        top = np.argsort(-p)[:20]  # the likely tokens, each its own cell; the rest pooled
        observed = np.append(counts[top], draws - counts[top].sum())
        expected = np.append(p[top], 1.0 - p[top].sum()) * draws
        assert st.chisquare(observed, expected).pvalue > 1e-3
        forbidden = float(sampler.probs(logits)[~allowed].sum())  # unconstrained mass the grammar forbids
        assert 0.05 < forbidden < 0.95
        assert abs(len(masked) / draws - forbidden) < 0.02  # only those draws masked the vocabulary
    finally:
        grammar.close()


def test_a_bad_grammar_or_schema_is_a_clear_error(engine):
    with pytest.raises(EdgeEagleError, match="grammar does not parse"):
        engine.generate("hi", grammar="root ::= (")
    with pytest.raises(EdgeEagleError, match="response_format"):
        engine.create_chat_completion(MESSAGES, response_format={"type": "xml"})
    with pytest.raises(EdgeEagleError, match="json_schema"):
        engine.create_chat_completion(MESSAGES, response_format={"type": "json_schema"})


# --- tool calls ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[HERMES, LLAMA3])
def tool_engine(request, tmp_path_factory, tiny_drafters):
    """The tiny pair (the same weights as the tiny target) with a template that renders tools."""
    template = CT.HERMES if request.param == HERMES else CT.LLAMA3
    path = write_tiny_target(tmp_path_factory.mktemp("tools") / f"tiny-{request.param}.gguf", chat_template=template)
    ee = EdgeEagle(path, tiny_drafters["eagle3.1"][0], k=3, n_ctx=768)
    yield request.param, ee
    ee.close()


def _args_valid(call: dict) -> None:
    fn = {t["function"]["name"]: t["function"] for t in TOOLS}[call["function"]["name"]]
    jsonschema.validate(json.loads(call["function"]["arguments"]), fn["parameters"])
    assert call["type"] == "function" and call["id"].startswith("call_")


def test_templates_name_their_tool_call_format():
    assert template_style(CT.HERMES) == HERMES and template_style(CT.LLAMA3) == LLAMA3
    assert template_style(CT.MINIMAL) is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_a_forced_tool_call_follows_the_functions_schema(tool_engine, choice):
    style, ee = tool_engine
    for temperature in (0.0, 0.8):
        r = ee.create_chat_completion([{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
                                      tool_choice=choice, temperature=temperature, seed=5, max_tokens=120)
        c = r["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        _args_valid(call)
        if isinstance(choice, dict):
            assert call["function"]["name"] == "lookup"


def test_tool_calls_stream_as_openai_deltas(tool_engine):
    style, ee = tool_engine
    chunks = list(ee.create_chat_completion([{"role": "user", "content": "Weather?"}], tools=TOOLS,
                                            tool_choice="required", temperature=0, max_tokens=120, stream=True))
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    assert not "".join(d.get("content") or "" for d in deltas).strip()  # the call is not streamed as text
    calls = [tc for d in deltas for tc in d.get("tool_calls") or ()]
    assert len(calls) == 1 and calls[0]["index"] == 0
    _args_valid(calls[0])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tools_and_earlier_calls_are_rendered_through_the_template(tool_engine):
    style, ee = tool_engine
    from edge_eagle.tools import chat_plan

    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
    plan = chat_plan(ee, history, tools=TOOLS)
    text = ee.target.detokenize(plan.prompt)
    assert "get_weather" in text and "-3 C" in text and plan.grammar is None and plan.style == style
    if style == HERMES:  # the earlier call's arguments as a JSON object, not a quoted string
        assert '"arguments": {"city": "Oslo", "unit": "c"}' in text


def test_without_template_support_tools_are_refused(engine):
    with pytest.raises(EdgeEagleError, match="no tool support") as err:
        engine.create_chat_completion(MESSAGES, tools=TOOLS)
    assert err.value.param == "tools"
    with pytest.raises(EdgeEagleError, match="no tools"):
        engine.create_chat_completion(MESSAGES, tool_choice="required")


@pytest.mark.parametrize("style,text,content,names", [
    (HERMES, 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "Sure.", ["f"]),
    (HERMES, '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {}}'
             '</tool_call>', None, ["f", "g"]),
    (HERMES, "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    (LLAMA3, '{"name": "f", "parameters": {"a": 1}}', None, ["f"]),
    (LLAMA3, '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}', None, ["f", "g"]),
    (LLAMA3, "The answer is {1}.", "The answer is {1}.", []),
])
def test_calls_are_parsed_from_free_text(style, text, content, names):
    got_content, calls = parse_calls(text, style)
    assert got_content == content and [c["function"]["name"] for c in calls] == names
    if names:
        assert json.loads(calls[0]["function"]["arguments"]) == ({"a": 1} if "1}" in text and "{1}" not in text
                                                                 else {})
    # streamed in pieces, the same text and calls come out, and no call is streamed as text
    stream = ToolStream(style)
    sent = "".join(stream.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, streamed = stream.finish()
    assert [c["function"]["name"] for c in streamed] == names
    if names:
        assert "{" not in sent or style == LLAMA3 and not sent.strip()
        assert (sent + rest).strip() == (content or "")
    else:
        assert sent + rest == text
