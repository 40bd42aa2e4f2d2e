"""Drafter logits computed through llama.cpp match the torch reference forward of the same
weights. Tolerance: max |logit difference| <= 5e-3 on f32 weights (observed ~1e-5 on the
tiny drafters, ~1e-3 on SmolLM2-sized ones), and the same greedy draft at every step."""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle.checks.parity import ChainComparison, compare_chain, verify_drafter
from edge_eagle.eagle import EagleDrafter
from edge_eagle.target import Target
from tests.conftest import VARIANTS

ATOL = 5e-3


def _assert_close(c: ChainComparison) -> None:
    assert c.max_abs_error <= ATOL, f"max abs logit error {c.max_abs_error:.2e} > {ATOL}"
    assert c.top1_agreement == 1.0, "llama.cpp and the reference drafted different tokens"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_chain_matches_reference(variant, tiny_target, tiny_drafters):
    path, model = tiny_drafters[variant]
    _assert_close(verify_drafter(path, tiny_target, model, k=6))


@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1"])
def test_drafter_state_after_partial_accepts_matches_reference(variant, tiny_target, tiny_drafters):
    """Drive the drafter as the loop does (ingest only accepted rows after each verify,
    chain rows left behind in its KV) and check every proposal against a fresh reference
    forward over the committed sequence."""
    path, model = tiny_drafters[variant]
    target = Target(tiny_target, n_ctx=256)
    drafter = EagleDrafter(path, target)
    try:
        target.set_capture(drafter.target_layers)
        seq = target.tokenize("Once upon a time there was")
        full = seq + list(np.random.default_rng(0).integers(100, 20000, size=40))
        all_feats = target.prefill(full).features.copy()  # features of every committed position
        n_past = len(seq)
        drafter.ingest(all_feats[:n_past], 0, full[:n_past])
        rng = np.random.default_rng(1)
        while n_past + 6 < len(full):
            _assert_close(compare_chain(drafter, model, all_feats[:n_past], full[: n_past + 1], k=4))
            accepted = int(rng.integers(0, 5))  # as if `accepted` drafts passed verification
            drafter.ingest(all_feats[n_past:n_past + accepted + 1], n_past, full[n_past:n_past + accepted + 1])
            n_past += accepted + 1
    finally:
        drafter.close()
        target.close()


@pytest.mark.smollm
def test_smollm_sized_drafter_matches_reference(smollm, tmp_path):
    from tests.tiny_models import make_drafter

    path, model = make_drafter(tmp_path / "d.gguf", smollm, seed=3, draft_vocab=4096, fc_norm=True,
                               norm_output=True)
    _assert_close(verify_drafter(path, smollm, model, prompts=["The capital of France is"], k=5))


def test_parity_through_the_callback_capture_path(qwen2_target, qwen2_drafter):
    assert Target(qwen2_target, n_ctx=64).capture_path == "callback"
    _assert_close(verify_drafter(qwen2_drafter[0], qwen2_target, qwen2_drafter[1], k=5))


def test_upstream_keys_only_drafter_runs_as_eagle3(tiny_drafters):
    from edge_eagle.gguf_file import read_gguf

    g = read_gguf(tiny_drafters["upstream_keys_only"][0])
    assert not [k for k in g.meta if k.startswith("edge_eagle.")]


def test_trimmed_idle_drafter_matches_reference_on_its_window(tiny_target, tiny_drafters):
    """While auto decodes plainly the drafter keeps only a window of pending rows; its next
    chain must equal the reference run on exactly that window (RoPE is relative, so the
    window's absolute positions do not matter), whatever its KV held before."""
    import torch

    from edge_eagle.checks.reference import reference_chain

    path, model = tiny_drafters["eagle3.1"]
    target = Target(tiny_target, n_ctx=256)
    drafter = EagleDrafter(path, target)
    try:
        target.set_capture(drafter.target_layers)
        seq = target.tokenize("A long enough prompt so that the window really drops rows: " * 3)
        res = target.prefill(seq)
        nxt = int(np.argmax(res.logits[-1]))
        drafter.ingest(res.features[:10], 0, seq[:10])
        drafter.propose(seq[:11], 3)  # the KV now holds rows that the trim will orphan
        drafter.ingest(res.features[10:], 10, seq[10:])
        drafter.trim(8)
        window = seq[-8:] + [nxt]
        proposal, logits = drafter.propose_with_logits(seq + [nxt], 4)
        ref_drafts, ref_logits = reference_chain(model, torch.from_numpy(res.features[-8:]), window, 4)
        assert list(proposal.tokens) == ref_drafts
        ref = ref_logits.numpy()
        finite = np.isfinite(ref)
        assert np.abs(np.stack(logits)[finite] - ref[finite]).max() <= ATOL
    finally:
        drafter.close()
        target.close()
