"""Checked against a peer's own code: vLLM's speculators 0.9.0 (PyPI), its model classes,
save code, loader and forward pass, on tiny drafters.

- What `edge-eagle train` writes, speculators' `from_pretrained` loads as it is, and its forward
  gives the logits of edge-eagle's reference at every training-time-test step.
- What speculators' own `save_pretrained` writes, `edge-eagle convert` reads right: the
  reference on the converted weights matches speculators' forward, and llama.cpp matches the
  reference.

Skipped, with the reason, where speculators is not installed (`make test` installs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

speculators = pytest.importorskip("speculators.models.eagle3", reason="speculators==0.9.0 is not installed")

from edge_eagle.converters import convert  # noqa: E402
from edge_eagle.converters.convert import TOLERANCE, read_drafter, reference_model  # noqa: E402
from edge_eagle.gguf_file import read_gguf  # noqa: E402
from edge_eagle.parity import verify_drafter  # noqa: E402
from edge_eagle.target import Target  # noqa: E402
from edge_eagle.train import TrainOptions, save_checkpoint  # noqa: E402
from edge_eagle.train.pipeline import init_model  # noqa: E402
from edge_eagle.train.ttt import ttt_states  # noqa: E402

STEPS = 3
quiet = dict(log=lambda m: None)


@pytest.fixture(scope="module")
def sequence(tiny_target):
    """Target features and drafter input tokens of a 128-row sequence (speculators' flex attention
    works in blocks of 128): feature row P pairs with token P+1."""
    t = Target(tiny_target, n_ctx=256)
    try:
        t.set_capture((2, 4, 5))
        seq = t.tokenize("Once upon a time a small robot learned to paint the sea. " * 20)[:129]
        feats = torch.from_numpy(t.prefill(seq).features[:-1].copy())
    finally:
        t.close()
    return feats, torch.tensor(seq[1:])


def speculators_logits(model, feats: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Draft logits of speculators' own forward at each training-time-test step."""
    got: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: got.append(out[0].detach()))
    try:
        with torch.no_grad():
            model(hidden_states=feats[None], input_ids=tokens[None],
                  document_ids=torch.zeros(1, len(tokens), dtype=torch.long), ttt_steps=STEPS)
    finally:
        hook.remove()
    return got


def assert_same_steps(reference, peer_logits: list[torch.Tensor], feats, tokens) -> None:
    """speculators' step s row P is the chain seeded at P; edge-eagle's TTT row P+s is the same one."""
    n = len(tokens)
    with torch.no_grad():
        ours = [reference.draft_logits(h)[0] for h in
                ttt_states(reference, feats[None], tokens[None], torch.arange(n)[None], STEPS)]
    for s in range(STEPS):
        a, b = ours[s][s:], peer_logits[s][: n - s]
        rel = float((a - b).abs().max() / b.abs().max())
        assert rel <= 1e-5, (s, rel)
        assert bool((a.argmax(-1) == b.argmax(-1)).all()), s


@pytest.mark.parametrize("eagle31", [True, False], ids=["eagle3.1", "eagle3"])
def test_speculators_loads_what_edge_eagle_trains(eagle31, tiny_target, sequence, tmp_path):
    from speculators.models.eagle3 import Eagle3DraftModel

    target = read_gguf(tiny_target)
    d2t = np.sort(np.random.default_rng(1).choice(target.vocab_size, 256, replace=False)).astype(np.int64)
    model = init_model(target, (2, 4, 5), d2t, TrainOptions(draft_vocab=256, eagle31=eagle31))
    torch.manual_seed(0)
    with torch.no_grad():  # off the initialisation, so every weight matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ckpt = save_checkpoint(model, tmp_path / "ckpt", target, {})
    peer = Eagle3DraftModel.from_pretrained(str(ckpt)).eval()  # verifier resolved from ckpt/verifier
    assert peer.config.norm_output is eagle31 and peer.config.fc_norm is eagle31
    assert torch.equal(peer.embed_tokens.weight, model.target_embed)
    feats, tokens = sequence
    assert_same_steps(model, speculators_logits(peer, feats, tokens), feats, tokens)
    # and the converter reads it back to the same drafter, sharing the target's embedding again
    report = convert(ckpt, tiny_target, tmp_path / "d.gguf", outtype="f32", **quiet)
    assert not report.config.has_embedding
    assert any("embed_tokens equals" in a for a in report.assumptions)


@pytest.mark.parametrize("flags", [{}, {"norm_before_residual": True}, {"fc_norm": True, "norm_output": True},
                                   {"norm_before_fc": True}],
                         ids=["eagle3", "norm_before_residual", "eagle3.1", "norm_before_fc"])
def test_edge_eagle_converts_what_speculators_saves(flags, tiny_target, sequence, tmp_path):
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    target = read_gguf(tiny_target)
    layer = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_hidden_layers=1, vocab_size=target.vocab_size, rms_norm_eps=1e-5,
                        max_position_embeddings=2048)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=512, target_hidden_size=64,
        eagle_aux_hidden_state_layer_ids=[2, 4, 5], **flags,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    torch.manual_seed(3)
    peer = Eagle3DraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in peer.named_parameters():  # norms away from 1, every weight random
            p.copy_((1.0 + 0.2 * torch.randn_like(p)) if p.dim() == 1 else 0.1 * torch.randn_like(p))
        d2t = np.sort(np.random.default_rng(2).choice(target.vocab_size, 512, replace=False))
        peer.d2t.copy_(torch.from_numpy(d2t - np.arange(512)))  # speculators stores offsets
        peer.t2d.zero_()
        peer.t2d[torch.from_numpy(d2t)] = True
    peer.save_pretrained(str(tmp_path / "peer"))
    feats, tokens = sequence
    peer_logits = speculators_logits(peer, feats, tokens)  # the weights just saved

    read = read_drafter(tmp_path / "peer", tiny_target)
    assert read.layout.name == "speculators"
    reference = reference_model(read.tensors, read.config, read.target)
    assert_same_steps(reference, peer_logits, feats, tokens)
    out = tmp_path / "peer.gguf"
    convert(tmp_path / "peer", tiny_target, out, outtype="f32", **quiet)
    c = verify_drafter(out, tiny_target, reference)  # llama.cpp against the same reference
    assert c.relative_error <= TOLERANCE["f32"] and c.top1_agreement == 1.0
