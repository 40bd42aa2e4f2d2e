"""What an eagle3 drafter GGUF says about itself (Eagle3Spec), and whether it fits a target
(check_pair): every check that would otherwise end in a llama.cpp assertion, refused first with
a sentence that says what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import gguf_keys as K
from ..errors import ModelFileError, PairMismatchError
from ..gguf_file import GGUFFile


@dataclass(frozen=True)
class Eagle3Spec:
    """What a drafter GGUF says about itself, as the runtime needs it."""

    hidden_size: int
    target_hidden_size: int
    target_layers: tuple[int, int, int]
    draft_vocab_size: int
    rms_eps: float
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    has_embedding: bool
    has_lm_head: bool
    vocab_size: int
    vocab_fingerprint: str | None

    @property
    def version(self) -> str:
        return "EAGLE-3.1" if (self.fc_norm or self.norm_output) else "EAGLE-3"

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Eagle3Spec":
        name = g.path.name
        if g.arch != K.EAGLE3:
            raise ModelFileError(f"{name} is not an EAGLE-3 drafter (architecture '{g.arch}'); pass an eagle3 "
                                 "GGUF made by `edge-eagle convert`, or --drafter none.")
        layers = g.require(K.TARGET_LAYERS)
        if len(layers) != 3:
            raise ModelFileError(f"{name} names {len(layers)} target layers, not 3; re-convert it.")
        for t in (K.T_FC, K.T_OUTPUT_NORM, K.T_ATTN_Q):
            if t not in g.tensors:
                raise ModelFileError(f"{name} lacks tensor '{t}'; re-convert it with `edge-eagle convert`.")
        # llama.cpp GGML_ASSERTs (aborts the process) on these at decode time: refuse them here
        if int(g.require(K.BLOCK_COUNT)) != 1:
            raise ModelFileError(f"{name} has {g.get(K.BLOCK_COUNT)} decoder layers; an EAGLE-3 drafter has exactly 1.")
        if g.get(K.KEY_LENGTH, 0) != g.get(K.VALUE_LENGTH, 0):
            raise ModelFileError(f"{name} has different key and value head sizes, which llama.cpp's eagle3 cannot run.")
        fc_norm = bool(g.meta.get(K.FC_NORM, False))
        norm_before_fc = bool(g.get(K.NORM_BEFORE_FC, False))
        if fc_norm and norm_before_fc:
            raise ModelFileError(f"{name} sets both fc_norm and norm_before_fc; re-convert it with one of them.")
        d2t = g.tensors.get(K.T_D2T)
        return cls(
            hidden_size=int(g.require(K.EMBEDDING_LENGTH)),
            target_hidden_size=int(g.require(K.TARGET_HIDDEN_SIZE)),
            target_layers=tuple(int(x) for x in layers),  # type: ignore[arg-type]
            draft_vocab_size=int(d2t.shape[0]) if d2t else g.vocab_size,
            rms_eps=float(g.require(K.RMS_EPS)),
            norm_before_residual=bool(g.get(K.NORM_BEFORE_RESIDUAL, False)),
            norm_before_fc=norm_before_fc,
            fc_norm=fc_norm,
            norm_output=bool(g.meta.get(K.NORM_OUTPUT, False)),
            has_embedding=K.T_TOKEN_EMBD in g.tensors,
            has_lm_head=K.T_OUTPUT in g.tensors,
            vocab_size=g.vocab_size,
            vocab_fingerprint=g.meta.get(K.TARGET_VOCAB_FINGERPRINT),
        )


def layer_ids_problem(ids: Sequence[int], n_layer: int, arch: str, target_name: str) -> str | None:
    """Why these captured-layer ids (layer-input convention) cannot run on this target, or None.

    0 (the token embeddings, the input of layer 0) works where llama.cpp exports layer inputs;
    N (the final hidden state, speculators' "include last layer") is no layer's input, so
    llama.cpp's layer-input API cannot give it."""
    ids = [int(i) for i in ids]
    if n_layer in ids:
        return (f"captures layer id {n_layer}, the final hidden state of {target_name}'s {n_layer} layers, which "
                f"llama.cpp's layer-input capture cannot give (it ends at the input of layer {n_layer - 1}); use a "
                f"drafter trained on layer ids below {n_layer}.")
    bad = [i for i in ids if not 0 <= i < n_layer]
    if bad:
        return (f"captures target layers {ids}, some outside {target_name}'s {n_layer} layers; use a drafter made "
                "for this target (or convert one with `edge-eagle convert --target`).")
    if 0 in ids and arch not in K.LAYER_INPUT_ARCHS:
        return (f"captures layer 0 (the token embeddings), which the eval-callback capture that {target_name}'s "
                f"architecture ({arch}) needs cannot give; use a drafter whose layer ids start at 1.")
    return None


def check_pair(drafter: GGUFFile, target: GGUFFile) -> Eagle3Spec:
    """Raise PairMismatchError unless this drafter fits this target; return its spec."""
    spec = Eagle3Spec.from_gguf(drafter)
    d, t = drafter.path.name, target.path.name
    t_embd = int(target.require(K.EMBEDDING_LENGTH))
    t_layers = int(target.require(K.BLOCK_COUNT))
    hint = "use a drafter made for this target (or convert one with `edge-eagle convert --target`)."
    if spec.target_hidden_size != t_embd:
        raise PairMismatchError(f"{d} expects target hidden size {spec.target_hidden_size} but {t} has {t_embd}; "
                                f"{hint}")
    fc = drafter.tensors[K.T_FC]
    if fc.shape != (3 * t_embd, spec.hidden_size):
        raise PairMismatchError(f"{d} has fc of shape {list(fc.shape)}, which does not fit {t}; {hint}")
    problem = layer_ids_problem(spec.target_layers, t_layers, target.arch, t)
    if problem:
        raise PairMismatchError(f"{d} {problem}")
    if spec.vocab_size != target.vocab_size:
        raise PairMismatchError(f"{d} has a vocabulary of {spec.vocab_size} tokens but {t} has "
                                f"{target.vocab_size}; {hint}")
    if spec.vocab_fingerprint and spec.vocab_fingerprint != target.vocab_fingerprint():
        raise PairMismatchError(f"{d} was made for a different tokenizer than {t}'s (vocabulary fingerprints "
                                f"differ); {hint}")
    if (not spec.has_embedding or not spec.has_lm_head) and spec.hidden_size != t_embd:
        raise PairMismatchError(f"{d} borrows the target's embedding or lm_head but its hidden size "
                                f"{spec.hidden_size} differs from {t}'s {t_embd}; {hint}")
    if not spec.has_lm_head and spec.draft_vocab_size != target.vocab_size:
        raise PairMismatchError(f"{d} has a draft vocabulary but no lm_head of its own; re-convert it.")
    if K.T_D2T in drafter.tensors:
        d2t = drafter.tensor_array(K.T_D2T)
        if d2t.min() < 0 or d2t.max() >= target.vocab_size or len(np.unique(d2t)) != len(d2t):
            raise PairMismatchError(f"{d} maps draft tokens outside {t}'s vocabulary or twice; re-convert it.")
    return spec


def draft_ids(drafter: GGUFFile, n_vocab: int) -> np.ndarray | None:
    """The target ids of a drafter's draft vocabulary, ascending (its d2t tensor), or None when it
    has none or they are not ascending target ids. The drafter's logits are -inf at every other
    id, so the best drafts are searched among these alone (the native chain's argmax, trees)."""
    if K.T_D2T not in drafter.tensors:
        return None
    d2t = drafter.tensor_array(K.T_D2T).astype(np.int64)
    if len(d2t) == 0 or not bool(np.all(np.diff(d2t) > 0)) or int(d2t[0]) < 0 or int(d2t[-1]) >= n_vocab:
        return None
    return d2t
