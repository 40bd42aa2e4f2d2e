"""A short soak in CI (scripts/soak.py runs 500 on SmolLM2): one process, a rotating mix of
speculative, auto, plain, sampled, cancelled and context-filling generations."""

from __future__ import annotations

from edge_eagle import live_handles
from scripts.soak import soak


def test_short_soak_on_tiny_models(tiny_target, tiny_drafters):
    before = live_handles()
    r = soak(str(tiny_target), str(tiny_drafters["eagle3.1"][0]), n=200, max_tokens=24, n_ctx=384, progress=False)
    assert r["lossless_ok"], r["greedy_mismatches"]
    assert r["handles_ok"] and live_handles() == before
    assert r["rss_ok"], r
    assert {"cancelled", "context"} <= set(r["finish_reasons"]), r["finish_reasons"]
    assert r["greedy_checked"] == 100 and len(r["rss_series_mb"]) > 10
