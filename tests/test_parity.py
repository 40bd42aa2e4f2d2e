"""Drafter logits computed through llama.cpp match the torch reference forward of the same
weights. Tolerance: max |logit difference| <= 5e-3 on f32 weights (observed ~1e-5 on the
tiny drafters, ~1e-3 on SmolLM2-sized ones), and the same greedy draft at every step."""

from __future__ import annotations

import numpy as np
import pytest

from edge_eagle.eagle import EagleDrafter
from edge_eagle.parity import ChainComparison, compare_chain, verify_drafter
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
