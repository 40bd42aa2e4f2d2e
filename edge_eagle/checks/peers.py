"""The source library's own forward pass as a check: does edge-eagle read a checkpoint the way
the code that wrote it means it? (A self-consistency check cannot catch a misread config flag.)

Supported peers, when importable: vLLM's speculators (layout "speculators") and SpecForge
(checkpoints of its LlamaForCausalLMEagle3 class with an eagle_config block). Its training
forward runs training-time-test steps over a whole sequence with teacher forcing; its step s
row P is the chain seeded at P, which is edge-eagle's TTT (train/ttt.py) row P + s.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

STEPS = 3
SEQ_ROWS = 128  # speculators' flex attention builds its block mask for multiples of 128 rows
TOLERANCE = 1e-4  # relative logit error; measured ~3e-7 on the test fixtures
TEXT = "Once upon a time a small robot learned to paint the sea. "


def _specforge_written(config: dict) -> bool:
    """SpecForge's class and its eagle_config block. (SafeAILab's and EAGLE-3.1 reference checkpoints
    share the class name but not eagle_config; SpecForge's semantics must not be imposed on them.)"""
    return ("LlamaForCausalLMEagle3" in (config.get("architectures") or []) and "speculators_config" not in config
            and isinstance(config.get("eagle_config"), dict))


def _specforge_before_879() -> bool:
    """Every SpecForge release so far (up to 0.2.0) reads norm_output: true as the final norm before
    lm_head only; PR #879 (unreleased) made it EAGLE-3.1 feedback."""
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("specforge")) <= Version("0.2.0")


def peer_library(layout: str, config: dict | None = None) -> str | None:
    """The importable library whose forward can check a checkpoint of this layout (and config), or None:
    speculators for its layout, SpecForge 0.2.0 for checkpoints of its LlamaForCausalLMEagle3 class."""
    try:
        if layout == "speculators":
            import speculators
            from speculators.models.eagle3 import Eagle3DraftModel  # noqa: F401

            return f"speculators {getattr(speculators, '__version__', '?')}"
        if config is not None and _specforge_written(config):
            from importlib.metadata import version

            from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3  # noqa: F401

            return f"SpecForge {version('specforge')}"
    except Exception:  # noqa: BLE001 - any import failure means: not available here
        return None
    return None


def sequence_features(target_path: str | os.PathLike[str], layers: Sequence[int], rows: int = SEQ_ROWS):
    """(features [rows, 3H], drafter input tokens [rows]) of a fixed text: feature row P pairs with token P+1."""
    import torch

    from ..target import Target

    t = Target(target_path, n_ctx=2 * rows + 8)
    try:
        t.set_capture(tuple(layers))
        seq = t.tokenize(TEXT * (rows // 4))[: rows + 1]
        feats = torch.from_numpy(t.prefill(seq).require_features()[:-1].copy())
    finally:
        t.close()
    return feats, torch.tensor(seq[1:])


def speculators_step_logits(model: Any, feats, tokens, steps: int = STEPS) -> list:
    """Draft logits [rows, draft vocab] of speculators' own forward at each TTT step."""
    import torch

    got: list = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: got.append(out[0].detach()))
    try:
        with torch.no_grad():
            model(hidden_states=feats[None], input_ids=tokens[None],
                  document_ids=torch.zeros(1, len(tokens), dtype=torch.long), ttt_steps=steps)
    finally:
        hook.remove()
    return got


def specforge_step_logits(model: Any, feats, tokens, steps: int = STEPS) -> list:
    """Draft logits [rows, draft vocab] of SpecForge's own training-time-test loop at each step,
    as its eagle3 trainer (algorithms/eagle3/model.py, sdpa backend) runs it: the same position
    ids every step (its attention adds the cache length, so RoPE advances one per step), the
    input ids shifted left by one per step, the raw backbone output fed back, and the earlier
    steps' keys in cache_hidden. Step s row P is the chain seeded at P, as with speculators."""
    import torch

    n = len(tokens)
    got: list = []
    with torch.no_grad():
        h = model.project_hidden_states(feats[None])
        mask = model.prepare_decoder_attention_mask(torch.ones(1, n, dtype=torch.bool), h, 1, n, 0)
        pos = torch.arange(n)[None]
        ids = tokens[None].clone()
        cache: list = [[], []]
        for _ in range(steps):
            h = model.backbone(input_embeds=model.embed_input_ids(ids).to(h.dtype), hidden_states=h,
                               cache_hidden=cache, attention_mask=mask, position_ids=pos, past_key_values=None,
                               use_cache=True)
            got.append(model.compute_logits(h)[0])
            ids = torch.cat([ids[:, 1:], ids[:, -1:]], 1)  # the next step's row P consumes token P+2
    return got


def compare_steps(reference: Any, peer_logits: list, feats, tokens) -> dict[str, Any]:
    """edge-eagle's reference against the peer, step by step: max relative error, top-1 agreement."""
    import torch

    from ..train.ttt import ttt_states

    n = len(tokens)
    with torch.no_grad():
        ours = [reference.draft_logits(h)[0] for h in
                ttt_states(reference, feats[None], tokens[None], torch.arange(n)[None], len(peer_logits))]
    rel, agree = [], []
    for s, peer in enumerate(peer_logits):
        a, b = ours[s][s:], peer[: n - s]
        rel.append(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)))
        agree.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
    return {"relative_error_by_step": rel, "top1_agreement_by_step": agree,
            "relative_error": max(rel), "ok": max(rel) <= TOLERANCE and min(agree) == 1.0}


def _specforge_fill_embedding(peer: Any, missing: set[str], target_path: str | os.PathLike[str]) -> None:
    """What SpecForge runs for a checkpoint without embed_tokens.weight: its trainer's checkpoints and
    its SGLang export drop the frozen embedding, and its loaders (AutoDraftModel.from_pretrained hides
    the "newly initialized" warning) fill it from the target with load_embedding. from_pretrained
    alone leaves a random table there. Any other missing weight: SpecForge cannot run it either."""
    import torch

    from ..gguf_file import read_gguf

    if missing - {"embed_tokens.weight"}:
        raise ValueError(f"missing draft weights {sorted(missing - {'embed_tokens.weight'})}")
    if "embed_tokens.weight" not in missing:
        return
    embed = torch.from_numpy(read_gguf(target_path).tensor_array("token_embd.weight").astype("float32"))
    if tuple(embed.shape) != tuple(peer.embed_tokens.weight.shape):
        raise ValueError(f"no embed_tokens.weight, and the target's token embedding {list(embed.shape)} does not "
                         f"fit its {list(peer.embed_tokens.weight.shape)}")
    with torch.no_grad():
        peer.embed_tokens.weight.copy_(embed)


def check_with_peer(src_dir: str | os.PathLike[str], layout: str, reference: Any,
                    target_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Run the source library's forward on the checkpoint and compare; None if no peer is importable."""
    import json
    from pathlib import Path

    cfg_path = Path(src_dir) / "config.json"
    config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    library = peer_library(layout, config)
    if library is None:
        return None
    if library.startswith("SpecForge") and config.get("norm_output") and reference.cfg.norm_output \
            and _specforge_before_879():
        return {"library": library, "ran": False, "ok": True,
                "why": f"{library} predates its PR #879, so it cannot run the feedback reading of norm_output chosen "
                       "with --norm-output"}
    try:
        if library.startswith("speculators"):
            from speculators.models.eagle3 import Eagle3DraftModel

            peer, run = Eagle3DraftModel.from_pretrained(os.fspath(src_dir)).eval(), speculators_step_logits
        else:
            from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

            loaded, info = LlamaForCausalLMEagle3.from_pretrained(os.fspath(src_dir), output_loading_info=True)
            # its RoPE tables are non-persistent buffers that from_pretrained (transformers 5, meta-device
            # init) leaves uninitialised: build the class afresh and load the saved weights into it
            peer = LlamaForCausalLMEagle3(loaded.config)
            peer.load_state_dict(loaded.state_dict())
            _specforge_fill_embedding(peer, set(info.get("missing_keys") or ()), target_path)
            peer, run = peer.eval(), specforge_step_logits
    except Exception as e:  # noqa: BLE001 - a checkpoint the library cannot load is no misread of ours
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return {"library": library, "ran": False, "why": f"{library} could not load it ({why})", "ok": True}
    feats, tokens = sequence_features(target_path, reference.cfg.target_layers)
    out = compare_steps(reference, run(peer.float(), feats, tokens), feats, tokens)
    return {"library": library, "ran": True, "steps": STEPS, "tolerance": TOLERANCE, **out}


__all__ = ["check_with_peer", "compare_steps", "peer_library", "sequence_features", "specforge_step_logits",
           "speculators_step_logits"]
