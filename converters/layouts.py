"""Checkpoint layouts as data (NOTES §3): how to recognise each, how its tensor names map
to the reference names (edge_eagle.tensors.DRAFTER_TENSORS) and back, where its config
keeps the architecture, and which layer-id convention it uses.

A new layout is a new Layout row, not a new branch in the converter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

_IDS = ("eagle_aux_hidden_state_layer_ids",)


@dataclass(frozen=True)
class Layout:
    name: str
    description: str
    tensor_mark: str  # a tensor-name prefix every checkpoint of this layout has
    renames: tuple[tuple[str, str], ...]  # (source prefix, reference prefix), first match wins
    requires_tensor: str | None = None  # a tensor that must be present (e.g. input_norm.weight)
    requires_config: str | None = None  # a config key that must be present somewhere
    arch_config: str | None = None  # nested config holding hidden_size etc., if any
    # where the aux layer ids may be, each with its convention: True for SpecForge/SGLang's
    # output-of-layer ids (= layer-input ids - 1), False for layer-input (HF hidden_states) ids
    ids_key_paths: tuple[tuple[tuple[str, ...], bool], ...] = ((_IDS, False),)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    kept: tuple[str, ...] = ()  # names this layout publishes unrenamed although a rename would match


_MIDLAYER = (("midlayer.", "midlayer."),)
_IDS_SPECFORGE = (("eagle_config",) + _IDS, True)

# Detection tries these in order; the first whose marks all match wins.
LAYOUTS: tuple[Layout, ...] = (
    Layout("nemo", "NeMo / Model-Optimizer export (model.layers.0.*)", "model.layers.0.",
           (("model.layers.0.", "midlayer."), ("model.fc_norm.", "fc_norm."), ("model.", "")),
           kept=("lm_head.weight", "d2t", "t2d")),
    Layout("speculators", "vLLM speculators Eagle3Speculator (layers.0.*)", "layers.0.",
           (("layers.0.", "midlayer."),), arch_config="transformer_layer_config",
           ids_key_paths=((_IDS, False), (("speculators_config",) + _IDS, False)),
           defaults={"norm_before_residual": True}),
    Layout("eagle3-v3", "NVIDIA Eagle3-v3 (norm_before_fc, input_norm.weight)", "midlayer.", _MIDLAYER,
           requires_tensor="input_norm.weight", defaults={"norm_before_fc": True}),
    Layout("eagle3.1", "EAGLE-3.1 (per-layer fc_norm.{0,1,2}, norm_output)", "midlayer.", _MIDLAYER,
           requires_tensor="fc_norm.0.weight",
           ids_key_paths=(_IDS_SPECFORGE, (_IDS, False)),
           defaults={"fc_norm": True}),
    Layout("specforge", "SpecForge (midlayer.*, eagle_config, output-of-layer aux ids)", "midlayer.", _MIDLAYER,
           requires_config="eagle_config", ids_key_paths=(_IDS_SPECFORGE, (_IDS, False))),
    Layout("safeailab", "SafeAILab EAGLE-3 (midlayer.*, LlamaForCausalLMEagle3)", "midlayer.", _MIDLAYER),
)
BY_NAME = {layout.name: layout for layout in LAYOUTS}
IGNORED_TENSORS = ("t2d",)  # not needed at run time


def find_config_key(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def has_config_key(config: Mapping[str, Any], key: str) -> bool:
    return key in config or any(isinstance(v, Mapping) and key in v for v in config.values())


def matches(layout: Layout, names: set[str], config: Mapping[str, Any]) -> bool:
    if not any(n.startswith(layout.tensor_mark) for n in names):
        return False
    if layout.requires_tensor and not any(n.endswith(layout.requires_tensor) for n in names):
        return False
    if layout.requires_config and not has_config_key(config, layout.requires_config):
        return False
    return True


def detect(names: set[str], config: Mapping[str, Any]) -> Layout | None:
    return next((layout for layout in LAYOUTS if matches(layout, names, config)), None)


def rename(layout: Layout, name: str) -> str:
    for src, dst in layout.renames:
        if name.startswith(src):
            return dst + name[len(src):]
    return name


def to_layout(layout: Layout, name: str) -> str:
    """The name `layout` publishes a reference-named tensor under: rename's inverse."""
    if name in layout.kept:
        return name
    for src, dst in layout.renames:
        if name.startswith(dst):
            return src + name[len(dst):]
    return name
