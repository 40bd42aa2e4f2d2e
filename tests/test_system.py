"""Weight repacking and AMX: llama.cpp 0c1e57098's AMX kernels segfault on multi-token
batches, so edge-eagle turns llama.cpp's extra CPU buffer types off where the AMX buffer
type would be used, and keeps repacking everywhere else. On an AMX machine the child-process
tests below crash without that decision; elsewhere they still run the decision code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edge_eagle import system
from edge_eagle._llama import llama_cpp_python_repack, requantize
from edge_eagle.errors import EdgeEagleError
from edge_eagle.target import Target
from tests.tiny_models import write_tiny_target

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
ENV.pop(system.REPACK_ENV, None)


@pytest.fixture(scope="module")
def q4_0_target(tmp_path_factory) -> Path:
    """A tiny llama target quantized to Q4_0 by llama.cpp: a type the CPU_REPACK buffer takes."""
    d = tmp_path_factory.mktemp("q4")
    src = write_tiny_target(d / "tiny-f32.gguf", seed=3)
    requantize(src, d / "tiny-q4_0.gguf", "Q4_0")
    return d / "tiny-q4_0.gguf"


# --- the decision -----------------------------------------------------------------------

@pytest.mark.parametrize("mode,bufts,on_cpu,expected", [
    ("auto", ["AMX", "CPU_REPACK"], True, False),   # the crashing case
    ("auto", ["AMX", "CPU_REPACK"], False, True),   # every layer offloaded: AMX never runs
    ("auto", ["CPU_REPACK"], True, True),           # repacking helps Q4_0 (scripts/bench_repack.py)
    ("auto", [], True, True),
    ("on", ["AMX", "CPU_REPACK"], True, True),      # forced: the user's call
    ("off", ["CPU_REPACK"], True, False),
])
def test_repack_decision(mode, bufts, on_cpu, expected):
    d = system.decide_repack(mode, bufts, on_cpu)
    assert d.use_extra_bufts is expected
    assert d.mode == mode
    if not expected and mode == "auto":
        assert "AMX" in d.reason and "20824" in d.reason


def test_repack_mode_reads_the_environment(monkeypatch):
    monkeypatch.setenv(system.REPACK_ENV, "OFF")
    assert system.repack_mode() == "off"
    assert system.repack_mode("on") == "on"  # an explicit argument wins
    monkeypatch.setenv(system.REPACK_ENV, "sometimes")
    with pytest.raises(EdgeEagleError, match="use auto, on or off"):
        system.repack_mode()


def test_this_machine_never_loads_weights_into_amx_buffers(q4_0_target):
    t = Target(q4_0_target, n_ctx=64)
    try:
        assert system.AMX_BUFT not in t.buffers
        if system.AMX_BUFT in system.cpu_extra_buffer_types():
            assert t.repack.use_extra_bufts is False
    finally:
        t.close()


def test_repack_switch_reaches_llama_cpp(q4_0_target):
    if "CPU_REPACK" not in system.cpu_extra_buffer_types():
        pytest.skip("this llama.cpp build has no CPU_REPACK buffer type")
    buffers = {}
    for mode in ("on", "off"):
        if mode == "on" and system.AMX_BUFT in system.cpu_extra_buffer_types():
            continue  # forcing it on would crash here
        t = Target(q4_0_target, n_ctx=64, repack=mode)
        try:
            buffers[mode] = t.buffers
            assert t.prefill(list(range(10, 42))).logits.shape[0] == 1
        finally:
            t.close()
    assert "CPU_REPACK" not in buffers["off"]
    if "on" in buffers:
        assert buffers["on"].get("CPU_REPACK", 0) > 0


def test_llama_cpp_python_llama_gets_the_decision(monkeypatch):
    from llama_cpp import llama_cpp as C

    with llama_cpp_python_repack(repack="off") as d:
        assert d.use_extra_bufts is False
        assert C.llama_model_default_params().use_extra_bufts is False
    assert C.llama_model_default_params().use_extra_bufts is True  # restored


def test_upstream_loop_gets_no_repack_when_off(monkeypatch):
    from edge_eagle.bench.runners import UpstreamRunner

    r = UpstreamRunner(Path("llama-speculative-simple"), "t.gguf", "d.gguf", 3, 256, 1)
    monkeypatch.setenv(system.REPACK_ENV, "off")
    assert "--no-repack" in r.command("p.txt", 8)
    monkeypatch.setenv(system.REPACK_ENV, "on")
    assert "--no-repack" not in r.command("p.txt", 8)


# --- in a child process: a crash is an exit code, not a dead test run -----------------------

_DECODE_64 = textwrap.dedent("""
    import sys
    from edge_eagle.target import Target
    t = Target(sys.argv[1], n_ctx=256)
    toks = t.tokenize("The quick brown fox jumps over the lazy dog. " * 20)[:64]
    assert len(toks) == 64
    res = t.decode(toks, 0, "all")
    assert res.logits.shape[0] == 64
    t.decode([int(res.logits[-1].argmax())], 64)
    t.close()
    print("ok")
""")


@pytest.mark.smollm
@pytest.mark.parametrize("which", ["smollm", "q4_0"])
def test_a_64_token_batch_decodes_in_a_fresh_process(which, smollm, q4_0_target):
    path = smollm if which == "smollm" else q4_0_target
    proc = subprocess.run([sys.executable, "-c", _DECODE_64, str(path)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode} (a negative code is a signal): {proc.stderr[-2000:]}"
    assert proc.stdout.strip() == "ok"


@pytest.mark.smollm
def test_generate_with_the_default_drafter_exits_cleanly():
    """What `make run` does, speculative (k=3, so multi-token verify batches) and plain."""
    for extra in (["--k", "3"], ["--drafter", "none"]):
        proc = subprocess.run([sys.executable, "-m", "edge_eagle.cli", "generate", "Explain speculative decoding.",
                               "-n", "24", "--json", *extra], capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        stats = json.loads(proc.stdout)["stats"]
        assert stats["generated_tokens"] > 0
        assert (stats["drafted"] > 0) is (extra[0] == "--k")


def test_inspect_system_reports_build_devices_buffers_and_threads(q4_0_target):
    proc = subprocess.run([sys.executable, "-m", "edge_eagle.cli", "inspect", "--system", "--json", "--target",
                           str(q4_0_target)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["llama_cpp_python"] == "0.3.36"
    assert any(d["type"] == "cpu" for d in r["devices"])
    assert "CPU" in r["features"] and r["threads_default"] >= 1
    assert r["repack"]["mode"] == "auto" and r["repack"]["reason"]
    assert r["repack"]["use_extra_bufts"] is (system.AMX_BUFT not in r["cpu_extra_buffer_types"])
    assert sum(r["model_buffers"]["target"].values()) > 0
    text = subprocess.run([sys.executable, "-m", "edge_eagle.cli", "inspect", "--system", "--repack", "off",
                           "--target", str(q4_0_target)], capture_output=True, text=True, env=ENV, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "weight repacking [off" in text.stdout and "forced off" in text.stdout
    assert "CPU_REPACK" not in text.stdout.split("target buffers:")[1]


# --- flash attention ----------------------------------------------------------------------

@pytest.mark.parametrize("mode,on_cpu,setting", [
    ("auto", True, "llama.cpp"),   # llama.cpp's own AUTO (on): off is the long-context choice
    ("auto", False, "llama.cpp"),
    (None, True, "llama.cpp"),
    ("on", True, "on"),           # forced: the user's call
    ("OFF", False, "off"),
])
def test_flash_attention_decision(mode, on_cpu, setting):
    d = system.decide_flash_attn(mode, on_cpu)
    assert d.setting == setting
    assert d.llama_type == {"off": 0, "on": 1, "llama.cpp": -1}[setting]


def test_auto_flash_attention_on_the_cpu_follows_the_prompt_length():
    """Routed (auto, attention on the CPU): off from FLASH_ATTN_OFF_FROM prompt tokens, back to
    llama.cpp's choice under FLASH_ATTN_ON_BELOW, and in between the setting in use stays."""
    lo, hi = system.FLASH_ATTN_ON_BELOW, system.FLASH_ATTN_OFF_FROM
    d = system.decide_flash_attn("auto", True)
    assert d.routed and d.setting == "llama.cpp"
    assert d.for_prompt(hi - 1) is d
    off = d.for_prompt(hi)
    assert off.setting == "off" and off.llama_type == 0 and off.routed and off.mode == "auto"
    assert off.for_prompt(lo) is off  # a chat that grew past hi stays off
    assert off.for_prompt(hi * 4).setting == "off"
    back = off.for_prompt(lo - 1)
    assert back.setting == "llama.cpp" and back.llama_type == -1
    assert back.for_prompt(lo) is back  # and one that shrank under lo stays on until hi
    for fixed in (system.decide_flash_attn("auto", False), system.decide_flash_attn("on", True),
                  system.decide_flash_attn("off", True)):
        assert not fixed.routed
        assert fixed.for_prompt(0) is fixed and fixed.for_prompt(10 * hi) is fixed


def test_an_unknown_flash_attention_mode_says_what_to_use():
    with pytest.raises(EdgeEagleError, match="use auto, on or off"):
        system.decide_flash_attn("sometimes", True)


def test_the_flash_attention_switch_reaches_llama_cpp(tiny_target):
    """on and off compute attention differently (the logits differ in their last bits); auto on a
    machine without a GPU is llama.cpp's AUTO, which is on there, bit for bit."""
    prompt = [(7 * i) % 200 + 10 for i in range(80)]
    logits = {}
    for mode in ("on", "off", "auto"):
        t = Target(tiny_target, n_ctx=256, flash_attn=mode)
        try:
            assert t.flash_attn.mode == mode
            logits[mode] = np.array(t.decode(prompt, 0, "all").logits, copy=True)
        finally:
            t.close()
    assert not np.array_equal(logits["on"], logits["off"])
    np.testing.assert_allclose(logits["on"], logits["off"], atol=0.05)  # the same attention, another kernel
    if not system._has_gpu():
        assert np.array_equal(logits["auto"], logits["on"])


def test_llama_cpps_tools_compute_attention_as_the_engines_do():
    from edge_eagle.bench.runners import UpstreamRunner

    def fa(**kw):
        cmd = UpstreamRunner(Path("llama-speculative-simple"), "t.gguf", "d.gguf", 3, 256, 1, **kw).command("p", 8)
        return cmd[cmd.index("-fa") + 1]

    assert fa(flash_attn="on") == "on"
    assert fa(flash_attn="off") == "off"
    assert fa() == "auto"  # llama.cpp's own choice, as the engines leave it


def test_a_calibration_belongs_to_one_flash_attention_setting(tiny_target):
    from edge_eagle import calibration

    keys = {}
    for mode in ("on", "off"):
        t = Target(tiny_target, n_ctx=64, flash_attn=mode)
        try:
            keys[mode] = calibration.key(t, 1, 9)
        finally:
            t.close()
    assert keys["on"] != keys["off"]
