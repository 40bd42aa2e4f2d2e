"""Suffix speculation: the index over the current request and earlier ones, its draft trees, its
memory cap and eviction, the history kept per engine, and lossless output with suffix drafts
as chains and trees."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge_eagle import EdgeEagle
from edge_eagle.errors import EdgeEagleError
from edge_eagle.policy import LOOKUP, DraftPolicy, Plan
from edge_eagle.proposal import Proposal
from edge_eagle.sampling import Sampler, SamplingParams
from edge_eagle.suffix import NativeSuffixIndex, SuffixIndex, native_available, new_index
from tests.test_lossless import PROMPTS, assert_lossless
from tests.test_tree import SIGNIFICANCE, first_two_tokens_pvalue, hold_costs


@pytest.fixture(params=["python", "native"])
def make_index(request):
    """Each index test runs on both implementations: the Python one and the C one."""
    return SuffixIndex if request.param == "python" else NativeSuffixIndex


def test_a_lookup_finds_what_followed_in_earlier_requests_as_a_tree(make_index):
    ix = make_index()
    ix.finish([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    ix.finish([1, 2, 3, 4, 5, 6, 7, 50, 51])
    ix.finish([30, 4, 5, 6, 7, 8, 9, 11])
    d = ix.lookup([20, 21, 4, 5, 6, 7], depth=4, max_nodes=10, max_paths=4)
    assert d.n == 4
    # 8 followed twice (weights 4 + 4), 50 once: the first-choice path first, depth-first
    assert d.first_path == [8, 9, 10] or d.first_path[:2] == [8, 9]
    tokens, parents = d.proposal.tokens, d.proposal.parents
    assert all(p < i for i, p in enumerate(parents))
    assert set(tokens) >= {8, 9, 50, 51} and parents[tokens.index(50)] == -1
    root_shares = [s for s, p in zip(d.shares, parents) if p < 0]
    assert sum(root_shares) == pytest.approx(1.0) and d.shares[0] == max(root_shares)
    chain = ix.lookup([20, 21, 4, 5, 6, 7], depth=4, max_nodes=10, max_paths=1)
    assert chain.proposal.is_chain and list(chain.proposal.tokens) == d.first_path
    assert ix.lookup([99, 98], depth=4, max_nodes=4).n == 0


def test_the_live_text_copies_itself_and_loops(make_index):
    ix = make_index(history=False)
    d = ix.lookup([5, 6, 7, 1, 2, 5, 6, 7], depth=5, max_nodes=5)
    assert d.n == 3 and list(d.proposal.tokens) == [1, 2, 5, 6, 7]
    d = ix.lookup([9, 9, 9, 9], depth=3, max_nodes=3)
    assert list(d.proposal.tokens) == [9, 9, 9]


def test_a_matchs_first_path_equals_its_trees_first_choice_path_without_the_tree(make_index):
    """first_path(match, d), which the controller uses for a lookup it does not draft, is the
    whole tree's first-choice path (most match-length weight at each depth, ties to the newest
    occurrence), cut to d tokens, also for a live text that loops, and as the live text grows."""
    rng = random.Random(7)
    checked = 0
    for trial in range(200):
        ix = make_index(history=trial % 5 != 0)
        for _ in range(rng.randint(0, 6)):
            ix.finish([rng.randrange(6) for _ in range(rng.randint(5, 40))])
        live = [rng.randrange(6) for _ in range(rng.randint(1, 30))]
        for _ in range(3):
            match = ix.match(live)
            whole = ix.lookup(live, depth=8, max_nodes=10_000, max_paths=10_000)
            if match is None:
                assert whole.n == 0
            else:
                assert match.n == min(whole.n, 8)
                for d in (1, 3, 8):
                    assert ix.first_path(match, d) == whole.first_path[:d]
                    checked += 1
            grown = live + [rng.randrange(6) for _ in range(rng.randint(1, 5))]
            ix.observe(grown)  # the live text grows: an earlier match still reads it as it was
            if match is not None:
                assert ix.first_path(match, 8) == whole.first_path
            live = grown
    assert checked > 300


def test_memory_stays_under_the_cap_and_proposals_after_eviction_are_valid(make_index):
    rng = random.Random(0)
    cap = 5_000
    ix = make_index(max_tokens=cap)
    texts = []
    peak_keys = 0
    for i in range(300):
        text = [rng.randrange(400) for _ in range(rng.randint(20, 120))]
        texts.append(text)
        ix.finish(text)
        st = ix.stats()
        assert st["history_tokens"] <= cap
        peak_keys = max(peak_keys, st["keys"])
        if i == 150:  # long after the cap was reached: the bytes held from here on stay level
            held = st["approx_bytes"]
        if i % 25 == 0:  # every proposal continues a text the history still holds
            kept = texts[-st["texts"]:]
            ctx = [*rng.choice(kept)[:10]]
            d = ix.lookup(ctx, depth=4, max_nodes=8, max_paths=4)
            ix.finish(ctx, keep=False)
            for leaf_path in _paths(d.proposal):  # what followed the context's last token somewhere
                assert any(_contains(t, ctx[-1:] + leaf_path) for t in kept + [ctx * 3]), (ctx, leaf_path)
    # the index holds what the kept texts need (6 n-grams per token at most), no stale entries
    assert ix.stats()["entries"] <= 6 * cap and peak_keys <= 6 * (cap + 120)
    assert ix.stats()["approx_bytes"] < 1.25 * held
    ix.reset()
    assert ix.stats()["keys"] == 0 and ix.stats()["history_tokens"] == 0


def _paths(p: Proposal) -> list[list[int]]:
    leaves = [i for i in range(len(p)) if i not in set(p.parents)]
    out = []
    for leaf in leaves:
        path, i = [], leaf
        while i >= 0:
            path.insert(0, p.tokens[i])
            i = p.parents[i]
        out.append(path)
    return out


def _contains(text: list[int], seq: list[int]) -> bool:
    n = len(seq)
    return any(text[i:i + n] == seq for i in range(len(text) - n + 1))


def test_history_is_per_engine_and_can_be_off_or_reset(tiny_target):
    text = "The quick brown fox jumps over the lazy dog and runs into the forest."
    with EdgeEagle(tiny_target, "ngram", n_ctx=256) as a, EdgeEagle(tiny_target, "ngram", n_ctx=256) as b, \
            EdgeEagle(tiny_target, "ngram", n_ctx=256, history=False) as off:
        ids = a.target.tokenize(text)
        for ee in (a, off):
            ee.generate(ids, max_tokens=4, speculative=False).result()
        probe = [7, 7] + ids[3:8]
        assert a.suffix.lookup(probe, 4, 4).n >= 4  # a request's text is in its engine's history
        a.suffix.finish(probe, keep=False)
        for other in (b, off):  # nothing crosses to another engine; history=False keeps none
            assert other.suffix.lookup(probe, 4, 4).n < 4
            other.suffix.finish(probe, keep=False)
        a.generate(ids, max_tokens=4, speculative=False, history=False).result()
        assert a.suffix.stats()["texts"] == 1  # history=False on a request: not added
        a.reset_history()
        assert a.suffix.lookup(probe, 4, 4).n < 4


class _SuffixOnly(DraftPolicy):
    """Every cycle a suffix lookup (tree or chain) from the engine's index."""

    idle_window = None

    def __init__(self, index: SuffixIndex, paths: int):
        self.index, self.paths = index, paths

    def plan(self, tokens):
        d = self.index.lookup(tokens, 6, 10, self.paths)
        return Plan(LOOKUP, len(d.proposal), d.proposal) if len(d.proposal) else Plan()

    def update(self, *args):
        pass

    def features_needed_soon(self):
        return True


@pytest.mark.parametrize("paths", [1, 4])
def test_greedy_output_with_suffix_drafts_equals_plain_decoding(tiny_target, tiny_drafters, paths):
    from edge_eagle.speculative import speculate
    from edge_eagle.stats import SpecStats

    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], n_ctx=512) as ee:
        for prompt in PROMPTS:
            toks = ee.target.tokenize(prompt)
            plain = ee.generate(toks, max_tokens=48, speculative=False).result().tokens
            # history: this answer and a variant that forks from it, so trees branch
            fork = plain[:10] + [t + 1 for t in plain[10:20]]
            ee.suffix.finish(toks + fork)
            stats, out = SpecStats(), []
            for new, _ in speculate(ee.target, ee.drafter, toks, max_tokens=48, policy=_SuffixOnly(ee.suffix, paths),
                                    sampler=Sampler(SamplingParams()), stats=stats):
                out += new
            ee.suffix.finish(toks + out, keep=False)
            assert_lossless(ee.target, toks, plain, out)
            assert stats.accepted > 0 and stats.proposers.get("lookup", 0) > 0


def test_auto_drafts_from_an_earlier_requests_answer(tiny_target, tiny_drafters):
    """The second request for the same text: auto drafts the first answer from the history. A hot
    seeded sample makes the answer varied text that its own earlier tokens cannot predict (the
    tiny target's greedy text loops, on some CPUs more than on others), and the seed makes it
    the same answer with drafts; an engine without the history has nothing to draft it from."""
    sampling = {"temperature": 5.0, "seed": 7}
    stats = {}
    for history in (True, False):
        with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k="auto", n_threads=2, n_ctx=512,
                       history=history) as ee:
            prompt = PROMPTS[1]
            first = ee.generate(prompt, max_tokens=64, speculative=False, **sampling).result().tokens
            assert len(set(first)) > 40  # no loop to copy from
            hold_costs(ee.auto_controller(), {n: 0.001 * (1 + 0.5 * (n - 1)) for n in range(1, 17)})
            gen = ee.generate(prompt, max_tokens=64, **sampling).result()
            assert gen.tokens == first
            stats[history] = gen.stats
    assert stats[True].proposers.get("lookup", 0) > 0 and stats[True].tau > 2.0
    assert stats[False].tau < 1.3


def test_sampled_suffix_trees_draw_exactly_from_the_target(make_index):
    """A suffix-shaped tree (depth-first, the first-choice path first, forks at two depths),
    verified by rejection over siblings: the first two tokens follow p(x1) p(x2 | x1)."""
    ix = make_index()
    for text in ([9, 0, 3, 5], [9, 0, 4], [9, 1, 3], [9, 2, 0]):
        ix.finish(text)
    d = ix.lookup([9], depth=2, max_nodes=8, max_paths=8)
    proposal = d.proposal
    assert not proposal.is_chain and proposal.tokens[0] == 0
    rng = np.random.default_rng(1)
    vocab = 6
    logits = rng.normal(size=(len(proposal) + 1, vocab)).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=0.9, seed=2))
    assert first_two_tokens_pvalue(sampler, logits, proposal) > SIGNIFICANCE


def test_the_native_index_is_built_and_is_the_default():
    assert native_available(), ("the native suffix index was not built: `pip install -e .` compiles "
                                "edge_eagle/_suffix.c (a C compiler is needed)")
    assert type(new_index()) is NativeSuffixIndex
    assert type(new_index(max_occurrences=100)) is SuffixIndex  # beyond what the C index keeps


def test_the_native_index_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("EDGE_EAGLE_NATIVE_SUFFIX", "0")
    assert not native_available() and type(new_index()) is SuffixIndex


def test_the_native_index_finds_what_the_python_index_finds():
    """Random texts from small vocabularies (many matches, forks and loops), requests kept or
    dropped, histories evicted and reset: both indexes hold the same keys and entries and give the
    same matches, splits, continuations, first paths and trees."""
    for seed in range(120):
        rng = random.Random(seed)
        kw = dict(max_tokens=rng.choice([50, 300, 5000]), history=rng.random() > 0.2,
                  max_occurrences=rng.choice([2, 3, 8]), extend_max=rng.choice([8, 32]))
        py, native = SuffixIndex(**kw), NativeSuffixIndex(**kw)
        vocab = rng.choice([3, 6, 50])
        for step in range(50):
            op = rng.random()
            if op < 0.25:
                text, keep = [rng.randrange(vocab) for _ in range(rng.randint(0, 60))], rng.random() > 0.2
                py.finish(text, keep=keep)
                native.finish(text, keep=keep)
            elif op < 0.3:
                py.finish()
                native.finish()
            elif op < 0.32:
                py.reset()
                native.reset()
            else:
                live = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
                for _ in range(rng.randint(1, 5)):
                    a, b = py.match(live), native.match(live)
                    assert a == b, (seed, step)
                    if a is not None and b is not None:
                        assert py.split(a) == native.split(b)
                        for depth in (1, 4, 9):
                            assert py.first_path(a, depth) == native.first_path(b, depth)
                            assert [(m, list(f)) for m, f in py._continuations(a, depth)] == \
                                native._continuations(b, depth)
                        assert py.tree(a, 8, 12, 4) == native.tree(b, 8, 12, 4)
                    live = live + [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
            want, got = py.stats(), native.stats()
            assert {k: want[k] for k in want if k != "approx_bytes"} == \
                {k: got[k] for k in got if k != "approx_bytes"}, (seed, step)


def test_the_native_index_refuses_bad_input_with_clear_errors():
    with pytest.raises(EdgeEagleError, match="2 to 64 occurrences"):
        NativeSuffixIndex(max_occurrences=1)
    with pytest.raises(EdgeEagleError, match="0 tokens or more"):
        NativeSuffixIndex(max_tokens=-1)
    ix = NativeSuffixIndex()
    with pytest.raises(TypeError):
        ix.observe([1, "two", 3])
    with pytest.raises(TypeError):
        ix.observe(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ix._core.split("not a tuple", 3, 1)
    blank = type(ix._core).__new__(type(ix._core))  # never initialised: an error, not a crash
    with pytest.raises(TypeError, match="Index"):
        blank.match([1, 2])
    ix.observe([1, 2, 3, 1, 2])
    assert ix.match([1, 2, 3, 1, 2]) is not None  # the index still works after the errors
