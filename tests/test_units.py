"""Small components: the GGUF reader, the metric definitions, the samplers, the n-gram drafter."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from scipy import stats as st

from edge_eagle.drafter import NgramDrafter
from edge_eagle.errors import ModelFileError
from edge_eagle.gguf_file import read_gguf
from edge_eagle.policy import DraftPolicy, Fixed
from edge_eagle.proposal import Proposal
from edge_eagle.sampling import Sampler, SamplingParams
from edge_eagle.stats import SpecStats
from edge_eagle.verify import verify

# --- GGUF reader -------------------------------------------------------------------------

def test_reader_matches_gguf_py(tiny_drafters):
    from gguf import GGUFReader

    path = tiny_drafters["eagle3.1"][0]
    ours, theirs = read_gguf(path), GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        assert ours.tensors[t.name].shape == tuple(int(x) for x in t.shape)
        assert ours.tensors[t.name].offset == t.data_offset
    assert ours.value("tokenizer.ggml.tokens") == [bytes(theirs.fields["tokenizer.ggml.tokens"].parts[i]).decode()
                                                   for i in theirs.fields["tokenizer.ggml.tokens"].data]
    assert list(ours.meta["eagle3.target_layers"]) == [2, 4, 5]


def test_fingerprint_depends_on_the_token_list(tiny_target, tiny_drafters):
    assert read_gguf(tiny_target).vocab_fingerprint() == read_gguf(tiny_drafters["eagle3"][0]).vocab_fingerprint()


@pytest.mark.parametrize("patch", [
    (4, struct.pack("<I", 99)),  # version
    (8, struct.pack("<Q", 2**40)),  # tensor count
    (16, struct.pack("<Q", 2**40)),  # kv count
    (24, struct.pack("<Q", 2**50)),  # first key length
])
def test_reader_rejects_corrupt_headers(tmp_path, tiny_drafters, patch):
    data = bytearray(tiny_drafters["eagle3"][0].read_bytes())
    off, raw = patch
    data[off:off + len(raw)] = raw
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError):
        read_gguf(bad)


# --- metrics -----------------------------------------------------------------------------

def test_metric_definitions():
    s = SpecStats()
    s.record_step(3, 3)  # all accepted
    s.record_step(3, 1)  # first accepted
    s.record_step(2, 0)
    s.record_step(0, 0)  # a plain step
    assert s.tau == pytest.approx(1 + 4 / 4)
    assert s.acceptance_rate == pytest.approx(4 / 8)
    assert s.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    total = SpecStats()
    total.merge(s)
    total.merge(s)
    assert total.per_position_acceptance == pytest.approx(s.per_position_acceptance)
    assert total.drafted == 16


# --- sampling ----------------------------------------------------------------------------

def test_greedy_verify():
    logits = np.zeros((4, 10), np.float32)
    for row, best in enumerate([3, 5, 7, 1]):
        logits[row, best] = 1.0
    s = Sampler(SamplingParams())
    assert verify(s, logits, Proposal.chain([3, 5, 7])) == (3, 1)
    assert verify(s, logits, Proposal.chain([3, 4, 7])) == (1, 5)
    assert verify(s, logits[:1], Proposal.chain([])) == (0, 3)


def test_top_k_counts_only_the_tokens_a_grammar_or_bias_leaves():
    """top_k keeps the k best of the finite logits; on a row that is mostly -inf (a grammar, a
    banned-token bias) it keeps every finite one when there are k or fewer."""
    rng = np.random.default_rng(5)
    row = np.full(1000, -np.inf, np.float32)
    live = rng.choice(1000, 30, replace=False)
    row[live] = rng.standard_normal(30).astype(np.float32)
    for k, kept in ((10, 10), (30, 30), (40, 30), (1, 1)):
        z = Sampler(SamplingParams(temperature=0.7, top_k=k)).log_weights(row)
        finite = np.flatnonzero(np.isfinite(z))
        assert len(finite) == kept
        best = live[np.argsort(-row[live], kind="stable")[:kept]]
        assert set(finite.tolist()) == set(best.tolist())


def test_speculative_sampling_preserves_the_target_distribution():
    """Chi-square test, 40k draws, p > 1e-3 required: the first emitted token after a
    (deterministic) draft d follows p exactly, whether d is likely or not."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 12)).astype(np.float32) * 1.5
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.95, seed=1)
    sampler = Sampler(params)
    p = sampler.probs(logits[0])
    for draft in (int(np.argmax(p)), int(np.argsort(p)[-4])):
        counts = np.zeros(12)
        for _ in range(40_000):
            n_acc, nxt = verify(sampler, logits, Proposal.chain([draft]))
            counts[draft if n_acc == 1 else nxt] += 1
        support = p > 0
        assert counts[~support].sum() == 0
        assert st.chisquare(counts[support], p[support] * counts.sum()).pvalue > 1e-3


def test_speculative_sampling_with_sampled_drafts_preserves_the_target_distribution():
    """Drafts drawn from a different q: accept with min(1, p/q), else sample max(p - q, 0).
    Chi-square over 40k draws of the first emitted token, p > 1e-3 required; and the
    acceptance rate is sum(min(p, q)), above sample-and-match's sum(p * q)."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((2, 12)) * 1.5).astype(np.float32)
    draft_logits = logits[0] + rng.standard_normal(12).astype(np.float32)  # a decent but imperfect drafter
    sampler = Sampler(SamplingParams(temperature=0.7, seed=4))
    p, q = sampler.probs(logits[0]), sampler.probs(draft_logits)
    counts, accepted = np.zeros(12), 0
    n = 40_000
    for _ in range(n):
        d, q_used = sampler.draft(draft_logits)
        n_acc, nxt = verify(sampler, logits, Proposal.chain([d], [q_used]))
        accepted += n_acc
        counts[d if n_acc == 1 else nxt] += 1
    assert st.chisquare(counts, p * n).pvalue > 1e-3
    assert abs(accepted / n - np.minimum(p, q).sum()) < 0.01
    assert np.minimum(p, q).sum() > (p * q).sum()


# --- prompt lookup -----------------------------------------------------------------------

def test_ngram_drafter_copies_what_followed_the_last_match():
    d = NgramDrafter(max_ngram=3)
    assert d.propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 3).tokens == (4, 5, 9)
    assert d.propose([7, 8, 9], 3).tokens == ()
    assert d.propose([5, 6, 5], 2).tokens == (6, 5)
    # inside a loop the copy runs into the end of the text and goes on as the loop would
    assert d.propose([1, 2, 1, 2], 5).tokens == (1, 2, 1, 2, 1)
    assert d.lookup([9, 1, 2, 3, 4, 1, 2, 3], 2) == (3, [4, 1])
    # a match of max_ngram tokens reports its real length (copying goes far back)
    assert d.lookup([7, 5, 6, 1, 2, 3, 9, 5, 6, 1, 2, 3], 2) == (5, [9, 5])


def _lookup_by_search(seq, k, max_ngram=3, extend_max=32):
    """The definition of NgramDrafter.lookup, by brute-force search."""
    length = len(seq)
    for n in range(min(max_ngram, length - 1), 0, -1):
        hits = [h for h in range(length - n) if seq[h:h + n] == seq[length - n:]]
        if hits:
            hit, start = hits[-1], hits[-1] + n
            if n == max_ngram:
                while n < extend_max and hit > 0 and seq[hit - 1] == seq[length - n - 1]:
                    hit, n = hit - 1, n + 1
            return n, [seq[start + j % (length - start)] for j in range(k)]
    return 0, []


def test_ngram_index_grows_with_the_sequence_and_matches_a_full_search():
    import random

    rng = random.Random(0)
    for _ in range(100):
        d = NgramDrafter()
        seq = [rng.randrange(5) for _ in range(3)]
        for _ in range(40):  # the loop only appends
            assert d.lookup(seq, 5) == _lookup_by_search(seq, 5)
            seq += [rng.randrange(5) for _ in range(rng.randint(1, 3))]
        other = [rng.randrange(5) for _ in range(25)]  # a new request: indexed anew
        assert d.lookup(other, 4) == _lookup_by_search(other, 4)


# --- proposals and policies ----------------------------------------------------------------

def test_a_chain_proposal_is_a_tree_of_single_children():
    p = Proposal.chain([5, 6, 7])
    assert p.parents == (-1, 0, 1) and p.depths == (1, 2, 3) and p.is_chain and len(p) == 3
    assert p.truncated(2) == Proposal.chain([5, 6])
    tree = Proposal((5, 6, 8, 9), (-1, 0, 0, 2))  # 5 -> {6, 8 -> 9}
    assert tree.depths == (1, 2, 2, 3) and not tree.is_chain
    with pytest.raises(ValueError):
        Proposal((5, 6), (-1, 1))  # a node cannot be its own parent
    with pytest.raises(ValueError):
        Proposal.chain([5, 6], [np.ones(3)])  # one q per draft
    with pytest.raises(ValueError, match="tree"):
        verify(Sampler(SamplingParams()), np.zeros((5, 10), np.float32), tree)


def test_fixed_policy():
    assert isinstance(Fixed(3), DraftPolicy)
    assert Fixed(3).choose() == 3 and Fixed(3).features_needed_soon()
    assert Fixed(0).choose() == 0 and not Fixed(0).features_needed_soon()
    with pytest.raises(ValueError):
        Fixed(-1)


def test_a_long_running_stats_history_stays_bounded_while_its_counts_stay_whole():
    from edge_eagle.stats import K_HISTORY_KEEP, SpecStats

    total = SpecStats()
    for _ in range(40):
        s = SpecStats()
        for i in range(500):
            s.record_step(i % 4, min(i % 4, 1))
        total.merge(s)
    steps = 40 * 500
    assert K_HISTORY_KEEP <= len(total.k_history) <= 2 * K_HISTORY_KEEP < steps
    assert total.k_history[-4:] == [0, 1, 2, 3]  # the newest steps, in order
    assert total.verify_steps == steps and total.draft_steps == 40 * 375
    assert total.k_mean == 1.5  # over every step, not only the kept ones


def test_per_position_counts_match_their_definition_over_random_steps():
    """drafted_at[i] counts the steps that reached position i, accepted_at[i] those whose draft i was
    accepted, accepted_rank_at[d][r] the accepted depth-d nodes of rank r; checked against the
    definitions over random chain, tree and plain steps (long ones included)."""
    import random

    from edge_eagle.stats import SpecStats

    rng = random.Random(5)
    s, steps = SpecStats(), []
    for _ in range(3000):
        kind = rng.choice(["plain", "chain", "tree", "lookup"])
        drafted = 0 if kind == "plain" else rng.randint(1, 90)
        depth = rng.randint(1, min(drafted, 70)) if kind == "tree" else drafted
        accepted = rng.randint(0, depth)
        ranks = [rng.randint(0, 5) for _ in range(accepted)] if kind == "tree" else []
        s.record_step(drafted, accepted, kind, depth, ranks)
        steps.append((drafted, accepted, depth, ranks))
    reach = max(d for _, _, d, _ in steps)
    assert s.drafted_at == [sum(d > i for _, _, d, _ in steps) for i in range(reach)]
    assert s.accepted_at == [sum(a > i for _, a, _, _ in steps) for i in range(reach)]
    assert s.draft_steps == sum(d > 0 for d, _, _, _ in steps)
    deepest = max(len(r) for *_, r in steps)
    for d in range(deepest):
        seen = [r[d] for *_, r in steps if len(r) > d]
        assert s.accepted_rank_at[d] == [seen.count(k) for k in range(max(seen) + 1)]


def test_penalties_follow_llama_cpps_formula():
    """repeat: a positive logit divided, a negative one multiplied; frequency: minus count x
    value; presence: minus the value once; only over the last penalty_last_n tokens."""
    logits = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.5, penalty_last_n=3))
    out = s.adjust(logits, [3, 0, 1, 1])  # the window is [0, 1, 1]: token 3 is too old
    assert out.tolist() == pytest.approx([2.0 / 2 - 0.1 - 0.5, -1.0 * 2 - 0.2 - 0.5, 0.5, 3.0])
    assert s.adjust(logits, []) is logits and Sampler(SamplingParams()).adjust(logits, [0]) is logits
