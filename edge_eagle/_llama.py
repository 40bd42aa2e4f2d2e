"""Loading llama.cpp models and contexts through llama-cpp-python's low-level API: the backend and
its log, model and context handles (counted, for leak checks), views of llama.cpp's output buffers,
quantizing, and the weight-repacking switch. KV bookkeeping is kv.py."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
from typing import Any, Iterator

import numpy as np
from llama_cpp import llama_cpp as C

from .errors import ModelFileError

_init_lock = threading.Lock()
_initialised = False
_log_cb: Any = None
_verbose = False
_load_log = threading.local()  # lines of llama.cpp's log collected while this thread loads a model
_BUFFER_LINE = re.compile(rb"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")


def init_backend() -> None:
    """Initialise llama.cpp once; its log is silent unless EDGE_EAGLE_VERBOSE is set, and the
    loader's buffer lines are kept so that each model can say where its weights went."""
    global _initialised, _log_cb, _verbose
    with _init_lock:
        if _initialised:
            return
        C.llama_backend_init()
        _verbose = bool(os.environ.get("EDGE_EAGLE_VERBOSE"))

        @C.llama_log_callback
        def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            lines = getattr(_load_log, "lines", None)
            if lines is not None and text:
                lines.append(text)
            if _verbose and text:
                os.write(2, text)

        _log_cb = _log  # keep a reference: llama.cpp holds the pointer
        C.llama_log_set(_log_cb, ctypes.c_void_p(0))
        _initialised = True


_LIVE = {"models": 0, "contexts": 0}


def live_handles() -> dict[str, int]:
    """How many llama.cpp models and contexts edge-eagle holds open right now (leak checks)."""
    return dict(_LIVE)


def free_context(ctx: Any) -> None:
    C.llama_free(ctx)
    _LIVE["contexts"] -= 1


def free_model(model: Any) -> None:
    C.llama_model_free(model)
    _LIVE["models"] -= 1


class LoadedModel:
    """What a load did: the repack decision taken and llama.cpp's buffers (type -> MiB)."""

    def __init__(self, handle: Any, repack: Any, buffers: dict[str, float]):
        self.handle, self.repack, self.buffers = handle, repack, buffers


def load_model(path: str, n_gpu_layers: int, n_layer: int | None = None, repack: str | None = None) -> LoadedModel:
    """Load a GGUF with the weight-repacking decision of system.repack_for (AMX-safe)."""
    from .system import repack_for

    init_backend()
    decision = repack_for(n_gpu_layers, n_layer, repack)
    params = C.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.use_extra_bufts = decision.use_extra_bufts
    _load_log.lines = []
    try:
        model = C.llama_model_load_from_file(os.fsencode(path), params)
    finally:
        lines, _load_log.lines = _load_log.lines, None
    if not model:
        raise ModelFileError(f"llama.cpp could not load {os.path.basename(path)}; check that it is a model this "
                             "llama-cpp-python version supports (set EDGE_EAGLE_VERBOSE=1 for its log).")
    _LIVE["models"] += 1
    buffers: dict[str, float] = {}
    for m in (_BUFFER_LINE.search(line) for line in lines):
        if m:
            buffers[m.group(1).decode()] = buffers.get(m.group(1).decode(), 0.0) + float(m.group(2))
    return LoadedModel(model, decision, buffers)


def load_model_buffers(path: str, n_gpu_layers: int = 0, repack: str | None = None) -> dict[str, float]:
    """Load a model only to see where llama.cpp puts its weights (for `inspect --system`)."""
    from . import gguf_keys as K
    from .gguf_file import read_gguf

    n_layer = read_gguf(path).get(K.BLOCK_COUNT)
    loaded = load_model(path, n_gpu_layers, n_layer, repack)
    free_model(loaded.handle)
    return loaded.buffers


def new_context(model: Any, name: str, **fields: Any) -> Any:
    params = C.llama_context_default_params()
    for key, value in fields.items():
        setattr(params, key, value)
    ctx = C.llama_init_from_model(model, params)
    if not ctx:
        raise ModelFileError(f"llama.cpp could not create a context for {name}; lower n_ctx or free memory "
                             "(set EDGE_EAGLE_VERBOSE=1 for its log).")
    _LIVE["contexts"] += 1
    return ctx


@functools.lru_cache(maxsize=64)
def _float_array_type(n: int) -> Any:
    return ctypes.c_float * n


_VIEWS: dict[tuple[int, int, int], np.ndarray] = {}


def float_view(ptr: Any, rows: int, cols: int) -> np.ndarray:
    """A [rows, cols] float32 numpy view of memory llama.cpp owns (valid until its next call
    that reallocates it). Views are cached by address and shape: llama.cpp's output buffers
    stay put between decodes, so the loop's several reads per cycle cost a dict lookup, not a
    new ctypes array and numpy buffer each (np.ctypeslib.as_array: ~5 us; after a compute has
    evicted the caches, several times that)."""
    addr = ctypes.cast(ptr, ctypes.c_void_p).value
    if not addr:
        raise RuntimeError("llama.cpp returned no buffer (were outputs requested for these rows?)")
    key = (addr, rows, cols)
    view = _VIEWS.get(key)
    if view is None:
        if len(_VIEWS) >= 256:
            _VIEWS.clear()
        view = np.frombuffer(_float_array_type(rows * cols).from_address(addr), dtype=np.float32).reshape(rows, cols)
        _VIEWS[key] = view
    return view


def n_threads_default() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def requantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str) -> None:
    """llama.cpp's own quantizer: write `src` as `dst` with file type `ftype` (e.g. "Q4_0")."""
    init_backend()
    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    if C.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)) != 0:
        raise ModelFileError(f"llama.cpp could not quantize {os.path.basename(src)} to {ftype}; "
                             "check that the file loads.")


@contextlib.contextmanager
def llama_cpp_python_repack(n_gpu_layers: int = 0, repack: str | None = None) -> Iterator[Any]:
    """Apply the repack decision to llama-cpp-python's own `Llama(...)`, which has no parameter
    for it: its constructor takes llama_model_default_params() and sets fields on the result,
    so the defaults it sees carry use_extra_bufts for the duration of the block."""
    from .system import repack_for

    decision = repack_for(n_gpu_layers, None, repack)
    original = C.llama_model_default_params

    def defaults() -> Any:
        params = original()
        params.use_extra_bufts = decision.use_extra_bufts
        return params

    C.llama_model_default_params = defaults
    try:
        yield decision
    finally:
        C.llama_model_default_params = original
