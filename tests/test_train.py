"""`edge-eagle train`: the TTT unroll computes what the runtime computes, training makes a
drafter better than a random one, and checkpoints round-trip through convert."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_eagle.converters import convert

from edge_eagle import EdgeEagle
from edge_eagle.checks.parity import verify_drafter
from edge_eagle.checks.reference import Eagle3Config, random_reference
from edge_eagle.errors import EdgeEagleError
from edge_eagle.gguf_file import read_gguf
from edge_eagle.target import Target
from edge_eagle.train import TrainOptions, save_checkpoint, train
from edge_eagle.train.trainer import draft_vocabulary, init_model
from edge_eagle.train.ttt import ttt_states

quiet = dict(log=lambda m: None)


@pytest.mark.parametrize("eagle31", [False, True])
def test_ttt_states_equal_the_runtime_chain(eagle31):
    """Step s at position P must be the s-th chain row of a chain seeded at P-s, run
    sequentially with a KV cache (real rows 0..P-s, then the chain's own rows)."""
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       target_hidden_size=24, vocab_size=100, draft_vocab_size=100, target_layers=(1, 2, 3),
                       fc_norm=eagle31, norm_output=eagle31)
    model = random_reference(cfg, seed=1, embed=torch.randn(100, 32))
    T, steps = 14, 4
    gen = torch.Generator().manual_seed(2)
    feats = torch.randn(1, T, 72, generator=gen) * 3
    toks = torch.randint(0, 100, (1, T + 1), generator=gen)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        states = list(ttt_states(model, feats, toks[:, 1:], pos, steps))
        g = model.encode(feats)
        for seed in range(T - steps):
            cache: dict = {}
            h = model.layer(toks[:, 1:seed + 2], g[:, :seed + 1], pos[:, :seed + 1], cache)[:, -1:]
            torch.testing.assert_close(h[0, 0], states[0][0, seed], atol=1e-5, rtol=1e-5)
            for j in range(1, steps):
                p = seed + j
                h = model.layer(toks[:, p + 1:p + 2], model.carry(h), torch.tensor([[p]]), cache)
                torch.testing.assert_close(h[0, 0], states[j][0, p], atol=1e-5, rtol=1e-5)


def test_extracted_features_are_the_runtime_capture(features, tiny_target):
    z = np.load(features / "shard-00000.npz")
    a, b = z["starts"][:2]
    toks = z["tokens"][a:b].tolist()
    target = Target(tiny_target, n_ctx=512)
    target.set_capture((2, 4, 5))
    res = target.prefill(toks[:-1])
    target.close()
    np.testing.assert_allclose(z["feats"][a:b - 1].astype(np.float32), res.features, atol=2e-2, rtol=1e-2)
    assert z["mask"][a:b].any() and not z["mask"][a]
    # greedy regeneration: each answer token is the top label of the position before it
    m = np.flatnonzero(z["mask"][a:b])
    assert (z["top_ids"][a:b][m, 0] == np.asarray(toks)[m + 1]).all()


def _tau(target_path: Path, drafter: Path, prompts: list[str]) -> float:
    with EdgeEagle(target_path, drafter, k=4) as ee:
        acc = steps = 0
        for p in prompts:
            s = ee.chat([{"role": "user", "content": p}], max_tokens=40).result().stats
            acc, steps = acc + s.accepted, steps + s.verify_steps
        return 1 + acc / steps


def test_training_lowers_the_loss_and_beats_a_random_drafter(features, tiny_target, trained_drafters, tmp_path):
    ckpt, trained_gguf = trained_drafters["eagle3.1"]  # 60 steps, TrainOptions as in conftest
    hist = json.loads((ckpt / "train_history.json").read_text())
    first = np.mean([h["loss"] for h in hist[:5]])
    last = np.mean([h["loss"] for h in hist[-5:]])
    assert last < 0.7 * first, (first, last)
    assert len(hist) == 60
    opts = TrainOptions(draft_vocab=512)

    # the same architecture and vocabulary, untrained
    target = read_gguf(tiny_target)
    shards = sorted(features.glob("shard-*.npz"))
    d2t = draft_vocabulary(shards, target.vocab_size, 512)
    save_checkpoint(init_model(target, (2, 4, 5), d2t, opts), tmp_path / "random", target, {})
    convert(tmp_path / "random", tiny_target, tmp_path / "random.gguf", outtype="f32", **quiet)

    prompts = ["Tell me about the sea.", "Tell me about winter.", "Tell me about clocks."]
    trained, untrained = _tau(tiny_target, trained_gguf, prompts), _tau(
        tiny_target, tmp_path / "random.gguf", prompts)
    assert trained > untrained + 0.2, (trained, untrained)


@pytest.mark.parametrize("ffn", [None, 48])
def test_checkpoint_round_trips_through_convert_into_the_runtime(features, tiny_target, tmp_path, ffn):
    """Also at an FFN width other than the target's (a capacity rung): llama.cpp's eagle3
    reads the drafter's own feed_forward_length."""
    target = read_gguf(tiny_target)
    d2t = draft_vocabulary(sorted(features.glob("shard-*.npz")), target.vocab_size, 256)
    model = init_model(target, (2, 4, 5), d2t, TrainOptions(ffn=ffn))
    assert model.cfg.intermediate_size == (ffn or target.require("llama.feed_forward_length"))
    with torch.no_grad():  # perturb so the round trip is checked on non-initial weights
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_checkpoint(model, tmp_path / "ckpt", target, {"note": "test"})
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DraftModel"] and cfg["fc_norm"] and cfg["norm_output"]
    report = convert(tmp_path / "ckpt", tiny_target, tmp_path / "d.gguf", outtype="f32", **quiet)
    assert report.layout == "speculators"
    assert report.config.fc_norm and report.config.norm_output and not report.config.norm_before_residual
    c = verify_drafter(tmp_path / "d.gguf", tiny_target, model)
    assert c.relative_error < 2e-3 and c.top1_agreement == 1.0


def test_cli_train_runs_the_whole_pipeline(tiny_target, corpus, tmp_path, capsys, monkeypatch):
    """extract -> train -> convert from one command; a second run resumes the feature cache,
    which lives in the user cache directory by default."""
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from edge_eagle.cli import main
    from edge_eagle.gguf_file import read_gguf

    base = ["train", "--target", str(tiny_target), "--data", str(corpus), "--out", str(tmp_path / "w"),
            "--max-tokens", "300", "--max-new", "16", "--layers", "2", "4", "5", "--json"]
    assert main(base + ["--steps", "0"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["tokens"] >= 300
    out = tmp_path / "d.gguf"
    assert main(base + ["--steps", "2", "--batch-rows", "64", "--draft-vocab", "256", "--gguf", str(out),
                        "--outtype", "f32"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2
    g = read_gguf(out)
    assert g.arch == "eagle3" and list(g.meta["eagle3.target_layers"]) == [2, 4, 5]
    cached = list((tmp_path / "cache" / "edge-eagle" / "features").glob("*/manifest.json"))
    assert len(cached) == 1 and first["features"] == str(cached[0].parent)


def test_batched_regeneration_equals_one_sequence_at_a_time(tiny_target, corpus):
    """extract_many regenerates several answers in one llama.cpp batch (one KV stream each):
    the tokens, captured features, labels and masks are those of extract_one."""
    from edge_eagle.train.data import iter_jsonl, training_examples
    from edge_eagle.train.extract import extract_many, extract_one

    convs = list(training_examples(iter_jsonl(corpus)))[:7]
    one = Target(tiny_target, n_ctx=160)
    many = Target(tiny_target, n_ctx=160, n_seq=3)
    for t in (one, many):
        t.set_capture((2, 4, 5))
    try:
        ref = {i: extract_one(one, c, regenerate=True, max_prompt=64, max_new=24, topk=8) for i, c in enumerate(convs)}
        got = dict(extract_many(many, enumerate(convs), regenerate=True, max_prompt=64, max_new=24, topk=8))
    finally:
        one.close()
        many.close()
    assert got.keys() == ref.keys() and sum(s is not None for s in got.values()) >= 6
    for i, r in ref.items():
        s = got[i]
        np.testing.assert_array_equal(s.tokens, r.tokens)
        np.testing.assert_array_equal(s.mask, r.mask)
        np.testing.assert_array_equal(s.top_ids[s.mask], r.top_ids[r.mask])
        n = len(s.tokens) - 1  # the last token is never decoded, its row is not used
        np.testing.assert_allclose(s.feats[:n].astype(np.float32), r.feats[:n].astype(np.float32), atol=2e-2)


def test_parallel_extraction_resumes_without_losing_or_repeating_a_conversation(tiny_target, corpus, tmp_path):
    """Answers finish out of order; an interrupted run resumes at exactly the unfinished ones."""
    from edge_eagle.train.data import iter_jsonl
    from edge_eagle.train.extract import extract

    def sequences(out: Path) -> list[tuple]:
        m = json.loads((out / "manifest.json").read_text())
        seqs = []
        for name in m["shards"]:
            with np.load(out / name) as z:
                st = z["starts"]
                seqs += [tuple(z["tokens"][a:b]) for a, b in zip(st[:-1], st[1:])]
        return seqs

    t = Target(tiny_target, n_ctx=200, n_seq=4)
    try:
        kw = dict(regenerate=True, max_new=40, shard_tokens=60, progress=False)
        whole = extract(t, (2, 4, 5), iter_jsonl(corpus), tmp_path / "whole", max_tokens=10**6, **kw)
        part = extract(t, (2, 4, 5), iter_jsonl(corpus), tmp_path / "part", max_tokens=250, **kw)
        assert part["tokens"] >= 250  # the budget is reached, not stopped short
        assert part["conversations_seen"] + len(part["done_beyond"]) < whole["conversations_seen"]
        resumed = extract(t, (2, 4, 5), iter_jsonl(corpus), tmp_path / "part", max_tokens=10**6, **kw)
    finally:
        t.close()
    assert resumed["conversations_seen"] == whole["conversations_seen"] == 17 and resumed["done_beyond"] == []
    a, b = sequences(tmp_path / "whole"), sequences(tmp_path / "part")
    assert len(b) == len(set(b)) and sorted(a) == sorted(b)


def test_training_resumes_exactly_where_it_stopped(features, tiny_target, tmp_path, monkeypatch):
    """An interrupted run continued with resume=True ends with the weights of an uninterrupted one,
    and the history carries the held-out simulated acceptance."""
    import edge_eagle.train.trainer as P
    from edge_eagle.train import train

    opts = TrainOptions(steps=8, ttt_steps=2, batch_rows=256, draft_vocab=256, lr=3e-3, warmup=2, save_every=3,
                        eval_every=4, heldout=2)
    train(features, tiny_target, tmp_path / "whole", opts, progress=False)
    real, calls = P.ttt_loss, []

    def stop_at_seventh(*a, **k):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(P, "ttt_loss", stop_at_seventh)
    with pytest.raises(KeyboardInterrupt):
        train(features, tiny_target, tmp_path / "part", opts, progress=False)
    monkeypatch.setattr(P, "ttt_loss", real)
    assert torch.load(tmp_path / "part" / P.STATE, weights_only=False)["step"] == 6
    summary = train(features, tiny_target, tmp_path / "part", opts, progress=False, resume=True, log=lambda m: None)
    assert summary["steps"] == 8
    from safetensors.torch import load_file

    w1, w2 = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "part" / "model.safetensors")
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=0, atol=1e-6)
    hist = json.loads((tmp_path / "part" / "train_history.json").read_text())
    assert [h["step"] for h in hist] == list(range(1, 9))
    evals = [h["heldout"] for h in hist if "heldout" in h]
    assert len(evals) == 2 and all(1.0 <= e["tau"] <= 3.0 and e["seeds"] > 0 for e in evals)
    with pytest.raises(Exception, match="nothing to resume"):
        train(features, tiny_target, tmp_path / "none", opts, progress=False, resume=True)


def test_simulated_acceptance_counts_chains_of_matching_drafts():
    """The held-out signal: a chain seeded at P accepts draft s when rows P..P+s all match."""
    from edge_eagle.train import pipeline as P

    class Fake(torch.nn.Module):  # drafts the token in column 0 of its input state
        def __init__(self):
            super().__init__()
            self.d2t = torch.arange(4)

        def draft_logits(self, h):
            return torch.nn.functional.one_hot(h[..., 0].long(), 4).float()

    truth = torch.tensor([[1, 2, 3, 0, 1, 2]])
    drafts = [torch.tensor([[1, 2, 0, 0, 1, 2]]), torch.tensor([[3, 2, 3, 0, 0, 2]])]  # step 0, step 1
    batch = type("B", (), {})()
    batch.feats = torch.zeros(1, 6, 1)
    batch.tokens = torch.zeros(1, 6, dtype=torch.long)
    batch.pos = torch.arange(6)[None]
    batch.label_ids = truth[..., None]
    batch.valid = torch.ones(1, 6, dtype=torch.bool)

    class Data:
        def batches(self, rows, rng):
            yield batch

    orig = P.__dict__.get("ttt_states")
    import edge_eagle.train.ttt as T

    saved = T.ttt_states
    T.ttt_states = lambda model, f, t, p, steps: iter([d[..., None].float() for d in drafts[:steps]])
    try:
        got = P.simulated_acceptance(Fake(), Data(), 2)
    finally:
        T.ttt_states = saved
    assert orig is None
    # step 0 matches at rows 0,1,3,4,5 (5 of 6 seeds); step 1 of seed P is row P+1:
    # seed 0 -> row1 ok, seed 1 -> row2 ok, seed 3 -> row4 no (0 != 1), seed 4 -> row5 ok, seed 5 -> none
    assert got["seeds"] == 6 and got["tau"] == round(1 + (5 + 3) / 6, 4)
    assert got["per_position_acceptance"] == [round(5 / 6, 4), round(3 / 5, 4)]
    # decoding's walk: seed 0 accepts 2 (3 tokens), seed 3 accepts 1 (2 tokens), seed 5 has 1 row left
    assert got["tau_decode"] == round(6 / 3, 4)


def test_frozen_head_stays_the_targets_and_warm_start_needs_the_targets_ffn(features, tiny_target, tmp_path):
    opts = TrainOptions(steps=3, batch_rows=128, draft_vocab=256, freeze_head=True, eval_every=0, warmup=1)
    train(features, tiny_target, tmp_path / "frozen", opts, progress=False)
    target = read_gguf(tiny_target)
    from safetensors.numpy import load_file  # the saved lm_head is still the target's rows

    weights = load_file(str(tmp_path / "frozen" / "model.safetensors"))
    d2t = weights["d2t"].astype(np.int64) + np.arange(len(weights["d2t"]))
    head = np.asarray(target.tensor_array("output.weight") if "output.weight" in target.tensors
                      else target.tensor_array("token_embd.weight"))
    np.testing.assert_allclose(weights["lm_head.weight"], head[d2t], atol=1e-6)
    with pytest.raises(EdgeEagleError, match="FFN width"):
        init_model(target, (2, 4, 5), np.arange(64), TrainOptions(ffn=32, init="warm"))


def test_warm_start_computes_the_target_layer_it_was_copied_from(tiny_target):
    """init="warm": with EAGLE-3 norms, step 0 of the drafter at row P is the target's own layer
    (the highest captured one) applied to the target's state at P: its output equals the input
    of the next target layer, as llama.cpp captures it."""
    target = read_gguf(tiny_target)
    n = int(target.require("llama.block_count"))
    layers = (2, 4, n - 2)
    d2t = np.arange(256, dtype=np.int64)
    model = init_model(target, layers, d2t, TrainOptions(draft_vocab=256, eagle31=False, init="warm"))
    t = Target(tiny_target, n_ctx=128)
    try:
        t.set_capture((2, 4, n - 2, n - 1))
        toks = t.tokenize("A warm start from the target's own layer")
        feats = torch.from_numpy(t.prefill(toks).features.copy())
    finally:
        t.close()
    h = feats.shape[1] // 4
    with torch.no_grad():
        got = model.layer(torch.tensor(toks)[None], model.encode(feats[None, :, :3 * h]),
                          torch.arange(len(toks))[None])[0]
    want = feats[:, 3 * h:]  # input of layer n-1 = output of layer n-2
    assert float((got - want).abs().max() / want.abs().max()) < 2e-3
    cold = init_model(target, layers, d2t, TrainOptions(draft_vocab=256, eagle31=False))
    with torch.no_grad():
        other = cold.layer(torch.tensor(toks)[None], cold.encode(feats[None, :, :3 * h]),
                           torch.arange(len(toks))[None])[0]
    assert float((other - want).abs().max() / want.abs().max()) > 0.1
