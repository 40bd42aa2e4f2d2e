"""Every bad input gets one clear line and exit code 2; the process never dies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_eagle import EdgeEagle
from edge_eagle._bindings import _resolve
from edge_eagle.errors import ContextOverflowError, MissingSymbolError, ModelFileError, PairMismatchError
from tests.tiny_models import make_drafter, write_tiny_target


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "edge_eagle.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def assert_clean_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("edge-eagle: error: ")
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def wide_target(tiny_dir: Path) -> Path:
    """Same tokenizer, different hidden size and layer count."""
    return write_tiny_target(tiny_dir / "wide-target.gguf", seed=7, hidden=96, heads=4, kv_heads=2, n_layer=12)


def test_drafter_that_is_not_eagle3(tiny_target):
    assert_clean_error(cli("generate", "hi", "--target", str(tiny_target), "--drafter", str(tiny_target)),
                       "not an EAGLE-3 drafter")
    with pytest.raises(ModelFileError):
        EdgeEagle(tiny_target, tiny_target)


def test_target_that_is_a_drafter(tiny_target, tiny_drafters):
    path = str(tiny_drafters["eagle3"][0])
    assert_clean_error(cli("generate", "hi", "--target", path, "--drafter", "none"), "not a target")


def test_hidden_size_mismatch(wide_target, tiny_drafters):
    assert_clean_error(cli("generate", "hi", "--target", str(wide_target), "--drafter",
                           str(tiny_drafters["eagle3"][0])), "hidden size")
    with pytest.raises(PairMismatchError):
        EdgeEagle(wide_target, tiny_drafters["eagle3"][0])


def test_layer_count_mismatch(tiny_dir, tiny_target, wide_target):
    # a drafter for the 12-layer target captures layer 9, which the 8-layer target lacks
    path, _ = make_drafter(tiny_dir / "deep.gguf", wide_target, seed=3)
    shallow = write_tiny_target(tiny_dir / "shallow96.gguf", seed=8, hidden=96, heads=4, kv_heads=2, n_layer=8)
    assert_clean_error(cli("inspect", str(path), "--target", str(shallow)), "layers")


def test_vocabulary_mismatch(tmp_path, tiny_target, tiny_drafters):
    """Same sizes, another tokenizer: the fingerprint check refuses the pair."""
    import numpy as np
    from gguf import GGUFValueType, GGUFWriter

    from edge_eagle.gguf_file import read_gguf

    src = read_gguf(tiny_target)
    tokens = src.value("tokenizer.ggml.tokens")
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    other = tmp_path / "other-vocab.gguf"
    w = GGUFWriter(str(other), "llama")
    for key, (vtype, item) in src.types.items():
        if key.startswith("general.architecture"):
            continue
        value = tokens if key == "tokenizer.ggml.tokens" else src.value(key)
        if hasattr(value, "tolist"):
            value = value.tolist()
        w.add_key_value(key, value, GGUFValueType(vtype), GGUFValueType(item) if item is not None else None)
    for name in src.tensors:
        w.add_tensor(name, src.tensor_array(name).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_clean_error(cli("inspect", str(tiny_drafters["eagle3"][0]), "--target", str(other)), "tokenizer")


def test_truncated_gguf(tmp_path, tiny_drafters, tiny_target):
    src = tiny_drafters["eagle3"][0]
    for cut in (10, 200, os.path.getsize(src) - 100):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(Path(src).read_bytes()[:cut])
        assert_clean_error(cli("generate", "hi", "--target", str(tiny_target), "--drafter", str(bad)), bad.name)
        assert_clean_error(cli("generate", "hi", "--target", str(bad), "--drafter", "none"), bad.name)


def test_not_a_gguf(tmp_path, tiny_target):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    assert_clean_error(cli("generate", "hi", "--target", str(junk)), "not a GGUF")
    assert_clean_error(cli("inspect", str(tmp_path / "missing.gguf")), "does not exist")


def test_a_prompt_that_does_not_fit_the_context_is_a_clear_error(tiny_target):
    assert_clean_error(cli("generate", "hello there " * 40, "--target", str(tiny_target), "--drafter", "none",
                           "--n-ctx", "64", "-n", "10"), "context window")
    with EdgeEagle(tiny_target, None, n_ctx=64) as ee:
        with pytest.raises(ContextOverflowError):
            ee.generate("hello " * 80, max_tokens=4)
        with pytest.raises(ContextOverflowError, match="start a new chat"):
            ee.chat([{"role": "user", "content": "hello " * 80}], max_tokens=4)


def test_missing_symbol_names_it_and_the_version():
    class Lib:
        pass

    with pytest.raises(MissingSymbolError, match="llama_fancy_new_api.*llama-cpp-python==0.3.36"):
        _resolve(Lib(), ["llama_fancy_new_api", "_Z19llama_fancy_new_apiv"], [], None)


def test_bad_drafter_leaves_no_target_loaded(tiny_target, tiny_drafters):
    """A failed construction closes what it opened (no leaked llama.cpp contexts)."""
    import gc

    before = len([o for o in gc.get_objects() if type(o).__name__ == "Target" and getattr(o, "ctx", None)])
    with pytest.raises(ModelFileError):
        EdgeEagle(tiny_target, tiny_target)
    gc.collect()
    after = len([o for o in gc.get_objects() if type(o).__name__ == "Target" and getattr(o, "ctx", None)])
    assert after == before


def test_console_script_reports_errors_the_same_way(tmp_path):
    script = Path(sys.executable).parent / "edge-eagle"
    assert script.exists(), "run `pip install -e .`"
    proc = subprocess.run([str(script), "inspect", str(tmp_path / "nope.gguf")], capture_output=True, text=True,
                          timeout=120)
    assert_clean_error(proc, "does not exist")
