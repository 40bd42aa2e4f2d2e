"""Tree drafting: EAGLE-2-style draft trees verified in one llama.cpp batch through sequence
sets, lossless greedy and sampled, with both KV caches consistent after any accept pattern,
and prompt lookup chosen per cycle by `auto`."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats as scipy_stats

from edge_eagle import EdgeEagle
from edge_eagle.eagle import top_logprobs
from edge_eagle.errors import EdgeEagleError
from edge_eagle.policy import CHAIN, LOOKUP, TREE, DraftPolicy, Plan
from edge_eagle.proposal import Proposal
from edge_eagle.sampling import Sampler, SamplingParams
from edge_eagle.verify import verify_tree
from tests.test_lossless import PROMPTS, assert_lossless

SIGNIFICANCE = 0.001  # the chance that a correct sampler fails a distribution test here


@pytest.fixture(scope="module")
def trained(tiny_target, trained_drafters):
    with EdgeEagle(tiny_target, trained_drafters["eagle3.1"][1], n_ctx=512) as ee:
        yield ee


@pytest.mark.parametrize("n_nodes", [1, 3, 7, 15])
def test_greedy_tree_output_equals_plain_decoding(trained, n_nodes):
    for prompt in PROMPTS:
        toks = trained.target.tokenize(prompt)
        plain = trained.generate(prompt, max_tokens=40, speculative=False).result().tokens
        gen = trained.generate(prompt, max_tokens=40, tree=n_nodes).result()
        assert_lossless(trained.target, toks, plain, gen.tokens)
        s = gen.stats
        assert s.proposers.get("tree", 0) > 0
        assert 1 <= s.tree_nodes_mean <= n_nodes
        assert s.tau == pytest.approx(1 + s.accepted / s.verify_steps)


def test_trees_with_planted_paths_accept_at_every_depth_and_rank(trained):
    """A real EAGLE tree with the true continuation planted on a random path: greedy output
    equals plain decoding exactly, and paths through 2nd and later candidates are accepted."""
    from tests.drafters import OracleOverlay

    inner = trained.drafter
    try:
        for seed, prompt in enumerate(PROMPTS):
            toks = trained.target.tokenize(prompt)
            plain = trained.generate(prompt, max_tokens=48, speculative=False).result().tokens
            trained.drafter = OracleOverlay(inner, toks + plain, seed)
            gen = trained.generate(prompt, max_tokens=48, tree=9).result()
            assert_lossless(trained.target, toks, plain, gen.tokens)
            ranks = gen.stats.accepted_rank_at
            assert len(ranks) >= 2 and any(sum(row[1:]) for row in ranks)
            assert gen.stats.per_position_acceptance[0] > gen.stats.per_position_acceptance[1] > 0
            trained.drafter = inner
    finally:
        trained.drafter = inner


@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1", "norm_before_residual"])
def test_greedy_tree_is_lossless_for_every_drafter_variant(tiny_target, tiny_drafters, variant):
    with EdgeEagle(tiny_target, tiny_drafters[variant][0], n_ctx=512) as ee:
        toks = ee.target.tokenize(PROMPTS[2])
        plain = ee.generate(PROMPTS[2], max_tokens=40, speculative=False).result().tokens
        gen = ee.generate(PROMPTS[2], max_tokens=40, tree=7).result()
        assert_lossless(ee.target, toks, plain, gen.tokens)
        assert gen.stats.tree_nodes_mean > 1  # trees with siblings were verified


def test_tree_nodes_are_what_a_chain_along_their_path_drafts(trained):
    """Each node's children are the drafter's most probable next tokens after the node's path,
    as a chain forced along that path computes them (EAGLE-3.1 norms per node)."""
    d = trained.drafter
    t = trained.target
    prompt = t.tokenize(PROMPTS[0])

    def fresh():
        t.memory.clear()
        d.reset()
        t.set_capture(d.target_layers)
        res = t.prefill(prompt)
        d.ingest(res.features, 0, prompt)
        return prompt + [int(np.argmax(res.logits[-1]))]

    seq = fresh()
    tree = d.propose_tree(seq, 15, depth=4, branch=3, children=5)
    assert not tree.is_chain and max(tree.depths) >= 2
    for node in range(-1, len(tree)):
        kids = [i for i, p in enumerate(tree.parents) if p == node]
        if not kids:
            continue
        path = []
        i = node
        while i >= 0:
            path.insert(0, tree.tokens[i])
            i = tree.parents[i]
        forced = iter(path)
        seq = fresh()
        def choose(lg, forced=forced):  # the path's tokens, then the drafter's own choice
            return next(forced, int(np.argmax(lg))), None

        _, logits = d.propose_with_logits(seq, len(path) + 1, choose=choose)
        row = logits[len(path)].astype(np.float64)
        top = np.argsort(-row)[:5]
        assert len(kids) <= 5
        for kid in kids:
            tok = tree.tokens[kid]
            assert tok in top or row[top[-1]] - row[tok] < 1e-3, f"node {kid} is not a top-5 child of its path"
        assert tree.tokens[kids[0]] == top[0] or row[top[0]] - row[tree.tokens[kids[0]]] < 1e-3


def test_children_are_searched_in_the_draft_vocabulary(trained):
    """The drafter's logits are -inf outside its draft vocabulary (d2t), so searching only those
    ids finds the same children with the same log-probabilities."""
    d, t = trained.drafter, trained.target
    ids = d.draft_ids
    assert ids is not None and len(ids) < t.n_vocab and np.all(np.diff(ids) > 0)
    prompt = t.tokenize(PROMPTS[1])
    t.memory.clear()
    d.reset()
    t.set_capture(d.target_layers)
    res = t.prefill(prompt)
    d.ingest(res.features, 0, prompt)
    _, rows = d.propose_with_logits(prompt + [int(np.argmax(res.logits[-1]))], 3)
    for row in rows:
        outside = np.ones(t.n_vocab, bool)
        outside[ids] = False
        assert np.all(np.isneginf(row[outside]))
        whole, within = top_logprobs(row, 8), top_logprobs(row, 8, ids)
        assert [tok for tok, _ in within] == [tok for tok, _ in whole]
        assert [lp for _, lp in within] == pytest.approx([lp for _, lp in whole], abs=1e-5)


class _Shuffle(DraftPolicy):
    """A random schedule of proposers: plain, chains, trees of several sizes and prompt lookups."""

    idle_window = None

    def __init__(self, seed: int, choices: list[str] | None = None):
        self.rng = random.Random(seed)
        self.choices = choices or ["plain", "chain", "tree", "tree", "lookup"]
        self.kinds: list[str] = []

    def plan(self, tokens):
        choice = self.rng.choice(self.choices)
        self.kinds.append(choice)
        if choice == "chain":
            return Plan(CHAIN, self.rng.randint(1, 5))
        if choice == "tree":
            return Plan(TREE, self.rng.choice([2, 3, 5, 9, 15]))
        if choice == "lookup":
            lookup = list(tokens[-self.rng.randint(1, 6):])  # often wrong: exercises rollback
            return Plan(LOOKUP, len(lookup), Proposal.chain(lookup))
        return Plan()

    def choose(self):
        raise AssertionError("the loop asks plan() when a policy has one")

    def update(self, *args):
        pass

    def features_needed_soon(self):
        return True


def test_both_caches_match_a_fresh_engine_after_a_random_proposer_schedule(tiny_target, trained_drafters):
    from edge_eagle.speculative import speculate
    from edge_eagle.stats import SpecStats
    from tests.drafters import OracleOverlay

    path = trained_drafters["eagle3.1"][1]
    with EdgeEagle(tiny_target, path, n_ctx=512) as ee, EdgeEagle(tiny_target, path, n_ctx=512) as fresh:
        for seed, prompt in enumerate(PROMPTS):
            toks = ee.target.tokenize(prompt)
            plain = ee.generate(prompt, max_tokens=48, speculative=False).result().tokens
            policy = _Shuffle(seed)
            stats = SpecStats()
            out: list[int] = []
            ee.target.memory.clear()  # no prompt-cache reuse: the drafter computes rows from 0, as fresh does
            drafter = OracleOverlay(ee.drafter, toks + plain, seed)
            for new, _ in speculate(ee.target, drafter, toks, max_tokens=48, policy=policy,
                                    sampler=Sampler(SamplingParams()), stats=stats):
                out += new
            assert_lossless(ee.target, toks, plain, out)
            assert {"plain", "chain", "tree", "lookup"} <= set(policy.kinds)
            assert 0 < stats.accepted < stats.drafted
            seq = toks + out
            # the target: sequence 0 holds exactly the committed tokens (all but the last)
            assert ee.target.memory.tokens == seq[:-1]
            got = ee.target.decode([seq[-1]], len(seq) - 1).logits[-1].copy()
            fresh.target.memory.clear()
            fresh.target.set_capture(())
            ref = fresh.target.prefill(seq).logits[-1]
            # rows computed in tree batches differ from a prefill's by float noise (~0.015 here); a
            # rejected node left in sequence 0 would move these logits by whole units
            np.testing.assert_allclose(got, ref, atol=0.05, rtol=0)
            ee.target.memory.remove_from(len(seq) - 1)
            # the drafter: its next drafts equal a fresh drafter's after a prefill of seq
            _, got_logits = ee.drafter.propose_with_logits(seq, 4)
            fresh.drafter.reset()
            fresh.target.memory.clear()
            fresh.target.set_capture(fresh.drafter.target_layers)
            res = fresh.target.prefill(seq[:-1])
            fresh.drafter.ingest(res.features, 0, seq[:-1])
            _, ref_logits = fresh.drafter.propose_with_logits(seq, 4)
            # likewise for the drafter (~0.01 here): a stale or missing row would move its logits
            # by whole units (measured: 0.4-2.8 when its first rows are missing)
            for a, b in zip(got_logits, ref_logits, strict=True):
                np.testing.assert_allclose(a, b, atol=0.03, rtol=0)


def _chi2_pvalue(counts: dict, probs: dict) -> float:
    keys = [k for k in probs if probs[k] > 0]
    assert set(counts) <= set(keys), "a token the target cannot sample was emitted"
    n = sum(counts.values())
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([probs[k] * n for k in keys])
    return float(scipy_stats.chisquare(observed, expected / expected.sum() * n).pvalue)


def test_tree_rejection_sampling_draws_exactly_from_the_target():
    """verify_tree on a fixed two-level tree with siblings: the first two emitted tokens
    follow p(x1) p(x2 | x1) exactly (chi-square, significance 0.001, 40,000 draws)."""
    rng = np.random.default_rng(0)
    vocab = 6
    # nodes: 0:a(root) 1:b(root) 2:c(root) 3:a->d 4:a->e 5:b->f
    proposal = Proposal((0, 1, 2, 3, 4, 5), (-1, -1, -1, 0, 0, 1))
    logits = rng.normal(size=(len(proposal) + 1, vocab)).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=0.8, seed=1))
    assert first_two_tokens_pvalue(sampler, logits, proposal) > SIGNIFICANCE


def first_two_tokens_pvalue(sampler: Sampler, logits: np.ndarray, proposal: Proposal, draws: int = 40_000) -> float:
    """verify_tree `draws` times on one tree (its roots' rows hold the target's next
    distribution): the chi-square p-value of the first two emitted tokens against p(x1) p(x2 | x1)."""
    vocab = logits.shape[-1]
    p_root = sampler.probs(logits[0])
    row_of = {proposal.tokens[i]: i + 1 for i, p in enumerate(proposal.parents) if p < 0}
    counts: dict = {}
    for _ in range(draws):
        path, bonus, _ = verify_tree(sampler, logits, proposal)
        emitted = [proposal.tokens[i] for i in path] + [bonus]
        key = tuple(emitted[:2]) if len(emitted) > 1 else (emitted[0], None)
        counts[key] = counts.get(key, 0) + 1
    probs: dict = {}
    for x1 in range(vocab):
        if x1 in row_of:  # a drafted first token: the second comes from its node's row
            p2 = sampler.probs(logits[row_of[x1]])
            for x2 in range(vocab):
                probs[(x1, x2)] = p_root[x1] * p2[x2]
        else:  # the bonus token ends the cycle
            probs[(x1, None)] = p_root[x1]
    return _chi2_pvalue(counts, probs)


def test_sampled_tree_generation_follows_the_target_distribution(tiny_target, trained_drafters):
    """End to end on the tiny model: the second token (the first one a tree cycle emits) has
    the target's distribution p(t2) = sum over t1 of p(t1) p(t2 | t1) (top-k 3, T = 1.5)."""
    prompt = PROMPTS[0]
    params = dict(temperature=1.5, top_k=3)
    with EdgeEagle(tiny_target, trained_drafters["eagle3.1"][1], n_ctx=256) as ee:
        t = ee.target
        toks = t.tokenize(prompt)
        sampler = Sampler(SamplingParams(**params))
        t.memory.clear()
        t.set_capture(())
        p1 = sampler.probs(t.prefill(toks).logits[-1].copy())
        p2 = np.zeros_like(p1)
        for t1 in np.flatnonzero(p1):
            t.memory.clear()
            p2 += p1[t1] * sampler.probs(t.prefill(toks + [int(t1)]).logits[-1].copy())
        counts: dict = {}
        trees = 0
        for seed in range(1500):
            gen = ee.generate(toks, max_tokens=4, tree=7, seed=seed, **params).result()
            counts[gen.tokens[1]] = counts.get(gen.tokens[1], 0) + 1
            trees += gen.stats.proposers.get("tree", 0)
        assert trees >= 1500
        assert _chi2_pvalue(counts, {i: float(p) for i, p in enumerate(p2) if p > 0}) > SIGNIFICANCE


def test_tree_needs_an_eagle_drafter(tiny_target):
    with pytest.raises(EdgeEagleError, match="needs an EAGLE drafter"):
        EdgeEagle(tiny_target, "ngram", tree=7)
    with EdgeEagle(tiny_target, None) as ee:
        with pytest.raises(EdgeEagleError, match="needs an EAGLE drafter"):
            ee.generate("hi", tree=3)


def hold_costs(ctl, verify_s: dict[int, float]) -> None:
    """Give auto these batch seconds at every context and keep them, trusted: this machine's own
    times and its calibration's context slopes differ from run to run and from machine to machine."""
    ctl.costs.verify_s, ctl.costs.slope_s = verify_s, {}
    ctl.costs.observe_verify = lambda n, s: None
    ctl._observe_cost = lambda predicted, seconds: None


def test_auto_copies_with_prompt_lookup_where_the_text_repeats(tiny_target, tiny_drafters):
    """The tiny model's greedy text falls into loops: auto notices from its shadow lookups
    (scored for free on every cycle) and verifies lookup drafts there, losslessly."""
    # fixed threads: no thread change may re-measure the injected costs
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k="auto", n_threads=2) as ee:
        prompt = "Once upon a time"
        plain = ee.generate(prompt, max_tokens=120, speculative=False).result().tokens
        assert len(set(plain[60:])) < 20  # it loops
        # c(n) = 1 + (n-1)/2, held there, as on hardware where batches are cheap
        hold_costs(ee.auto_controller(), {n: 0.001 * (1 + 0.5 * (n - 1)) for n in range(1, 10)})
        gen = ee.generate(prompt, max_tokens=120).result()
        assert_lossless(ee.target, ee.target.tokenize(prompt), plain, gen.tokens)
        s = gen.stats
        assert s.proposers.get("lookup", 0) > 5 and s.accepted / s.drafted > 0.8
        assert s.tau > 2.0


def test_auto_weighs_trees_on_memory_bound_costs(tiny_target, trained_drafters):
    """With batch costs like a GPU's (c(n) = 1), auto drafts trees; greedy output stays plain."""
    with EdgeEagle(tiny_target, trained_drafters["eagle3.1"][1], k="auto", n_ctx=512, n_threads=2) as ee:
        plain = ee.generate(PROMPTS[1], max_tokens=60, speculative=False).result().tokens
        ctl = ee.auto_controller()
        assert ctl.tree_sizes
        hold_costs(ctl, {n: 0.001 for n in range(1, 17)})
        ctl.costs.draft_step_s = 0.00001
        ctl.lookup = None
        gen = ee.generate(PROMPTS[1], max_tokens=60).result()
        assert_lossless(ee.target, ee.target.tokenize(PROMPTS[1]), plain, gen.tokens)
        assert gen.stats.proposers.get("tree", 0) > 0


@pytest.mark.smollm
@pytest.mark.parametrize("n_nodes", [7, 15])
def test_smollm_greedy_trees_equal_plain_decoding(smollm, n_nodes):
    """The real target and the shipped drafter: trees with siblings at several depths, and
    the output of plain decoding (within the near-tie rule)."""
    from edge_eagle.defaults import default_drafter

    questions = ["List three colours of the rainbow, one per line.", "Name the planets of the solar system.",
                 "Write a haiku about the sea."]
    with EdgeEagle(smollm, default_drafter(), n_ctx=1024) as ee:
        ranks = []
        for q in questions:
            prompt = ee.apply_chat_template([{"role": "user", "content": q}])
            toks = ee.target.tokenize(prompt, add_special=False)
            plain = ee.generate(toks, max_tokens=48, speculative=False).result().tokens
            gen = ee.generate(toks, max_tokens=48, tree=n_nodes).result()
            assert_lossless(ee.target, toks, plain, gen.tokens)
            assert gen.stats.tree_nodes_mean > 4
            ranks += gen.stats.accepted_rank_at[:1]
        assert any(sum(row[1:]) for row in ranks)  # a 2nd or later candidate was accepted
