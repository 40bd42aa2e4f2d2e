"""Seeded sampling (sampling.py): with a seed, the sampled text is the same whatever k, tree
or proposer runs, and the same as plain decoding with that seed; the tokens still follow the
target's distribution exactly."""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle import EdgeEagle
from edge_eagle.proposal import Proposal
from edge_eagle.sampling import Sampler, SamplingParams
from edge_eagle.verify import verify
from tests.drafters import OracleDrafter

PROMPTS = ["Once upon a time", "The sea was", "In the beginning the"]


@pytest.mark.parametrize("temperature,top_p", [(0.8, 1.0), (1.2, 0.9)])
def test_a_seed_fixes_the_text_whatever_speculation_runs(tiny_target, tiny_drafters, temperature, top_p):
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], n_ctx=256) as ee:
        for prompt in PROMPTS:
            args = dict(max_tokens=40, temperature=temperature, top_p=top_p, seed=7)
            plain = ee.generate(prompt, speculative=False, **args).result().tokens
            for kw in ({"k": 0}, {"k": 1}, {"k": 3}, {"k": 5}, {"k": "auto"}, {"tree": 5}, {"k": 3, "p_min": 0.3}):
                assert ee.generate(prompt, **args, **kw).result().tokens == plain, kw
            other = ee.generate(prompt, speculative=False, **{**args, "seed": 8}).result().tokens
            assert other != plain  # the seed matters


def test_a_drafter_that_knows_the_seeded_text_has_every_draft_accepted(tiny_target):
    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        args = dict(max_tokens=40, temperature=0.9, seed=11)
        plain = ee.generate(PROMPTS[0], **args).result()
        prompt_ids = ee.target.tokenize(PROMPTS[0])
    with EdgeEagle(tiny_target, OracleDrafter(prompt_ids + plain.tokens), k=4, n_ctx=256) as ee:
        spec = ee.generate(PROMPTS[0], **args).result()
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > 0 and spec.stats.accepted == spec.stats.drafted


def test_seeded_samples_follow_the_target_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    counts = np.zeros(4)
    for seed in range(4000):
        counts[Sampler(SamplingParams(temperature=1.0, seed=seed)).sample(logits, pos=17)] += 1
    freq = counts / counts.sum()
    assert np.abs(freq - [0.5, 0.3, 0.15, 0.05]).max() < 0.03
    top_p = Sampler(SamplingParams(temperature=1.0, top_p=0.7, seed=1))
    picks = {Sampler(SamplingParams(temperature=1.0, top_p=0.7, seed=s)).sample(logits, pos=3) for s in range(300)}
    assert picks == {0, 1} and top_p.probs(logits)[2:].sum() == 0


def test_seeded_verification_accepts_exactly_the_drafts_that_equal_the_seeded_samples():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50))
    s = Sampler(SamplingParams(temperature=0.7, seed=5))
    truth = [s.sample_at(logits[i], 20 + i) for i in range(4)]
    assert verify(s, logits, Proposal.chain(truth[:3]), pos=20) == (3, truth[3])
    wrong = [truth[0], (truth[1] + 1) % 50, truth[2]]
    assert verify(s, logits, Proposal.chain(wrong), pos=20) == (1, truth[1])
    assert verify(s, logits, Proposal.chain([]), pos=20) == (0, truth[0])
    draws = s.drafter_at(20)
    assert [draws(logits[i])[0] for i in range(4)] == truth  # the drafter uses the same noise
