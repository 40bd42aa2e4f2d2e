"""The whole `edge-eagle train` pipeline for a target: extract features through the runtime's
capture path, train, and optionally convert the checkpoint to a GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..fsutil import cache_dir
from .trainer import (  # noqa: F401
    TrainOptions,
    draft_vocabulary,
    init_model,
    read_manifest,
    save_checkpoint,
    simulated_acceptance,  # the trainer's names, as this module had them
    train,
    write_verifier,
)


def train_drafter(target_path: str | Path, data: str, out: Path, opts: TrainOptions, *,
                  features: Path | None = None, layers: Sequence[int] | None = None, max_tokens: int = 200_000,
                  regenerate: bool = False, max_prompt: int = 384, max_new: int = 256, gguf: str | None = None,
                  outtype: str = "q8_0", progress: bool = True, parallel: int = 16, turns: str = "first",
                  resume: bool = False, log: Callable[[str], Any] = print, n_gpu_layers: int = 0,
                  n_threads: int | None = None, repack: str | None = None, extra_features: Sequence[Path] = (),
                  eval_sets: dict[str, Path] | None = None) -> dict[str, Any]:
    """Extract (resumable) -> train (opts.steps == 0: extraction only; resume: continue the
    training state in out/checkpoint) -> convert to `gguf`. Features go to `features`, by
    default a folder of the user cache named after the target and settings.
    Returns the training summary, or {"features", "tokens"} after an extraction only."""
    from .. import gguf_keys as K
    from ..gguf_file import read_gguf
    from ..target import Target
    from .data import conversations
    from .extract import extract

    n = int(read_gguf(target_path).require(K.BLOCK_COUNT))
    chosen = (int(layers[0]), int(layers[1]), int(layers[2])) if layers else (2, n // 2, n - 3)
    features = features or default_features_dir(target_path, data, chosen, regenerate, turns)
    from ..threads import current_decision

    threads = current_decision(n_threads).threads  # the thread policy: cores other programs leave free
    target = Target(target_path, n_ctx=max_prompt + max_new + 8, n_seq=max(1, parallel), n_gpu_layers=n_gpu_layers,
                    n_threads=threads, repack=repack)
    try:
        manifest = extract(target, chosen, conversations(data), features, max_tokens=max_tokens,
                           regenerate=regenerate, max_prompt=max_prompt, max_new=max_new, progress=progress,
                           turns=turns)
    finally:
        target.close()
    log(f"features: {manifest['tokens']} tokens from {manifest['conversations_seen']} conversations")
    if opts.steps == 0:
        return {"features": str(features), "tokens": manifest["tokens"]}
    summary = train(features, Path(target_path), out / "checkpoint", opts, progress=progress, resume=resume,
                    extra_features=tuple(extra_features), eval_sets=eval_sets)
    log(f"checkpoint: {out / 'checkpoint'} (speculators layout), final loss {summary['final_loss']:.3f}")
    if gguf:
        from edge_eagle.converters import convert

        convert(out / "checkpoint", target_path, gguf, outtype=outtype, log=log)
    return summary


def default_features_dir(target_path: str | Path, data: str, layers: Sequence[int], regenerate: bool,
                         turns: str) -> Path:
    """Where features are cached unless --features says otherwise: the user cache directory
    ($XDG_CACHE_HOME or ~/.cache)/edge-eagle/features/, one folder per target, data and settings."""
    import hashlib

    base = cache_dir() / "features"
    source = data if data == "sharegpt" else str(Path(data).resolve())
    key = hashlib.sha256(f"{source}|{list(layers)}|{regenerate}|{turns}".encode()).hexdigest()[:10]
    stem = Path(data).stem if data != "sharegpt" else "sharegpt"
    return base / f"{Path(target_path).stem}-{stem}-{'regen' if regenerate else 'text'}-{turns}-{key}"
