"""Batch-cost calibration off the request path: measured before the server says ready, cached
per machine, model and thread count, re-checked in the background, and measured after the
cached prompt without losing it."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient

from edge_eagle import EdgeEagle, calibration, engine_costs, kv
from edge_eagle.costs import MIN_SPAN, BatchCosts, measure_batch_costs, measure_context_costs
from edge_eagle.server import create_app
from edge_eagle.threads import LoadMeter


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("EDGE_EAGLE_CALIBRATION", str(path))
    monkeypatch.setattr(LoadMeter, "sample", lambda self, min_interval=0.0: 0.0)  # an idle machine
    return path


def _no_measuring(*args, **kwargs):
    raise AssertionError("measured although a calibration was cached")


def test_a_calibration_is_cached_per_model_and_thread_count_and_reused(tiny_target, cache, monkeypatch):
    with EdgeEagle(tiny_target, None, n_threads=2) as first:
        costs = dict(first.calibrate().verify_s)
        assert first.calibration["source"] == "measured" and first.calibration["threads"] == 2
    assert sorted(costs) == list(range(1, first.cost_n_max + 1))
    entries = json.loads(cache.read_text())["entries"]
    assert len(entries) == 1 and json.loads(next(iter(entries)))["threads"] == 2
    with monkeypatch.context() as m:
        m.setattr(engine_costs, "measure_context_costs", _no_measuring)
        with EdgeEagle(tiny_target, None, n_threads=2) as second:
            assert second.calibrate().verify_s == costs and second.calibration["source"] == "cache"
    with EdgeEagle(tiny_target, None, n_threads=1) as other:  # another thread count: measured again
        other.calibrate()
        assert other.calibration["source"] == "measured"
    assert len(json.loads(cache.read_text())["entries"]) == 2


def test_a_busy_machine_measurement_is_used_but_not_cached(tiny_target, cache, monkeypatch):
    monkeypatch.setattr(LoadMeter, "sample", lambda self, min_interval=0.0: 2.0)
    with EdgeEagle(tiny_target, None, n_threads=1) as ee:
        ee.calibrate()
        assert ee.calibration["source"] == "measured" and ee.costs is not None
    assert not cache.exists()


def test_a_damaged_cache_is_measured_over(tiny_target, cache):
    cache.write_text("{not json")
    with EdgeEagle(tiny_target, None, n_threads=1) as ee:
        ee.calibrate()
        assert ee.calibration["source"] == "measured"
    assert json.loads(cache.read_text())["entries"]


def test_measuring_after_the_cached_prompt_keeps_it_and_can_be_abandoned(tiny_target):
    with EdgeEagle(tiny_target, None, n_threads=1) as ee:
        ee.generate("Once upon a time", max_tokens=8, k=0).result()
        held = list(ee.target.memory.tokens)
        assert held
        costs = measure_batch_costs(ee.target, 4, reps=2, keep=len(held))
        assert costs is not None and sorted(costs) == [1, 2, 3, 4]
        assert ee.target.memory.tokens == held
        assert measure_batch_costs(ee.target, 4, keep=len(held), should_stop=lambda: True) is None
        assert ee.target.memory.tokens == held
        again = ee.generate("Once upon a time", max_tokens=8, k=0).result()
        assert again.stats.prompt_cached > 0  # the prompt cache survived both


def _wait(predicate, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_server_says_loading_until_the_costs_are_measured(tiny_target, cache):
    engine = EdgeEagle(tiny_target, None, n_ctx=256)
    release, started = threading.Event(), threading.Event()
    measure = engine.prepare_costs

    def slow_prepare():
        started.set()
        assert release.wait(30)
        measure()

    engine.prepare_costs = slow_prepare
    app = create_app(engine)
    try:
        http = TestClient(app)
        assert started.wait(30)
        r = http.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading" and int(r.headers["Retry-After"]) >= 1
        answer: dict = {}
        early = threading.Thread(target=lambda: answer.setdefault(
            "r", http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "temperature": 0})))
        early.start()  # a request during loading waits for ready, then is served
        time.sleep(0.2)
        assert "r" not in answer
        release.set()
        _wait(lambda: http.get("/health").status_code == 200)
        body = http.get("/health").json()
        assert body["status"] == "ok" and body["calibration"]["source"] == "measured"
        early.join(30)
        assert answer["r"].status_code == 200
    finally:
        app.state.server.close()
        engine.close()


def test_a_cached_calibration_is_ready_at_once_and_re_checked_when_idle(tiny_target, cache, monkeypatch):
    with EdgeEagle(tiny_target, None, n_ctx=256) as first:
        first.prepare_costs()  # measured and cached
    engine = EdgeEagle(tiny_target, None, n_ctx=256)
    checks: list[bool] = []
    recheck = engine.recheck_costs

    def recorded(should_stop):
        checks.append(should_stop())
        return recheck(should_stop)

    engine.recheck_costs = recorded
    monkeypatch.setattr(engine_costs, "measure_context_costs", _no_measuring)  # ready from the cache ...
    app = create_app(engine)
    try:
        assert app.state.server.worker.ready.wait(30)
        assert engine.calibration["source"] == "cache"
        monkeypatch.undo()  # ... and the idle re-check measures
        monkeypatch.setenv("EDGE_EAGLE_CALIBRATION", str(cache))
        _wait(lambda: checks)
        assert checks == [False]
        _wait(lambda: not engine._lock.locked())
        assert engine.calibration["source"] in ("cache", "re-checked")
    finally:
        app.state.server.close()
        engine.close()


def test_threads_default_to_the_policy_and_a_forced_count_disables_the_governor(tiny_target):
    with EdgeEagle(tiny_target, None) as auto:
        assert auto.governor is not None and auto.threads.reason in ("idle", "busy", "unknown load")
        assert auto.target.n_threads == auto.threads.threads
    with EdgeEagle(tiny_target, None, n_threads=1) as forced:
        assert forced.governor is None and forced.threads.reason == "forced" and forced.target.n_threads == 1


def test_a_thread_change_re_measures_the_costs_before_the_next_generation(tiny_target, cache):
    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        ee.generate("Once upon a time", max_tokens=4).result()
        assert ee.calibration["threads"] == ee.target.n_threads
        new = 1 if ee.target.n_threads > 1 else 2
        ee.governor._switch(new, "test")
        assert ee.target.n_threads == new
        ee.generate("Once upon a time", max_tokens=4).result()
        assert ee.calibration["threads"] == new


def test_the_calibration_cache_keeps_the_newest_entries(cache):
    for i in range(calibration.MAX_ENTRIES + 5):
        calibration.store(f"k{i}", BatchCosts({1: 0.01, 2: 0.02}, 8, {1: 1e-6, 2: 3e-6}))
    entries = json.loads(cache.read_text())["entries"]
    assert len(entries) == calibration.MAX_ENTRIES and "k0" not in entries
    assert calibration.load(f"k{calibration.MAX_ENTRIES + 4}") == BatchCosts({1: 0.01, 2: 0.02}, 8, {1: 1e-6, 2: 3e-6})


def test_an_entry_without_context_slopes_is_measured_again(tiny_target, cache):
    """A cache written before c(n) followed the context holds one context's seconds only."""
    with EdgeEagle(tiny_target, None, n_threads=1) as ee:
        key = calibration.key(ee.target, 1, ee.cost_n_max)
        cache.write_text(json.dumps({"version": 1, "entries": {key: {"verify_s": {"1": 0.01, "2": 0.02}}}}))
        assert calibration.load(key) is None
        ee.calibrate()
        assert ee.calibration["source"] == "measured"
        assert calibration.load(key) is not None


def test_a_one_context_entry_is_measured_again_where_the_window_has_room(tiny_target, cache):
    """An entry measured when the cached prompt filled the window holds no slopes: an engine
    whose window has room measures again; one whose window never has room uses it."""
    for n_ctx, source in ((512, "measured"), (128, "cache")):
        with EdgeEagle(tiny_target, None, n_threads=1, n_ctx=n_ctx) as ee:
            key = calibration.key(ee.target, 1, ee.cost_n_max)
            calibration.store(key, BatchCosts({n: 0.01 * n for n in range(1, ee.cost_n_max + 1)}, n_ctx - 20))
            ee.calibrate()
            assert ee.calibration["source"] == source, n_ctx
            assert bool(ee.costs.slope_s) == (source == "measured")


def test_a_full_window_sets_the_cached_prompt_aside_to_measure_the_slopes(tiny_target, cache, monkeypatch):
    """A cached prompt that leaves no room for the second context: the costs are measured from
    a short context, with their slopes, and the cells come back bit for bit (the next request
    reads only its new tokens and answers as before). Cells beyond ASIDE_MAX_BYTES stay where
    they are, and the costs are measured after them, in one context."""
    with EdgeEagle(tiny_target, None, n_threads=1, n_ctx=512) as ee:
        ids = ee.target.tokenize("one two three four five six seven eight nine ten " * 40)[:420]
        ee.generate(ids, max_tokens=4, k=0).result()
        # the answer from this cache state: the last prompt token decoded alone (as it will be again)
        first = ee.generate(ids, max_tokens=4, k=0).result().tokens
        held = list(ee.target.memory.tokens)
        assert ee.target.n_ctx - ee.cost_n_max - 1 - len(held) < MIN_SPAN
        cells = kv.seq_state(ee.target.ctx)
        costs = ee.calibrate(use_cache=False)
        assert costs.ref_context == 8 and sorted(costs.slope_s) == list(range(1, ee.cost_n_max + 1))
        assert ee.target.memory.tokens == held and kv.seq_state(ee.target.ctx) == cells
        again = ee.generate(ids, max_tokens=4, k=0).result()
        assert again.stats.prompt_cached == len(ids) - 1 and again.tokens == first
        monkeypatch.setattr(engine_costs, "ASIDE_MAX_BYTES", kv.seq_state_size(ee.target.ctx) - 1)
        held = list(ee.target.memory.tokens)
        one = ee.calibrate(use_cache=False)
        assert one.ref_context == len(held) and not one.slope_s and ee.target.memory.tokens == held


def test_costs_are_measured_at_two_contexts_and_the_cached_prompt_stays(tiny_target):
    with EdgeEagle(tiny_target, None, n_threads=1, n_ctx=2048) as ee:
        ee.generate("Once upon a time", max_tokens=8, k=0).result()
        held = list(ee.target.memory.tokens)
        costs = measure_context_costs(ee.target, 4, reps=2, keep=len(held), span=512)
        assert costs is not None and costs.context == len(held)
        assert sorted(costs.verify_s) == sorted(costs.slope_s) == [1, 2, 3, 4]
        assert all(s >= 0 for s in costs.slope_s.values())
        assert ee.target.memory.tokens == held
        assert measure_context_costs(ee.target, 4, keep=len(held), should_stop=lambda: True) is None
        assert ee.target.memory.tokens == held
        assert ee.generate("Once upon a time", max_tokens=8, k=0).result().stats.prompt_cached > 0
        fresh = measure_context_costs(ee.target, 4, reps=1, span=512)  # no prompt: after 8 tokens, cache cleared
        assert fresh is not None and fresh.context == 8 and fresh.slope_s and not ee.target.memory.tokens
    with EdgeEagle(tiny_target, None, n_threads=1, n_ctx=128) as small:  # no room for a second context
        one = measure_context_costs(small.target, 4, reps=1)
        assert one is not None and one.verify_s and not one.slope_s


@pytest.mark.parametrize("k", [0, 3])
def test_slow_token_choice_is_not_read_as_a_slower_target(tiny_target, trained_drafters, monkeypatch, k):
    """Choosing tokens from a batch's logits (a grammar's mask, sampling, penalties) is work every
    decoding pays per token, not part of the target's batch cost: the policy's cost model and the
    thread governor see the batch alone, however slow the choice (here 50 ms a cycle, where the
    tiny target's batch takes well under a millisecond). A grammar's mask once made single steps
    look twice as slow as calibrated, and most requests then measured the costs again first."""
    from edge_eagle import cycle
    from edge_eagle.policy import Fixed

    pause = 0.05
    real = cycle.verify

    def slow(*args, **kwargs):
        time.sleep(pause)
        return real(*args, **kwargs)

    class Recording(Fixed):
        def __init__(self, k: int):
            super().__init__(k)
            self.seen: list[float] = []

        def update(self, drafted, accepted, verify_tokens, verify_s, draft_s):
            self.seen.append(verify_s)

    with EdgeEagle(tiny_target, trained_drafters["eagle3.1"][1], n_ctx=256, k=k) as ee:
        policy = Recording(k)
        monkeypatch.setattr(ee, "policy", lambda k, tree=None: policy)
        governed: list[float] = []
        if ee.governor is not None:
            observe = ee.governor.observe
            monkeypatch.setattr(ee.governor, "observe", lambda n, s: (governed.append(s), observe(n, s))[1])
        monkeypatch.setattr(cycle, "verify", slow)
        gen = ee.generate("the cat sat on the", max_tokens=12, temperature=1.0, seed=1).result()
        assert len(policy.seen) == gen.stats.verify_steps >= 4
        # every cycle pays the pause; one cycle stalled by another program may still look slow
        assert sum(s >= pause / 2 for s in policy.seen) <= 1
        assert len(governed) in (0, len(policy.seen)) and sum(s >= pause / 2 for s in governed) <= 1
        assert gen.stats.t_verify >= pause * len(policy.seen)  # the stats still count the whole verification
