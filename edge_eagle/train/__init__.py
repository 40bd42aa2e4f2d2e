"""Distil an EAGLE-3.1 drafter for a GGUF target (`edge-eagle train`)."""

from .pipeline import train_drafter  # noqa: F401
from .trainer import TrainOptions, save_checkpoint, train  # noqa: F401

__all__ = ["TrainOptions", "train", "train_drafter", "save_checkpoint"]
