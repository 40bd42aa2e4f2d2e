"""The optional native fast path (edge_eagle/_fastpath.c): greedy draft chains and whole greedy
cycles (draft, the target's verify, greedy verification, KV cut, features) in C, handed
llama.cpp's entry points as function pointers. The drafter's buffers are described to it once,
in a Session; each call then passes a few ints.

setup.py builds it as an optional extension; without a C compiler the install still works and
everything runs the Python path, which drafts the same tokens (tests/test_fastpath.py).
EDGE_EAGLE_FASTPATH=0 turns it off (for A/B measurements).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.machinery
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from llama_cpp import llama_cpp as C

from . import _bindings as B
from .errors import LayoutMismatchError, LlamaCallError, MissingSymbolError

ABI_VERSION = 5
_i32, _f32, _vp = ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


class Api(ctypes.Structure):
    """Mirror of ee_api in _fastpath.c."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [(name, _vp) for name in (
        "batch_clear", "batch_add_token", "batch_add_embd", "batch_set_embd_token", "batch_set_output_logits",
        "batch_set_pos", "process", "get_logits_ith", "get_embd_nextn", "get_embd_nextn_ith", "decode", "get_logits",
        "get_layer_inp", "memory_seq_rm", "memory_clear")]
    _fields_ += [("encode_type", _i32), ("decode_type", _i32), ("timing", _i32), ("native_s", ctypes.c_double)]


class Target(ctypes.Structure):
    """Mirror of ee_target in _fastpath.c: what a cycle needs of the target."""

    _fields_ = [("ctx", _vp), ("batch", _vp), ("mem", _vp), ("n_vocab", _i32), ("n_embd", _i32),
                ("n_layers", _i32), ("layers", ctypes.c_uint32 * 3)]


class Session(ctypes.Structure):
    """Mirror of ee_session in _fastpath.c: a cycle's constant inputs (the drafter's buffers)."""

    _fields_ = [("api", _vp), ("ctx", _vp), ("batch", _vp), ("mem", _vp), ("feats", _vp), ("feats_rows", _i32),
                ("width", _i32), ("fc_norm_w", _vp), ("eps", _f32), ("scratch", _vp), ("n_batch", _i32), ("g", _vp),
                ("tokens", _vp), ("rows", _i32), ("all_outputs_max", _i32), ("ids", _vp), ("n_ids", _i32),
                ("n_vocab", _i32), ("n_embd", _i32), ("out_norm_w", _vp), ("gbuf", _vp), ("drafts", _vp),
                ("drafts_cap", _i32), ("target", Target)]


# the structs whose layouts the library reports (ee_layout), and the ctypes mirrors that must match
def _mirrors() -> dict[str, type[ctypes.Structure]]:
    return {"ee_api": Api, "ee_target": Target, "ee_session": Session, "llama_batch": C.llama_batch,
            "llama_embd": C.llama_embd}


def check_layouts(lib: Any) -> None:
    """Raise LayoutMismatchError unless every struct shared with the library has the same size and
    the same fields at the same offsets on both sides (llama.h's structs: as llama-cpp-python
    mirrors them)."""
    lib.ee_layout.argtypes = [ctypes.c_char_p, ctypes.POINTER(_i32), ctypes.POINTER(ctypes.c_char_p)]
    lib.ee_layout.restype = ctypes.POINTER(ctypes.c_int64)
    for name, mirror in _mirrors().items():
        n, fields = _i32(0), ctypes.c_char_p()
        table = lib.ee_layout(name.encode(), ctypes.byref(n), ctypes.byref(fields))
        numbers = [int(table[i]) for i in range(n.value)] if table else []
        names = (fields.value or b"").decode().rstrip(",").split(",")
        native = (numbers[:1], dict(zip(names, numbers[1:])))
        ours = ([ctypes.sizeof(mirror)], {f[0]: getattr(mirror, f[0]).offset for f in mirror._fields_})
        if native != ours:
            raise LayoutMismatchError(f"{name}: the library has size {native[0]} and offsets {native[1]}, "
                                      f"Python {ours[0]} and {ours[1]}")


# The library's error codes (_fastpath.c): a stage's base, minus llama.cpp's return code there.
_STAGES = ((-5000, "target outputs"), (-4000, "target decode"), (-3000, "drafter encoder"),
           (-2000, "drafter outputs"), (-1000, "drafter decode"))


def call_error(code: int) -> LlamaCallError:
    """The named error for a negative code from propose() or cycle()."""
    for base, stage in _STAGES:
        if code <= base:
            return LlamaCallError(stage, base - code)
    return LlamaCallError("drafter batch", code)


def library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_fastpath{suffix}"
        if path.is_file():
            return path
    return None


def _addr(fn: Any) -> int:
    return int(ctypes.cast(fn, _vp).value or 0)


class FastPath:
    """The loaded library and one ee_api table (shared: llama.cpp's entry points are global)."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        lib.ee_abi_version.restype = _i32
        if lib.ee_abi_version() != ABI_VERSION:
            raise OSError(f"{path.name} has ABI {lib.ee_abi_version()}, not {ABI_VERSION}")
        check_layouts(lib)
        P = ctypes.POINTER
        api_p = P(Api)
        lib.ee_encode.argtypes = [api_p, _vp, _vp, _vp, _i32, _i32, _i32, _vp, _f32, _vp, _i32, _vp, _i32]
        lib.ee_encode.restype = _i32
        lib.ee_propose.argtypes = [_vp, _i32, _i32, _i32, _f32, _i32]
        lib.ee_propose.restype = _i32
        lib.ee_cycle.argtypes = [_vp, _i32, _i32, _i32, _f32, _i32, _i32, _vp, _vp]
        lib.ee_cycle.restype = _i32
        lib.ee_argmax_lanes.argtypes = [_i32]
        lib.ee_argmax_lanes.restype = _i32
        lib.ee_decode_rows.argtypes = [api_p, _vp, _vp, _vp, _vp, _vp, _vp, _i32, _i32, _i32]
        lib.ee_decode_rows.restype = _i32
        lib.ee_rms_norm.argtypes = [_vp, _vp, _i32, _i32, _f32, _vp]
        lib.ee_rms_norm.restype = None
        lib.ee_argmax_rows.argtypes = [_vp, _i32, _i32, _vp, _i32, _vp]
        lib.ee_argmax_rows.restype = None
        self.lib = lib
        raw = C._lib  # the ctypes symbols themselves, not module attributes a profiler may have wrapped
        self.api = Api(
            _addr(raw.llama_batch_ext_clear), _addr(raw.llama_batch_ext_add_token), _addr(raw.llama_batch_ext_add_embd),
            _addr(raw.llama_batch_ext_set_embd_token), _addr(raw.llama_batch_ext_set_output_logits),
            _addr(raw.llama_batch_ext_set_pos), _addr(raw.llama_process), _addr(raw.llama_get_logits_ith),
            _addr(B.symbol("llama_get_embeddings_nextn")), _addr(B.symbol("llama_get_embeddings_nextn_ith")),
            _addr(raw.llama_decode), _addr(raw.llama_get_logits), _addr(B.symbol("llama_get_embeddings_layer_inp")),
            _addr(raw.llama_memory_seq_rm), _addr(raw.llama_memory_clear), int(C.LLAMA_PROCESS_TYPE_ENCODE),
            int(C.LLAMA_PROCESS_TYPE_DECODE), 0, 0.0)
        self.api_p = ctypes.pointer(self.api)
        self.encode, self.decode_rows = lib.ee_encode, lib.ee_decode_rows
        try:  # a proposal and a whole greedy cycle as CPython functions of the same library (_fastpath.c)
            module = importlib.import_module(f"{__package__}._fastpath")
            self.propose, self.cycle = module.propose, module.cycle
        except (ImportError, SystemError, AttributeError):  # built without Python's headers
            self.propose, self.cycle = self.ctypes_propose, self.ctypes_cycle

    # propose(session address, pending tokens, last, pos0, k, p_min, clear KV) -> drafts or an error
    # code; cycle(...) -> (drafted, accepted tokens, bonus, draft, verify and copy seconds) or a code.
    # Without Python's headers, the same through ctypes:

    @staticmethod
    def _session_tokens(address: int, pending: list[int], last: int, k: int) -> Session:
        s = Session.from_address(address)
        n = len(pending) + 1
        if n > s.rows or n > s.feats_rows or not 0 < k <= s.drafts_cap or k >= s.feats_rows:
            raise ValueError("the session's buffers are too small for these rows or k")
        (_i32 * n).from_address(s.tokens)[:] = [*pending, last]
        return s

    def ctypes_propose(self, address: int, pending: list[int], last: int, pos0: int, k: int, p_min: float,
                       clear: bool) -> list[int] | int:
        s = self._session_tokens(address, pending, last, k)
        got = self.lib.ee_propose(address, len(pending) + 1, pos0, k, p_min, int(clear))
        return got if got < 0 else (_i32 * got).from_address(s.drafts)[:] if got else []

    def ctypes_cycle(self, address: int, pending: list[int], last: int, pos0: int, k: int, p_min: float,
                     clear: bool) -> tuple | int:
        s = self._session_tokens(address, pending, last, k)
        out, secs = (_i32 * 3)(), (ctypes.c_double * 3)()  # per call: engines may run in several threads
        rc = self.lib.ee_cycle(address, len(pending) + 1, pos0, k, p_min, last, int(clear), out, secs)
        if rc != 0:
            return rc
        got, acc, bonus = out
        return (got, (_i32 * acc).from_address(s.drafts)[:] if acc else [], bonus, *secs)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """The C RMSNorm over the last axis (for the parity test against eagle.rms_norm)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        w = np.ascontiguousarray(np.broadcast_to(weight, (x.shape[-1],)), dtype=np.float32)
        out = np.empty_like(x)
        n = x.shape[-1]
        self.lib.ee_rms_norm(x.ctypes.data, w.ctypes.data, x.size // n, n, eps, out.ctypes.data)
        return out

    def argmax_lanes(self, force: int = 0) -> int:
        """Which argmax the library runs after choosing again (1: scalar, 4 or 8 lanes); force 1 or
        4 picks that one (for the tests)."""
        return int(self.lib.ee_argmax_lanes(force))

    def argmax_rows(self, logits: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Each row's argmax (over ids, ascending, when given: a draft vocabulary), for the tests."""
        x = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])
        out = np.empty(len(x), np.int32)
        i = None if ids is None else np.ascontiguousarray(ids, dtype=np.int32)
        self.lib.ee_argmax_rows(x.ctypes.data, len(x), x.shape[1], None if i is None else i.ctypes.data,
                                0 if i is None else len(i), out.ctypes.data)
        return out


def enabled() -> bool:
    return os.environ.get("EDGE_EAGLE_FASTPATH", "1") != "0"


_why_not: list[str] = []  # why the library did not load, when it is built but unusable


@functools.lru_cache(maxsize=1)
def _load() -> FastPath | None:
    path = library_path()
    if path is None:
        _why_not[:] = ["not built"]
        return None
    try:
        return FastPath(path)
    except (OSError, ImportError, AttributeError, MissingSymbolError, LayoutMismatchError) as exc:
        # a stale or foreign build, or another llama-cpp-python: the Python path still works
        # (and says what it lacks, if it needs it)
        _why_not[:] = [f"{type(exc).__name__}: {exc}"]
        return None


def status() -> str:
    """One line for `inspect --system`: whether the fast path runs, and if not, why."""
    if not enabled():
        return "off (EDGE_EAGLE_FASTPATH=0)"
    lib = _load()
    if lib is None:
        return "unavailable: " + (_why_not[0] if _why_not else "unknown")
    kind = ("CPython functions" if lib.cycle != lib.ctypes_cycle
            else "ctypes entry points (built without Python's headers)")
    return f"on ({kind}, argmax {lib.argmax_lanes()} lanes)"


def load() -> FastPath | None:
    """The fast path, or None when it is off (EDGE_EAGLE_FASTPATH=0) or was not built."""
    return _load() if enabled() else None
