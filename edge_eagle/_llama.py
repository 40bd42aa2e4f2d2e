"""Thin helpers over llama-cpp-python's low-level API: logging, loading, KV memory."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from llama_cpp import llama_cpp as C

from .errors import ModelFileError

_init_lock = threading.Lock()
_initialised = False
_log_cb: Any = None


def init_backend() -> None:
    """Initialise llama.cpp once and silence its logging unless EDGE_EAGLE_VERBOSE is set."""
    global _initialised, _log_cb
    with _init_lock:
        if _initialised:
            return
        C.llama_backend_init()
        if not os.environ.get("EDGE_EAGLE_VERBOSE"):
            @C.llama_log_callback
            def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
                return None

            _log_cb = _quiet  # keep a reference: llama.cpp holds the pointer
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


def load_model(path: str, n_gpu_layers: int) -> Any:
    init_backend()
    params = C.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    model = C.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        raise ModelFileError(f"llama.cpp could not load {os.path.basename(path)}; check that it is a model this "
                             "llama-cpp-python version supports (set EDGE_EAGLE_VERBOSE=1 for its log).")
    _LIVE["models"] += 1
    return model


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


def n_threads_default() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


class Memory:
    """The KV memory of one context, sequence 0."""

    def __init__(self, ctx: Any):
        self._mem = C.llama_get_memory(ctx)

    def remove_from(self, pos: int) -> None:
        C.llama_memory_seq_rm(self._mem, 0, pos, -1)

    def clear(self) -> None:
        C.llama_memory_clear(self._mem, True)

    def pos_max(self) -> int:
        return int(C.llama_memory_seq_pos_max(self._mem, 0))
