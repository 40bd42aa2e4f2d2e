"""`edge-eagle bench`: end to end on the tiny synthetic models (every runner, all three
outputs), and the pieces its numbers come from."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from edge_eagle.bench.divergence import divergences, greedy_equal
from edge_eagle.bench.prompts import load_jsonl
from edge_eagle.bench.report import markdown
from edge_eagle.bench.run import BenchOptions, run_bench
from edge_eagle.bench.runners import EngineRunner, RunResult, acceptance_from_calls, run_measured, upstream_binary
from edge_eagle.bench.suite import Bench
from edge_eagle.bench.summary import predict
from edge_eagle.cli import main
from edge_eagle.errors import EdgeEagleError
from tests.tiny_models import write_tiny_target

PROMPTS = [
    {"id": "a", "category": "writing", "prompt": "Write a haiku about the sea."},
    {"id": "b", "category": "math", "prompt": "What is 12 times 12?"},
    {"id": "c", "category": "writing", "prompt": "Describe a red apple."},
]
REQUIRED = {"name", "tokens_per_second", "speedup", "tau", "per_position_acceptance"}


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("bench") / "prompts.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in PROMPTS) + "\n")
    return p


@pytest.fixture(scope="module")
def upstream() -> Path:
    binary = upstream_binary()
    if binary is None:
        pytest.skip("llama-speculative-simple is not built: `make test` builds it (scripts/build_upstream.sh)")
    return binary


def test_bench_cli_end_to_end_on_tiny_models(tmp_path, prompt_file, tiny_target, tiny_drafters, upstream):
    draft_model = write_tiny_target(tmp_path / "tiny-draft-model.gguf", seed=11, n_layer=2)
    out = tmp_path / "out"
    rc = main(["bench", "--prompts", str(prompt_file), "-n", "12", "--target", str(tiny_target),
               "--drafter", str(tiny_drafters["eagle3"][0]), "--drafter", str(tiny_drafters["eagle3.1"][0]),
               "--k", "2", "--draft-model", str(draft_model), "--draft-model-k", "2", "--threads", "1", "--ngram",
               "--n-ctx", "512", "--out", str(out), "--json", str(tmp_path / "report.json"), "--quiet"])
    assert rc == 0
    for name in ("bench.json", "bench.md", "acceptance.png", "speedup_by_category.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "report.json").read_text())
    names = [r["name"] for r in report["runners"]]
    assert names[0] == "plain"
    for want in ("edge-eagle k=2 [tiny-eagle3]", "edge-eagle auto [tiny-eagle3.1]",
                 "llama.cpp draft-eagle3 k=2 [tiny-eagle3]", "llama.cpp draft-eagle3 k=2 [tiny-eagle3.1]",
                 "prompt-lookup k=3", "draft-model k=2", "llama.cpp ngram-mod [defaults]",
                 "llama.cpp ngram-map-k [cpu]"):
        assert want in names, names
    for r in report["runners"]:
        assert REQUIRED <= r.keys(), r["name"]
        assert r["tokens_per_second"] > 0, r["name"]
        assert r["peak_rss_mb"] and r["peak_rss_mb"] > 10, r["name"]
        assert set(r["speedup_by_category"]) == {"math", "writing"}
        if r["kind"] in ("edge-eagle", "upstream", "draft-model", "prompt-lookup", "ngram"):
            assert r["tau"] is not None and r["tau"] >= 1.0, r["name"]
    by = {r["name"]: r for r in report["runners"]}
    assert by["plain"]["speedup"] == 1.0 and by["plain"]["tau"] is None
    # llama.cpp's loop without drafts: the reference for its n-gram runners' loop
    assert by["llama.cpp ngram-mod [no drafts]"]["drafted"] == 0
    # the same drafter, the same greedy semantics: every runner reproduces plain decoding
    for name in ("edge-eagle k=2 [tiny-eagle3]", "edge-eagle k=2 [tiny-eagle3.1]", "edge-eagle auto [tiny-eagle3]"):
        assert by[name]["greedy_equals_plain"]["ok"], name
    assert len(by["edge-eagle k=2 [tiny-eagle3]"]["per_position_acceptance"]) == 2
    assert report["prompts"]["count"] == 3 and report["cost_model"]["c"]["1"] == 1.0
    md = (out / "bench.md").read_text()
    assert all(n in md for n in names)
    # the paired comparison: only the prompts on which every runner wrote plain decoding's text
    texts = [[o["text"] for o in r["outputs"]] for r in report["runners"]]

    def same_as(text: str, ref: str) -> bool:
        return text.startswith(ref) if len(text) >= len(ref) else ref.startswith(text)
    common = sum(all(same_as(t[i], texts[0][i]) for t in texts) for i in range(3))
    # each prompt's own ratio, of which the runner's speedup is the median
    for r in report["runners"]:
        per = [o["speedup"] for o in r["outputs"]]
        assert r["speedup"] == pytest.approx(statistics.median(per), abs=1e-3), r["name"]
        assert sum(o["greedy_equals_plain"] for o in r["outputs"]) == r["greedy_equals_plain"]["equal"]
    assert {r["speedup_same_text"]["prompts"] for r in report["runners"]} == {common}
    assert common <= min(r["greedy_equals_plain"]["equal"] for r in report["runners"])
    if common:
        assert by["plain"]["speedup_same_text"]["median"] == 1.0
        assert f"On the {common} of 3 prompts where every runner wrote plain decoding's text" in md
    else:
        assert "No prompt where every runner wrote plain decoding's text" in md


def test_same_semantics_as_upstream_on_an_eagle3_drafter(tmp_path, tiny_target, trained_drafters, upstream):
    """Drafters distilled from the tiny target, same k, greedy: on the EAGLE-3 one, upstream's
    C++ loop accepts what ours accepts (same semantics)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about {t}."}) + "\n"
                               for t in ("the sea", "winter", "clocks", "a garden")))
    report = run_bench(BenchOptions(prompts=str(prompts), max_tokens=40, target=str(tiny_target),
                                    drafters=[str(trained_drafters["eagle3"][1])],
                                    ks=[3], auto=False, prompt_lookup_k=None, threads=1, n_ctx=512, memory=False),
                       progress=False)
    by = {r["kind"]: r for r in report["runners"]}
    ours, theirs = by["edge-eagle"], by["upstream"]
    assert ours["greedy_equals_plain"]["ok"] and theirs["greedy_equals_plain"]["ok"]
    assert ours["tau"] > 1.2, ours["tau"]  # far from a trivial 0 == 0
    assert abs(ours["tau"] - theirs["tau"]) <= 0.03 * ours["tau"], (ours["tau"], theirs["tau"])


@pytest.mark.smollm
def test_upstream_runs_the_shipped_eagle31_drafter_as_eagle3_and_accepts_less(tmp_path, upstream):
    """The real SmolLM2 target and the shipped EAGLE-3.1 drafter: upstream llama.cpp ignores
    fc_norm / norm_output, so its drafts are worse than edge-eagle's from the same file."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in (
        "Write a short travel blog post about a trip to Hawaii.",
        "Explain how a bicycle works to a ten year old.",
        "Give three tips for writing clean Python code.")))
    report = run_bench(BenchOptions(prompts=str(prompts), max_tokens=64, ks=[3], auto=False, prompt_lookup_k=None,
                                    memory=False), progress=False)
    by = {r["kind"]: r for r in report["runners"]}
    assert by["edge-eagle"]["greedy_equals_plain"]["ok"]
    assert by["edge-eagle"]["tau"] > by["upstream"]["tau"], (by["edge-eagle"]["tau"], by["upstream"]["tau"])


def test_acceptance_from_recorded_proposals():
    seq = [1, 2, 3, 4, 5, 6, 7]
    calls = [(2, [3, 4, 9]),  # 2 accepted, third wrong
             (5, [6, 7]),  # both accepted (cut at the end of seq)
             (7, [8])]  # after the last kept token: never verified
    acc = acceptance_from_calls(calls, seq)
    assert (acc.verify_steps, acc.accepted, acc.drafted, acc.drafted_at, acc.accepted_at) == (2, 4, 5, [2, 2, 1],
                                                                                             [2, 2, 0])


def test_greedy_equality_check():
    plain = RunResult(text="hello world", tokens=[1, 2, 3], generated=3, seconds=1.0)
    assert greedy_equal(RunResult("hello world", [1, 2, 3], 3, 1.0), plain, 3)
    assert not greedy_equal(RunResult("hello world", [1, 2, 4], 3, 1.0), plain, 3)
    assert greedy_equal(RunResult("hello world and more", None, 5, 1.0), plain, 3)  # upstream overshoots n
    assert not greedy_equal(RunResult("hello there", None, 3, 1.0), plain, 3)


def test_cost_model_prediction():
    r = EngineRunner(engine=None, k=3, drafter="d.gguf")
    out = predict(r, {"tau": 2.0}, {1: 1.0, 2: 1.5, 3: 1.8, 4: 2.0}, {"d.gguf": 0.1})
    assert out["predicted_speedup"] == pytest.approx(2.0 / (2.0 + 0.3), abs=1e-4)
    assert out["predicted_speedup_memory_bound"] == pytest.approx(2.0 / 1.3, abs=1e-4)


def test_peak_rss_is_the_childs_own():
    import numpy as np

    ballast = np.ones(300 * 2**20 // 8)  # make this process large: the child must not inherit it
    rc, out, _, rss = run_measured(["python3", "-c", "import sys; b = bytearray(64 * 2**20); print(len(b))"])
    assert rc == 0 and out.strip() == str(64 * 2**20)
    assert 64 * 2**20 < rss < 250 * 2**20
    del ballast


def test_prompt_file_errors(tmp_path):
    with pytest.raises(EdgeEagleError, match="not found"):
        load_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(EdgeEagleError, match="line 2 is not JSON"):
        load_jsonl(bad)
    bad.write_text('{"text": 3}\n')
    with pytest.raises(EdgeEagleError, match="no prompt"):
        load_jsonl(bad)
    good = tmp_path / "good.jsonl"
    good.write_text('{"turns": ["first", "second"], "category": "x"}\n{"messages": [{"role": "user", '
                    '"content": "hi"}]}\n')
    assert [(p.category, p.text) for p in load_jsonl(good)] == [("x", "first"), ("default", "hi")]


def test_markdown_lists_every_runner():
    runner = {"name": "plain", "kind": "plain", "tokens_per_second": 10.0, "speedup": 1.0, "speedup_min": 1.0,
              "speedup_max": 1.0, "tau": None, "per_position_acceptance": [], "peak_rss_mb": 100.0,
              "rss_over_plain_mb": 0.0, "greedy_equals_plain": {"equal": 2, "prompts": 2, "ok": True},
              "predicted_speedup": 1.0, "predicted_speedup_memory_bound": 1.0, "time_split": None}
    spec = dict(runner, name="edge-eagle k=3", tau=1.5, per_position_acceptance=[0.5, 0.2, 0.1, 0.0, 0.0, 0.0])
    report = {"target": "t.gguf", "machine": {"cpu": "cpu", "cores": 2, "threads": 2, "memory_gib": 8,
                                              "backend": "b"},
              "prompts": {"set": "x", "count": 2, "categories": ["a"]}, "settings": {"max_tokens": 8},
              "runners": [runner, spec], "skipped": [{"runner": "llama.cpp", "why": "not built"}],
              "cost_model": {"c": {"1": 1.0}, "target_step_s": 0.01, "drafter_step": {}}}
    md = markdown(report)
    assert "| plain |" in md and "| edge-eagle k=3 |" in md and "0.50 0.20 0.10 0.00 0.00 …" in md
    assert "Not run: llama.cpp (not built)" in md
    report["machine"]["flash_attn"] = "forced off"
    assert "flash attention forced off" in markdown(report)  # every runner's attention, in the report's header


def test_divergence_is_located_and_its_logit_gap_measured(tiny_target, tiny_drafters):
    import numpy as np

    from edge_eagle.bench.prompts import BenchPrompt

    bench = Bench(BenchOptions(target=str(tiny_target), drafters=[str(tiny_drafters["eagle3"][0])], ks=[],
                               auto=False, upstream=False, prompt_lookup_k=None, n_ctx=512, max_tokens=16))
    try:
        p = BenchPrompt("1", "x", "Tell me about the sea.")
        ids, text = bench.prompt_tokens(p)
        plain = bench.runners[0].run(ids, text, 16)
        wrong = list(plain.tokens)
        wrong[5] = (wrong[5] + 1) % 1000
        target = bench.engines[0].target
        by_tokens = RunResult(text="", tokens=wrong, generated=16, seconds=1.0)
        by_text = RunResult(text=target.detokenize(wrong), tokens=None, generated=16, seconds=1.0)
        noise, div = divergences(bench, [p], [ids], {"plain": [plain], "a": [by_tokens], "b": [by_text]})
        assert noise >= 0.0
        assert div["a"][0]["token"] == 5
        assert div["b"][0]["token"] <= 5  # text may differ from the start of the changed token's piece
        target.memory.clear()
        target.set_capture(())
        logits = np.sort(np.asarray(target.prefill(ids + plain.tokens[:5]).logits[-1], dtype=np.float64))
        assert div["a"][0]["top2_gap"] == pytest.approx(logits[-1] - logits[-2], abs=1e-3)
        # plain decoding ended after 6 tokens and a runner went on: the divergence is at the end
        ended = RunResult(text=target.detokenize(plain.tokens[:6]), tokens=list(plain.tokens[:6]), generated=6,
                          seconds=1.0)
        _, div = divergences(bench, [p], [ids], {"plain": [ended], "c": [plain]})
        assert div["c"][0]["token"] == 6
        target.memory.clear()
        logits = np.sort(np.asarray(target.prefill(ids + plain.tokens[:6]).logits[-1], dtype=np.float64))
        assert div["c"][0]["top2_gap"] == pytest.approx(logits[-1] - logits[-2], abs=1e-3)
    finally:
        bench.close()


def test_the_noise_estimate_decodes_the_longest_context_the_runs_reached(tiny_target, tiny_drafters, monkeypatch):
    """The batch-shape noise is measured over plain decoding's whole answer after the prompt whose
    prompt and answer are longest together (rounding changes with the context length: one-token and
    batched decodes can agree early in an answer and part later)."""
    from edge_eagle.bench import divergence
    from edge_eagle.bench.prompts import BenchPrompt

    seen = []
    real = divergence.numeric_noise

    def spy(target, prompt, continuation):
        seen.append((list(prompt), list(continuation)))
        return real(target, prompt, continuation)

    monkeypatch.setattr(divergence, "numeric_noise", spy)
    bench = Bench(BenchOptions(target=str(tiny_target), drafters=[str(tiny_drafters["eagle3"][0])], ks=[],
                               auto=False, upstream=False, prompt_lookup_k=None, n_ctx=512, max_tokens=40))
    try:
        ps = [BenchPrompt("long", "x", "Tell me about the sea, the waves, the wind and the ships."),
              BenchPrompt("short", "x", "Hi.")]
        ids = [bench.prompt_tokens(p)[0] for p in ps]
        plain = [bench.runners[0].run(ids[0], "", 8), bench.runners[0].run(ids[1], "", 40)]
        assert len(ids[1]) + len(plain[1].tokens) > len(ids[0]) + len(plain[0].tokens)
        noise, _ = divergences(bench, ps, ids, {"plain": plain})
        assert seen == [(ids[1], list(plain[1].tokens))]
        assert noise >= 0.0
        assert divergence.NOISE_CHUNKS[-1] >= 9  # a verify batch of a chain of 8
    finally:
        bench.close()


def test_the_multi_turn_and_agent_sets_load():
    from edge_eagle.bench.prompts import load_prompts

    turn2 = load_prompts("mtbench-turn2")
    assert len(turn2) == 80 and all(len(p.turns) == 2 and p.text == p.turns[1] for p in turn2)
    agent = load_prompts("agent")
    assert len(agent) >= 8
    for p in agent:
        assert p.messages[-1]["role"] == "user" and p.messages[-1]["content"] == p.text
        assert {m["role"] for m in p.messages} <= {"system", "user", "assistant"}


def test_a_second_turn_follows_the_targets_own_first_answer(tiny_target, tiny_drafters):
    from edge_eagle.bench.prompts import BenchPrompt
    from tests.chat_templates import MINIMAL

    bench = Bench(BenchOptions(target=str(tiny_target), drafters=[str(tiny_drafters["eagle3"][0])], ks=[],
                               auto=False, upstream=False, prompt_lookup_k=None, n_ctx=512, max_tokens=12))
    try:
        bench.engines[0].target.chat_template = MINIMAL
        p = BenchPrompt("1", "writing", "Shorter, please.", turns=("Tell me about rain.", "Shorter, please."))
        msgs = bench.messages(p)
        first = bench.engines[0].chat([msgs[0]], max_tokens=12, speculative=False).result().text
        assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == first
        tokens, _ = bench.prompt_tokens(p)
        assert len(tokens) + 12 + 16 <= 512
    finally:
        bench.close()


def test_a_prompt_cut_to_the_window_keeps_its_special_tokens_for_llama_cpps_tools(smollm):
    """A conversation whose last message alone overflows the window keeps that message's end; the
    text given to llama.cpp's tools, tokenized as they do (BOS added, special tokens parsed),
    gives them the same prompt, chat markers included."""
    from edge_eagle.bench.prompts import BenchPrompt

    bench = Bench(BenchOptions(target=str(smollm), drafters=[], ks=[], auto=False, upstream=False,
                               prompt_lookup_k=None, n_ctx=256, max_tokens=16))
    try:
        target = bench.engines[0].target
        long = " ".join(f"line {i}: a tool result" for i in range(200))
        p = BenchPrompt("1", "agent", long, messages=({"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": long}))
        tokens, text = bench.prompt_tokens(p)
        assert len(tokens) == 256 - 16 - 16
        again = target.tokenize(text, add_special=True, parse_special=True)
        special = target.tokenize("<|im_start|>", add_special=False, parse_special=True)[0]
        assert again[-len(tokens) + 8:] == tokens[8:]  # the same tokens, but maybe where the cut split a word
        assert tokens[-3:] == again[-3:] and special in tokens[-4:]  # it ends with the assistant's turn
    finally:
        bench.close()


def test_llama_cpps_tools_read_a_prompt_with_backslashes_as_it_is(tiny_target, upstream):
    """llama.cpp's tools turn escapes in a prompt file into characters unless told not to: a
    prompt quoting JSON (\\" inside a string) would be another prompt for them. The prompt they
    echo is ours, so their answer is found after it."""
    from edge_eagle.bench.prompts import BenchPrompt

    bench = Bench(BenchOptions(target=str(tiny_target), drafters=[], ks=[], auto=False, upstream=False,
                               prompt_lookup_k=None, n_ctx=256, max_tokens=8, ngram=True))
    try:
        p = BenchPrompt("1", "agent", 'Run {"cmd": "rg -n \\"a|b\\" x.json"} and print \\n then \\\\ done.')
        ids, text = bench.prompt_tokens(p)
        assert '\\"' in text and "\\n" in text
        runner = next(r for r in bench.runners if r.kind == "ngram")
        result = runner.run(ids, text, 8)
        assert result.generated > 0
        assert "rg -n" not in result.text  # the echo they print matched ours and was cut off
    finally:
        bench.close()


def test_rounds_rotate_the_runners_and_keep_each_ones_median_run(tiny_target, tiny_drafters):
    """--rounds: every runner decodes a prompt once a round, the order rotating by prompt and by
    round; each keeps its median-speed run; and auto's engine history receives one answer per
    prompt (its last round's), so no round drafts from an earlier round's answer."""
    from edge_eagle.bench.prompts import BenchPrompt
    from edge_eagle.bench.run import _prompt_rounds, median_run
    from edge_eagle.errors import EdgeEagleError

    with pytest.raises(EdgeEagleError, match="--rounds must be 1 or more"):
        run_bench(BenchOptions(rounds=0))
    runs = [RunResult(text=str(s), tokens=None, generated=10, seconds=10 / s) for s in (50.0, 10.0, 30.0, 20.0)]
    assert median_run(runs).tokens_per_second == pytest.approx(20.0)  # the lower middle one of four
    assert median_run(runs[:3]).tokens_per_second == pytest.approx(30.0)
    bench = Bench(BenchOptions(target=str(tiny_target), drafters=[str(tiny_drafters["eagle3.1"][0])], ks=[1],
                               auto=True, upstream=False, prompt_lookup_k=None, n_ctx=512, max_tokens=12,
                               memory=False))
    try:
        names = [r.name for r in bench.runners]
        assert names == ["plain", "edge-eagle k=1", "edge-eagle auto"]
        engine = bench.engines[0]
        engine.reset_history()
        order: list[str] = []
        for i, text in enumerate(["Tell me about the sea.", "Name three colours."]):
            ids, shown = bench.prompt_tokens(BenchPrompt(str(i), "x", text))
            got = _prompt_rounds(bench.runners, i, 3, ids, shown, 12, lambda r: order.append(r.name), lambda: None)
            assert set(got) == set(names) and all(g.generated > 0 for g in got.values())
            assert engine.suffix.stats()["texts"] == i + 1  # one answer per prompt joined the history
        # prompt 0: rounds start at runner 0, 1, 2; prompt 1: at runner 1, 2, 0
        starts = [order[j] for j in range(0, len(order), len(names))]
        assert starts == [names[0], names[1], names[2], names[1], names[2], names[0]]
        assert all(sorted(order[j:j + 3]) == sorted(names) for j in range(0, len(order), 3))
        assert [r.history for r in bench.runners] == [False, False, True]  # restored after the rounds
    finally:
        bench.close()
