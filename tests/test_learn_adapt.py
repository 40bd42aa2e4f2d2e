"""Adaptation on kept requests: on a narrow synthetic domain it raises simulated and measured
acceptance on unseen prompts of that domain; a candidate that scores worse is not kept; versions
swap between requests without changing greedy output, roll back, and survive a kill mid-write."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_eagle.converters import convert
from edge_eagle.converters.gguf_out import write_eagle3

from edge_eagle import EdgeEagle
from edge_eagle.checks.reference import random_reference
from edge_eagle.gguf_file import read_gguf
from edge_eagle.learn import LearnStore, Versions, store_dir
from edge_eagle.learn.adapt import AdaptOptions
from edge_eagle.learn.run import adapt_store
from edge_eagle.learn.weights import read_drafter
from tests.tiny_models import drafter_config, reference_weights

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def _prompts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["Count: " + " ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(n)]


@pytest.fixture(scope="module")
def domain(tmp_path_factory, tiny_target):
    """A drafter for the tiny target whose draft vocabulary covers the domain's answers (as one
    trained on that domain's text would), with random weights: it accepts almost nothing yet."""
    d = tmp_path_factory.mktemp("adapt")
    seen, unseen = _prompts(1, 24), _prompts(2, 6)
    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        answers = {p: ee.generate(p, max_tokens=24).result().tokens for p in seen + unseen}
    target = read_gguf(tiny_target)
    domain_tokens = {t for a in answers.values() for t in a}
    vocab = sorted(domain_tokens | set(range(1000, 1000 + 2048 - len(domain_tokens))))
    cfg = drafter_config(target, len(vocab), fc_norm=True, norm_output=True)
    model = random_reference(cfg, seed=5, embed=torch.from_numpy(target.tensor_array("token_embd.weight")),
                             d2t=torch.tensor(vocab))
    base = write_eagle3(d / "base.gguf", reference_weights(model), cfg, target)
    return {"dir": d, "base": base, "seen": seen, "unseen": unseen, "answers": answers}


@pytest.fixture
def learn_root(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_EAGLE_LEARN_DIR", str(tmp_path / "learn"))
    return tmp_path / "learn"


def _use(tiny_target, drafter, prompts, learn=False):
    """Serve the prompts greedily at k = 3; (texts, mean tau, the engine's drafter version)."""
    with EdgeEagle(tiny_target, drafter, k=3, n_ctx=256, learn=learn) as ee:
        gens = [ee.generate(p, max_tokens=24).result() for p in prompts]
        return [g.tokens for g in gens], sum(g.stats.tau for g in gens) / len(gens), ee.drafter_version


def test_adaptation_raises_acceptance_on_unseen_prompts_and_keeps_output_lossless(tiny_target, domain,
                                                                                   learn_root):
    texts, _, _ = _use(tiny_target, domain["base"], domain["seen"], learn=True)  # the user's stream, kept
    assert texts == [domain["answers"][p] for p in domain["seen"]]
    store = LearnStore(store_dir(tiny_target, domain["base"]))
    assert len(list(store.requests())) == len(domain["seen"])
    report = adapt_store(tiny_target, domain["base"], store, AdaptOptions(steps=60, lr=2e-3, batch_rows=512, samples=0),
                         general_prompts=0, progress=False)
    assert report["accepted"] and report["version"] == 1, report
    assert report["tau_after"] > report["tau_before"] + 0.15  # simulated decoding, on the newest requests held out
    before = _use(tiny_target, domain["base"], domain["unseen"])
    after = _use(tiny_target, domain["base"], domain["unseen"], learn=True)  # --learn runs version 1
    assert after[2] == 1 and before[2] == 0
    assert after[1] > before[1] + 0.3, (before[1], after[1])  # measured through llama.cpp, unseen prompts
    assert after[0] == before[0] == [domain["answers"][p] for p in domain["unseen"]]  # greedy = plain decoding
    assert Versions(store.directory).rollback() == 0
    assert _use(tiny_target, domain["base"], domain["unseen"][:1], learn=True)[2] == 0


def test_sampled_answers_come_from_training_prompts_only_and_are_kept_for_later(tiny_target, domain, tmp_path):
    """The augmentation: n seeded answers per training prompt, sampled by the target, at most as
    long as the kept answer; asked again, they come from work/samples.json, not the target."""
    from edge_eagle.learn.adapt import adapt
    from edge_eagle.learn.run import SAMPLES, sampled_answers
    from edge_eagle.learn.store import WORK
    from edge_eagle.target import Target

    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        requests = [(ee.target.tokenize(p), domain["answers"][p]) for p in domain["seen"][:10]]
    got = sampled_answers(tmp_path, tiny_target, domain["base"], requests[:4], 2, 0.8, 512, log=lambda s: None)
    assert [p for p, _ in got] == [p for p, _ in requests[:4] for _ in range(2)]
    assert all(0 < len(a) <= len(requests[0][1]) for _, a in got)
    assert got[0][1] != got[1][1]  # two samples, not one answer twice
    cache = tmp_path / WORK / SAMPLES
    stamp = cache.stat().st_mtime_ns
    assert sampled_answers(tmp_path, tiny_target, domain["base"], requests[:4], 2, 0.8, 512) == got
    assert cache.stat().st_mtime_ns == stamp  # nothing sampled again
    seen: list = []
    target = Target(tiny_target, n_ctx=256, n_batch=256)
    try:
        adapt(target, domain["base"], requests, tmp_path / "w", AdaptOptions(steps=1),
              augment=lambda train: seen.extend(train) or [])
    finally:
        target.close()
    assert seen == requests[:8]  # the newest fifth is held out, and never augmented


def test_a_candidate_that_scores_worse_is_not_kept(tiny_target, domain, learn_root):
    _use(tiny_target, domain["base"], domain["seen"][:8], learn=True)
    store = LearnStore(store_dir(tiny_target, domain["base"]))
    report = adapt_store(tiny_target, domain["base"], store, AdaptOptions(steps=5, lr=0.0), general_prompts=0,
                         progress=False)
    assert not report["accepted"] and "did not rise" in report["reason"]
    assert Versions(store.directory).current == 0 and not (store.directory / "versions").exists()


def test_the_replayed_general_answers_get_sampled_answers_too_and_the_scored_ones_do_not(tiny_target, domain,
                                                                                          learn_root):
    """Sampled answers multiply the training requests, and the replayed general text with them, so
    that its share of the training data stays what it was; the held-out requests and the general
    set that scores candidates are never sampled from."""
    import hashlib

    from edge_eagle.bench.prompts import load_prompts
    from edge_eagle.learn.run import GENERAL, SAMPLES
    from edge_eagle.learn.store import WORK

    _use(tiny_target, domain["base"], domain["seen"][:5], learn=True)
    store = LearnStore(store_dir(tiny_target, domain["base"]))
    requests = [p for p, _, _ in store.requests()]
    adapt_store(tiny_target, domain["base"], store, AdaptOptions(steps=1, samples=1), general_prompts=1,
                replay_prompts=2, progress=False, log=lambda s: None)
    kept = json.loads((store.directory / GENERAL).read_text())
    general = [r["prompt"] for r in kept]
    category = {p.id: p.category for p in load_prompts("mtbench")}
    assert len({category[r["id"]] for r in kept}) == 3  # MT-bench's categories in turn, not its first 3 questions

    def key(prompt: list[int]) -> str:
        return hashlib.sha1(json.dumps([list(prompt), 0.8]).encode()).hexdigest()

    sampled = json.loads((store.directory / WORK / SAMPLES).read_text())
    assert set(sampled) == {key(p) for p in requests[:4] + general[1:]}  # the newest request is held out
    assert all(len(v) == 1 and v[0] for v in sampled.values())


def test_a_swap_between_requests_keeps_greedy_output(tiny_target, domain, tmp_path):
    from edge_eagle.learn.adapt import model_weights
    from edge_eagle.learn.weights import reference_from_gguf

    other = reference_from_gguf(domain["base"], tiny_target)
    with torch.no_grad():
        other.fc.weight.mul_(0.5)  # another drafter of the same shape
    path = write_eagle3(tmp_path / "other.gguf", model_weights(other), other.cfg, read_gguf(tiny_target))
    prompts = domain["unseen"][:3]
    with EdgeEagle(tiny_target, domain["base"], k=3, n_ctx=256) as ee:
        first = [ee.generate(p, max_tokens=24).result().tokens for p in prompts]
        ee.auto_controller()
        ee.swap_drafter(path)
        assert ee.drafter_version == 1 and ee.controller is None  # acceptance is estimated afresh
        second = [ee.generate(p, max_tokens=24).result().tokens for p in prompts]
    assert first == second == [domain["answers"][p] for p in prompts]


_KILLED_WRITE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from edge_eagle.fsutil import atomic_path
    from edge_eagle.learn import Versions

    def write(path):
        with atomic_path(path, suffix=".part") as tmp:
            tmp.write_bytes(b"GGUF" + b"half a drafter")
            os._exit(9)  # killed mid-write

    Versions({store!r}).add(write, {{}})
""")


def test_a_kill_while_a_version_is_written_leaves_a_loadable_drafter(tiny_target, domain, tmp_path):
    store = tmp_path / "store"
    versions = Versions(store)
    n, first = versions.add(lambda p: p.write_bytes(Path(domain["base"]).read_bytes()), {"note": "v1"})
    code = _KILLED_WRITE.format(root=str(ROOT), store=str(store))
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 9
    assert versions.current == 1 and versions.current_path() == first
    assert json.loads((store / "current.json").read_text())["current"] == 1
    prompt = domain["unseen"][0]
    with EdgeEagle(tiny_target, versions.current_path(), k=3, n_ctx=256) as ee:  # loads
        assert ee.generate(prompt, max_tokens=8).result().tokens == domain["answers"][prompt][:8]


def test_the_learn_command_adapts_exports_and_rolls_back(tiny_target, domain, learn_root, capsys, tmp_path):
    from edge_eagle.cli import main

    _use(tiny_target, domain["base"], domain["seen"], learn=True)
    pair = ["--target", str(tiny_target), "--drafter", str(domain["base"])]
    assert main(["learn", "adapt", *pair, "--steps", "60", "--lr", "2e-3", "--general-prompts", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["accepted"] and report["version"] == 1 and Path(report["written"]).is_file()
    # the version in use as a speculators checkpoint, which converts back to the same drafter
    ckpt = tmp_path / "speculators"
    assert main(["learn", "export", *pair, "--speculators", str(ckpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1
    assert json.loads((ckpt / "config.json").read_text())["speculators_model_type"] == "eagle3"
    convert(ckpt, tiny_target, tmp_path / "back.gguf", outtype="f32", log=lambda s: None)
    _, got = read_drafter(tmp_path / "back.gguf", tiny_target)
    _, want = read_drafter(report["written"], tiny_target)
    for name, w in want.items():
        assert np.allclose(got[name], w, atol=1e-6), name
    assert main(["learn", "rollback", *pair, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": 0}
    assert main(["learn", "rollback", *pair]) == 2  # nothing earlier: one sentence, exit code 2
    assert "base drafter is already in use" in capsys.readouterr().err
    assert main(["learn", "adapt", "--target", str(tiny_target), "--drafter", "none"]) == 2


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _cpu_ticks(pid: int) -> int:
    """The process's user and system time so far, in clock ticks (/proc's utime and stime)."""
    return sum(int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child's state in /proc")
@pytest.mark.parametrize("signals", [True, False], ids=["signals", "psutil"])
def test_the_background_child_stops_mid_work_and_goes_on(signals):
    """Both ways of stopping the child: signals (POSIX) and psutil (Windows has no SIGSTOP; run
    here through psutil's own POSIX implementation)."""
    import subprocess

    from edge_eagle.learn.idle import resume, suspend

    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 60: pass"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        _wait(lambda: _process_state(child.pid) == "R", 10, "the child to run")
        suspend(child, signals=signals)
        _wait(lambda: _process_state(child.pid) == "T", 10, "the child to stop")
        ticks = lambda: _cpu_ticks(child.pid)  # noqa: E731
        before = ticks()
        time.sleep(0.5)
        assert ticks() == before  # no CPU time while stopped
        resume(child, signals=signals)
        _wait(lambda: ticks() > before, 10, "the child to run again")
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child's state in /proc")
def test_the_server_adapts_when_idle_stops_for_a_request_and_swaps_between_requests(tiny_target, domain,
                                                                                      learn_root):
    from fastapi.testclient import TestClient

    from edge_eagle.server import ServerOptions, create_app

    engine = EdgeEagle(tiny_target, domain["base"], k=3, n_ctx=256, learn=True, learn_idle=1.5, learn_min_new=10)
    app = create_app(engine, ServerOptions())
    state = app.state.server
    assert state.adapter is engine.adapter and state.adapter is not None
    state.adapter.steps, state.adapter.lr, state.adapter.samples = 80, 2e-3, 0
    state.adapter.general_prompts = 0  # no MT-bench set for the tiny target's random text
    try:
        http = TestClient(app)
        assert state.worker.ready.wait(60) and state.adapter is not None

        def complete(prompt: str) -> dict:
            r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200
            return r.json()

        for p in domain["seen"][:12]:
            complete(p)
        _wait(lambda: state.adapter.state == "training", 30, "the background adaptation to start")
        child = state.adapter._child
        assert child is not None
        t0 = time.monotonic()
        body = complete(domain["unseen"][0])  # arrives mid-training
        took = time.monotonic() - t0
        assert _process_state(child.pid) == "T"  # stopped while a request ran, and still, until idle again
        assert body["edge_eagle"]["drafter_version"] == 0 and took < 10
        assert body["choices"][0]["text"] == engine.target.detokenize(domain["answers"][domain["unseen"][0]])
        _wait(lambda: state.adapter.reports, 180, "the adaptation to finish")
        report = state.adapter.reports[-1]
        assert report["accepted"], report
        _wait(lambda: engine.drafter_version == 1, 30, "the swap")
        for p in domain["unseen"]:
            body = complete(p)
            assert body["edge_eagle"]["drafter_version"] == 1
            assert body["choices"][0]["text"] == engine.target.detokenize(domain["answers"][p])  # greedy = plain
        assert http.get("/health").json()["learn"]["drafter_version"] == 1
        assert "edge_eagle:drafter_version 1.0" in http.get("/metrics").text
    finally:
        state.close()
        engine.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child's state in /proc")
def test_the_library_adapts_by_itself_and_the_chat_shows_the_version_and_tau(tiny_target, domain, learn_root):
    """No server: an engine made with learn=True adapts in its idle time, a reply that starts
    mid-training stops the child, and the chat shows the adaptation's result and tau per version."""
    import asyncio

    from edge_eagle.tui.app import ChatOptions, EdgeEagleChat
    from textual.widgets import Input, Static

    engine = EdgeEagle(tiny_target, domain["base"], k=3, n_ctx=256, learn=True, learn_idle=1.0, learn_min_new=12)
    adapter = engine.adapter
    assert adapter is not None
    adapter.steps, adapter.lr, adapter.general_prompts, adapter.samples = 80, 2e-3, 0, 0
    try:
        for p in domain["seen"][:12]:  # the user's earlier requests, kept by the library
            engine.generate(p, max_tokens=24).result()
        _wait(lambda: adapter.state == "training", 30, "the background adaptation to start")
        child = adapter._child
        assert child is not None
        gen = engine.generate(domain["unseen"][0], max_tokens=24)
        try:
            next(iter(gen))  # a generation holds the engine: the child is stopped at once ...
            assert adapter.state == "paused"
            _wait(lambda: _process_state(child.pid) == "T", 10, "the child to stop")  # ... as signals land
            assert gen.result().tokens == domain["answers"][domain["unseen"][0]]
        finally:
            gen.close()  # a failure above must not leave the engine's lock held for close()

        async def chat() -> None:
            app = EdgeEagleChat(ChatOptions(max_tokens=24, k=3), engine=engine)
            async with app.run_test(size=(120, 50)) as pilot:
                panel = lambda: str(app.query_one("#learning", Static).render())  # noqa: E731
                deadline = time.monotonic() + 180
                while not adapter.reports:
                    assert time.monotonic() < deadline, "timed out waiting for the adaptation to finish"
                    await pilot.pause(0.2)
                deadline = time.monotonic() + 30
                while "drafter version 1" not in panel():
                    assert time.monotonic() < deadline, f"the panel did not follow the swap: {panel()}"
                    await pilot.pause(0.2)
                assert adapter.reports[-1]["accepted"] and "v1 kept" in panel() and "held-out tau" in panel()
                app.query_one("#prompt", Input).value = "Count: alpha beta"
                await pilot.press("enter")
                deadline = time.monotonic() + 60
                while "tau here with v1" not in panel():
                    assert time.monotonic() < deadline, f"the reply's tau is not shown per version: {panel()}"
                    await pilot.pause(0.1)

        asyncio.run(chat())
        assert engine.drafter_version == 1
    finally:
        engine.close()


def test_learning_from_files_before_any_use(tiny_target, domain, learn_root, tmp_path, capsys):
    from edge_eagle.cli import main

    with EdgeEagle(tiny_target, None, n_ctx=256) as ee:
        texts = {p: ee.target.detokenize(domain["answers"][p]) for p in domain["seen"]}
    asked = tmp_path / "asked.jsonl"  # prompts with the answers the user got
    asked.write_text("".join(json.dumps({"prompt": p, "answer": texts[p]}) + "\n" for p in domain["seen"]))
    bare = tmp_path / "bare.jsonl"  # prompts alone: the target writes the answers
    bare.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in domain["unseen"][:2]))
    pair = ["--target", str(tiny_target), "--drafter", str(domain["base"])]
    assert main(["learn", "--from", str(bare), *pair]) == 2  # prompts without answers need --regenerate
    assert "--regenerate" in capsys.readouterr().err
    code = tmp_path / "src"
    code.mkdir()
    (code / "tool.py").write_text("def add(a, b):\n    return a + b\n" * 20)
    (code / "blob.bin").write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "mine.gguf"
    assert main(["learn", "--from", str(code), str(bare), str(asked), *pair, "--regenerate", "-n", "24",
                 "--steps", "60", "--lr", "2e-3", "--general-prompts", "0", "--samples", "0", "--out", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["from_requests"] == 1 + 2 + len(domain["seen"]) and report["regenerated"] == 2
    assert report["skipped"] == [str(code / "blob.bin")]
    assert report["accepted"] and out.is_file(), report["reason"]
    assert len(list(LearnStore(store_dir(tiny_target, domain["base"])).requests())) == report["from_requests"]


def test_the_draft_vocabulary_takes_the_users_missing_tokens(tiny_target, domain, tmp_path):
    """A drafter whose vocabulary lacks the domain's most frequent tokens can never draft them;
    with vocab_swap, adaptation swaps unused entries for them (the vocabulary stays ascending
    and unique), and the adapted drafter drafts them: higher acceptance than adapting without
    the swap, and greedy output still the target's."""
    from collections import Counter

    from edge_eagle.learn.adapt import widen_vocabulary

    target = read_gguf(tiny_target)
    counts = Counter(t for p in domain["seen"] for t in domain["answers"][p])
    dropped = [t for t, _ in counts.most_common(4)]
    vocab = sorted(set(read_drafter(domain["base"], target)[1]["d2t"].tolist()) - set(dropped))
    cfg = drafter_config(target, len(vocab), fc_norm=True, norm_output=True)
    model = random_reference(cfg, seed=5, embed=torch.from_numpy(target.tensor_array("token_embd.weight")),
                             d2t=torch.tensor(vocab))
    narrow = write_eagle3(tmp_path / "narrow.gguf", reference_weights(model), cfg, target)

    used = {t for a in domain["answers"].values() for t in a}
    assert widen_vocabulary(model, target, dict(counts), used, limit=2, min_count=2) == 2
    d2t = model.d2t.numpy()
    assert set(dropped[:2]) <= set(d2t.tolist()) and np.all(np.diff(d2t) > 0) and len(d2t) == len(vocab)
    assert not used & (set(vocab) - set(d2t.tolist()))  # only entries no text uses were given up

    from edge_eagle.learn.adapt import adapt, model_weights
    from edge_eagle.target import Target

    runtime = Target(tiny_target, n_ctx=256, n_batch=256)
    try:
        requests = [(runtime.tokenize(p), domain["answers"][p]) for p in domain["seen"]]
        results = {}
        for name, swap in (("kept", 0), ("wide", 64)):
            result, adapted = adapt(runtime, narrow, requests, tmp_path / name,
                                    AdaptOptions(steps=60, lr=2e-3, batch_rows=512, samples=0, vocab_swap=swap))
            write_eagle3(tmp_path / f"{name}.gguf", model_weights(adapted), adapted.cfg, target)
            results[name] = result
    finally:
        runtime.close()
    kept, wide = results["kept"], results["wide"]
    assert kept.vocab_swapped == 0 and wide.vocab_swapped >= len(dropped), wide
    assert set(dropped) <= set(read_drafter(tmp_path / "wide.gguf", target)[1]["d2t"].tolist())
    assert wide.tau_after > kept.tau_after + 0.1, (kept.tau_after, wide.tau_after)
    texts, tau_wide, _ = _use(tiny_target, tmp_path / "wide.gguf", domain["unseen"])
    _, tau_kept, _ = _use(tiny_target, tmp_path / "kept.gguf", domain["unseen"])
    assert texts == [domain["answers"][p] for p in domain["unseen"]]  # greedy = plain decoding
    assert tau_wide > tau_kept, (tau_kept, tau_wide)  # measured through llama.cpp, unseen prompts


def test_the_learning_rate_warms_up_then_falls_to_its_final_share_by_the_last_step():
    """lr_final is the rate's share at step `steps`, reached by a falling cosine after the
    linear warm-up; 1 keeps the rate constant after the warm-up."""
    from edge_eagle.learn.adapt import lr_scale

    opts = AdaptOptions(steps=200, warmup=10, lr_final=0.1)
    scales = [lr_scale(opts, i) for i in range(300)]
    assert scales[0] == pytest.approx(0.1) and scales[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(scales[:10], scales[1:10]))  # warm-up rises
    assert all(a >= b for a, b in zip(scales[10:200], scales[11:201]))  # then falls
    assert scales[105] == pytest.approx(0.55, abs=0.01)  # the cosine's middle
    assert scales[200] == pytest.approx(0.1) and scales[299] == pytest.approx(0.1)  # and stays at the floor
    flat = AdaptOptions(steps=200, warmup=10, lr_final=1.0)
    assert [lr_scale(flat, i) for i in range(10, 300)] == [1.0] * 290
