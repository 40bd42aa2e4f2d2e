"""Prompt-cache reuse: a request reuses the target's and the drafter's KV for the longest common
token prefix with the previous one, and the result is what a fresh prefill gives."""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle import EdgeEagle
from tests.test_lossless import assert_lossless

BASE = "The quick brown fox jumps over the lazy dog, and then"


class _Recorder:
    """Wraps an engine's EAGLE drafter: keeps the drafter's logits of every proposal."""

    def __init__(self, ee):
        self.logits: list[np.ndarray] = []
        drafter = ee.drafter

        def propose(tokens, k, p_min=0.0, choose=None):
            proposal, logits = drafter.propose_with_logits(tokens, k, p_min, choose)
            self.logits.extend(row.copy() for row in logits)
            return proposal

        drafter.propose = propose
        drafter.native_cycle = lambda target, steps: None  # the native cycle does not expose the drafter's logits


@pytest.fixture(scope="module")
def engines(tiny_target, trained_drafters):
    path = trained_drafters["eagle3.1"][1]  # a trained drafter: its drafts depend on its context
    warm = EdgeEagle(tiny_target, path, k=3, n_ctx=512)
    warm.recorder = _Recorder(warm)
    yield warm, lambda: EdgeEagle(tiny_target, path, k=3, n_ctx=512)
    warm.close()


def _fresh(make, prompt, **kw):
    ee = make()
    rec = _Recorder(ee)
    try:
        gen = ee.generate(prompt, **kw).result()
        gen.drafter_logits = rec.logits
        return gen
    finally:
        ee.close()


def _assert_same_drafts(warm, got, ref):
    logits = warm.recorder.logits[-len(ref.drafter_logits):] if ref.drafter_logits else []
    assert len(ref.drafter_logits) > 3
    assert (got.stats.k_history, got.stats.accepted) == (ref.stats.k_history, ref.stats.accepted)
    for a, b in zip(logits, ref.drafter_logits):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)


def test_shared_prefix_is_reused_and_output_and_drafts_match_a_fresh_prefill(engines):
    warm, make = engines
    warm.recorder.logits.clear()
    first = warm.generate(BASE + " it ran away.", max_tokens=24).result()
    assert first.stats.prompt_cached == 0  # nothing held yet
    second_prompt = BASE + " it slept all day."
    second = warm.generate(second_prompt, max_tokens=24).result()
    ref = _fresh(make, second_prompt, max_tokens=24)
    assert second.text == ref.text and second.tokens == ref.tokens
    lcp = 0
    a, b = warm.target.tokenize(BASE + " it ran away."), warm.target.tokenize(second_prompt)
    while a[lcp] == b[lcp]:
        lcp += 1
    # the feature drafter needs the features of the last shared token again: one token less is reused
    assert second.stats.prompt_cached == lcp - 1 > 5
    assert second.stats.to_dict()["prompt_prefilled_tokens"] == len(b) - (lcp - 1)
    # the drafter kept its rows for the prefix: it drafts exactly what it drafts after a fresh prefill
    _assert_same_drafts(warm, second, ref)


def test_a_continuation_reuses_the_whole_previous_exchange(engines):
    warm, make = engines
    first = warm.generate(BASE, max_tokens=16).result()
    prompt = warm.target.tokenize(BASE) + first.tokens + warm.target.tokenize(" Next,", add_special=False)
    second = warm.generate(prompt, max_tokens=16).result()
    # everything the first request left in the KV is reused: its prompt and all but its last token
    assert second.stats.prompt_cached >= len(warm.target.tokenize(BASE)) + len(first.tokens) - 2
    assert second.tokens == _fresh(make, prompt, max_tokens=16).tokens


def test_a_plain_request_in_between_does_not_leave_the_drafter_stale(engines):
    """The drafter's rows are for another prompt: it must not reuse them. The target's prefix
    is still reused; the drafter restarts at the first prefilled row (as after a pause in auto)."""
    warm, make = engines
    warm.generate(BASE + " one", max_tokens=12).result()  # drafter rows for this prompt
    warm.generate("Something else entirely, about rivers", max_tokens=12, speculative=False).result()
    prompt = "Something else entirely, about mountains"
    kept = []
    keep = warm.drafter.keep
    warm.drafter.keep = lambda tokens, n: kept.append(keep(tokens, n)) or kept[-1]
    try:
        got = warm.generate(prompt, max_tokens=20).result()
    finally:
        del warm.drafter.keep
    assert kept == [0] and got.stats.prompt_cached > 0
    assert got.tokens == _fresh(make, prompt, max_tokens=20).tokens
    assert got.stats.drafted > 0


def test_cancelled_request_leaves_a_cache_the_next_one_can_reuse(engines):
    warm, make = engines
    gen = warm.generate(BASE + " it ran", max_tokens=40)
    for i, _ in enumerate(gen):
        if i == 5:
            gen.cancel()
    assert gen.finish_reason == "cancelled"
    got = warm.generate(BASE + " it ran far", max_tokens=20).result()
    assert got.stats.prompt_cached > 0
    assert got.tokens == _fresh(make, BASE + " it ran far", max_tokens=20).tokens


@pytest.mark.smollm
def test_chat_turns_reuse_the_conversation_on_smollm(smollm):
    with EdgeEagle(smollm, "default", k=3, n_ctx=2048) as ee:
        msgs = [{"role": "user", "content": "Name three colours."}]
        one = ee.chat(msgs, max_tokens=24).result()
        msgs += [{"role": "assistant", "content": one.text}, {"role": "user", "content": "And three fruits?"}]
        two = ee.chat(msgs, max_tokens=24).result()
        n_first = len(ee.target.tokenize(ee.apply_chat_template(msgs[:1]), add_special=False))
        assert two.stats.prompt_cached >= n_first
    # what a fresh engine's plain decoding gives for the whole conversation; the cached turn's
    # speculative answer equals it, or parts from it at a numerical tie only (batch shapes differ:
    # the cached turn prefilled just its new tokens)
    with EdgeEagle(smollm, "default", k=3, n_ctx=2048) as fresh:
        plain = fresh.chat(msgs, max_tokens=24, speculative=False).result()
        assert_lossless(fresh.target, plain._prompt, list(plain.tokens), list(two.tokens))
