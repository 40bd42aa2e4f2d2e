"""User-facing errors: one sentence that says what to do; the CLI prints it and exits 2."""

from __future__ import annotations


class EdgeEagleError(Exception):
    """A problem with the user's input or setup, not a bug in edge-eagle."""

    exit_code = 2


class RequestFieldError(EdgeEagleError):
    """A request field (`param`: "tools", "response_format", ...) asks for what cannot run."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ModelFileError(EdgeEagleError):
    """A model file is missing, truncated, not a GGUF, or not what was expected."""


class PairMismatchError(EdgeEagleError):
    """A drafter does not fit its target."""


class ContextOverflowError(EdgeEagleError):
    """The prompt plus the tokens to generate do not fit the context window."""


class MissingSymbolError(EdgeEagleError):
    """The installed llama-cpp-python lacks a llama.cpp symbol edge-eagle needs."""


class InternalError(RuntimeError):
    """A failure inside edge-eagle or llama.cpp that the user's input did not cause: a bug to
    report, shown with its traceback (the CLI does not dress it up as a user error)."""


class LlamaCallError(InternalError):
    """A llama.cpp call of the drafter or of the native cycle failed: `stage` names the step
    (e.g. "drafter decode"), `code` is llama.cpp's return code there (0: none, an output was
    missing)."""

    def __init__(self, stage: str, code: int):
        super().__init__(f"llama.cpp failed at the {stage} step (return code {code})")
        self.stage, self.code = stage, code


class LayoutMismatchError(InternalError):
    """The native library and its Python mirrors disagree on a struct's layout."""
