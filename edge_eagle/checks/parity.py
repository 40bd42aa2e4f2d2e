"""Compare the llama.cpp drafter with the torch reference on real target features.
Used by the parity tests and by `edge-eagle convert --verify`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..eagle import EagleDrafter
from ..target import Target

DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    ",
    "Speculative decoding makes language models faster because",
    "Q: What is the capital of France?\nA:",
)


@dataclass
class ChainComparison:
    max_abs_error: float  # over the steps where both chains still agree
    max_abs_logit: float
    steps: int
    top1_agree: int

    @property
    def relative_error(self) -> float:
        return self.max_abs_error / max(1.0, self.max_abs_logit)

    @property
    def top1_agreement(self) -> float:
        return self.top1_agree / self.steps if self.steps else 1.0


def compare_chain(drafter: EagleDrafter, model, feats: np.ndarray, seq: Sequence[int], k: int) -> ChainComparison:
    """Drafter chain after a prefill of seq[:-1] (features feats) vs reference_chain."""
    import torch

    from .reference import reference_chain

    proposal, logits = drafter.propose_with_logits(seq, k)
    drafts = proposal.tokens
    ref_drafts, ref_logits = reference_chain(model, torch.from_numpy(np.asarray(feats)), list(seq), k)
    ref = ref_logits.numpy()
    err, scale, agree = 0.0, 0.0, 0
    for step in range(min(len(drafts), len(ref_drafts))):
        finite = np.isfinite(ref[step])
        if (np.isfinite(logits[step]) != finite).any():
            return ChainComparison(float("inf"), float(np.abs(ref[step][finite]).max()), k, agree)
        err = max(err, float(np.abs(logits[step][finite] - ref[step][finite]).max()))
        scale = max(scale, float(np.abs(ref[step][finite]).max()))
        if drafts[step] != ref_drafts[step]:
            break  # the chains now run on different tokens
        agree += 1
    return ChainComparison(err, scale, k, agree)


def verify_drafter(drafter_path: str | os.PathLike[str], target_path: str | os.PathLike[str], model,
                   prompts: Sequence[str] = DEFAULT_PROMPTS, k: int = 5) -> ChainComparison:
    """Run each prompt through the target, then compare the drafter's k-step chain."""
    target = Target(target_path, n_ctx=512)
    drafter = EagleDrafter(drafter_path, target)
    total = ChainComparison(0.0, 0.0, 0, 0)
    try:
        target.set_capture(drafter.target_layers)
        for prompt in prompts:
            target.memory.clear()
            drafter.reset()
            toks = target.tokenize(prompt)
            res = target.prefill(toks)
            feats = res.require_features()
            nxt = int(np.argmax(res.logits[-1]))
            drafter.ingest(feats, 0, toks)
            c = compare_chain(drafter, model, feats, toks + [nxt], k)
            total = ChainComparison(max(total.max_abs_error, c.max_abs_error),
                                    max(total.max_abs_logit, c.max_abs_logit),
                                    total.steps + c.steps, total.top1_agree + c.top1_agree)
    finally:
        drafter.close()
        target.close()
    return total
