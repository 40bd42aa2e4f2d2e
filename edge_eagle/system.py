"""What llama.cpp sees on this machine, and the weight-repacking decision that depends on it.

llama.cpp 0c1e57098 (vendored by llama-cpp-python 0.3.36) repacks CPU weights into "extra
buffer types" at load time: CPU_REPACK (interleaved Q4_0/Q4_K/IQ4_NL/Q8_0/... blocks for
AVX2/AVX-512/NEON kernels) and, on CPUs with AMX when the build has AMX kernels, AMX. The
AMX kernels crash (a segfault, or "Illegal instruction" on a tile instruction) in
``ggml_backend_amx_mul_mat`` on batches of more than a couple of
tokens (ggml-org/llama.cpp#20824, closed unfixed). llama.cpp offers one switch for both,
``llama_model_params.use_extra_bufts`` (``--no-repack`` in its tools), so "auto" turns the
extra buffer types off exactly when the AMX buffer type is among them and weights live on
the CPU, and leaves repacking on everywhere else (it speeds up Q4_0/Q4_K on x86; see README).

Override with ``EDGE_EAGLE_REPACK=auto|on|off``, ``repack=`` in the API or ``--repack``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .cpu_key import cpuinfo as _cpuinfo
from .errors import EdgeEagleError

REPACK_ENV = "EDGE_EAGLE_REPACK"
REPACK_MODES = ("auto", "on", "off")
AMX_BUFT = "AMX"
AMX_BUG = "llama.cpp's AMX kernels crash on multi-token batches (ggml-org/llama.cpp#20824)"

# ggml_backend_dev_type
_DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


@dataclass(frozen=True)
class RepackDecision:
    use_extra_bufts: bool
    mode: str  # the requested mode: auto, on or off
    reason: str


def repack_mode(requested: str | None = None) -> str:
    """The repack mode in force: the argument, else $EDGE_EAGLE_REPACK, else auto."""
    mode = (requested if requested is not None else os.environ.get(REPACK_ENV, "auto")).strip().lower() or "auto"
    if mode not in REPACK_MODES:
        source = "repack=" if requested is not None else REPACK_ENV
        raise EdgeEagleError(f"Unknown repack mode '{mode}' (from {source}); "
                             "use auto, on or off.")
    return mode


def decide_repack(mode: str, extra_bufts: list[str], weights_on_cpu: bool) -> RepackDecision:
    """Whether llama.cpp may put weights into its CPU extra buffer types (pure: unit-tested)."""
    if mode == "on":
        return RepackDecision(True, mode, "forced on")
    if mode == "off":
        return RepackDecision(False, mode, "forced off")
    if AMX_BUFT in extra_bufts and weights_on_cpu:
        return RepackDecision(False, mode, f"off: this CPU and build use the AMX buffer type, and {AMX_BUG}")
    if not extra_bufts:
        return RepackDecision(True, mode, "on (this build has no extra CPU buffer types; nothing is repacked)")
    if AMX_BUFT in extra_bufts:
        return RepackDecision(True, mode, "on: every layer is offloaded, so the AMX kernels are not used")
    return RepackDecision(True, mode, f"on: {', '.join(extra_bufts)} repacking, no AMX")


def weights_on_cpu(n_gpu_layers: int, n_layer: int | None) -> bool:
    """Whether some matmul weights of a model stay on the CPU."""
    if not _has_gpu():
        return True
    if n_gpu_layers < 0:
        return False
    return n_layer is None or n_gpu_layers < n_layer + 1  # llama.cpp counts the output layer as one more


def repack_for(n_gpu_layers: int, n_layer: int | None, requested: str | None = None) -> RepackDecision:
    return decide_repack(repack_mode(requested), cpu_extra_buffer_types(), weights_on_cpu(n_gpu_layers, n_layer))


# --- flash attention ---------------------------------------------------------------------------

FLASH_ATTN_MODES = ("auto", "on", "off")
# llama_flash_attn_type: llama.cpp's own AUTO enables it wherever the device supports it, the CPU included
FLASH_ATTN_TYPES = {"llama.cpp": -1, "off": 0, "on": 1}


#: auto on the CPU: a request whose prompt has at least this many tokens runs with flash attention
#: off (the engine makes its contexts again when the setting changes, docs/measurements.md)
FLASH_ATTN_OFF_FROM = 512
#: ... and one whose prompt is shorter than this with llama.cpp's choice (on) again; prompts in
#: between keep the setting in use, so a chat that grows past FLASH_ATTN_OFF_FROM stays off
FLASH_ATTN_ON_BELOW = 256


@dataclass(frozen=True)
class FlashAttnDecision:
    setting: str  # what llama.cpp is asked for now: on, off, or llama.cpp (its own AUTO)
    mode: str  # the requested mode: auto, on or off
    reason: str
    #: whether the setting follows each request's prompt length (auto with attention on the CPU)
    routed: bool = False

    def for_prompt(self, n_tokens: int) -> "FlashAttnDecision":
        """The decision for a request whose prompt has n_tokens tokens (pure: unit-tested): a
        routed decision turns off from FLASH_ATTN_OFF_FROM tokens on and back to llama.cpp's
        choice below FLASH_ATTN_ON_BELOW; in between, and when not routed, it stays as it is."""
        if not self.routed:
            return self
        setting = ("off" if n_tokens >= FLASH_ATTN_OFF_FROM else
                   "llama.cpp" if n_tokens < FLASH_ATTN_ON_BELOW else self.setting)
        return self if setting == self.setting else replace(self, setting=setting)

    @property
    def llama_type(self) -> int:
        """The llama_context_params.flash_attn_type value."""
        return FLASH_ATTN_TYPES[self.setting]

    @property
    def flag(self) -> str:
        """The value of llama.cpp's tools' `-fa` for the same setting."""
        return "auto" if self.setting == "llama.cpp" else self.setting


def decide_flash_attn(mode: str | None, attention_on_cpu: bool) -> FlashAttnDecision:
    """Whether a context computes attention with llama.cpp's flash-attention kernel (pure: unit-tested).

    auto: llama.cpp's own AUTO (on wherever the device supports it, the CPU included). On the CPU,
    off is faster on long contexts: llama.cpp's CPU kernel (vendored 0.3.36) walks every cached
    cell once per query row and head. On a 2-core AMD EPYC (AVX2) with SmolLM2-135M, one token
    after 2,048 tokens took 26.0 ms with it and 20.7 ms without, a batch of 9 after 1,024 tokens
    113 ms and 64 ms; below about 100 tokens on is up to 6% faster. On an AVX-512 EPYC, plain
    decoding gains less (1.06x after 1,900 tokens) and loses 10% on 65-token prompts, while
    `auto` gains 1.38x after 1,900 tokens and breaks even at about 220: the point where off pays
    depends on the CPU and on how much is drafted, from about 150 to a few hundred tokens. Off
    also rounds one-token decodes and batches differently on short contexts too, where on agrees
    bit for bit up to about 256 tokens, so greedy speculation parts from plain decoding at
    near-ties more often (docs/measurements.md, 2026-12-07). So auto on the CPU is routed: a
    request with a short prompt runs with llama.cpp's choice (on), one with a long prompt
    (FLASH_ATTN_OFF_FROM tokens) with it off; FlashAttnDecision.for_prompt decides, and the
    engine makes its contexts again when the setting changes. With layers on a GPU, auto is
    llama.cpp's choice."""
    mode = (mode or "auto").strip().lower()
    if mode not in FLASH_ATTN_MODES:
        raise EdgeEagleError(f"Unknown flash attention mode '{mode}'; use auto, on or off.")
    if mode != "auto":
        return FlashAttnDecision(mode, mode, f"forced {mode}" + (
            " (faster on the CPU on long contexts)" if mode == "off" and attention_on_cpu else ""))
    if attention_on_cpu:
        return FlashAttnDecision("llama.cpp", mode, f"on (llama.cpp's auto), off from a prompt of "
                                 f"{FLASH_ATTN_OFF_FROM} tokens until one under {FLASH_ATTN_ON_BELOW} "
                                 "(faster on the CPU on long contexts)", routed=True)
    return FlashAttnDecision("llama.cpp", mode, "llama.cpp's auto (on where the device supports it)")


def flash_attn_for(n_gpu_layers: int, requested: str | None = None) -> FlashAttnDecision:
    return decide_flash_attn(requested, not _has_gpu() or n_gpu_layers == 0)


# --- ggml's backend registry, through ctypes -------------------------------------------------

class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_ggml: Any = None


def _lib() -> Any:
    global _ggml
    if _ggml is None:
        from llama_cpp import _ggml as G

        from ._llama import init_backend

        init_backend()
        lib = G.libggml
        p = ctypes.c_void_p
        for name, args, res in [
            ("ggml_backend_dev_count", [], ctypes.c_size_t), ("ggml_backend_dev_get", [ctypes.c_size_t], p),
            ("ggml_backend_dev_name", [p], ctypes.c_char_p), ("ggml_backend_dev_description", [p], ctypes.c_char_p),
            ("ggml_backend_dev_type", [p], ctypes.c_int), ("ggml_backend_dev_backend_reg", [p], p),
            ("ggml_backend_dev_memory", [p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
            ("ggml_backend_reg_name", [p], ctypes.c_char_p),
            ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
            ("ggml_backend_buft_name", [p], ctypes.c_char_p),
        ]:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        _ggml = lib
    return _ggml


def _cpu_device() -> Any:
    g = _lib()
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if _device_type(g, dev) == "cpu":
            return dev
    return None


def _device_type(g: Any, dev: Any) -> str:
    return _DEV_TYPES.get(g.ggml_backend_dev_type(dev), "unknown")


@functools.lru_cache(maxsize=None)
def _has_gpu() -> bool:
    """A GPU device is registered (fixed for the life of the process, so asked once)."""
    g = _lib()
    return any(_device_type(g, g.ggml_backend_dev_get(i)) in ("gpu", "igpu") for i in range(g.ggml_backend_dev_count()))


def cpu_extra_buffer_types() -> list[str]:
    """Names of the CPU device's extra buffer types in this build on this CPU, in llama.cpp's order."""
    return list(_cpu_extra_buffer_types())


@functools.lru_cache(maxsize=None)
def _cpu_extra_buffer_types() -> tuple[str, ...]:
    # fixed for the life of the process: asked once, not on every model load or upstream run
    g, dev = _lib(), _cpu_device()
    if dev is None:
        return ()
    fn = g.ggml_backend_reg_get_proc_address(g.ggml_backend_dev_backend_reg(dev), b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        return ()
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(dev)
    names, i = [], 0
    while arr and arr[i]:
        names.append(g.ggml_backend_buft_name(arr[i]).decode())
        i += 1
    return tuple(names)


def backend_features() -> dict[str, dict[str, str]]:
    """Per backend registry, the features it reports (CPU: SSE3, AVX2, AVX512, AMX_INT8, REPACK, ...)."""
    g = _lib()
    out: dict[str, dict[str, str]] = {}
    seen: set[int] = set()
    for i in range(g.ggml_backend_dev_count()):
        reg = g.ggml_backend_dev_backend_reg(g.ggml_backend_dev_get(i))
        if reg in seen:
            continue
        seen.add(reg)
        feats: dict[str, str] = {}
        fn = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
        if fn:
            arr = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(fn)(reg)
            j = 0
            while arr and arr[j].name:
                feats[arr[j].name.decode()] = (arr[j].value or b"").decode()
                j += 1
        out[g.ggml_backend_reg_name(reg).decode()] = feats
    return out


def devices() -> list[dict[str, Any]]:
    g = _lib()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({"name": g.ggml_backend_dev_name(dev).decode(),
                    "description": (g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    "type": _device_type(g, dev),
                    "memory_total_mib": round(total.value / 2**20), "memory_free_mib": round(free.value / 2**20)})
    return out


def cpu_flags() -> set[str]:
    """The kernel's CPU flags (Linux); empty elsewhere."""
    return set((_cpuinfo("flags") or "").split())


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


@dataclass
class SystemReport:
    llama_cpp_python: str
    llama_cpp_commit: str
    system_info: str
    cpu: str
    cores: int | None
    cpu_amx_flags: list[str]
    threads_default: int
    devices: list[dict[str, Any]]
    features: dict[str, dict[str, str]]
    cpu_extra_buffer_types: list[str]
    repack: dict[str, Any]
    flash_attn: dict[str, Any] = field(default_factory=dict)
    model_buffers: dict[str, dict[str, float]] = field(default_factory=dict)
    thread_policy: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


LLAMA_CPP_COMMIT = "0c1e57098"  # what llama-cpp-python 0.3.36 vendors (NOTES §4)


def thread_policy(threads: int | None = None, interval: float = 0.5) -> dict[str, Any]:
    """The thread policy in force now (threads.py): the decision over `interval` seconds of this
    machine's load, the governor, and where calibrations are cached."""
    from . import calibration
    from .threads import ThreadGovernor, current_decision

    decision = current_decision(threads, interval=interval)
    gov = ThreadGovernor(lambda n: None, decision)
    governor = (f"on: fewer threads when a step takes over {gov.slowed}x its calibrated time while other "
                f"programs use the cores, more again when they stop (looked at every {gov.recheck_s:g} s)"
                if gov.active
                else "off: --threads fixes the count")
    return {**decision.to_dict(), "describe": decision.describe(), "governor": governor,
            "calibration_cache": str(calibration.cache_path())}


def system_report(n_gpu_layers: int = 0, model_paths: dict[str, str] | None = None,
                  repack: str | None = None, threads: int | None = None,
                  flash_attn: str | None = None) -> SystemReport:
    """Everything a bug report about speed or a crash needs; loads the given models to list their buffers."""
    import llama_cpp
    from llama_cpp import llama_cpp as C

    from ._llama import load_model_buffers, n_threads_default

    decision = repack_for(n_gpu_layers, None, repack)
    buffers = {role: load_model_buffers(path, n_gpu_layers, repack) for role, path in (model_paths or {}).items()}
    return SystemReport(
        llama_cpp_python=getattr(llama_cpp, "__version__", "?"), llama_cpp_commit=LLAMA_CPP_COMMIT,
        system_info=C.llama_print_system_info().decode(errors="replace").strip(), cpu=cpu_name(),
        cores=os.cpu_count(), cpu_amx_flags=sorted(f for f in cpu_flags() if f.startswith("amx")),
        threads_default=n_threads_default(), devices=devices(), features=backend_features(),
        cpu_extra_buffer_types=cpu_extra_buffer_types(),
        repack={"env": os.environ.get(REPACK_ENV), **asdict(decision)},
        flash_attn=asdict(flash_attn_for(n_gpu_layers, flash_attn)), model_buffers=buffers,
        thread_policy=thread_policy(threads))


def format_report(r: SystemReport) -> str:
    lines = [f"llama-cpp-python {r.llama_cpp_python} (llama.cpp {r.llama_cpp_commit})",
             f"CPU: {r.cpu}, {r.cores} cores; default threads {r.threads_default}"
             + (f"; kernel AMX flags: {' '.join(r.cpu_amx_flags)}" if r.cpu_amx_flags else "; no AMX"),
             "devices:"]
    lines += [f"  {d['name']} ({d['type']}): {d['description']}"
              + (f", {d['memory_free_mib']}/{d['memory_total_mib']} MiB free" if d["memory_total_mib"] else "")
              for d in r.devices]
    for reg, feats in r.features.items():
        lines.append(f"{reg} features: " + " ".join(k if v in ("1", "") else f"{k}={v}" for k, v in feats.items()))
    lines.append("CPU extra buffer types: " + (", ".join(r.cpu_extra_buffer_types) or "none"))
    env = f" (from {REPACK_ENV}={r.repack['env']})" if r.repack["env"] else ""
    lines.append(f"weight repacking [{r.repack['mode']}{env}]: {r.repack['reason']}")
    if r.flash_attn:
        lines.append(f"flash attention [{r.flash_attn['mode']}]: {r.flash_attn['reason']}")
    for role, bufs in r.model_buffers.items():
        lines.append(f"{role} buffers: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in bufs.items()))
    if r.thread_policy:
        lines.append(f"threads: {r.thread_policy['describe']}")
        lines.append(f"thread governor: {r.thread_policy['governor']}")
        lines.append(f"batch-cost calibrations: {r.thread_policy['calibration_cache']}")
    return "\n".join(lines)
