"""The native fast path (edge_eagle/_fastpath.c) computes what the Python path computes: the
same RMSNorm bits, numpy's argmax, the same encoder states and the same draft chains, so
turning it on changes the host cost and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle import EdgeEagle, _fast
from edge_eagle.eagle import EagleDrafter, rms_norm
from edge_eagle.target import Target
from tests.conftest import VARIANTS
from tests.test_lossless import PROMPTS


@pytest.fixture(scope="module")
def fast():
    lib = _fast.load()
    assert lib is not None, ("the native fast path was not built: `pip install -e .` compiles edge_eagle/_fastpath.c "
                             "(it needs a C compiler)")
    return lib


def test_the_install_builds_the_fast_path(fast):
    assert _fast.library_path() is not None
    assert fast.lib.ee_abi_version() == _fast.ABI_VERSION


def test_fast_path_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("EDGE_EAGLE_FASTPATH", "0")
    assert _fast.load() is None


def test_rms_norm_bits_equal_the_python_path(fast):
    rng = np.random.default_rng(0)
    for shape, scale in [((576,), 1.0), ((7, 576), 30.0), ((5, 64), 1e-3), ((3, 1), 2.0), ((2, 1728), 400.0)]:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        w = rng.standard_normal(shape[-1]).astype(np.float32)
        assert np.array_equal(fast.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5)), shape


def test_argmax_equals_numpy_on_ties_infinities_and_nan(fast):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((7, 1000)).astype(np.float32)
    rows[1, [3, 500]] = 10.0  # a tie: the first wins
    rows[2] = -np.inf  # nothing finite: the first entry
    rows[3, [700, 800]] = np.nan  # NaN counts as the maximum, the first one
    rows[4] = 5.0
    rows[5, 999] = np.inf
    rows[6, :10] = -np.inf
    assert np.array_equal(fast.argmax_rows(rows), rows.argmax(-1))


def _drafter_runs(target: Target, path, monkeypatch, flag: str, k: int, p_min: float):
    """Encoder states and draft chains over a few prompts, each chain continued by its own
    first draft for several cycles (the drafter's KV advancing as in the loop)."""
    monkeypatch.setenv("EDGE_EAGLE_FASTPATH", flag)
    d = EagleDrafter(path, target)
    try:
        assert (d.native is not None) == (flag == "1")
        out = []
        for prompt in PROMPTS[:3]:
            target.memory.clear()
            d.reset()
            target.set_capture(d.target_layers)
            toks = target.tokenize(prompt)
            res = target.prefill(toks)
            feats = res.features
            out.append(d.encode(feats, 0).tobytes())
            d.ingest(feats, 0, toks)
            seq = toks + [int(np.argmax(res.logits[-1]))]
            for _ in range(4):  # accept one draft per cycle, as a real verify would feed it back
                chain = d.propose(seq, k, p_min)
                out.append(chain.tokens)
                step = [seq[-1], *chain.tokens[:1]]
                res = target.decode(step, len(seq) - 1, "all")
                nxt = int(np.argmax(res.logits[len(step) - 1]))
                target.memory.remove_from(len(seq) - 1 + len(step))
                d.ingest(res.features, len(seq) - 1, step)
                seq = seq + list(chain.tokens[:1]) + [nxt]
        return out
    finally:
        d.close()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_both_paths_encode_and_draft_the_same_for_every_drafter_variant(fast, tiny_target, tiny_drafters, variant,
                                                                       monkeypatch):
    target = Target(tiny_target, n_ctx=512)
    try:
        for k, p_min in ((5, 0.0), (6, 0.05)):
            py = _drafter_runs(target, tiny_drafters[variant][0], monkeypatch, "0", k, p_min)
            c = _drafter_runs(target, tiny_drafters[variant][0], monkeypatch, "1", k, p_min)
            assert py == c
    finally:
        target.close()


def _generate(target, drafter, monkeypatch, flag: str, **kw) -> list:
    monkeypatch.setenv("EDGE_EAGLE_FASTPATH", flag)
    out = []
    with EdgeEagle(target, drafter, n_ctx=1024) as ee:
        assert (ee.drafter.native is not None) == (flag == "1")
        for prompt in PROMPTS[:3]:
            gen = ee.chat([{"role": "user", "content": prompt}], **kw).result()
            out.append((gen.text, gen.stats.accepted, gen.stats.drafted, gen.stats.verify_steps))
    return out


def test_trained_drafter_generates_the_same_text_and_acceptance_on_both_paths(fast, tiny_target, trained_drafters,
                                                                             monkeypatch):
    drafter = trained_drafters["eagle3.1"][1]
    # fixed k: `auto` chooses from measured timings, which differ between any two runs
    for kw in ({"k": 5, "max_tokens": 48}, {"k": 3, "max_tokens": 48, "p_min": 0.3}):
        py = _generate(tiny_target, drafter, monkeypatch, "0", **kw)
        assert py == _generate(tiny_target, drafter, monkeypatch, "1", **kw)
        assert sum(a for _, a, _, _ in py) > 0  # acceptance is there to compare


@pytest.mark.smollm
def test_shipped_drafter_on_smollm_is_the_same_on_both_paths(fast, smollm, monkeypatch):
    from edge_eagle.defaults import default_drafter

    monkeypatch.setenv("EDGE_EAGLE_FASTPATH", "1")
    with EdgeEagle(smollm, default_drafter(), n_ctx=256) as ee:
        assert ee.drafter.native.ids is not None  # its 8k draft vocabulary: the chain reads only those logits
    py = _generate(smollm, default_drafter(), monkeypatch, "0", k=5, max_tokens=40)
    assert py == _generate(smollm, default_drafter(), monkeypatch, "1", k=5, max_tokens=40)


@pytest.mark.parametrize("force", [1, 4, 0])
def test_every_argmax_version_equals_numpy(fast, force):
    lanes = fast.argmax_lanes(force)
    try:
        assert lanes == (force or lanes) and lanes in (1, 4, 8)
        rng = np.random.default_rng(2)
        for n in (1, 3, 7, 8, 9, 16, 17, 33, 1000, 49152):
            rows = rng.standard_normal((9, n)).astype(np.float32)
            rows[1, [0, n - 1]] = 10.0  # ties: the first wins, also between lanes and the tail
            rows[2] = -np.inf  # nothing finite: the first entry
            rows[3, n // 2] = np.nan  # NaN counts as the maximum ...
            rows[3, n - 1] = np.nan  # ... the first one
            rows[4] = 5.0
            rows[5, n - 1] = np.inf
            rows[6, : n // 2] = -np.inf
            rows[7] = np.where(rng.random(n) < 0.8, -np.inf, rows[7])  # a draft vocabulary's row
            rows[8] = 0.0
            rows[8, n // 3] = -0.0  # equal to 0.0: the first still wins
            assert np.array_equal(fast.argmax_rows(rows), rows.argmax(-1)), (lanes, n)
            # over a draft vocabulary (ascending ids; every other entry -inf, as llama.cpp writes it)
            ids = np.flatnonzero(rng.random(n) < 0.3)
            if not len(ids):
                continue
            masked = np.full_like(rows, -np.inf)
            masked[:, ids] = rows[:, ids]
            masked[3, ids[len(ids) // 2:]] = np.nan  # a NaN among the ids: the first one
            assert np.array_equal(fast.argmax_rows(masked, ids), masked.argmax(-1)), (lanes, n, "ids")
    finally:
        fast.argmax_lanes(0)


@pytest.mark.parametrize("entry", ["cpython", "ctypes"])
def test_the_fused_cycle_equals_the_step_by_step_loop_under_any_proposer_schedule(fast, tiny_target,
                                                                                   trained_drafters, monkeypatch,
                                                                                   entry):
    """The native cycle (draft, the target's verify, greedy verification and ingest in one call),
    as the CPython function and through ctypes (a build without Python's headers), against the
    loop's own steps, with plain, chain, tree and lookup cycles interleaved: the same tokens,
    counts, KV contents and pending drafter rows, and lossless against plain decoding."""
    from edge_eagle.eagle import EagleDrafter
    from edge_eagle.sampling import Sampler, SamplingParams
    from edge_eagle.speculative import speculate
    from edge_eagle.stats import SpecStats
    from tests.test_lossless import assert_lossless
    from tests.test_tree import _Shuffle

    monkeypatch.setenv("EDGE_EAGLE_FASTPATH", "1")
    assert type(fast.cycle).__name__ == "builtin_function_or_method"  # setup.py builds the CPython one
    if entry == "ctypes":
        monkeypatch.setattr(fast, "cycle", fast.ctypes_cycle)
        monkeypatch.setattr(fast, "propose", fast.ctypes_propose)
    native = EagleDrafter.native_cycle
    calls = {"fused": 0, "accepted": 0}

    def counted(self, target, steps):
        cycle = native(self, target, steps)
        call = cycle.native  # the library's cycle function

        def counted_call(*args):
            got = call(*args)
            calls["fused"] += 1
            calls["accepted"] += len(got[1])
            return got
        cycle.native = counted_call
        return cycle

    def generate(fused: bool) -> list:
        monkeypatch.setattr(EagleDrafter, "native_cycle", counted if fused else (lambda self, target, steps: None))
        out = []
        with EdgeEagle(tiny_target, trained_drafters["eagle3.1"][1], n_ctx=512) as ee:
            for seed, prompt in enumerate(PROMPTS):
                chat = ee.apply_chat_template([{"role": "user", "content": prompt}])
                toks = ee.target.tokenize(chat, add_special=False)  # chat text: the drafter was trained on it
                plain = ee.generate(toks, max_tokens=48, speculative=False).result().tokens
                ee.target.memory.clear()
                stats, got = SpecStats(), []
                policy = _Shuffle(seed, ["plain", "chain", "chain", "chain", "chain", "tree", "lookup"])
                for new, _ in speculate(ee.target, ee.drafter, toks, max_tokens=48, policy=policy,
                                        sampler=Sampler(SamplingParams()), stats=stats):
                    got += new
                assert_lossless(ee.target, toks, plain, got)
                d = ee.drafter
                p = d.pending
                out.append((got, stats.accepted, stats.drafted, stats.verify_steps, dict(stats.proposers),
                            list(ee.target.memory.tokens), list(p.tokens), p.pos0, p.rows,
                            p.buf[: p.rows].tobytes(), p.kv_rows))
        return out

    steps = generate(False)
    assert calls["fused"] == 0
    assert generate(True) == steps
    assert calls["fused"] >= 10 and calls["accepted"] >= 5, calls
    assert sum(s[1] for s in steps) > 0


def test_the_library_and_its_python_mirrors_agree_on_every_shared_struct(fast, monkeypatch):
    import ctypes

    from edge_eagle.errors import LayoutMismatchError

    _fast.check_layouts(fast.lib)  # the installed build: every size and offset agrees

    class Shifted(ctypes.Structure):  # llama.h's llama_embd with its fields swapped
        _fields_ = [("n_rows", ctypes.c_size_t), ("data", ctypes.c_void_p), ("n_embd", ctypes.c_size_t)]

    monkeypatch.setattr(_fast, "_mirrors", lambda: {"llama_embd": Shifted})
    with pytest.raises(LayoutMismatchError, match="llama_embd"):
        _fast.check_layouts(fast.lib)


def test_native_failures_are_named_internal_errors_not_user_errors():
    from edge_eagle.errors import EdgeEagleError, InternalError, LlamaCallError

    for code, stage, rc in ((-1003, "drafter decode", 3), (-2000, "drafter outputs", 0), (-3001, "drafter encoder", 1),
                            (-4001, "target decode", 1), (-5000, "target outputs", 0), (-101, "drafter batch", -101)):
        err = _fast.call_error(code)
        assert isinstance(err, LlamaCallError) and isinstance(err, InternalError)
        assert not isinstance(err, EdgeEagleError)
        assert (err.stage, err.code) == (stage, rc), code
        assert stage in str(err)
