"""The library API: streaming, origins, stop conditions, serialization, cancellation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from edge_eagle import EdgeEagle, EdgeEagleError
from edge_eagle.api import _find_stop, _partial_stop
from edge_eagle.target import Target
from tests.drafters import OracleDrafter
from tests.test_errors import cli


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_drafters):
    ee = EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=512)
    yield ee
    ee.close()


def test_capture_paths_give_identical_features(tiny_target):
    feats = {}
    for path in ("layer_inp", "callback"):
        t = Target(tiny_target, n_ctx=128, capture=path)
        t.set_capture([2, 4, 5])
        toks = t.tokenize("A tiny world of tokens")
        first = t.prefill(toks).features.copy()
        more = t.decode([5, 6, 7], len(toks), "all").features.copy()
        feats[path] = (first, more)
        t.close()
    for a, b in zip(feats["layer_inp"], feats["callback"]):
        assert a.shape == b.shape and a.shape[1] == 3 * 64
        np.testing.assert_array_equal(a, b)


def test_auto_capture_picks_the_layer_input_api_for_llama(tiny_target):
    t = Target(tiny_target, n_ctx=64)
    assert t.capture_path == "layer_inp"
    t.close()


def test_streamed_tokens_rebuild_the_text_and_carry_origins(engine):
    reference = engine.generate("Once upon a time", max_tokens=40, speculative=False).result()
    engine_drafter = engine.drafter
    engine.drafter = OracleDrafter(engine.target.tokenize("Once upon a time") + reference.tokens, corrupt_every=3,
                                   vocab_size=engine.target.n_vocab)
    try:
        gen = engine.generate("Once upon a time", max_tokens=40)
        toks = list(gen)
    finally:
        engine.drafter = engine_drafter
    assert "".join(t.text for t in toks) == gen.text == reference.text
    origins = [t.origin for t in toks]
    assert set(origins) == {"draft", "target"}
    assert origins.count("draft") == gen.stats.accepted
    assert origins[0] == "target"


def test_max_tokens_and_finish_reason(engine):
    gen = engine.generate("Hello", max_tokens=7).result()
    assert len(gen.tokens) == 7 and gen.finish_reason == "length"
    assert gen.stats.generated == 7


def test_stop_string_cuts_the_text_and_ends_generation(engine):
    full = engine.generate("Once upon a time", max_tokens=40, speculative=False).result().text
    stop = full[10:14]
    gen = engine.generate("Once upon a time", max_tokens=40, stop=[stop]).result()
    assert gen.finish_reason == "stop"
    assert gen.text == full[: full.index(stop)]
    assert stop not in gen.text


def test_stop_helpers():
    assert _find_stop("abc###def", ["###"], 0) == 3
    assert _find_stop("abcdef", ["###"], 0) is None
    assert _partial_stop("abc##", ["###"]) == 2
    assert _partial_stop("abc", ["###"]) == 0


def test_eos_ends_generation_without_emitting_it(tiny_target):
    """An oracle that proposes EOS mid-chain: generation stops there, EOS not in the text."""
    with EdgeEagle(tiny_target, None, k=4) as ee:
        plain = ee.generate("Once", max_tokens=12, speculative=False).result().tokens
        prompt = ee.target.tokenize("Once")
        eog_id = plain[5]  # treat the 6th token as end-of-generation
        orig = ee.target.is_eog
        ee.target.is_eog = lambda t: t == eog_id or orig(t)  # type: ignore[method-assign]
        try:
            ee.drafter = OracleDrafter(prompt + plain)
            gen = ee.generate("Once", max_tokens=12).result()
        finally:
            ee.target.is_eog = orig  # type: ignore[method-assign]
        assert gen.finish_reason == "stop"
        assert gen.tokens == plain[: plain.index(eog_id)]


def test_concurrent_callers_are_serialized(engine):
    expected = {p: engine.generate(p, max_tokens=20).result().tokens for p in ("One", "Two", "Three")}
    results: dict[str, list[int]] = {}

    def worker(p: str) -> None:
        results[p] = engine.generate(p, max_tokens=20).result().tokens

    threads = [threading.Thread(target=worker, args=(p,)) for p in expected for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


def test_same_thread_interleaving_is_refused(engine):
    first = iter(engine.generate("One", max_tokens=20))
    next(first)
    with pytest.raises(EdgeEagleError, match="finish or close"):
        next(iter(engine.generate("Two", max_tokens=5)))
    first.close()  # releases the engine
    assert engine.generate("Two", max_tokens=5).result().finish_reason == "length"


def test_cancel_leaves_a_consistent_state(engine):
    expected = engine.generate("Once upon a time", max_tokens=30).result().tokens
    gen = engine.generate("Once upon a time", max_tokens=30)
    for i, _ in enumerate(gen):
        if i == 4:
            gen.cancel()
    assert gen.finish_reason == "cancelled" and len(gen.tokens) < 30
    gen2 = engine.generate("Once upon a time", max_tokens=30)
    it = iter(gen2)
    next(it)
    gen2.close()
    assert engine.generate("Once upon a time", max_tokens=30).result().tokens == expected


def test_chat_uses_the_targets_template(engine):
    text = engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert "<|im_start|>user\nHi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    gen = engine.chat([{"role": "user", "content": "Hi"}], max_tokens=5).result()
    assert len(gen.tokens) == 5


def test_running_stats_accumulate(engine):
    before = engine.stats.generated
    engine.generate("Hello", max_tokens=6).result()
    assert engine.stats.generated == before + 6
    assert engine.last_stats.generated == 6


def test_cli_generate_json(tiny_target, tiny_drafters):
    proc = cli("generate", "Hello", "--target", str(tiny_target), "--drafter", str(tiny_drafters["eagle3"][0]),
               "-n", "12", "--k", "3", "--json", "--raw")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"]
    for key in ("tau", "drafted", "accepted", "per_position_acceptance", "tokens_per_second"):
        assert key in out["stats"]
    assert out["stats"]["generated_tokens"] == 12


def test_sampling_with_the_eagle_drafter_is_reproducible(engine):
    a = engine.generate("Once upon a time", max_tokens=30, temperature=0.7, seed=11).result()
    b = engine.generate("Once upon a time", max_tokens=30, temperature=0.7, seed=11).result()
    assert a.tokens == b.tokens and len(a.tokens) == 30
    assert a.stats.drafted > 0


def test_drafter_kv_is_no_larger_than_the_targets_context(tiny_target, tiny_drafters):
    from llama_cpp import llama_cpp as C

    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], n_ctx=320) as ee:
        # llama.cpp pads a context to a multiple of 256 cells; the drafter's is never larger
        assert C.llama_n_ctx(ee.drafter.ctx) <= C.llama_n_ctx(ee.target.ctx) <= 512
        # tree sequences share one unified KV of n_ctx cells, not one stream each
        assert C.llama_n_seq_max(ee.drafter.ctx) == 1 + ee.drafter.tree_branch_max
        assert C.llama_n_seq_max(ee.target.ctx) == 1 + ee.target.tree_paths


def test_the_loop_drives_any_draft_policy_through_one_protocol(engine):
    """A policy the library does not know (a schedule of draft lengths) plugs into the loop:
    choose() is asked once per cycle, update() hears what that cycle drafted and accepted."""
    from edge_eagle.policy import DraftPolicy
    from edge_eagle.sampling import Sampler, SamplingParams
    from edge_eagle.speculative import speculate
    from edge_eagle.stats import SpecStats

    class Schedule(DraftPolicy):
        idle_window = None

        def __init__(self, ks):
            self.ks, self.chosen, self.updates = list(ks), [], []

        def choose(self):
            k = self.ks[len(self.chosen) % len(self.ks)]
            self.chosen.append(k)
            return k

        def update(self, drafted, accepted, verify_tokens, verify_s, draft_s):
            self.updates.append((drafted, accepted, verify_tokens))

        def features_needed_soon(self):
            return True

    prompt = engine.target.tokenize("Once upon a time")
    plain = engine.generate(prompt, max_tokens=30, speculative=False).result().tokens
    policy, stats = Schedule([0, 2, 3]), SpecStats()
    out = [t for new, _ in speculate(engine.target, OracleDrafter(prompt + plain), prompt, max_tokens=30,
                                     policy=policy, sampler=Sampler(SamplingParams()), stats=stats) for t in new]
    assert out == plain
    assert len(policy.updates) == len(policy.chosen) == stats.verify_steps
    assert [d for d, _, _ in policy.updates] == stats.k_history
    assert all(d <= k for (d, _, _), k in zip(policy.updates, policy.chosen))
    assert all(a == d and n == d + 1 for d, a, n in policy.updates)  # the oracle is always right
    assert stats.accepted == sum(a for _, a, _ in policy.updates) > 0
