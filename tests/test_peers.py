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

from edge_eagle.checks.parity import verify_drafter  # noqa: E402
from edge_eagle.checks.peers import compare_steps, sequence_features, specforge_step_logits, speculators_step_logits  # noqa: E402
from edge_eagle.gguf_file import read_gguf  # noqa: E402
from edge_eagle.train import TrainOptions, save_checkpoint  # noqa: E402
from edge_eagle.train.trainer import init_model, write_verifier  # noqa: E402

quiet = dict(log=lambda m: None)


@pytest.fixture(scope="module")
def sequence(tiny_target):
    """Target features and drafter input tokens of a 128-row sequence (feature row P pairs with token P+1)."""
    return sequence_features(tiny_target, (2, 4, 5))


def assert_same_steps(reference, peer_logits, feats, tokens) -> None:
    out = compare_steps(reference, peer_logits, feats, tokens)
    assert out["ok"] and out["relative_error"] <= 1e-5, out


def specforge_drafter(target, aux_ids: list[int], seed: int, **flags: bool):
    """A tiny drafter of SpecForge 0.2.0's own LlamaForCausalLMEagle3 class, its aux layer ids
    (output-of-layer convention) under eagle_config, every weight random and the norms away from 1."""
    sf = pytest.importorskip("specforge.modeling.draft.llama3_eagle", reason="specforge==0.2.0 is not installed")
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, num_hidden_layers=1, vocab_size=target.vocab_size, rms_norm_eps=1e-5,
                      max_position_embeddings=2048)
    cfg.draft_vocab_size, cfg.target_hidden_size = 512, 64
    for key, value in flags.items():
        setattr(cfg, key, value)
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    torch.manual_seed(seed)
    peer = sf.LlamaForCausalLMEagle3(cfg).eval()
    with torch.no_grad():
        for _, p in peer.named_parameters():
            p.copy_((1.0 + 0.2 * torch.randn_like(p)) if p.dim() == 1 else 0.1 * torch.randn_like(p))
        d2t = np.sort(np.random.default_rng(seed + 1).choice(target.vocab_size, 512, replace=False))
        peer.d2t.copy_(torch.from_numpy(d2t - np.arange(512)))
        peer.t2d.zero_()
        peer.t2d[torch.from_numpy(d2t)] = True
    return peer


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
    assert_same_steps(model, speculators_step_logits(peer, feats, tokens), feats, tokens)
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
            # speculators 0.9.0 cannot load a checkpoint whose verifier does not resolve: a local one
            verifier=VerifierConfig(name_or_path=write_verifier(target, tmp_path / "verifier")[0],
                                    architectures=["LlamaForCausalLM"])))
    torch.manual_seed(3)
    peer = Eagle3DraftModel(cfg).eval()
    with torch.no_grad():
        for _, p in peer.named_parameters():  # norms away from 1, every weight random
            p.copy_((1.0 + 0.2 * torch.randn_like(p)) if p.dim() == 1 else 0.1 * torch.randn_like(p))
        d2t = np.sort(np.random.default_rng(2).choice(target.vocab_size, 512, replace=False))
        peer.d2t.copy_(torch.from_numpy(d2t - np.arange(512)))  # speculators stores offsets
        peer.t2d.zero_()
        peer.t2d[torch.from_numpy(d2t)] = True
    peer.save_pretrained(str(tmp_path / "peer"))
    feats, tokens = sequence
    peer_logits = speculators_step_logits(peer, feats, tokens)  # the weights just saved

    read = read_drafter(tmp_path / "peer", tiny_target)
    assert read.layout.name == "speculators"
    reference = reference_model(read.tensors, read.config, read.target)
    assert_same_steps(reference, peer_logits, feats, tokens)
    out = tmp_path / "peer.gguf"
    report = convert(tmp_path / "peer", tiny_target, out, outtype="f32", verify=True, **quiet)
    c = verify_drafter(out, tiny_target, reference)  # llama.cpp against the same reference
    assert c.relative_error <= TOLERANCE["f32"] and c.top1_agreement == 1.0
    assert report.verify["ok"] and report.verify["peer"]["library"].startswith("speculators")
    assert report.verify["peer"]["ok"]


def test_verify_catches_a_misread_flag_with_the_peers_forward(tiny_target, tmp_path, capsys):
    """A self-consistency check passes a misread norm_output; speculators' own forward does not."""
    from edge_eagle.cli import main

    target = read_gguf(tiny_target)
    d2t = np.sort(np.random.default_rng(1).choice(target.vocab_size, 256, replace=False)).astype(np.int64)
    model = init_model(target, (2, 4, 5), d2t, TrainOptions(draft_vocab=256, eagle31=True))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ckpt = save_checkpoint(model, tmp_path / "ckpt", target, {})
    base = ["convert", str(ckpt), "--target", str(tiny_target), "--outtype", "f32", "--verify"]
    assert main(base + ["-o", str(tmp_path / "right.gguf")]) == 0
    assert "own forward" in capsys.readouterr().err
    assert main(base + ["-o", str(tmp_path / "wrong.gguf"), "--norm-output", "head-only"]) == 1
    err = capsys.readouterr().err
    assert "reads this checkpoint differently from speculators" in err


@pytest.mark.parametrize("reading", ["head-only", "feedback"])
def test_edge_eagle_reads_what_specforge_saves(reading, tiny_target, sequence, tmp_path):
    """SpecForge 0.2.0's own draft class and save_pretrained (output-of-layer aux ids under
    eagle_config, fc_norm, norm_output: true): against SpecForge's own training-time-test loop over
    3 chain steps, the head-only reading (SpecForge 0.2.0's meaning) matches at every step; the
    feedback reading (EAGLE-3.1, SpecForge after PR #879) agrees at the first step only, which is
    why an explicit norm_output is refused without --norm-output."""
    target = read_gguf(tiny_target)
    # SpecForge: outputs of layers 1, 3, 4
    peer = specforge_drafter(target, [1, 3, 4], seed=4, fc_norm=True, norm_output=True)
    peer.save_pretrained(str(tmp_path / "sf"))
    feats, tokens = sequence
    theirs = specforge_step_logits(peer, feats, tokens)  # SpecForge's own TTT loop, 3 chain steps
    read = read_drafter(tmp_path / "sf", tiny_target, norm_output=reading)
    assert read.layout.name == "eagle3.1" and read.config.target_layers == (2, 4, 5) and read.config.fc_norm
    ref = reference_model(read.tensors, read.config, read.target)
    out = compare_steps(ref, theirs, feats, tokens)
    assert out["relative_error_by_step"][0] <= 1e-5  # both readings agree at the first step
    if reading == "head-only":  # what SpecForge 0.2.0 means by norm_output: true
        assert out["ok"] and out["relative_error"] <= 1e-5, out
    else:  # EAGLE-3.1 feedback is another drafter from the second step on: the check must see it
        assert min(out["relative_error_by_step"][1:]) > 1e-2, out
    with pytest.raises(Exception, match="PR #879"):
        read_drafter(tmp_path / "sf", tiny_target)  # the version-dependent flag is not guessed
    # convert --verify runs SpecForge's own loop too where the installed release can run the chosen reading
    from edge_eagle.checks.peers import check_with_peer
    from edge_eagle.cli import main

    code = main(["convert", str(tmp_path / "sf"), "--target", str(tiny_target), "--outtype", "f32", "--verify",
                 "--norm-output", reading, "-o", str(tmp_path / "sf.gguf")])
    assert code == 0
    peer = check_with_peer(tmp_path / "sf", "eagle3.1", ref, tiny_target)
    if reading == "head-only":
        assert peer["ran"] and peer["ok"] and peer["library"] == "SpecForge 0.2.0"
    else:  # 0.2.0 cannot run the post-#879 meaning: it says so instead of failing a right reading
        assert not peer["ran"] and "predates its PR #879" in peer["why"]
    if reading == "head-only":  # and a misread fails it: the same weights read with another residual
        import dataclasses

        wrong = reference_model(read.tensors, dataclasses.replace(read.config, norm_before_residual=True), read.target)
        bad = check_with_peer(tmp_path / "sf", "eagle3.1", wrong, tiny_target)
        assert bad["ran"] and not bad["ok"]


@pytest.mark.parametrize("embedding", ["dropped", "saved"])
def test_verify_passes_what_specforge_saves_with_explicit_aux_ids(embedding, tiny_target, tmp_path, capsys):
    """SpecForge 0.2.0's own class and save_pretrained, explicit aux layer ids (not the default
    capture) under eagle_config, EAGLE-3 (no norm_output, no fc_norm), its embedding frozen from the
    target as SpecForge trains it. Saved as its trainer and SGLang export save it ("dropped": no
    embed_tokens.weight; SpecForge's loaders fill it from the target) or whole ("saved"): edge-eagle's
    reading matches SpecForge's own loop on the in-memory model, and convert --verify passes it."""
    from edge_eagle.checks.peers import check_with_peer
    from edge_eagle.cli import main

    target = read_gguf(tiny_target)
    peer = specforge_drafter(target, [0, 2, 5], seed=6)  # outputs of layers 0, 2, 5: layer inputs 1, 3, 6
    with torch.no_grad():  # SpecForge's load_embedding + freeze_embedding
        peer.embed_tokens.weight.copy_(torch.from_numpy(target.tensor_array("token_embd.weight")))
    state = {k: v for k, v in peer.state_dict().items() if embedding == "saved" or "embed" not in k.lower()}
    peer.save_pretrained(str(tmp_path / "sf"), state_dict=state)  # SpecForge's trainer-side/SGLang-export filter
    read = read_drafter(tmp_path / "sf", tiny_target)
    assert read.layout.name == "specforge" and read.config.target_layers == (1, 3, 6)
    assert not read.config.has_embedding and not read.config.norm_output and not read.config.fc_norm
    ref = reference_model(read.tensors, read.config, read.target)
    feats, tokens = sequence_features(tiny_target, read.config.target_layers)
    assert_same_steps(ref, specforge_step_logits(peer, feats, tokens), feats, tokens)  # the reading is right

    code = main(["convert", str(tmp_path / "sf"), "--target", str(tiny_target), "--outtype", "f32", "--verify",
                 "-o", str(tmp_path / "sf.gguf")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "SpecForge 0.2.0's own forward" in err and "reads this checkpoint differently" not in err
    checked = check_with_peer(tmp_path / "sf", "specforge", ref, tiny_target)
    assert checked["ran"] and checked["ok"] and checked["relative_error"] <= 1e-5, checked
