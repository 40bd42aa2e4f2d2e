"""User-facing errors: one sentence that says what to do; the CLI prints it and exits 2."""

from __future__ import annotations


class EdgeEagleError(Exception):
    """A problem with the user's input or setup, not a bug in edge-eagle."""

    exit_code = 2


class ModelFileError(EdgeEagleError):
    """A model file is missing, truncated, not a GGUF, or not what was expected."""


class PairMismatchError(EdgeEagleError):
    """A drafter does not fit its target."""


class ContextOverflowError(EdgeEagleError):
    """The prompt plus the tokens to generate do not fit the context window."""


class MissingSymbolError(EdgeEagleError):
    """The installed llama-cpp-python lacks a llama.cpp symbol edge-eagle needs."""
