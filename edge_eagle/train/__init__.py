"""Distil an EAGLE-3.1 drafter for a GGUF target (`edge-eagle train`)."""

from .pipeline import TrainOptions, save_checkpoint, train  # noqa: F401

__all__ = ["TrainOptions", "train", "save_checkpoint"]
