"""`edge-eagle convert`: an EAGLE-3 / EAGLE-3.1 checkpoint plus a target GGUF -> an eagle3 GGUF.

    from edge_eagle.converters import convert
    report = convert("path/or/owner-repo", "target.gguf", "drafter.gguf", outtype="f16", verify=True)

Everything the target must agree with (hidden size, layer count, vocabulary) is checked
before anything is written; the write is atomic.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from edge_eagle import gguf_keys as K
from edge_eagle import tensors as T
from edge_eagle.errors import EdgeEagleError, ModelFileError
from edge_eagle.gguf_file import GGUFFile, read_gguf

from . import layouts as L
from .gguf_out import OUTTYPES, write_eagle3
from .sources import Checkpoint, load_checkpoint

# Max relative logit error (|llama.cpp - reference| / max(1, max |reference logit|)) that
# --verify accepts per outtype. Measured on the EAGLE-3.1 test fixture: f32 4.9e-4, f16 1.3e-3,
# bf16 6.6e-3, q8_0 2.1e-2.
TOLERANCE = {"f32": 2e-3, "f16": 1e-2, "bf16": 5e-2, "q8_0": 5e-2}

@dataclass
class ConvertReport:
    output: Path
    layout: str
    config: Any  # reference.Eagle3Config
    assumptions: list[str] = field(default_factory=list)
    verify: dict[str, Any] | None = None


def _err(msg: str) -> EdgeEagleError:
    return EdgeEagleError(msg)


def _first(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _layer_ids(layout: L.Layout, config: Mapping[str, Any], n_layer: int, notes: list[str]) -> tuple[int, int, int]:
    for path, outputs in layout.ids_key_paths:
        ids = L.find_config_key(config, path)
        if ids is None:
            continue
        if not (isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) for i in ids)):
            raise _err(f"{'.'.join(path)} must list 3 layer ids, found {ids!r}; fix the checkpoint's config.json.")
        if outputs:
            notes.append(f"aux layer ids {ids} from {'.'.join(path)} use the output-of-layer convention "
                         f"(SpecForge); stored as layer-input ids {[i + 1 for i in ids]}")
            return (ids[0] + 1, ids[1] + 1, ids[2] + 1)
        notes.append(f"aux layer ids {ids} from {'.'.join(path)} taken as layer-input ids")
        return (ids[0], ids[1], ids[2])
    ids = (2, n_layer // 2, n_layer - 3)
    notes.append(f"no aux layer ids in config.json: using the EAGLE-3 default {list(ids)} for {n_layer} layers")
    return ids


def build_config(ckpt: Checkpoint, layout: L.Layout, tensors: Mapping[str, np.ndarray], target: GGUFFile,
                 notes: list[str], norm_output: str | bool | None = None):
    """The drafter's Eagle3Config from config.json and the tensors; a malformed or
    out-of-range value becomes one clear error, whatever its type."""
    import math

    try:
        c = _build_config(ckpt, layout, tensors, target, notes, norm_output)
    except EdgeEagleError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as e:
        raise _err(f"config.json has a missing or malformed value ({type(e).__name__}: {str(e)[:80]}); fix it or "
                   "re-export the checkpoint.") from None
    ints = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "draft_vocab_size": c.draft_vocab_size,
            "max_position_embeddings": c.max_position_embeddings}
    bad = [k for k, v in ints.items() if not 0 < v < 2**31]
    if not bad and (c.num_attention_heads % c.num_key_value_heads or c.head_dim % 2):
        bad = ["num_key_value_heads" if c.num_attention_heads % c.num_key_value_heads else "head_dim"]
    if not bad and not (math.isfinite(c.rms_norm_eps) and 0 < c.rms_norm_eps < 1):
        bad = ["rms_norm_eps"]
    if not bad and not (math.isfinite(c.rope_theta) and 0 < c.rope_theta <= 1e12):
        bad = ["rope_theta"]
    if bad:
        raise _err(f"config.json has an impossible {bad[0]}; fix it or re-export the checkpoint.")
    return c


NORM_OUTPUT_CHOICES = ("feedback", "head-only")


def _norm_output(raw: Mapping[str, Any], cfg: Mapping[str, Any], eagle_cfg: Mapping[str, Any], flag: Callable,
                 override: str | bool | None, notes: list[str]) -> bool:
    """Whether norm(h) is fed back between chain steps (EAGLE-3.1) rather than only normed for lm_head.

    SpecForge changed the meaning of norm_output in its PR #879 (Sept 2026), and its checkpoints
    carry no version: up to 0.2.0, true = the final norm before lm_head only (EAGLE-3) and false
    = no final norm at all; after it, false = EAGLE-3 and true = EAGLE-3.1. Its defaults (true
    before, false after) both mean EAGLE-3, so only an explicit value is ambiguous."""
    if override is not None:
        if isinstance(override, bool):  # the API's old spelling
            override = "feedback" if override else "head-only"
        if override not in NORM_OUTPUT_CHOICES:
            raise _err(f"Unknown norm_output reading '{override}'; use feedback (EAGLE-3.1) or head-only (EAGLE-3).")
        notes.append(f"norm_output read as {override} (--norm-output)")
        return override == "feedback"
    specforge = isinstance(raw.get("eagle_config"), Mapping)
    explicit = "norm_output" in cfg or "norm_output" in eagle_cfg
    if not specforge or not explicit:
        if specforge:
            notes.append("norm_output not in config.json: EAGLE-3 (SpecForge's default means that in every version)")
        return flag("norm_output")
    if flag("norm_output"):
        raise _err("This SpecForge checkpoint sets norm_output: true, which meant the final norm before lm_head "
                   "only (EAGLE-3) up to SpecForge 0.2.0 and norm(h) fed back (EAGLE-3.1) after its PR #879, and "
                   "config.json does not say which wrote it; pass --norm-output head-only or --norm-output feedback.")
    raise _err("This SpecForge checkpoint sets norm_output: false, which meant no final norm before lm_head (a "
               "drafter llama.cpp's eagle3 graph cannot run) up to SpecForge 0.2.0 and EAGLE-3 after its PR #879; "
               "if it was trained after PR #879, pass --norm-output head-only.")


def _build_config(ckpt: Checkpoint, layout: L.Layout, tensors: Mapping[str, np.ndarray], target: GGUFFile,
                 notes: list[str], norm_output: str | bool | None = None):
    from edge_eagle.checks.reference import Eagle3Config, llama3_rope_factors

    cfg = dict(ckpt.config)
    if layout.arch_config:
        nested = cfg.get(layout.arch_config)
        if not isinstance(nested, Mapping):
            raise _err(f"config.json lacks '{layout.arch_config}', which the {layout.name} layout needs.")
        cfg = {**nested, **{k: v for k, v in cfg.items() if k != layout.arch_config}}
    nested_eagle = cfg.get("eagle_config")
    eagle_cfg: Mapping[str, Any] = nested_eagle if isinstance(nested_eagle, Mapping) else {}
    t_embd, t_layers = int(target.require(K.EMBEDDING_LENGTH)), int(target.require(K.BLOCK_COUNT))
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        ffn = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        raise _err("config.json lacks hidden_size, num_attention_heads or intermediate_size; "
                   "it is not an EAGLE-3 drafter config.") from None
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    nested_rope = cfg.get("rope_parameters")
    rope_params: Mapping[str, Any] = nested_rope if isinstance(nested_rope, Mapping) else {}
    rope_theta = float(_first(cfg, "rope_theta", default=_first(rope_params, "rope_theta", default=0.0)) or
                       target.get(K.ROPE_FREQ_BASE, 10000.0))
    scaling = cfg.get("rope_scaling") or (rope_params if rope_params.get("rope_type") not in (None, "default")
                                          else None)
    factors = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise _err(f"rope scaling '{kind}' is not supported yet; only llama3 scaling converts.")
        factors = llama3_rope_factors(rope_theta, head_dim, scaling)
        notes.append("llama3 rope scaling written as rope_freqs")
    target_hidden = int(_first(cfg, "target_hidden_size", default=t_embd))
    if target_hidden != t_embd:
        raise _err(f"The drafter was trained for target hidden size {target_hidden} but "
                   f"{target.path.name} has {t_embd}; pass the target it was made for.")
    ids = _layer_ids(layout, ckpt.config, t_layers, notes)
    from edge_eagle.eagle import layer_ids_problem

    problem = layer_ids_problem(ids, t_layers, target.arch, target.path.name)
    if problem:
        raise _err(f"The drafter {problem}")
    flag = lambda key, default=False: bool(_first(cfg, key, default=_first(eagle_cfg, key,  # noqa: E731
                                                                            default=layout.defaults.get(key, default))))
    fc_norm = "fc_norm.0.weight" in tensors
    if flag("fc_norm") and not fc_norm:
        raise _err("config.json sets fc_norm but the checkpoint has no fc_norm.{0,1,2}.weight tensors; "
                   "re-export the checkpoint.")
    norm_before_fc = flag("norm_before_fc") or "input_norm.weight" in tensors
    if fc_norm and norm_before_fc:
        raise _err("The checkpoint has both per-layer fc_norm and norm_before_fc; a drafter uses one of them.")
    if norm_before_fc and "input_norm.weight" not in tensors:
        raise _err("config.json sets norm_before_fc but the checkpoint has no input_norm.weight; re-export it.")
    n_out = _norm_output(ckpt.config, cfg, eagle_cfg, flag, norm_output, notes)
    nbr = flag("norm_before_residual")
    if layout.defaults.get("norm_before_residual") and "norm_before_residual" not in cfg:
        notes.append("norm_before_residual not in config.json: speculators' default true assumed")
    lm_rows = tensors["lm_head.weight"].shape[0] if "lm_head.weight" in tensors else 0
    draft_vocab = int(_first(cfg, "draft_vocab_size", default=lm_rows))
    vocab = int(_first(cfg, "vocab_size", default=target.vocab_size))
    if vocab != target.vocab_size and "d2t" not in tensors:
        raise _err(f"The drafter's vocabulary ({vocab}) differs from {target.path.name}'s ({target.vocab_size}); "
                   "pass the target it was made for.")
    return Eagle3Config(
        hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
        num_key_value_heads=int(_first(cfg, "num_key_value_heads", default=heads)), head_dim=head_dim,
        target_hidden_size=t_embd, vocab_size=target.vocab_size, draft_vocab_size=draft_vocab,
        target_layers=ids, rms_norm_eps=float(_first(cfg, "rms_norm_eps", default=1e-6)), rope_theta=rope_theta,
        max_position_embeddings=int(_first(cfg, "max_position_embeddings", default=4096)),
        norm_before_residual=nbr, norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=n_out,
        has_embedding="embed_tokens.weight" in tensors, rope_freq_factors=factors)


def canonical_tensors(ckpt: Checkpoint, layout: L.Layout) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, value in ckpt.tensors.items():
        if name in L.IGNORED_TENSORS:
            continue
        out[L.rename(layout, name)] = value
    missing = [n for n in T.REQUIRED if n not in out]
    unexpected = sorted(set(out) - set(T.BY_REF))
    if missing:
        raise _err(f"The checkpoint lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} for the "
                   f"{layout.name} layout; check --format or re-export the checkpoint.")
    if unexpected:
        raise _err(f"The checkpoint has tensors the {layout.name} layout does not know: "
                   f"{', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}; check --format.")
    return out


def absolute_d2t(d2t: np.ndarray, vocab: int) -> np.ndarray:
    """HF checkpoints store offsets (target = draft + d2t[draft]); GGUF stores absolute ids."""
    d2t = np.asarray(d2t).reshape(-1).astype(np.int64)
    ids = d2t + np.arange(len(d2t), dtype=np.int64)
    if ids.min() < 0 or ids.max() >= vocab:
        raise _err(f"d2t maps draft tokens to ids outside the target vocabulary (0..{vocab - 1}); "
                   "the checkpoint does not fit this target.")
    if len(np.unique(ids)) != len(ids):
        raise _err("d2t maps two draft tokens to the same target token; the checkpoint is corrupt.")
    return ids


class DrafterRead(NamedTuple):
    target: GGUFFile
    checkpoint: Checkpoint
    layout: L.Layout
    tensors: dict[str, np.ndarray]
    config: Any  # reference.Eagle3Config
    notes: list[str]


def read_drafter(src: str | os.PathLike[str], target: str | os.PathLike[str], *, fmt: str | None = None,
                 revision: str | None = None, norm_output: str | bool | None = None) -> DrafterRead:
    """A checkpoint read and validated against a target GGUF: reference-named tensors (d2t
    absolute) and the reference config, with the assumptions made. Nothing is written."""
    if Path(target).is_dir():
        raise _err(f"{target} is a directory; pass the target's GGUF file (HF target directories are not "
                   "supported yet).")
    tgt = read_gguf(target)
    if tgt.arch == K.EAGLE3:
        raise ModelFileError(f"{tgt.path.name} is a drafter, not a target; pass the target model's GGUF.")
    if not tgt.vocab_size:
        raise ModelFileError(f"{tgt.path.name} has no tokenizer; pass a complete target GGUF.")
    ckpt = load_checkpoint(src, revision)
    names = set(ckpt.tensors)
    layout = L.BY_NAME[fmt] if fmt else L.detect(names, ckpt.config)
    if layout is None:
        found = sorted({n.split(".")[0] + ("." + n.split(".")[1] if n.count(".") > 1 else "") for n in names})[:6]
        expected = ", ".join(sorted({f"{lay.tensor_mark}* ({lay.name})" for lay in L.LAYOUTS}))
        raise _err(f"Unknown checkpoint layout: found tensors {found}, expected one of {expected}; "
                   "pass --format to choose one.")
    notes: list[str] = []
    tensors = canonical_tensors(ckpt, layout)
    embed = tensors.get("embed_tokens.weight")
    if embed is not None and K.T_TOKEN_EMBD in tgt.tensors and embed.shape == tgt.tensors[K.T_TOKEN_EMBD].shape[::-1] \
            and np.array_equal(np.asarray(embed, np.float32), tgt.tensor_array(K.T_TOKEN_EMBD).astype(np.float32)):
        del tensors["embed_tokens.weight"]  # a copy of the target's own (speculators saves one): share it
        notes.append("embed_tokens equals the target's token embedding: shared, not stored again")
    cfg = build_config(ckpt, layout, tensors, tgt, notes, norm_output)
    for name, value in tensors.items():
        want = T.expected_shapes(cfg)[name]
        if tuple(value.shape) != want:
            raise _err(f"Tensor {name} has shape {list(value.shape)} but this drafter on {tgt.path.name} needs "
                       f"{list(want)}; pass the target the drafter was made for.")
    if "d2t" in tensors:
        tensors["d2t"] = absolute_d2t(tensors["d2t"], tgt.vocab_size)
    elif cfg.draft_vocab_size != tgt.vocab_size:
        raise _err(f"The drafter has a {cfg.draft_vocab_size}-token draft vocabulary but no d2t mapping; "
                   "re-export the checkpoint with d2t.")
    if not cfg.has_embedding and not any(n.startswith("embed_tokens equals") for n in notes):
        notes.append("no embed_tokens in the checkpoint: the drafter borrows the target's token embedding")
    return DrafterRead(tgt, ckpt, layout, tensors, cfg, notes)


def reference_model(tensors: Mapping[str, np.ndarray], cfg: Any, target: GGUFFile):
    """The torch reference (reference.Eagle3Reference) on a read checkpoint's weights."""
    import torch

    from edge_eagle.checks.reference import Eagle3Reference

    embed = None if cfg.has_embedding else torch.from_numpy(target.tensor_array(K.T_TOKEN_EMBD))
    model = Eagle3Reference(cfg, embed)
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "d2t"]:
        raise RuntimeError(f"reference does not take {unexpected or missing}")
    return model


def convert(src: str | os.PathLike[str], target: str | os.PathLike[str], out: str | os.PathLike[str], *,
            outtype: str = "f16", fmt: str | None = None, revision: str | None = None, verify: bool = False,
            norm_output: str | bool | None = None, progress: bool = False,
            log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> ConvertReport:
    if outtype not in OUTTYPES:
        raise _err(f"Unknown --outtype '{outtype}'; use one of {', '.join(OUTTYPES)}.")
    if fmt is not None and fmt not in L.BY_NAME:
        raise _err(f"Unknown --format '{fmt}'; use one of {', '.join(L.BY_NAME)}.")
    tgt, ckpt, layout, tensors, cfg, notes = read_drafter(src, target, fmt=fmt, revision=revision,
                                                         norm_output=norm_output)
    # reported once everything is validated, so a refused input prints only its error line
    log(f"layout: {layout.name} ({layout.description}){' [--format]' if fmt else ' [detected]'}")
    for note in notes:
        log(f"assumption: {note}")
    provenance = {"source": ckpt.source, "layout": layout.name}
    if ckpt.revision:
        provenance["revision"] = ckpt.revision
    path = write_eagle3(out, tensors, cfg, tgt, outtype=outtype, provenance=provenance, progress=progress,
                        name=f"{Path(ckpt.source).name} (eagle3)")
    log(f"wrote {path} ({'EAGLE-3.1' if cfg.fc_norm or cfg.norm_output else 'EAGLE-3'}, {outtype}, "
        f"target layers {list(cfg.target_layers)})")
    report = ConvertReport(path, layout.name, cfg, notes)
    if verify:
        report.verify = verify_conversion(path, tgt, tensors, cfg, outtype, ckpt.directory, layout.name)
        v = report.verify
        log(f"verify: llama.cpp vs edge-eagle's reading: max abs logit error {v['max_abs_error']:.3g} (relative "
            f"{v['relative_error']:.3g}, tolerance {v['tolerance']}), top-1 agreement {v['top1_agreement']:.1%}")
        peer = v["peer"]
        if peer is None or not peer["ran"]:
            why = peer["why"] if peer else f"no importable library reads the {layout.name} layout here"
            log(f"verify: only a self-consistency check ran ({why}), so a misread config flag would not show")
        else:
            log(f"verify: edge-eagle's reading vs {peer['library']}'s own forward, {peer['steps']} steps: relative "
                f"error {peer['relative_error']:.3g} (tolerance {peer['tolerance']}), top-1 agreement "
                f"{min(peer['top1_agreement_by_step']):.1%}")
    return report


def verify_conversion(path: Path, target: GGUFFile, tensors: Mapping[str, np.ndarray], cfg, outtype: str,
                      src_dir: Path | None = None, layout: str | None = None) -> dict:
    """llama.cpp on the written file against the reference on the source weights; and, where the
    library that wrote the checkpoint is importable, the reference against that library's own
    forward ("peer"; None when none ran). ok needs both."""
    from edge_eagle.checks.parity import verify_drafter
    from edge_eagle.checks.peers import check_with_peer

    reference = reference_model(tensors, cfg, target)
    c = verify_drafter(path, target.path, reference)
    tol = TOLERANCE[outtype]
    peer = check_with_peer(src_dir, layout, reference, target.path) if src_dir is not None and layout else None
    return {"max_abs_error": c.max_abs_error, "relative_error": c.relative_error, "top1_agreement": c.top1_agreement,
            "tolerance": tol, "peer": peer, "ok": c.relative_error <= tol and (peer is None or peer["ok"])}
