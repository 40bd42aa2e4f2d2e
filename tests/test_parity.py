"""Drafter logits computed through llama.cpp match the torch reference forward of the same
weights. Tolerance: max |logit difference| <= 5e-3 on f32 weights (observed ~1e-5 on the
tiny drafters, ~1e-3 on SmolLM2-sized ones), and the same greedy draft at every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_eagle.eagle import EagleDrafter
from edge_eagle.reference import reference_chain
from edge_eagle.target import Target
from tests.conftest import VARIANTS

ATOL = 5e-3


def _compare(drafter: EagleDrafter, model, feats: np.ndarray, seq: list[int], k: int) -> None:
    drafts, logits = drafter.propose_with_logits(seq, k)
    ref_drafts, ref_logits = reference_chain(model, torch.from_numpy(feats), seq, k)
    ref = ref_logits.numpy()
    got = np.stack(logits)
    finite = np.isfinite(ref)
    assert (np.isfinite(got) == finite).all(), "draft vocabulary (d2t) mapping differs"
    err = np.abs(got[finite] - ref[finite]).max()
    assert err <= ATOL, f"max abs logit error {err:.2e} > {ATOL}"
    assert drafts == ref_drafts


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_chain_matches_reference(variant, tiny_target, tiny_drafters):
    path, model = tiny_drafters[variant]
    target = Target(tiny_target, n_ctx=256)
    drafter = EagleDrafter(path, target)
    try:
        target.set_capture(drafter.target_layers)
        prompt = target.tokenize("The quick brown fox jumps over the lazy dog")
        res = target.prefill(prompt)
        nxt = int(np.argmax(res.logits[-1]))
        drafter.ingest(res.features, 0, prompt)
        _compare(drafter, model, res.features, prompt + [nxt], k=6)
    finally:
        drafter.close()
        target.close()


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
            committed = full[: n_past + 1]
            _compare(drafter, model, all_feats[:n_past], committed, k=4)
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
    target = Target(smollm, n_ctx=512)
    drafter = EagleDrafter(path, target)
    try:
        target.set_capture(drafter.target_layers)
        prompt = target.tokenize("The capital of France is")
        res = target.prefill(prompt)
        drafter.ingest(res.features, 0, prompt)
        _compare(drafter, model, res.features, prompt + [int(np.argmax(res.logits[-1]))], k=5)
    finally:
        drafter.close()
        target.close()


def test_parity_through_the_callback_capture_path(qwen2_target, qwen2_drafter):
    path, model = qwen2_drafter
    target = Target(qwen2_target, n_ctx=256)
    drafter = EagleDrafter(path, target)
    try:
        assert target.capture_path == "callback"
        target.set_capture(drafter.target_layers)
        prompt = target.tokenize("Callbacks capture the residual stream")
        res = target.prefill(prompt)
        drafter.ingest(res.features, 0, prompt)
        _compare(drafter, model, res.features, prompt + [int(np.argmax(res.logits[-1]))], k=5)
    finally:
        drafter.close()
        target.close()


def test_upstream_keys_only_drafter_runs_as_eagle3(tiny_drafters):
    from edge_eagle.gguf_file import read_gguf

    g = read_gguf(tiny_drafters["upstream_keys_only"][0])
    assert not [k for k in g.meta if k.startswith("edge_eagle.")]
