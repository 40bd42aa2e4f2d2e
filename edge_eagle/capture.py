"""Capturing the target's features: the inputs of the drafter's target layers, for every token
of each decode.

Two capture paths, picked automatically from the GGUF architecture:
- "layer_inp": llama.cpp's staging API (llama_set/get_embeddings_layer_inp), for graphs
  that export layer inputs (gguf_keys.LAYER_INPUT_ARCHS);
- "callback": the scheduler's eval callback, copying tensor ``l_out-(il-1)`` (the output
  of layer il-1 is the input of layer il); works on any graph, costs ~1 µs per node.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from . import _bindings as B
from ._llama import float_view
from .errors import EdgeEagleError


class FeatureCapture:
    """One target context's capture. The eval callback (path "callback") must be handed to the
    context when it is created (`callback`); then attach() the context."""

    def __init__(self, path: str, n_layer: int, n_embd: int):
        self.path, self.n_layer, self.n_embd = path, n_layer, n_embd
        self.layers: tuple[int, ...] = ()
        self.ctx: Any = None
        self._wanted: dict[bytes, int] = {}  # tensor name -> layer, on the callback path
        self._captured: dict[bytes, list[np.ndarray]] = {}  # eval-callback captures by tensor name
        self.callback: Any = B.eval_callback_type(self._eval_callback) if path == "callback" else None

    def attach(self, ctx: Any) -> None:
        """Capture from `ctx` (a context made again keeps capturing the same layers)."""
        self.ctx = ctx
        if self.path == "layer_inp":
            for lid in self.layers:
                B.llama_set_embeddings_layer_inp(ctx, lid, True)

    def set(self, layer_ids: Sequence[int]) -> None:
        """Capture the inputs of these layers on every later decode (empty: capture nothing)."""
        layer_ids = tuple(int(i) for i in layer_ids)
        if layer_ids == self.layers:
            self._captured = {}
            return  # unchanged: a change makes llama.cpp build the graph again (ms)
        for lid in layer_ids:
            if not 0 <= lid < self.n_layer:
                raise EdgeEagleError(f"Layer {lid} is outside the target's {self.n_layer} layers; "
                                     "use a drafter made for this target.")
            if self.path == "callback" and lid == 0:
                raise EdgeEagleError("The eval-callback capture path cannot capture layer 0; "
                                     "use a drafter whose target layers start at 1 or later.")
        if self.path == "layer_inp":
            for lid in self.layers:
                B.llama_set_embeddings_layer_inp(self.ctx, lid, False)
            for lid in layer_ids:
                B.llama_set_embeddings_layer_inp(self.ctx, lid, True)
        self.layers = layer_ids
        self._wanted = {f"l_out-{lid - 1}".encode(): lid for lid in layer_ids}
        self._captured = {}

    def _eval_callback(self, t: int, ask: bool, user_data: int) -> bool:
        tensor = ctypes.cast(t, ctypes.POINTER(B.ggml_tensor)).contents
        if ask:
            return tensor.name in self._wanted
        if tensor.name in self._wanted and tensor.type == 0:  # GGML_TYPE_F32
            ne0, ne1 = tensor.ne[0], tensor.ne[1]
            out = np.empty((ne1, ne0), dtype=np.float32)
            B.ggml_backend_tensor_get(t, out.ctypes.data, 0, out.nbytes)
            self._captured.setdefault(tensor.name, []).append(out)
        return True

    def parts(self, n_tokens: int) -> list[np.ndarray] | None:
        """The captured layer inputs of the last decode, one [n_tokens, n_embd] array per layer
        (views of llama.cpp's buffers on the layer_inp path), or None when nothing is captured."""
        if not self.layers:
            return None
        if self.path == "layer_inp":
            return [float_view(B.llama_get_embeddings_layer_inp(self.ctx, lid), n_tokens, self.n_embd)
                    for lid in self.layers]
        parts = []
        for name, lid in self._wanted.items():
            chunks = self._captured.pop(name, [])
            got = np.concatenate(chunks) if chunks else np.empty((0, self.n_embd), np.float32)
            if got.shape != (n_tokens, self.n_embd):
                raise RuntimeError(f"eval callback captured {got.shape} for layer {lid}, expected "
                                   f"{(n_tokens, self.n_embd)}")
            parts.append(got)
        return parts
