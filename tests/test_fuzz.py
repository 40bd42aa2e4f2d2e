"""Bounded fuzzing in CI (tests/fuzz.py runs the same cases longer): mutated real files
into the GGUF reader, llama.cpp loading, the safetensors, config and PyTorch readers and
the converter. The only outcome allowed is a result or a clear EdgeEagleError: no other
exception, no crash, no abort inside llama.cpp, no hang. Cases are derandomized, so a
failure here reproduces."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_eagle import defaults
from tests import fuzz_cases as F


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def torch_bin(trained_drafters, work) -> Path:
    import torch
    from safetensors.torch import load_file

    ckpt = trained_drafters["eagle3.1"][0]
    path = work / "pytorch_model.bin"
    torch.save(load_file(ckpt / "model.safetensors"), path)
    return path


@fuzz(120)
@given(rng=st.randoms(use_true_random=False))
def test_gguf_reader_on_the_shipped_drafter(rng, work):
    assert F.case_gguf_reader(rng, defaults.default_drafter(), work) in ("ok", "error")


@fuzz(60)
@given(rng=st.randoms(use_true_random=False))
def test_gguf_reader_on_a_target(rng, work, tiny_target):
    assert F.case_gguf_reader(rng, tiny_target, work) in ("ok", "error")


@fuzz(14)
@given(rng=st.randoms(use_true_random=False))
def test_llama_cpp_never_aborts_on_a_mutated_target(rng, work, tiny_target):
    assert F.case_gguf_load(rng, tiny_target, work) in ("ok", "error")


@fuzz(10)
@given(rng=st.randoms(use_true_random=False))
def test_llama_cpp_never_aborts_on_a_mutated_drafter(rng, work, tiny_target, tiny_drafters):
    assert F.case_gguf_load(rng, tiny_target, work, drafter=tiny_drafters["eagle3.1"][0]) in ("ok", "error")


@fuzz(80)
@given(rng=st.randoms(use_true_random=False))
def test_safetensors_reader(rng, work, trained_drafters):
    assert F.case_safetensors(rng, trained_drafters["eagle3.1"][0], work) in ("ok", "error")


@fuzz(40)
@given(rng=st.randoms(use_true_random=False))
def test_config_reader_and_converter(rng, work, trained_drafters, tiny_target):
    assert F.case_config(rng, trained_drafters["eagle3.1"][0], tiny_target, work) in ("ok", "error")


@fuzz(120)
@given(rng=st.randoms(use_true_random=False))
def test_pickle_free_torch_reader(rng, work, torch_bin):
    assert F.case_torch_zip(rng, torch_bin, work) in ("ok", "error")
