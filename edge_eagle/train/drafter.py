"""The whole `edge-eagle train` pipeline for a target: extract features through the runtime's
capture path, train, and optionally convert the checkpoint to a GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .pipeline import TrainOptions, train


def train_drafter(target_path: str | Path, data: str, out: Path, opts: TrainOptions, *,
                  features: Path | None = None, layers: Sequence[int] | None = None, max_tokens: int = 200_000,
                  regenerate: bool = False, max_prompt: int = 384, max_new: int = 256, gguf: str | None = None,
                  outtype: str = "q8_0", progress: bool = True,
                  log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Extract (resumable) -> train (opts.steps == 0: extraction only) -> convert to `gguf`.
    Returns the training summary, or {"features", "tokens"} after an extraction only."""
    from ..target import Target
    from .data import conversations
    from .extract import extract

    features = features or out / "features"
    target = Target(target_path, n_ctx=max_prompt + max_new + 8)
    try:
        n = target.n_layer
        chosen = tuple(layers) if layers else (2, n // 2, n - 3)
        manifest = extract(target, chosen, conversations(data), features, max_tokens=max_tokens,
                           regenerate=regenerate, max_prompt=max_prompt, max_new=max_new, progress=progress)
    finally:
        target.close()
    log(f"features: {manifest['tokens']} tokens from {manifest['conversations_seen']} conversations")
    if opts.steps == 0:
        return {"features": str(features), "tokens": manifest["tokens"]}
    summary = train(features, Path(target_path), out / "checkpoint", opts, progress=progress)
    log(f"checkpoint: {out / 'checkpoint'} (speculators layout), final loss {summary['final_loss']:.3f}")
    if gguf:
        from edge_eagle.converters import convert

        convert(out / "checkpoint", target_path, gguf, outtype=outtype, log=log)
    return summary
