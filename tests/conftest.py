from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.tiny_models import make_drafter, smollm_path, write_tiny_target  # noqa: E402

VARIANTS = {
    "eagle3": {},
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    "norm_before_residual": {"norm_before_residual": True},
    "norm_before_fc": {"norm_before_fc": True},
    "own_embedding": {"has_embedding": True},
    "upstream_keys_only": {"upstream_only": True},  # as upstream's convert_hf_to_gguf.py writes
}


@pytest.fixture(scope="session")
def smollm() -> Path:
    return smollm_path()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    return write_tiny_target(tiny_dir / "tiny-target.gguf")


@pytest.fixture(scope="session")
def tiny_drafters(tiny_dir: Path, tiny_target: Path) -> dict:
    """variant -> (gguf path, torch reference)"""
    return {name: make_drafter(tiny_dir / f"tiny-{name}.gguf", tiny_target, seed=i + 1, **flags)
            for i, (name, flags) in enumerate(VARIANTS.items())}


@pytest.fixture(scope="session")
def qwen2_target(tiny_dir: Path) -> Path:
    """An architecture whose llama.cpp graph exports no layer inputs: the eval-callback path."""
    return write_tiny_target(tiny_dir / "tiny-qwen2.gguf", seed=4, arch="qwen2")


@pytest.fixture(scope="session")
def qwen2_drafter(tiny_dir: Path, qwen2_target: Path) -> tuple:
    return make_drafter(tiny_dir / "tiny-qwen2-eagle3.1.gguf", qwen2_target, seed=9, fc_norm=True, norm_output=True)
