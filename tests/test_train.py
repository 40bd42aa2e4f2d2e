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
from edge_eagle.gguf_file import read_gguf
from edge_eagle.parity import verify_drafter
from edge_eagle.reference import Eagle3Config, random_reference
from edge_eagle.target import Target
from edge_eagle.train import TrainOptions, save_checkpoint
from edge_eagle.train.pipeline import draft_vocabulary, init_model
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


def test_checkpoint_round_trips_through_convert_into_the_runtime(features, tiny_target, tmp_path):
    target = read_gguf(tiny_target)
    d2t = draft_vocabulary(sorted(features.glob("shard-*.npz")), target.vocab_size, 256)
    model = init_model(target, (2, 4, 5), d2t, TrainOptions())
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


def test_cli_train_runs_the_whole_pipeline(tiny_target, corpus, tmp_path, capsys):
    """extract -> train -> convert from one command; a second run resumes the feature cache."""
    import json

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
