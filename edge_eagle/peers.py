"""The source library's own forward pass as a check: does edge-eagle read a checkpoint the way
the code that wrote it means it? (A self-consistency check cannot catch a misread config flag.)

Supported peer: vLLM's speculators (layout "speculators"), when importable. Its training
forward runs training-time-test steps over a whole sequence with teacher forcing; its step s
row P is the chain seeded at P, which is edge-eagle's TTT (train/ttt.py) row P + s.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

STEPS = 3
SEQ_ROWS = 128  # speculators' flex attention builds its block mask for multiples of 128 rows
TOLERANCE = 1e-4  # relative logit error; measured ~3e-7 on the test fixtures
TEXT = "Once upon a time a small robot learned to paint the sea. "


def peer_library(layout: str) -> str | None:
    """The importable library whose forward can check a checkpoint of this layout, or None."""
    if layout != "speculators":
        return None
    try:
        import speculators  # noqa: F401
        from speculators.models.eagle3 import Eagle3DraftModel  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: not available here
        return None
    return f"speculators {getattr(speculators, '__version__', '?')}"


def sequence_features(target_path: str | os.PathLike[str], layers: Sequence[int], rows: int = SEQ_ROWS):
    """(features [rows, 3H], drafter input tokens [rows]) of a fixed text: feature row P pairs with token P+1."""
    import torch

    from .target import Target

    t = Target(target_path, n_ctx=2 * rows + 8)
    try:
        t.set_capture(tuple(layers))
        seq = t.tokenize(TEXT * (rows // 4))[: rows + 1]
        feats = torch.from_numpy(t.prefill(seq).features[:-1].copy())
    finally:
        t.close()
    return feats, torch.tensor(seq[1:])


def speculators_step_logits(model: Any, feats, tokens, steps: int = STEPS) -> list:
    """Draft logits [rows, draft vocab] of speculators' own forward at each TTT step."""
    import torch

    got: list = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: got.append(out[0].detach()))
    try:
        with torch.no_grad():
            model(hidden_states=feats[None], input_ids=tokens[None],
                  document_ids=torch.zeros(1, len(tokens), dtype=torch.long), ttt_steps=steps)
    finally:
        hook.remove()
    return got


def compare_steps(reference: Any, peer_logits: list, feats, tokens) -> dict[str, Any]:
    """edge-eagle's reference against the peer, step by step: max relative error, top-1 agreement."""
    import torch

    from .train.ttt import ttt_states

    n = len(tokens)
    with torch.no_grad():
        ours = [reference.draft_logits(h)[0] for h in
                ttt_states(reference, feats[None], tokens[None], torch.arange(n)[None], len(peer_logits))]
    rel, agree = [], []
    for s, peer in enumerate(peer_logits):
        a, b = ours[s][s:], peer[: n - s]
        rel.append(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)))
        agree.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
    return {"relative_error_by_step": rel, "top1_agreement_by_step": agree,
            "relative_error": max(rel), "ok": max(rel) <= TOLERANCE and min(agree) == 1.0}


def check_with_peer(src_dir: str | os.PathLike[str], layout: str, reference: Any,
                    target_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Run the source library's forward on the checkpoint and compare; None if no peer is importable."""
    library = peer_library(layout)
    if library is None:
        return None
    from speculators.models.eagle3 import Eagle3DraftModel

    try:
        peer = Eagle3DraftModel.from_pretrained(os.fspath(src_dir)).eval()
    except Exception as e:  # noqa: BLE001 - a checkpoint the library cannot load is no misread of ours
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return {"library": library, "ran": False, "why": f"{library} could not load it ({why})", "ok": True}
    feats, tokens = sequence_features(target_path, reference.cfg.target_layers)
    out = compare_steps(reference, speculators_step_logits(peer, feats, tokens), feats, tokens)
    return {"library": library, "ran": True, "steps": STEPS, "tolerance": TOLERANCE, **out}


__all__ = ["check_with_peer", "compare_steps", "peer_library", "sequence_features", "speculators_step_logits"]
