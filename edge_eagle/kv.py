"""KV bookkeeping: one llama.cpp context's memory, and which tokens sequence 0 holds.

Knowing sequence 0's tokens lets a new request reuse the longest common prefix with the last
one (the prompt cache); every operation that changes the cache keeps that list true.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Sequence

import numpy as np
from llama_cpp import llama_cpp as C


class Memory:
    """The KV memory of one context (sequence 0 unless told otherwise). `tokens` are the tokens
    whose KV sequence 0 holds at positions 0.. (kept up to date by Target.decode), so a new
    request can reuse the longest common prefix."""

    def __init__(self, ctx: Any):
        self._mem = C.llama_get_memory(ctx)
        self.tokens: list[int] = []

    @property
    def handle(self) -> Any:
        """llama.cpp's llama_memory_t, for native code that edits the cache itself (it then tells
        this object what it did, through extend_at or remove_from)."""
        return self._mem

    def remove_from(self, pos: int, seq: int = 0) -> None:
        C.llama_memory_seq_rm(self._mem, seq, pos, -1)
        if seq == 0:
            del self.tokens[pos:]

    def remove_seq(self, seq: int) -> None:
        C.llama_memory_seq_rm(self._mem, seq, -1, -1)
        if seq == 0:
            self.tokens.clear()

    def clear(self) -> None:
        C.llama_memory_clear(self._mem, True)
        self.tokens.clear()

    def extend_at(self, pos: int, tokens: Sequence[int]) -> None:
        """Sequence 0 now also holds `tokens` at positions pos..: they join `tokens` when they
        continue it; otherwise what it holds is no longer known token by token."""
        if len(self.tokens) == pos:
            self.tokens.extend(tokens)
        else:
            self.tokens.clear()

    def copy_seq(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence dst to the cells of src at positions [p0, p1) (-1: open end); in a
        unified KV cache the cells are shared, nothing is copied."""
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` sequence 0 already holds."""
        return common_prefix(self.tokens, tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# --- a sequence's KV cells across flash attention settings ----------------------------------------
#
# llama.cpp stores V transposed when a context computes attention without flash attention, and its
# sequence state data (llama_state_seq_get_data) says which: a context of the other setting refuses
# it ("incompatible V transposition"). The data, as llama.cpp 0.3.36 writes it: an 8-byte header,
# n_stream (u32), then per stream: cell_count (u32), and unless it is 0: per cell pos (i32),
# n_seq_id (u32) and the sequence ids (i32 each); v_trans (u32), n_layer (u32); per layer K: type
# (i32), row size (u64), the cells' rows; per layer V: type (i32), row size (u64), the cells' rows,
# or transposed: type (i32), element size (u32), n_embd_v (u32), then n_embd_v rows of cell_count
# elements.

_ELEMENT_SIZE = {0: 4, 1: 2, 30: 2}  # GGML_TYPE_F32, F16, BF16: the V types that transpose element-wise
_ELEMENT_DTYPE = {2: np.uint16, 4: np.uint32}


def relayout_v(data: bytes | bytearray, v_trans: bool) -> bytearray | None:
    """A sequence's state data with its V cells in the layout `v_trans` asks for (the data
    itself when they are in it already); None when the data is not the layout described above
    or its V type does not transpose element by element (a quantized V cache): then the cells
    cannot move."""
    try:
        return _relayout_v(memoryview(data), v_trans)
    except (struct.error, ValueError, KeyError):
        return None


def _relayout_v(data: memoryview, v_trans: bool) -> bytearray:
    out = bytearray(data[:12])  # the header and n_stream
    (n_stream,) = struct.unpack_from("<I", data, 8)
    o = 12
    for _ in range(n_stream):
        start = o
        (cells,) = struct.unpack_from("<I", data, o)
        o += 4
        if not cells:  # an empty stream is its count alone
            out += data[start:o]
            continue
        for _ in range(cells):  # the cells' positions and sequences, as they are
            _, n_seq = struct.unpack_from("<iI", data, o)
            o += 8 + 4 * n_seq
        out += data[start:o]
        trans, n_layer = struct.unpack_from("<II", data, o)
        out += struct.pack("<II", int(v_trans), n_layer)
        o += 8
        start = o
        for _ in range(n_layer):  # K: rows either way
            _, row = struct.unpack_from("<iQ", data, o)
            o += 12 + cells * row
        out += data[start:o]
        for _ in range(n_layer):
            if trans:
                vtype, el, n_embd = struct.unpack_from("<iII", data, o)
                o += 12
                shape = (n_embd, cells)
            else:
                vtype, row = struct.unpack_from("<iQ", data, o)
                o += 12
                # rows that stay rows are copied as bytes, whatever their type
                el = _ELEMENT_SIZE[vtype] if bool(trans) != v_trans else 1
                n_embd = row // el
                if n_embd * el != row:
                    raise ValueError("a V row is not whole elements")
                shape = (cells, n_embd)
            size = cells * el * n_embd
            if o + size > len(data):
                raise ValueError("the data ends inside a V layer")
            block = data[o:o + size]
            o += size
            if bool(trans) != v_trans:
                block = np.ascontiguousarray(np.frombuffer(block, _ELEMENT_DTYPE[el]).reshape(shape).T).data
            out += struct.pack("<iII", vtype, el, n_embd) if v_trans else struct.pack("<iQ", vtype, el * n_embd)
            out += block
    if o != len(data):
        raise ValueError("data after the last stream")
    return out


def seq_state_size(ctx: Any, seq: int = 0) -> int:
    """Bytes of sequence `seq`'s state data (seq_state)."""
    return int(C.llama_state_seq_get_size(ctx, seq))


def seq_state(ctx: Any, seq: int = 0) -> bytearray:
    """Sequence `seq`'s KV cells as llama.cpp's state data (empty when it holds none), written
    straight into the one buffer returned: for a large cache, every copy is its size again."""
    size = seq_state_size(ctx, seq)
    data = bytearray(size)
    view = (ctypes.c_uint8 * size).from_buffer(data)
    got = C.llama_state_seq_get_data(ctx, view, size, seq)
    del view  # the buffer can be resized once nothing points into it
    del data[got:]
    return data


def move_cells(state: bytes | bytearray, ctx: Any, v_trans: bool, seq: int = 0) -> bool:
    """Put the cells of `state` (seq_state of another context) into sequence `seq` of ctx, V in
    the layout `v_trans` says ctx keeps; whether they are there now (True for no cells)."""
    moved = relayout_v(state, v_trans)
    if moved is None:
        return False
    if len(moved) == 16 and moved[12:16] == b"\0\0\0\0":  # one stream without cells: nothing to load
        return True
    return load_seq_state(ctx, moved, seq)


def load_seq_state(ctx: Any, data: bytes | bytearray, seq: int = 0) -> bool:
    """Put state data (seq_state) into sequence `seq` of ctx; False when llama.cpp refused it
    (the sequence is then empty). A bytearray is read in place."""
    n = len(data)
    buf = (ctypes.c_uint8 * n).from_buffer(data) if isinstance(data, bytearray) else \
        (ctypes.c_uint8 * n).from_buffer_copy(data)
    return C.llama_state_seq_set_data(ctx, buf, n, seq) == n
