from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the tests' batch-cost calibrations go to a file of their own, not the user's cache
_CALIBRATION_DIR = tempfile.mkdtemp(prefix="ee-calib-")
atexit.register(shutil.rmtree, _CALIBRATION_DIR, ignore_errors=True)
os.environ["EDGE_EAGLE_CALIBRATION"] = str(Path(_CALIBRATION_DIR) / "calibration.json")

import json  # noqa: E402

from edge_eagle.target import Target  # noqa: E402
from edge_eagle.train.data import iter_jsonl  # noqa: E402
from edge_eagle.train.extract import extract  # noqa: E402
from tests.chat_templates import MINIMAL  # noqa: E402
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


@pytest.fixture(scope="module")
def served_engine(tiny_target, tiny_drafters):
    """The server tests' engine: the tiny pair at k=3 with a minimal chat template (the tiny
    target has none)."""
    from edge_eagle import EdgeEagle

    ee = EdgeEagle(tiny_target, tiny_drafters["eagle3.1"][0], k=3, n_ctx=256)
    ee.target.chat_template = MINIMAL
    yield ee
    ee.close()


@pytest.fixture(scope="session")
def qwen2_target(tiny_dir: Path) -> Path:
    """An architecture whose llama.cpp graph exports no layer inputs: the eval-callback path."""
    return write_tiny_target(tiny_dir / "tiny-qwen2.gguf", seed=4, arch="qwen2")


@pytest.fixture(scope="session")
def qwen2_drafter(tiny_dir: Path, qwen2_target: Path) -> tuple:
    return make_drafter(tiny_dir / "tiny-qwen2-eagle3.1.gguf", qwen2_target, seed=9, fc_norm=True, norm_output=True)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    topics = ["the sea", "a red fox", "mountains", "old books", "the moon", "rain", "a small robot", "bread",
              "rivers", "winter", "a garden", "music", "trains", "clocks", "birds", "stars"]
    with open(path, "w") as f:
        for t in topics:
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Tell me about {t}."}]}) + "\n")
        f.write(json.dumps({"text": "Plain text records work too: one two three four five six."}) + "\n")
    return path


@pytest.fixture(scope="session")
def features(tmp_path_factory, tiny_target, corpus) -> Path:
    out = tmp_path_factory.mktemp("feat") / "features"
    target = Target(tiny_target, n_ctx=512)
    extract(target, (2, 4, 5), iter_jsonl(corpus), out, max_tokens=900, regenerate=True, max_new=48,
            shard_tokens=300, progress=False)
    # a later run with a larger budget resumes instead of starting over
    before = json.loads((out / "manifest.json").read_text())
    m = extract(target, (2, 4, 5), iter_jsonl(corpus), out, max_tokens=10**6, regenerate=True, max_new=48,
                shard_tokens=300, progress=False)
    target.close()
    assert m["shards"][: len(before["shards"])] == before["shards"]
    assert m["conversations_seen"] == 17 > before["conversations_seen"]
    return out


@pytest.fixture(scope="session")
def trained_drafters(features, tiny_target, tmp_path_factory) -> dict:
    """Drafters distilled briefly from the tiny target ("eagle3" and "eagle3.1" norms, same
    data and steps): name -> (checkpoint dir, f32 GGUF). Good enough that acceptance is far
    from zero."""
    from edge_eagle.converters import convert

    from edge_eagle.train import TrainOptions, train

    out = tmp_path_factory.mktemp("trained")
    paths = {}
    for name, eagle31 in (("eagle3", False), ("eagle3.1", True)):
        opts = TrainOptions(steps=60, ttt_steps=3, batch_rows=512, draft_vocab=512, lr=3e-3, warmup=5,
                            eagle31=eagle31)
        train(features, tiny_target, out / name, opts, progress=False)
        convert(out / name, tiny_target, out / f"trained-{name}.gguf", outtype="f32", log=lambda m: None)
        paths[name] = (out / name, out / f"trained-{name}.gguf")
    return paths
