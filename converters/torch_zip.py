"""Read tensors from a PyTorch zip checkpoint (pytorch_model.bin) without unpickling.

torch.save writes a zip with `<prefix>/data.pkl` (a pickle of the state dict that names
each tensor's storage, offset, shape and stride) and the raw storages as `<prefix>/data/<key>`.
Unpickling, even with torch's weights_only, runs an interpreter over untrusted bytes. Here
the pickle is only *disassembled* (pickletools.genops) and a small stack machine rebuilds
the state dict from a fixed set of opcodes and a fixed set of globals; anything else is
refused. Tensors come back as numpy arrays (bf16 widened to f32).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_eagle.errors import EdgeEagleError
from edge_eagle.gguf_file import _show

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "HalfStorage": np.float16, "BFloat16Storage": "bf16", "DoubleStorage": np.float64,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
_TORCH_DTYPES = {"float32": np.float32, "float": np.float32, "float16": np.float16, "half": np.float16,
                 "bfloat16": "bf16", "float64": np.float64, "int64": np.int64, "long": np.int64, "int32": np.int32,
                 "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}
_ALLOWED_GLOBALS = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                    ("torch._utils", "_rebuild_parameter"), ("torch", "Size")}
MAX_OPS = 5_000_000


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(frozen=True)
class _Storage:
    dtype: Any
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Mark:
    pass


def _global(module: str, name: str) -> _Global:
    if (module, name) in _ALLOWED_GLOBALS or (module == "torch" and (name in _STORAGE_DTYPES or name in _TORCH_DTYPES)):
        return _Global(module, name)
    raise ValueError(f"refuses the global {module}.{name}")


def _reduce(fn: Any, args: Any) -> Any:
    if not isinstance(fn, _Global) or not isinstance(args, tuple):
        raise ValueError("calls something that is not an allowed function")
    name = (fn.module, fn.name)
    if name == ("collections", "OrderedDict"):
        return {}
    if name == ("torch", "Size"):
        return tuple(args[0]) if args else ()
    if name == ("torch._utils", "_rebuild_parameter"):
        return args[0]
    if name == ("torch._utils", "_rebuild_tensor_v2"):
        storage, offset, size, stride = args[:4]
        if not (isinstance(storage, _Storage) and isinstance(offset, int) and isinstance(size, tuple)
                and isinstance(stride, tuple) and len(size) == len(stride)
                and all(isinstance(x, int) and x >= 0 for x in size + stride) and offset >= 0):
            raise ValueError("has a malformed tensor record")
        return _TensorRef(storage, offset, size, stride)
    raise ValueError(f"calls {fn.module}.{fn.name}")


def _pop_mark(stack: list) -> list:
    for i in range(len(stack) - 1, -1, -1):
        if isinstance(stack[i], _Mark):
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise ValueError("has an unbalanced MARK")


def _interpret(pkl: bytes) -> Any:
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    for n_ops, (op, arg, _) in enumerate(pickletools.genops(io.BytesIO(pkl))):
        if n_ops > MAX_OPS:
            raise ValueError("is too long")
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            if len(stack) != 1:
                raise ValueError("ends with a malformed stack")
            return stack[0]
        if name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE"):
            stack.append({} if name == "EMPTY_DICT" else [] if name == "EMPTY_LIST" else ())
        elif name == "MARK":
            stack.append(_Mark())
        elif name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "BININT", "BININT1", "BININT2",
                      "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT", "SHORT_BINSTRING", "BINSTRING", "STRING"):
            stack.append(arg)
        elif name == "NONE":
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg or 0)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[int(arg or 0)])
        elif name == "GLOBAL":
            module, _, gname = str(arg).partition(" ")
            stack.append(_global(module, gname))
        elif name == "STACK_GLOBAL":
            gname, module = stack.pop(), stack.pop()
            stack.append(_global(str(module), str(gname)))
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise ValueError("underflows its stack")
            stack[-n:] = [tuple(stack[-n:])]
        elif name in ("SETITEM", "SETITEMS"):
            items = [stack.pop(), stack.pop()][::-1] if name == "SETITEM" else _pop_mark(stack)
            target = stack[-1]
            if not isinstance(target, dict) or len(items) % 2:
                raise ValueError("sets items on something that is not a dict")
            for k, v in zip(items[::2], items[1::2]):
                if not isinstance(k, (str, int)):
                    raise ValueError("has a non-string key")
                target[k] = v
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
            if not isinstance(stack[-1], list):
                raise ValueError("appends to something that is not a list")
            stack[-1].extend(items)
        elif name == "BINPERSID":
            pid = stack.pop()
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and isinstance(pid[1], _Global) and isinstance(pid[2], str) and isinstance(pid[4], int)):
                raise ValueError("names a storage it cannot read")
            dtype = _STORAGE_DTYPES.get(pid[1].name) or _TORCH_DTYPES.get(pid[1].name)
            if dtype is None:
                raise ValueError(f"has storage type {pid[1].name}")
            stack.append(_Storage(dtype, pid[2], pid[4]))
        elif name == "REDUCE":
            args, fn = stack.pop(), stack.pop()
            stack.append(_reduce(fn, args))
        elif name == "BUILD":
            stack.pop()  # object state (e.g. a state dict's _metadata): not needed
        else:
            raise ValueError(f"uses the pickle opcode {name}")
    raise ValueError("has no STOP")


def _materialize(zf: zipfile.ZipFile, prefix: str, ref: _TensorRef, cache: dict[str, np.ndarray]) -> np.ndarray:
    st = ref.storage
    if st.key not in cache:
        raw = zf.read(f"{prefix}data/{st.key}")
        if st.dtype == "bf16":
            u16 = np.frombuffer(raw, dtype="<u2")
            arr = (u16.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(st.dtype).newbyteorder("<"))
        if arr.size < st.numel:
            raise ValueError(f"has a storage {st.key} shorter than it says")
        cache[st.key] = arr
    flat = cache[st.key]
    if not ref.size or 0 in ref.size:
        return np.zeros(ref.size, dtype=flat.dtype)
    last = ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride))
    if last >= flat.size:
        raise ValueError("has a tensor that reads past its storage")
    view = np.lib.stride_tricks.as_strided(flat[ref.offset:], shape=ref.size,
                                           strides=tuple(s * flat.itemsize for s in ref.stride), writeable=False)
    return np.array(view)


def load_torch_zip(path: str | Path) -> dict[str, np.ndarray]:
    """name -> array for every tensor in a torch.save zip file; raises EdgeEagleError otherwise."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            pkls = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
            if len(pkls) != 1:
                raise ValueError("has no data.pkl")
            prefix = pkls[0][: -len("data.pkl")]
            if f"{prefix}byteorder" in names and zf.read(f"{prefix}byteorder").strip() not in (b"little", b""):
                raise ValueError("is big-endian")
            obj = _interpret(zf.read(pkls[0]))
            if not isinstance(obj, dict):
                raise ValueError("does not hold a state dict")
            cache: dict[str, np.ndarray] = {}
            return {str(k): _materialize(zf, prefix, v, cache) for k, v in obj.items() if isinstance(v, _TensorRef)}
    except zipfile.BadZipFile:
        raise EdgeEagleError(f"{path.name} is not a zip-format PyTorch file (legacy or damaged); re-download it or "
                             "convert it to safetensors.") from None
    except (ValueError, KeyError, IndexError, TypeError, EOFError, OSError, UnicodeDecodeError, OverflowError,
            MemoryError, NotImplementedError) as e:
        raise EdgeEagleError(f"{path.name} is not a plain PyTorch state dict (it {_show(str(e), 120)}); "
                             "re-download it or "
                             "convert it to safetensors.") from None
