"""The auto-k controller: k = 0 when drafts are always rejected, a large k when they are
always accepted; and the engine's "auto" mode stays lossless."""

from __future__ import annotations

import pytest

from edge_eagle import EdgeEagle
from edge_eagle.controller import AcceptanceModel, KController
from edge_eagle.costs import CostModel
from edge_eagle.policy import CHAIN, Plan
from edge_eagle.suffix import SuffixDraft
from tests.drafters import OracleDrafter


def _gpu_like_costs() -> CostModel:
    c = CostModel()
    for n in range(1, 10):
        c.verify_s[n] = 0.010 * (1 + 0.05 * (n - 1))  # a batch of up to 9 costs about one token
    c.draft_step_s = 0.001
    return c


def _cpu_like_costs() -> CostModel:
    c = CostModel()
    for n, rel in zip(range(1, 10), [1, 1.90, 2.36, 2.80, 3.66, 4.0, 4.3, 4.69, 5.2]):  # NOTES §5, SmolLM2
        c.verify_s[n] = 0.0066 * rel
    c.draft_step_s = 0.0015
    return c


def _run(controller: KController, accept_all: bool, cycles: int = 400) -> list[int]:
    chosen = []
    for _ in range(cycles):
        k = controller.choose()
        chosen.append(k)
        controller.acceptance.observe(k, k if accept_all else 0)
    return chosen


def test_always_rejected_drafts_lead_to_plain_decoding():
    for costs in (_gpu_like_costs(), _cpu_like_costs()):
        chosen = _run(KController(k_max=8, costs=costs), accept_all=False)
        tail = chosen[100:]
        assert tail.count(0) / len(tail) > 0.95  # only the occasional 1-token probe
        assert max(tail) <= 1


def test_always_accepted_drafts_lead_to_a_large_k_where_batches_are_cheap():
    chosen = _run(KController(k_max=8, costs=_gpu_like_costs()), accept_all=True)
    assert min(chosen[-50:]) >= 7


def test_compute_bound_costs_need_high_acceptance_to_speculate():
    c = KController(k_max=8, costs=_cpu_like_costs())
    c.acceptance = AcceptanceModel(8, prior=0.5)
    assert c.best_k() == 0  # coin-flip drafts do not pay when k drafts cost ~k decodes
    c.acceptance = AcceptanceModel(8, prior=0.98)
    assert c.best_k() > 0


def test_best_k_is_the_argmax_of_the_modelled_speedup():
    for costs in (_cpu_like_costs(), _gpu_like_costs()):
        for prior in (0.2, 0.5, 0.8, 0.95, 0.99):
            c = KController(costs=costs, acceptance=AcceptanceModel(8, prior=prior))
            best = max(range(9), key=c.speedup)
            assert c.best_k() == (best if c.speedup(best) >= 1 + c.margin else 0)


def test_expected_tokens_and_cost_follow_the_formula():
    a = AcceptanceModel(3, prior=0.5)
    assert a.expected_tokens(3) == 1 + 0.5 + 0.25 + 0.125
    costs = _cpu_like_costs()
    assert abs(costs.cost(2) - (2.36 + 2 * 0.0015 / 0.0066)) < 1e-9


def test_auto_mode_is_lossless_and_adapts(tiny_target):
    with EdgeEagle(tiny_target, None, k="auto") as ee:
        plain = ee.generate("Once upon a time", max_tokens=60, speculative=False).result().tokens
        prompt = ee.target.tokenize("Once upon a time")
        ee.drafter = OracleDrafter(prompt + plain)
        gen = ee.generate("Once upon a time", max_tokens=60).result()
        assert gen.tokens == plain
        assert ee.controller is not None and ee.controller.costs.verify_s.get(1)
        ee.drafter = OracleDrafter(prompt + plain, corrupt_every=1, vocab_size=ee.target.n_vocab)
        ee.controller.acceptance = AcceptanceModel(ee.k_max, prior=0.5)
        for _ in range(3):
            gen = ee.generate("Once upon a time", max_tokens=60).result()
            assert gen.tokens == plain
        # always-wrong drafts: no chains beyond a probe (prompt lookup may still copy the tiny model's loops)
        assert gen.stats.proposers.get("chain", 0) <= 1


def test_auto_captures_features_only_near_a_draft_and_stays_lossless(tiny_target, tiny_drafters):
    """While auto decodes plainly, target features are captured (and fed to the drafter) only in
    the idle window before the next probe; the drafter restarts there, and output stays
    exactly plain decoding."""
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k="auto") as ee:
        plain = ee.generate("Once upon a time", max_tokens=120, speculative=False).result().tokens
        ctl = ee.auto_controller()
        ctl.acceptance = AcceptanceModel(ee.k_max, prior=0.0)  # drafts look worthless: plain decoding
        ctl.probe_every, ctl.idle_window = 30, 5
        ctl.lookup = None  # the tiny model's loops would be copied by prompt lookup instead of probed
        switches = []
        set_capture = ee.target.set_capture
        ee.target.set_capture = lambda ids: (switches.append(tuple(ids)), set_capture(ids))[1]
        gen = ee.generate("Once upon a time", max_tokens=120).result()
        assert gen.tokens == plain
        assert gen.stats.drafted >= 2  # the probes ran, from restarted drafter windows
        offs = sum(1 for s in switches if s == ())
        assert offs >= 3 and any(s for s in switches[1:]), switches  # off between probes, on before them


def test_a_request_starts_capturing_only_when_a_draft_may_come_soon(tiny_target, tiny_drafters):
    """Each switch of the capture makes llama.cpp build the target's graph again (milliseconds),
    so a request whose first cycles decode plainly prefills without capturing and switches
    nothing; one whose probe is due within the idle window captures from its prefill on. Both
    stay exactly plain decoding."""
    with EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k="auto", n_threads=2) as ee:
        plain = ee.generate("Once upon a time", max_tokens=40, speculative=False).result().tokens
        ctl = ee.auto_controller()
        ctl.acceptance = AcceptanceModel(ee.k_max, prior=0.0)  # drafts look worthless: plain decoding
        ctl.lookup = None
        ctl.probe_every = ctl.probe_max = 10_000
        layers = tuple(ee.drafter.target_layers)
        at_prefill: list[tuple[int, ...]] = []  # what the prefill captured
        switches: list[tuple[int, ...]] = []  # switches after the prefill
        prefill, set_capture = ee.target.prefill, ee.target.set_capture

        def recording_prefill(*args, **kwargs):
            at_prefill.append(ee.target.capture.layers)
            switches.clear()
            return prefill(*args, **kwargs)

        ee.target.prefill = recording_prefill
        ee.target.set_capture = lambda ids: (switches.append(tuple(ids)), set_capture(ids))[1]
        assert ee.generate("Once upon a time", max_tokens=40).result().tokens == plain
        assert at_prefill == [()] and switches == []  # no switch on for the prefill and off again
        ctl._plain_run = ctl.probe_gap - 3  # a probe is due on the third cycle
        gen = ee.generate("Once upon a time", max_tokens=40).result()
        assert gen.tokens == plain
        assert at_prefill[-1] == layers and gen.stats.drafted >= 1  # captured from the prefill, then probed


def test_rejected_probes_back_off_and_an_accepted_one_resets():
    c = KController(k_max=4, costs=_cpu_like_costs())
    c.acceptance = AcceptanceModel(4, prior=0.0)
    gaps = []
    for _ in range(4):
        while c.choose() == 0:
            c.update(0, 0, 1, 0.0066, 0.0)
        gaps.append(c.probe_gap)
        c.update(1, 0, 2, 0.0125, 0.0015)  # the probe's draft is rejected
    assert gaps == [128, 256, 512, 1024]
    while c.choose() == 0:
        c.update(0, 0, 1, 0.0066, 0.0)
    c.update(1, 1, 2, 0.0125, 0.0015)  # accepted: probe at the base rate again
    assert c.probe_gap == 128


def test_relative_costs_extrapolate_from_the_largest_smaller_size_and_never_fall():
    from edge_eagle.costs import relative_cost, relative_costs

    table = {1: 1.0, 2: 1.8, 4: 3.0, 5: 2.5}  # the 5-token time is noise below the 4-token one
    want = [1.8, 2.7, 3.0, 3.0, 3.0, 3.5]  # c(2..7)
    assert relative_costs(table, 7)[2:] == pytest.approx(want)
    assert [relative_cost(table, n) for n in range(2, 8)] == pytest.approx(want)
    assert relative_costs({}, 4)[1:] == [1.0, 2.0, 3.0, 4.0]  # no 1-token time: compute-bound


def test_suffix_tree_choice_equals_its_definition():
    """On a chain the choice is the best lookup length by speedup; on a tree, the best prefix of
    the nodes sorted by their modelled probability, by expected tokens over c(m + 1)."""
    import itertools
    import random

    from edge_eagle.proposal import Proposal
    from edge_eagle.suffix import SuffixDraft

    rng = random.Random(3)
    for _ in range(50):
        table = {n: rng.uniform(0.5, 3.0) * n for n in rng.sample(range(1, 12), rng.randint(1, 8))}
        c = KController(costs=CostModel(verify_s=table))
        for _ in range(4):
            c._lookup_model(rng.choice([1, 3, 8])).observe(rng.randint(1, 8), rng.randint(0, 4))
        for n in (1, 3, 9):
            chain = SuffixDraft(n, Proposal.chain(list(range(8))), (1.0,) * 8)
            sub, s, m = c._best_suffix(chain)
            assert s == pytest.approx(max(c.lookup_speedup(n, i) for i in range(1, 9)))
            assert c.lookup_speedup(n, m) == pytest.approx(s) and sub.tokens == tuple(range(m))
        # a fork at the root: 0 -> 1 -> 2 (shares 0.75, 1, 1) and 3 -> 4 (0.25, 1)
        tree = SuffixDraft(4, Proposal((10, 11, 12, 13, 14), (-1, 0, 1, -1, 3)), (0.75, 1.0, 1.0, 0.25, 1.0))
        sub, s, m = c._best_suffix(tree)
        r = c._lookup_model(4).rate
        prob = {0: r(0), 1: r(0) * r(1), 2: r(0) * r(1) * r(2), 3: r(0) / 3, 4: r(0) / 3 * r(1)}
        best = 0.0
        for size in range(1, 6):  # every closed node set of each size: the best ratio
            for nodes in itertools.combinations(range(5), size):
                if all(p < 0 or p in nodes for p in (tree.proposal.parents[i] for i in nodes)):
                    best = max(best, (1 + sum(prob[i] for i in nodes)) / c.costs.c(size + 1))
        assert s == pytest.approx(best) and len(sub) == m


def _simulate(ctl: KController, cycles: int, true_cost, accept_rate: float, seed: int = 0) -> list[tuple[str, int]]:
    """Drive a controller as the loop does, on a simulated target whose batch of n tokens really
    takes true_cost(n) seconds; each draft position is accepted with `accept_rate`."""
    import random

    rng, tokens, plans = random.Random(seed), [1, 2, 3], []
    for _ in range(cycles):
        plan = ctl.plan(tokens)
        k = plan.n if plan.kind != "plain" else 0
        accepted = 0
        while accepted < k and rng.random() < accept_rate:
            accepted += 1
        ctl.update(k, accepted, k + 1, true_cost(k + 1), 0.0002 * k)
        tokens += [rng.randrange(1000, 2000) for _ in range(accepted + 1)]  # no repeats: no lookups
        plans.append((plan.kind, k))
    return plans


def test_costs_that_make_long_drafts_look_free_are_found_out_within_a_few_cycles():
    free = CostModel(verify_s={n: 0.010 for n in range(1, 10)}, draft_step_s=0.0001)  # a bad calibration
    ctl = KController(k_max=8, costs=free, lookup=None)
    plans = _simulate(ctl, 400, lambda n: 0.010 * n, accept_rate=0.4)  # compute-bound: c(n) = n
    assert plans[0][1] >= 4  # it believed the calibration
    drafts = [i for i, (_, k) in enumerate(plans) if k > 1]
    assert drafts == [0]  # one cycle that cost far more than predicted, then plain decoding ...
    assert sum(k == 1 for _, k in plans[4:]) <= 6  # ... but for the rare 1-token probe
    assert ctl.trust < 0.7 and ctl.suspect  # and the engine is told to measure c(n) again
    ctl.recalibrated()
    assert ctl.trust == 1.0 and not ctl.suspect


def test_honest_costs_keep_their_trust_and_a_lone_stall_does_not_stop_drafting():
    costs = _gpu_like_costs()
    ctl = KController(k_max=8, costs=costs, lookup=None)
    stall = {40}
    n = [0]

    def true_cost(tokens):
        n[0] += 1
        return costs_at(tokens) * (20 if n[0] in stall else 1)

    def costs_at(tokens):
        return 0.010 * (1 + 0.05 * (tokens - 1))

    plans = _simulate(ctl, 120, true_cost, accept_rate=0.9)
    assert all(k >= 4 for _, k in plans[60:])
    assert ctl.trust > 0.8 and not ctl.suspect


def test_a_suffix_match_counts_at_most_one_token_before_the_answer():
    """Every answer starts after the same template tokens: a match reaching back into them is not
    copying, so its length counts from the answer's start (plus one); a copy inside the answer
    then grows it."""
    from edge_eagle.suffix import SuffixIndex

    template = [900, 901, 902, 903, 904, 905, 906, 907, 908]
    ix = SuffixIndex()
    earlier = [1, 2, 3] + template + list(range(10, 40))
    ix.finish(earlier)
    ctl = KController(k_max=8, costs=CostModel(verify_s={n: 0.01 * n for n in range(1, 18)}), lookup=ix)
    ctl.begin()
    prompt = [4, 5, 6] + template
    assert ix.lookup(prompt, 8, 8).n >= 8  # the index itself matches the whole template
    ctl.plan(prompt)
    assert ctl._shadow is not None and ctl._shadow[0] == 1
    ctl.plan(prompt + list(range(10, 22)))  # the answer copies the earlier one: 12 tokens in
    assert ctl._shadow is not None and ctl._shadow[0] == 13
    ctl.begin()  # a new request starts counting again
    ctl.plan(prompt + [10])
    assert ctl._shadow is not None and ctl._shadow[0] == 1


def test_costs_follow_the_context_and_a_long_context_is_not_a_shift():
    """c(n) is taken at the cycle's context through the calibrated slopes; observations at a long
    context join the windows moved back to the calibration's context."""
    from edge_eagle.costs import BatchCosts

    short = {n: 0.01 * (1 + 0.5 * (n - 1)) for n in range(1, 10)}  # c(n) = 1 + (n - 1) / 2 after 8 tokens
    slope = {n: 0.01 * n / 1000 for n in range(1, 10)}  # every token of context adds n x 10 us
    costs = CostModel.from_measured(BatchCosts(short, 8, slope))
    assert costs.c(5) == pytest.approx(3.0)
    costs.context = 1008  # a batch of n now costs 0.01 (1 + (n - 1) / 2) + 0.01 n seconds
    assert costs.step_s() == pytest.approx(0.02)
    assert costs.c(5) == pytest.approx((0.03 + 0.05) / 0.02)
    for _ in range(20):  # decoding at the long context as calibrated: no shift, the same costs
        costs.observe_verify(1, 0.02)
        costs.observe_verify(5, 0.08)
    assert not costs.shifted and costs.verify_s[1] == pytest.approx(0.01) and costs.c(5) == pytest.approx(4.0)
    for _ in range(20):  # twice as slow at that context: a shift
        costs.observe_verify(1, 0.04)
    assert costs.shifted


def test_a_draft_that_pays_after_a_short_context_is_declined_after_a_long_one():
    from edge_eagle.costs import BatchCosts

    short = {n: 0.01 * (1 + 0.25 * (n - 1)) for n in range(1, 10)}
    slope = {n: 0.01 * n * n / 1000 for n in range(1, 10)}  # the batch's attention grows with n
    ctl = KController(k_max=8, costs=CostModel.from_measured(BatchCosts(short, 8, slope)), probe_every=1 << 30)
    ctl.costs.draft_step_s = 0.0005
    for _ in range(200):
        ctl.acceptance.observe(3, 2)  # tau about 2.6 at k = 3
    ctl.plan([1] * 8)
    assert ctl.plan([1] * 8).n > 0
    assert ctl.plan([1] * 3000).n == 0


def test_a_lookup_that_cannot_pay_is_not_built_and_the_plans_stay_the_same():
    """plan() skips building a short match's tree when the bound on any tree from it cannot win;
    the bound is never below what _best_suffix finds, and a controller that builds every tree
    makes the same plans and learns the same lookup rates."""
    import random

    from edge_eagle.suffix import SuffixIndex

    rng = random.Random(5)
    verify_s = {n: 0.01 * (1 + 0.2 * (n - 1)) for n in range(1, 18)}  # batches neither free nor linear

    def controller(build_all: bool) -> KController:
        ctl = KController(k_max=8, costs=CostModel(verify_s=dict(verify_s), draft_step_s=0.0), lookup=SuffixIndex(),
                          lookup_nodes=12, lookup_paths=4, probe_every=1 << 30)
        if build_all:
            ctl._lookup_bound = lambda *args: float("inf")  # type: ignore[method-assign]
        return ctl

    lazy, eager = controller(False), controller(True)
    built = []
    real_tree = lazy.lookup.tree

    def counting_tree(*args, **kwargs):
        built.append(1)
        return real_tree(*args, **kwargs)

    lazy.lookup.tree = counting_tree  # type: ignore[method-assign]
    phrases = [[rng.randrange(40) for _ in range(rng.randint(8, 20))] for _ in range(6)]
    cycles = lookups = chains = 0
    for _ in range(6):
        stream: list[int] = []  # the request's answer: phrases copied, and fresh tokens
        while len(stream) < 200:
            stream += list(rng.choice(phrases)) if rng.random() < 0.3 else [rng.randrange(40, 400)]
        for ctl in (lazy, eager):
            ctl.begin()
        tokens = [1, 2, 3]
        pos = 0
        while pos < len(stream) - 1:
            plans = [ctl.plan(tokens) for ctl in (lazy, eager)]
            assert plans[0] == plans[1]
            plan = plans[0]
            k = plan.n if plan.kind != "plain" else 0
            accepted = min(rng.randint(0, k), len(stream) - pos - 1) if plan.kind == "chain" else 0
            if plan.kind == "lookup":
                found = real_tree(lazy.lookup.match(tokens), lazy.lookup_max, lazy.lookup_nodes, lazy.lookup_paths)
                m = lazy.lookup.match(tokens)
                n, history = min(found.n, len(tokens) - lazy._answer_start + 1), m.from_history
                best = lazy._best_suffix(SuffixDraft(n, found.proposal, found.shares), history)[1]
                assert lazy._lookup_bound(n, history) >= lazy._lookup_bound(n, history, len(m.occ)) >= best - 1e-12
                lookups += 1
                node, p = -1, plan.proposal  # greedy verification of the tree against the stream
                while accepted < len(stream) - pos - 1:
                    want = stream[pos + accepted]
                    nxt = [i for i, par in enumerate(p.parents) if par == node and p.tokens[i] == want]
                    if not nxt:
                        break
                    node, accepted = nxt[0], accepted + 1
            for ctl in (lazy, eager):
                ctl.update(k, accepted, k + 1, lazy.costs.step_s() * lazy.costs.c(k + 1), 0.0)
            chains += plan.kind == "chain"
            tokens += stream[pos:pos + accepted + 1]
            pos += accepted + 1
            cycles += 1
        for ctl in (lazy, eager):
            ctl.lookup.finish(tokens)
    for n, model in eager._lookup_models.items():
        assert lazy._lookup_models[n].hits == pytest.approx(model.hits)
        assert lazy._lookup_models[n].seen == pytest.approx(model.seen)
    assert lookups > 10 and chains > 10 and cycles - len(built) > 50  # every kind of cycle happened, trees skipped


def test_no_probe_on_a_requests_first_cycle_and_its_drafting_time_is_not_a_draft_step():
    """A request's first draft also runs the whole prompt's rows through the drafter (0.5 s after
    1,500 tokens on a 2-core EPYC): a probe due then waits one cycle, and when a chain is chosen
    there, its time moves neither the drafter's step cost nor the cost model's trust."""
    c = KController(k_max=4, costs=_cpu_like_costs(), probe_every=8)
    c.acceptance = AcceptanceModel(4, prior=0.0)
    tokens = [1, 2, 3]
    for _ in range(7):  # one cycle short of the probe
        assert c.plan(tokens).kind == "plain"
        c.update(0, 0, 1, 0.0066, 0.0)
        tokens = tokens + [len(tokens) + 10]
    c.begin()  # a new request: its first cycle stays plain, the probe comes next
    assert c.plan(tokens).kind == "plain"
    c.update(0, 0, 1, 0.0066, 0.0)
    assert c.plan(tokens + [99]) == Plan(CHAIN, 1)

    gpu = KController(k_max=8, costs=_gpu_like_costs())
    gpu.acceptance = AcceptanceModel(8, prior=0.9)
    gpu.begin()
    plan = gpu.plan([1, 2, 3])
    assert plan.kind == "chain" and plan.n >= 4  # chosen for real on the first cycle
    gpu.update(plan.n, plan.n, plan.n + 1, 0.0105, 0.5)  # with the prompt's catch-up in its drafting time
    assert gpu.costs.draft_step_s == 0.001 and gpu.trust == 1.0
    plan = gpu.plan([1, 2, 3] + list(range(10, 10 + plan.n + 1)))
    gpu.update(plan.n, plan.n, plan.n + 1, 0.0105, 0.002 * plan.n)  # a later cycle's drafting counts
    assert gpu.costs.draft_step_s == pytest.approx(0.001 + 0.1 * (0.002 - 0.001))


def test_matches_into_this_requests_text_and_into_earlier_requests_learn_apart():
    """A phrase only earlier requests hold is weaker evidence than text this request copies: the
    two kinds have their own models; a long match into this request's own text starts from
    LONG_MATCH_PRIOR, one into the history from 0.5."""
    from edge_eagle.controller import LONG_MATCH_PRIOR
    from edge_eagle.suffix import SuffixIndex

    ix = SuffixIndex()
    ctl = KController(k_max=8, costs=CostModel(verify_s={n: 0.01 * n for n in range(1, 18)}), lookup=ix)
    assert ctl._lookup_model(8).rate(0) == pytest.approx(LONG_MATCH_PRIOR)
    assert ctl._lookup_model(16, history=True).rate(0) == pytest.approx(0.5)
    ix.finish([50, 51, 52, 53, 60])  # an earlier request
    ctl.begin()
    tokens = [1, 2, 3, 50, 51, 52, 53]  # ends with that request's phrase: only the history holds it
    ctl.plan(tokens)
    tokens += [70]  # not what followed it there
    ctl.plan(tokens)
    assert (ctl._lookup_model(1, history=True).seen[0], ctl._lookup_model(1, history=True).hits[0]) == (1.0, 0.0)
    assert ctl._lookup_model(1).seen[0] == 0.0
    tokens += [1, 2, 3]  # now the request repeats its own text
    ctl.plan(tokens)
    tokens += [50]  # as it went on before
    ctl.plan(tokens)
    assert (ctl._lookup_model(3).seen[0], ctl._lookup_model(3).hits[0]) == (1.0, 1.0)
    assert ctl._lookup_model(3, history=True).seen[0] == 0.0


def test_matches_whose_occurrences_went_on_in_different_ways_learn_apart():
    """A match whose earlier occurrences disagree on the next token (split) is a weaker guess than
    one whose occurrences agree: the two have their own models, scored with the split the match
    had when it was found."""
    from edge_eagle.suffix import SuffixIndex

    ix = SuffixIndex()
    ix.finish([5, 6, 7, 8, 40])
    ix.finish([5, 6, 7, 8, 41])  # two earlier requests went on differently after 5 6 7 8
    ix.finish([9, 10, 11, 12, 42])  # one went on after 9 10 11 12
    ctl = KController(k_max=8, costs=CostModel(verify_s={n: 0.01 * n for n in range(1, 18)}), lookup=ix)
    ctl.begin()
    ctl.plan([1])  # the answer starts after this prompt token
    tokens = [1, 5, 6, 7, 8]
    assert ix.split(ix.match(tokens))
    ctl.plan(tokens)
    tokens += [40]
    ctl.plan(tokens)
    split = ctl._lookup_model(4, history=True, split=True)
    assert (split.seen[0], split.hits[0]) == (1.0, 0.0)  # the newest occurrence's 41 came first: missed
    assert ctl._lookup_model(4, history=True).seen[0] == 0.0
    tokens += [9, 10, 11, 12]
    assert not ix.split(ix.match(tokens))
    ctl.plan(tokens)
    tokens += [42]
    ctl.plan(tokens)
    agreed = ctl._lookup_model(4, history=True)
    assert (agreed.seen[0], agreed.hits[0]) == (1.0, 1.0)
    assert split.seen[0] == 1.0  # untouched by the agreeing match


def test_a_match_is_split_only_where_what_followed_it_differs():
    from edge_eagle.suffix import SuffixIndex

    ix = SuffixIndex()
    ix.finish([3, 4, 5, 9])
    ix.finish([3, 4, 5, 9])
    assert not ix.split(ix.match([3, 4, 5]))  # two occurrences, one continuation
    ix.finish([3, 4, 5, 7])
    assert ix.split(ix.match([3, 4, 5]))
    live = SuffixIndex()
    assert not live.split(live.match([1, 2, 1, 2]))  # the only earlier 1 2 is followed by 1
    assert live.split(live.match([1, 2, 1, 2, 3, 1, 2]))  # 1 2 went on as 1, then as 3


def test_a_copy_of_32_tokens_or_more_has_one_rate_at_every_depth():
    """A copy breaks off at any depth with about the same chance: the model of matches of 32 tokens
    or more pools every depth's evidence into one rate, so short drafts that all held make its deep
    positions as likely as its first; a shorter match's model keeps a rate per depth."""
    from edge_eagle.controller import POOLED_MATCH, AcceptanceModel

    ctl = KController(k_max=8, costs=CostModel(verify_s={n: 0.01 * n for n in range(1, 18)}))
    copy, short = ctl._lookup_model(POOLED_MATCH), ctl._lookup_model(POOLED_MATCH - 1)
    assert copy.pooled and not short.pooled and ctl._lookup_model(POOLED_MATCH + 7) is copy
    for model in (copy, short):
        for _ in range(20):
            model.observe(3, 3)  # three-token drafts, all accepted
        model.observe(8, 4)  # one long draft that broke off at its fifth token: the only one seen there
    assert copy.rates == [copy.rate(0)] * 8 and copy.rate(7) > 0.9
    assert short.rate(7) == short.rate(4) < 0.5 and short.rate(0) > 0.9
    pooled = AcceptanceModel(4, prior=0.5, pooled=True)
    pooled.observe(4, 1)  # seen at depths 0 and 1, accepted at depth 0
    assert pooled.rate(3) == pytest.approx((1 + 0.5) / (2 + 1))
