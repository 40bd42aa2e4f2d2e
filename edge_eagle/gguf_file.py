"""A fast, bounded GGUF header reader that validates a file before llama.cpp sees it.

llama.cpp aborts the whole process on some malformed files, so every file is read here
first. gguf-py's GGUFReader parses every vocabulary string into numpy views (4 s for a
49k-token vocabulary on this machine); this reader walks the header with struct,
keeps big string arrays as byte ranges, and checks that every tensor's data lies inside
the file. Every malformation becomes a ModelFileError, never another exception.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUFValueType as V

from . import gguf_keys as K
from .errors import ModelFileError

_MAGIC = b"GGUF"
_SCALARS: dict[int, str] = {  # gguf value type -> struct format
    V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
    V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d",
}
_NP_SCALARS: dict[int, type] = {
    V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16, V.UINT32: np.uint32,
    V.INT32: np.int32, V.FLOAT32: np.float32, V.BOOL: np.bool_, V.UINT64: np.uint64, V.INT64: np.int64,
    V.FLOAT64: np.float64,
}
_STRING, _ARRAY = V.STRING, V.ARRAY
_MAX_STRING_ARRAY = 4096  # longer string arrays stay as byte ranges
_MAX_DIMS = 4


@dataclass(frozen=True)
class ArrayRef:
    """A string array left in the file: its element count and the raw byte range."""

    count: int
    start: int
    end: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    type: GGMLQuantizationType
    offset: int  # absolute file offset of the data
    nbytes: int


@dataclass
class GGUFFile:
    path: Path
    version: int
    meta: dict[str, Any]
    tensors: dict[str, TensorInfo]
    _raw: dict[str, bytes] = field(default_factory=dict, repr=False)
    types: dict[str, tuple[int, int | None]] = field(default_factory=dict, repr=False)  # key -> (type, item type)

    @property
    def arch(self) -> str:
        return str(self.meta.get(K.ARCH, ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key.format(arch=self.arch), default)

    def require(self, key: str) -> Any:
        full = key.format(arch=self.arch)
        if full not in self.meta:
            raise ModelFileError(f"{self.path.name} lacks the GGUF key '{full}'; "
                                 "re-create it with `edge-eagle convert`.")
        return self.meta[full]

    @property
    def vocab_size(self) -> int:
        tokens = self.meta.get(K.TOKENS)
        if isinstance(tokens, ArrayRef):
            return tokens.count
        return len(tokens) if tokens is not None else 0

    def vocab_fingerprint(self) -> str:
        """sha256 over the raw bytes of the token list: equal lists, equal fingerprints."""
        tokens = self._raw.get(K.TOKENS)
        return hashlib.sha256(tokens).hexdigest() if tokens else ""

    def value(self, key: str) -> Any:
        """A metadata value with big string arrays read out of the file."""
        v = self.meta[key]
        if not isinstance(v, ArrayRef):
            return v
        with open(self.path, "rb") as f:
            f.seek(v.start)
            buf = f.read(v.end - v.start)
        out, pos = [], 0
        for _ in range(v.count):
            (n,) = struct.unpack_from("<Q", buf, pos)
            out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        return out

    def tensor_array(self, name: str) -> np.ndarray:
        """Read a small F32/F16/I64 tensor (norm weights, d2t) into numpy, shaped numpy-style."""
        info = self.tensors[name]
        dtypes = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                  GGMLQuantizationType.I64: np.int64, GGMLQuantizationType.I32: np.int32}
        if info.type in dtypes:
            with open(self.path, "rb") as f:
                f.seek(info.offset)
                arr = np.frombuffer(f.read(info.nbytes), dtype=dtypes[info.type])
            return arr.reshape(tuple(reversed(info.shape))).copy()
        from gguf.quants import dequantize

        with open(self.path, "rb") as f:
            f.seek(info.offset)
            raw = np.frombuffer(f.read(info.nbytes), dtype=np.uint8)
        return dequantize(raw, info.type).reshape(tuple(reversed(info.shape))).astype(np.float32)


def _show(text: str, limit: int = 48) -> str:
    """Text fit for an error message: printable, one line, short."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path.name} is not a valid GGUF file ({what}); re-download or re-convert it.")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated at byte {self.pos}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8", errors="replace")

    def name(self, what: str, limit: int) -> str:
        """A key or tensor name: printable ASCII of at most `limit` bytes."""
        n = self.unpack("<Q")
        if n > limit:
            raise self.fail(f"a {what} name is {n} bytes long")
        raw = self.take(n)
        if not raw.isascii() or not all(32 < b < 127 for b in raw):
            raise self.fail(f"a {what} name is not printable text ({_show(raw.decode('ascii', 'replace'))})")
        return raw.decode("ascii")

    def skip_strings(self, count: int) -> None:
        buf, pos, size = self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                raise self.fail(f"truncated at byte {pos}")
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
            if pos > size:
                raise self.fail(f"truncated at byte {pos}")
        self.pos = pos


def _value(cur: _Cursor, vtype: int, key: str, raw: dict[str, bytes]) -> Any:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return cur.string()
    if vtype == _ARRAY:
        itype, count = cur.unpack("<I"), cur.unpack("<Q")
        if count > cur.size:
            raise cur.fail(f"array '{_show(key)}' claims {count} elements")
        if itype in _NP_SCALARS:
            width = np.dtype(_NP_SCALARS[itype]).itemsize
            return np.frombuffer(cur.take(count * width), dtype=_NP_SCALARS[itype]).copy()
        if itype == _STRING:
            start = cur.pos
            if count > _MAX_STRING_ARRAY:
                cur.skip_strings(count)
                if key == K.TOKENS:
                    raw[key] = bytes(cur.buf[start:cur.pos])
                return ArrayRef(count, start, cur.pos)
            items = [cur.string() for _ in range(count)]
            if key == K.TOKENS:
                raw[key] = bytes(cur.buf[start:cur.pos])
            return items
        raise cur.fail(f"array '{_show(key)}' has element type {itype}")
    raise cur.fail(f"key '{_show(key)}' has value type {vtype}")


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse and validate a GGUF header; raise ModelFileError on anything malformed."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path} does not exist; check the path.")
    size = path.stat().st_size
    if size < 24:
        raise ModelFileError(f"{path.name} is not a GGUF file (only {size} bytes); check the path.")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        if cur.take(4) != _MAGIC:
            raise ModelFileError(f"{path.name} is not a GGUF file (bad magic); pass a .gguf model file.")
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise cur.fail(f"unsupported GGUF version {version}")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        if n_tensors > size // 24 or n_kv > size // 12:
            raise cur.fail(f"header claims {n_tensors} tensors and {n_kv} keys")
        meta: dict[str, Any] = {}
        raw: dict[str, bytes] = {}
        types: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            key = cur.name("key", 256)
            vtype = cur.unpack("<I")
            item = struct.unpack_from("<I", buf, cur.pos)[0] if vtype == _ARRAY and cur.pos + 4 <= size else None
            types[key] = (vtype, item)
            meta[key] = _value(cur, vtype, key, raw)
        infos = []
        for _ in range(n_tensors):
            name = cur.name("tensor", 63)  # GGML_MAX_NAME is 64 with the NUL
            n_dims = cur.unpack("<I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise cur.fail(f"tensor '{name}' has {n_dims} dimensions")
            shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
            ttype, offset = cur.unpack("<I"), cur.unpack("<Q")
            infos.append((name, shape, ttype, offset))
        alignment = int(meta.get(K.ALIGNMENT, 32))
        if alignment <= 0 or alignment & (alignment - 1):
            raise cur.fail(f"alignment {alignment}")
        data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, ttype, offset in infos:
        try:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFileError(f"{path.name} has tensor '{name}' of unknown type {ttype}; re-convert it.") from None
        n_el = int(np.prod(shape, dtype=np.float64))
        if any(d <= 0 for d in shape) or shape[0] % block or n_el > size * 64:
            raise ModelFileError(f"{path.name} has tensor '{name}' with impossible shape {list(shape)}; re-convert it.")
        nbytes = n_el // block * type_size
        start = data_start + offset
        if start + nbytes > size:
            raise ModelFileError(
                f"{path.name} is truncated (tensor '{name}' ends past the end of the file); "
                "re-download or re-convert it.")
        if name in tensors:
            raise ModelFileError(f"{path.name} has tensor '{name}' twice; re-convert it.")
        tensors[name] = TensorInfo(name, shape, qtype, start, nbytes)
    if K.ARCH not in meta:
        raise ModelFileError(f"{path.name} lacks '{K.ARCH}'; it is not a llama.cpp model file.")
    return GGUFFile(path, version, meta, tensors, raw, types)


def check_hparams(g: GGUFFile) -> None:
    """Reject model hyperparameters llama.cpp would abort on (or divide by), before it loads
    the file: counts and sizes in range and consistent, norms' epsilon and rope base finite
    and positive, special token ids inside the vocabulary."""
    import math

    name = g.path.name

    def bad(key: str, value: Any) -> ModelFileError:
        return ModelFileError(f"{name} has an impossible {key.format(arch=g.arch)} ({_show(str(value), 24)}); "
                              "re-download or re-convert it.")

    def ints(key: str, lo: int, hi: int, required: bool = False) -> list[int] | None:
        full = key.format(arch=g.arch)
        if full not in g.meta:
            if required:
                raise ModelFileError(f"{name} lacks the GGUF key '{full}'; re-download or re-convert it.")
            return None
        v = g.meta[full]
        vals = list(np.asarray(v).reshape(-1)) if isinstance(v, np.ndarray) else [v]
        if not vals or any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or not lo <= x <= hi
                           for x in vals):
            raise bad(key, v)
        return [int(x) for x in vals]

    def positive_float(key: str, hi: float) -> None:
        full = key.format(arch=g.arch)
        if full in g.meta:
            v = g.meta[full]
            if not isinstance(v, (float, int, np.floating)) or not (math.isfinite(v) and 0 < v < hi):
                raise bad(key, v)

    n_layer = ints(K.BLOCK_COUNT, 1, 1024, required=True)[0]  # type: ignore[index]
    n_embd = ints(K.EMBEDDING_LENGTH, 1, 1 << 17, required=True)[0]  # type: ignore[index]
    ints(K.CONTEXT_LENGTH, 1, 1 << 24)
    ints(K.FEED_FORWARD_LENGTH, 0, 1 << 20)
    heads = ints(K.HEAD_COUNT, 0, 4096)
    heads_kv = ints(K.HEAD_COUNT_KV, 0, 4096)
    key_len = ints(K.KEY_LENGTH, 1, 4096)
    ints(K.VALUE_LENGTH, 1, 4096)
    if heads is not None:
        if len(heads) not in (1, n_layer) or (heads_kv is not None and len(heads_kv) not in (1, n_layer)):
            raise bad(K.HEAD_COUNT, heads)
        kv = heads_kv if heads_kv is not None else heads
        for i in range(n_layer):
            h, k = heads[min(i, len(heads) - 1)], kv[min(i, len(kv) - 1)]
            if h and (k == 0 or h % k or (key_len is None and n_embd % h)):
                raise bad(K.HEAD_COUNT_KV if k == 0 or h % k else K.HEAD_COUNT, f"{h}/{k}")
        head_dim = key_len[0] if key_len else (n_embd // max(heads) if max(heads) else 0)
        rope = ints(K.ROPE_DIM, 2, 4096)
        if rope is not None and head_dim and (rope[0] > head_dim or rope[0] % 2):
            raise bad(K.ROPE_DIM, rope[0])
    positive_float(K.RMS_EPS, 1.0)
    positive_float("{arch}.attention.layer_norm_epsilon", 1.0)
    positive_float(K.ROPE_FREQ_BASE, 1e12)
    positive_float("{arch}.rope.scaling.factor", 1e6)
    n_vocab = g.vocab_size
    if n_vocab <= 0:
        raise ModelFileError(f"{name} has no tokenizer vocabulary; re-download or re-convert it.")
    for key, v in g.meta.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not (0 <= v < n_vocab or
                                                                                  v in (0xFFFFFFFF, -1)):
                raise bad(key, v)
    if g.arch == K.EAGLE3:
        ints(K.TARGET_HIDDEN_SIZE, 1, 1 << 17)
        ints(K.TARGET_LAYERS, 0, 4096)
