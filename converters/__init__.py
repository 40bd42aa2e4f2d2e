"""Checkpoint -> eagle3 GGUF conversion (`edge-eagle convert`)."""

from .convert import ConvertReport, convert  # noqa: F401

__all__ = ["convert", "ConvertReport"]
