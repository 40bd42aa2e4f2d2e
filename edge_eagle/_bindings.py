"""ctypes bindings for the llama.cpp staging API (src/llama-ext.h) that llama-cpp-python
exports but does not bind, plus the few ggml symbols the eval-callback capture needs.

The staging API has C++ linkage, so each symbol is looked up by its plain, Itanium and
MSVC names. A missing symbol raises MissingSymbolError naming it; nothing here aborts.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Iterable

import llama_cpp
from llama_cpp import llama_cpp as C

from .errors import MissingSymbolError

REQUIRED_VERSION = "0.3.36"

_ctx_p = C.llama_context_p_ctypes


def _resolve(lib: Any, names: Iterable[str], argtypes: list[Any], restype: Any) -> Callable[..., Any]:
    names = tuple(names)
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    raise MissingSymbolError(
        f"The installed llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks the llama.cpp symbol "
        f"'{names[0]}'; install llama-cpp-python=={REQUIRED_VERSION}.")


_SYMBOLS: dict[str, Callable[[], Any]] = {}  # name -> resolver, unaffected by wrapping the module attributes


def symbol(name: str) -> Any:
    """The ctypes function of a staging-API symbol bound here (e.g. for its address)."""
    return _SYMBOLS[name]()


def _lazy(names: tuple[str, ...], argtypes: list[Any], restype: Any, lib: Callable[[], Any] = lambda: C._lib):
    """Resolve on first call, so importing edge_eagle never fails on an old llama.cpp."""

    @functools.lru_cache(maxsize=None)
    def fn() -> Callable[..., Any]:
        return _resolve(lib(), names, argtypes, restype)

    _SYMBOLS[names[0]] = fn

    def call(*args: Any) -> Any:
        return fn()(*args)

    call.resolve = fn  # type: ignore[attr-defined]
    call.__name__ = names[0]
    return call


llama_set_embeddings_layer_inp = _lazy(
    ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
     "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
    [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None)

llama_get_embeddings_layer_inp = _lazy(
    ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
     "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
    [_ctx_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float))

llama_set_embeddings_nextn = _lazy(
    ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb",
     "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
    [_ctx_p, ctypes.c_bool, ctypes.c_bool], None)

llama_get_embeddings_nextn = _lazy(
    ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context",
     "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"),
    [_ctx_p], ctypes.POINTER(ctypes.c_float))

llama_get_embeddings_nextn_ith = _lazy(
    ("llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
     "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"),
    [_ctx_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float))

# --- ggml, for the eval-callback capture path -------------------------------------------

GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_MAX_NAME = 4, 64, 10, 64


class ggml_tensor(ctypes.Structure):
    """Mirror of struct ggml_tensor (ggml/include/ggml.h) up to the fields read here."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def _ggml_lib() -> Any:
    from llama_cpp._ggml import libggml

    return libggml


ggml_backend_tensor_get = _lazy(
    ("ggml_backend_tensor_get",),
    [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t], None, lib=_ggml_lib)

eval_callback_type = C.ggml_backend_sched_eval_callback
