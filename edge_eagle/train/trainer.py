"""`edge-eagle train`: features -> draft vocabulary -> TTT training -> speculators checkpoint
(-> GGUF through `edge-eagle convert`)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import gguf_keys as K
from ..checks.reference import Eagle3Config, Eagle3Reference
from ..errors import EdgeEagleError
from ..fsutil import atomic_path, atomic_write
from ..gguf_file import GGUFFile, read_gguf
from ..tensors import BY_REF
from .extract import MANIFEST
from .ttt import FeatureData, ttt_loss


@dataclass
class TrainOptions:
    steps: int = 1000  # optimizer steps
    ttt_steps: int = 5
    step_decay: float = 0.8
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 0.5
    batch_rows: int = 2048
    draft_vocab: int = 8192
    eagle31: bool = True  # fc_norm + norm_output; False trains EAGLE-3 norms (the ablation)
    device: str = "cpu"
    seed: int = 0
    hf_target: str | None = None  # the checkpoint's verifier for speculators (None: a folder beside it)
    init: str = "default"  # "warm": the decoder from one of the target's late layers, fc passing its top layer
    eval_every: int = 50  # steps between simulated-acceptance evaluations on the held-out slice (0: never)
    heldout: int = 48  # sequences held out of training for that evaluation
    save_every: int = 50  # steps between training-state saves (what --resume continues from)
    ffn: int | None = None  # the decoder's FFN width (None: the target's; llama.cpp reads it from the GGUF)
    freeze_head: bool = False  # keep the lm_head at the target's own rows (not trained)
    train_tokens: int | None = None  # train on the first this many feature tokens only (None: all; a ladder budget)


def draft_vocabulary(shards: list[Path], vocab_size: int, n: int) -> np.ndarray:
    """The n target tokens most frequent in the data (tokens and the targets' top labels), sorted."""
    counts = np.zeros(vocab_size, np.int64)
    for path in shards:
        with np.load(path) as z:
            mask = z["mask"]
            np.add.at(counts, z["tokens"], 1)
            np.add.at(counts, z["top_ids"][mask, 0], 1)
    n = min(n, vocab_size)
    return np.sort(np.argsort(-counts, kind="stable")[:n]).astype(np.int64)


def draft_index(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """target id -> draft id (-1: outside the draft vocabulary)."""
    t2d = np.full(vocab_size, -1, np.int64)
    t2d[np.asarray(d2t, np.int64)] = np.arange(len(d2t))
    return t2d


def output_head(target: GGUFFile) -> np.ndarray:
    """The target's output head [vocab, hidden] (float32, dequantised): output.weight, or the token
    embedding where the two are tied."""
    return np.asarray(target.tensor_array(K.T_OUTPUT if K.T_OUTPUT in target.tensors else K.T_TOKEN_EMBD), np.float32)


def init_model(target: GGUFFile, layers: tuple[int, int, int], d2t: np.ndarray, opts: TrainOptions) -> Eagle3Reference:
    h = int(target.require(K.EMBEDDING_LENGTH))
    heads = int(target.require(K.HEAD_COUNT))
    ffn = int(target.require(K.FEED_FORWARD_LENGTH))
    if opts.ffn is not None and opts.ffn != ffn and opts.init == "warm":
        raise EdgeEagleError(f"--init warm copies the target's MLP, so it needs the target's FFN width ({ffn}); "
                             "drop --ffn or use --init default.")
    cfg = Eagle3Config(hidden_size=h, intermediate_size=opts.ffn or ffn,
                       num_attention_heads=heads, num_key_value_heads=int(target.get(K.HEAD_COUNT_KV, heads)),
                       target_hidden_size=h, vocab_size=target.vocab_size, draft_vocab_size=len(d2t),
                       target_layers=layers, rms_norm_eps=float(target.get(K.RMS_EPS, 1e-5)),
                       rope_theta=float(target.get(K.ROPE_FREQ_BASE, 10000.0)),
                       max_position_embeddings=int(target.get(K.CONTEXT_LENGTH, 4096)),
                       fc_norm=opts.eagle31, norm_output=opts.eagle31)
    embed = torch.from_numpy(target.tensor_array(K.T_TOKEN_EMBD))
    torch.manual_seed(opts.seed)
    model = Eagle3Reference(cfg, embed)
    with torch.no_grad():
        model.d2t.copy_(torch.from_numpy(d2t))
        # start from the target's own output head and final norm, restricted to the draft vocabulary
        model.lm_head.weight.copy_(torch.from_numpy(output_head(target)[d2t]))
        model.norm.weight.copy_(torch.from_numpy(target.tensor_array(K.T_OUTPUT_NORM)))
        if opts.freeze_head:
            model.lm_head.weight.requires_grad_(False)
        if opts.init == "warm":
            warm_start(model, target, layers[-1])
        elif opts.init != "default":
            raise EdgeEagleError(f"Unknown init '{opts.init}'; use default or warm.")
    return model


def warm_start(model: Eagle3Reference, target: GGUFFile, layer: int) -> None:
    """The decoder starts as the target's own layer `layer` (dequantized from the GGUF): its
    attention takes the hidden-state half of q/k/v (the embedding half starts at zero), o, MLP
    and both norms; fc starts as the pass-through of the highest captured layer, whose input is
    that layer's. (NOTES §8's caution: this gives the target's function one position early, a
    start, not the drafter's function; the ladder measures it against the default.)"""
    from ..tensors import unpermute

    def w(name: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(target.tensor_array(f"blk.{layer}.{name}.weight"),
                                                     dtype=np.float32))

    c, m = model.cfg, model.midlayer
    h = c.hidden_size
    heads, kv = int(target.require(K.HEAD_COUNT)), int(target.get(K.HEAD_COUNT_KV, target.require(K.HEAD_COUNT)))
    q = torch.from_numpy(unpermute(w("attn_q").numpy(), heads))
    k = torch.from_numpy(unpermute(w("attn_k").numpy(), kv))
    for proj, src in ((m.self_attn.q_proj, q), (m.self_attn.k_proj, k), (m.self_attn.v_proj, w("attn_v"))):
        proj.weight.zero_()
        proj.weight[:, h:] = src  # x = [input_layernorm(embed), hidden_norm(g)]: the hidden half
    m.self_attn.o_proj.weight.copy_(w("attn_output"))
    m.mlp.gate_proj.weight.copy_(w("ffn_gate"))
    m.mlp.up_proj.weight.copy_(w("ffn_up"))
    m.mlp.down_proj.weight.copy_(w("ffn_down"))
    m.hidden_norm.weight.copy_(w("attn_norm"))
    m.post_attention_layernorm.weight.copy_(w("ffn_norm"))
    ht = c.target_hidden_size
    model.fc.weight.zero_()
    model.fc.weight[:, 2 * ht:] = torch.eye(h, ht)


# GGUF architecture -> (HF model_type, architecture) of the verifier folder beside a checkpoint
_HF_ARCH = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
            "qwen3": ("qwen3", "Qwen3ForCausalLM"), "mistral": ("mistral", "MistralForCausalLM")}
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose format this writes (and whose loader is tested)


def write_verifier(target: GGUFFile, out: Path) -> tuple[str, list[str]]:
    """A minimal HF folder for the target (config.json + embed_tokens, final norm and lm_head taken
    from the GGUF), so speculators can resolve the checkpoint's verifier offline. Returns the
    folder's path and the verifier's architectures."""
    from safetensors.torch import save_file

    model_type, arch = _HF_ARCH.get(target.arch, ("llama", "LlamaForCausalLM"))
    embed = torch.from_numpy(np.ascontiguousarray(target.tensor_array(K.T_TOKEN_EMBD), dtype=np.float32))
    head = (torch.from_numpy(np.ascontiguousarray(target.tensor_array(K.T_OUTPUT), dtype=np.float32))
            if K.T_OUTPUT in target.tensors else embed.clone())  # tied: safetensors stores no shared tensors
    norm = torch.from_numpy(np.ascontiguousarray(target.tensor_array(K.T_OUTPUT_NORM), dtype=np.float32))
    heads = int(target.require(K.HEAD_COUNT))
    config = {"architectures": [arch], "model_type": model_type,
              "hidden_size": int(target.require(K.EMBEDDING_LENGTH)),
              "intermediate_size": int(target.require(K.FEED_FORWARD_LENGTH)),
              "num_hidden_layers": int(target.require(K.BLOCK_COUNT)), "num_attention_heads": heads,
              "num_key_value_heads": int(target.get(K.HEAD_COUNT_KV, heads)),
              "rms_norm_eps": float(target.get(K.RMS_EPS, 1e-6)), "vocab_size": target.vocab_size,
              "max_position_embeddings": int(target.get(K.CONTEXT_LENGTH, 4096)),
              "rope_parameters": {"rope_theta": float(target.get(K.ROPE_FREQ_BASE, 10000.0)), "rope_type": "default"},
              "tie_word_embeddings": K.T_OUTPUT not in target.tensors,
              "edge_eagle": {"note": f"embedding, final norm and lm_head of {target.path.name} only, for "
                                     "speculators' verifier lookup; not a runnable model"}}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file({"model.embed_tokens.weight": embed, "model.norm.weight": norm, "lm_head.weight": head}, str(tmp))
    atomic_write(out / "config.json", json.dumps(config, indent=2))
    return str(out.resolve()), [arch]


def save_checkpoint(model: Eagle3Reference, out: Path, target: GGUFFile, meta: dict[str, Any],
                    hf_target: str | None = None) -> Path:
    """The speculators 0.9.0 layout, as its own save_pretrained writes it: config.json +
    model.safetensors (layers.0.*, HF d2t offsets, t2d, embed_tokens), loadable by speculators'
    from_pretrained as it is. Its verifier is `hf_target` (a Hub id or HF folder of the target)
    when given, else a minimal verifier folder written beside it (`verifier/`)."""
    from safetensors.torch import save_file

    from edge_eagle.converters.layouts import BY_NAME, to_layout

    c = model.cfg
    out.mkdir(parents=True, exist_ok=True)
    layout = BY_NAME["speculators"]  # the converter reads this back with the same table
    state = {}
    for name, value in model.state_dict().items():
        if name == "d2t":
            continue
        if name not in BY_REF:
            raise RuntimeError(f"the drafter has a tensor {name} that edge_eagle.tensors does not name")
        state[to_layout(layout, name)] = value.contiguous()
    if "embed_tokens.weight" not in state:  # self-contained, as speculators saves it; convert shares it again
        state["embed_tokens.weight"] = model.target_embed.contiguous()
    d2t = model.d2t.clone()
    state["d2t"] = d2t - torch.arange(len(d2t))
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    state["t2d"] = t2d
    if hf_target:
        verifier, archs = hf_target, [_HF_ARCH.get(target.arch, ("llama", "LlamaForCausalLM"))[1]]
    else:
        verifier, archs = write_verifier(target, out / "verifier")
    config = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "num_hidden_layers": 1, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False},
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc, "fc_norm": c.fc_norm,
        "norm_output": c.norm_output, "embed_requires_grad": False, "tie_word_embeddings": False,
        "eagle_aux_hidden_state_layer_ids": list(c.target_layers),
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": archs}},
        "edge_eagle": meta,
    }
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp))
    atomic_write(out / "config.json", json.dumps(config, indent=2))
    return out


STATE = "train_state.pt"  # beside the checkpoint: model, optimizer, scheduler, data position


def adamw(params: list[Any], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """The drafter's optimizer (training and adaptation alike)."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def optimizer_step(model: Eagle3Reference, batch: Any, params: list[Any], optim: torch.optim.Optimizer,
                   sched: Any, ttt_steps: int, step_decay: float,
                   grad_clip: float) -> tuple[torch.Tensor, list[float], list[float]]:
    """One step on a batch (training and adaptation alike): the TTT loss, clipped gradients, the
    optimizer and the schedule; returns ttt_loss's (loss, per-step loss, per-step top-1)."""
    loss, losses, accs = ttt_loss(model, batch, ttt_steps, step_decay)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optim.step()
    sched.step()
    return loss, losses, accs


def simulated_acceptance(model: Eagle3Reference, data: FeatureData, steps: int, batch_rows: int = 4096) -> dict:
    """Greedy acceptance the drafter would get on `data` (held-out sequences of the target's own
    greedy answers), from its training-time-test states: a chain seeded at row P accepts its
    s-th draft when the drafts at rows P..P+s all equal the target's greedy token. Exact for
    regenerated data (the chain's inputs are then the true tokens), cheap (no llama.cpp).

    tau averages over every seed row. tau_decode walks each answer as greedy decoding with a
    chain of `steps` drafts does (the next cycle seeded after the accepted drafts and the
    target's token): tokens per cycle, the tau that decoding reports. It is the lower of the
    two where acceptance is uneven, since runs of easy text take few cycles."""
    from .ttt import ttt_states

    model.eval()
    seeds, tokens, cycles = 0, 0, 0
    accepted_at = np.zeros(steps)
    with torch.no_grad():
        for batch in data.batches(batch_rows, np.random.default_rng(0)):
            greedy = batch.label_ids[..., 0]  # draft id of the target's greedy token (-1: outside the vocab)
            match = [(model.draft_logits(h).argmax(-1) == greedy) & batch.valid
                     for h in ttt_states(model, batch.feats, batch.tokens, batch.pos, steps)]
            B, T = batch.tokens.shape
            run = torch.ones(B, T, dtype=torch.bool)
            runs = torch.zeros(B, T, dtype=torch.long)  # drafts the chain seeded at each row accepts
            valid = batch.valid
            for s, m in enumerate(match):  # the chain seeded at P drafts step s at row P + s
                shifted = torch.zeros(B, T, dtype=torch.bool)
                if s < T:
                    shifted[:, :T - s] = m[:, s:]
                run = run & shifted
                runs += run
                accepted_at[s] += float(run[valid].sum())
            seeds += int(valid.sum())
            for b in range(B):  # decoding's walk: a cycle at P emits its accepted drafts and one more token
                rows = valid[b].nonzero().flatten()
                if not len(rows):
                    continue
                at, end, r = int(rows[0]), int(rows[-1]), runs[b].tolist()
                while at <= end:
                    tokens += min(r[at] + 1, end - at + 1)
                    cycles += 1
                    at += r[at] + 1
    model.train()
    if not seeds:
        return {"tau": 0.0, "tau_decode": 0.0, "per_position_acceptance": [], "seeds": 0}
    per_pos = [accepted_at[s] / seeds if s == 0 else
               (accepted_at[s] / accepted_at[s - 1] if accepted_at[s - 1] else 0.0)
               for s in range(steps)]
    return {"tau": round(1.0 + float(accepted_at.sum()) / seeds, 4), "tau_decode": round(tokens / cycles, 4),
            "per_position_acceptance": [round(float(x), 4) for x in per_pos], "seeds": seeds}


def read_manifest(features_dir: Path, target: GGUFFile, layers: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A feature folder's manifest, checked against the target (same tokenizer) and, if given, the layers."""
    path = features_dir / MANIFEST
    if not path.is_file():
        raise EdgeEagleError(f"{features_dir} holds no extracted features; run extraction first.")
    manifest = json.loads(path.read_text())
    if manifest["fingerprint"] != target.vocab_fingerprint():
        raise EdgeEagleError(f"The features in {features_dir} come from another tokenizer than "
                             f"{target.path.name}'s; extract them again for this target.")
    if layers is not None and tuple(manifest["layers"]) != tuple(layers):
        raise EdgeEagleError(f"{features_dir} captured target layers {manifest['layers']}, not {list(layers)}; "
                             "extract it again with the same --layers.")
    return manifest


def cap_shards(shards: list[Path], max_tokens: int | None, total_tokens: int) -> tuple[list[Path], int]:
    """The leading shards that hold about max_tokens feature tokens (all of them for None), and
    their token count (total_tokens, the manifests' sum, when all are kept)."""
    if max_tokens is None or max_tokens >= total_tokens:
        return shards, total_tokens
    kept, total = [], 0
    for path in shards:
        if total >= max_tokens:
            break
        with np.load(path) as z:
            total += len(z["tokens"])
        kept.append(path)
    return kept, total


@dataclass
class _TrainingData:
    """What a training run reads: the feature folders, their layers, the shards within the token
    budget, the draft vocabulary, and the held-out and evaluation sets."""

    dirs: list[Path]
    layers: tuple[int, int, int]
    features_tokens: int
    d2t: np.ndarray
    data: FeatureData
    evals: dict[str, FeatureData]
    heldout: FeatureData | None


def _training_data(features_dir: Path, extra_features: tuple[Path, ...], target: GGUFFile, opts: TrainOptions,
                   eval_sets: dict[str, Path] | None) -> _TrainingData:
    dirs = [features_dir, *extra_features]
    manifests = [read_manifest(d, target) for d in dirs]
    first = [int(i) for i in manifests[0]["layers"]]
    layers = (first[0], first[1], first[2])
    for d, m in zip(dirs[1:], manifests[1:]):
        if tuple(m["layers"]) != layers:
            raise EdgeEagleError(f"{d} captured target layers {m['layers']}, not {list(layers)}; "
                                 "train only on features extracted with the same --layers.")
    # shards taken in turn from each folder, so that a token cap keeps a mix of all of them
    per_dir = [[d / s for s in m["shards"]] for d, m in zip(dirs, manifests)]
    interleaved = [lst[i] for i in range(max(map(len, per_dir))) for lst in per_dir if i < len(lst)]
    shards, features_tokens = cap_shards(interleaved, opts.train_tokens, sum(int(m["tokens"]) for m in manifests))
    d2t = draft_vocabulary(shards, target.vocab_size, opts.draft_vocab)
    t2d_index = draft_index(d2t, target.vocab_size)
    data = FeatureData(shards, t2d_index)
    evals = {name: FeatureData([d / s for s in m["shards"]], t2d_index)
             for name, d in (eval_sets or {}).items()
             for m in [read_manifest(d, target, layers)]}
    heldout = data.split(opts.heldout) if opts.eval_every and opts.heldout else None
    return _TrainingData(dirs, layers, features_tokens, d2t, data, evals, heldout)


def warmup_cosine(i: int, warmup: int, steps: int, final: float = 0.0, start: int = 0) -> float:
    """A learning rate's share at step i: a linear warm-up over `warmup` steps, times a cosine that
    falls from 1 at step `start` to `final` at step `steps` and stays there."""
    t = min(1.0, max(0, i - start) / max(1, steps - start))
    return min(1.0, (i + 1) / warmup) * (final + (1.0 - final) * 0.5 * (1 + math.cos(math.pi * t)))


class _Run:
    """A training run's state: model, optimizer, schedule, data order and history; saved whole
    every opts.save_every steps and restored by resume."""

    def __init__(self, model: Eagle3Reference, opts: TrainOptions, td: _TrainingData, state_path: Path):
        self.model, self.opts, self.td, self.state_path = model, opts, td, state_path
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optim = adamw(self.params, opts.lr, opts.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda i: warmup_cosine(i, opts.warmup, opts.steps))
        self.rng = np.random.default_rng(opts.seed)
        self.history: list[dict[str, Any]] = []
        self.step, self.epoch, self.skip, self.wall_before = 0, 0, 0, 0.0
        self.t0 = time.time()

    def resume(self, log: Callable[[str], Any]) -> None:
        if not self.state_path.is_file():
            raise EdgeEagleError(f"{self.state_path} does not exist, so there is nothing to resume; run without "
                                 "--resume.")
        state = torch.load(self.state_path, map_location=self.opts.device, weights_only=False)
        if state["d2t"] != self.td.d2t.tolist() or state["features_tokens"] != self.td.features_tokens:
            raise EdgeEagleError(f"{self.state_path} was trained on other features or another draft vocabulary; "
                                 "resume with the same --features and --draft-vocab, or start a new --out.")
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.sched.load_state_dict(state["sched"])
        self.step, self.epoch, self.skip = state["step"], state["epoch"] - 1, state["batches_in_epoch"]
        self.rng.bit_generator.state = state["rng_epoch_start"]
        self.history, self.wall_before = state["history"], state["wall_time_s"]
        log(f"resuming at step {self.step} of {self.opts.steps} (epoch {self.epoch + 1})")

    def wall(self) -> float:
        return self.wall_before + time.time() - self.t0

    def save(self, batches_in_epoch: int, rng_epoch_start: dict) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.state_dict(), "optim": self.optim.state_dict(),
                 "sched": self.sched.state_dict(), "step": self.step, "epoch": self.epoch,
                 "batches_in_epoch": batches_in_epoch, "rng_epoch_start": rng_epoch_start,
                 "history": self.history, "d2t": self.td.d2t.tolist(), "features_tokens": self.td.features_tokens,
                 "wall_time_s": self.wall(), "options": asdict(self.opts)}
        with atomic_path(self.state_path) as tmp:
            torch.save(state, tmp)

    def train_step(self, batch: Any) -> dict[str, Any]:
        """One optimizer step on a batch; its history record."""
        opts = self.opts
        batch = type(batch)(*(t.to(opts.device) for t in vars(batch).values()))
        loss, losses, accs = optimizer_step(self.model, batch, self.params, self.optim, self.sched, opts.ttt_steps,
                                            opts.step_decay, opts.grad_clip)
        self.step += 1
        return {"step": self.step, "loss": float(loss.detach()), "step_loss": losses, "top1": accs}


def _postfix(record: dict[str, Any], last_eval: dict[str, Any] | None, last_sets: dict[str, Any]) -> dict[str, str]:
    """The progress bar's figures after a step."""
    post = {"loss": f"{record['loss']:.3f}", "top1": f"{record['top1'][0]:.2f}",
            "top1_last": f"{record['top1'][-1]:.2f}"}
    if last_eval is not None:
        post["sim_tau"] = f"{last_eval['tau']:.3f}"
    for name, ev in last_sets.items():
        post[f"tau_{name}"] = f"{ev['tau']:.3f}"
    return post


def train(features_dir: Path, target_path: Path, out: Path, opts: TrainOptions, progress: bool = True,
          log=print, resume: bool = False, extra_features: tuple[Path, ...] = (),
          eval_sets: dict[str, Path] | None = None) -> dict[str, Any]:
    """Train a drafter on cached features and save it to `out` (speculators layout).

    Every opts.save_every steps the whole training state goes to out/train_state.pt; with
    resume, training continues from there (same model, optimizer, schedule and position in
    the data), so a run can be stopped and continued. Every opts.eval_every steps the
    simulated acceptance on a held-out slice, and on each feature folder of eval_sets
    (name -> folder, e.g. MT-bench answers never trained on), is printed and kept in the history.
    extra_features are further feature folders trained on with features_dir (same layers)."""
    target = read_gguf(target_path)
    td = _training_data(features_dir, extra_features, target, opts, eval_sets)
    run = _Run(init_model(target, td.layers, td.d2t, opts).to(opts.device), opts, td, out / STATE)
    if resume:
        run.resume(log)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.steps, initial=min(run.step, opts.steps), desc="train", unit="step")
    last_eval: dict[str, Any] | None = None
    last_sets: dict[str, Any] = {}
    while run.step < opts.steps:
        run.epoch += 1
        rng_epoch_start = copy_rng_state(run.rng)
        for n_batch, batch in enumerate(td.data.batches(opts.batch_rows, run.rng), 1):
            if run.skip:  # resuming inside an epoch: its first batches were already trained on
                run.skip -= 1
                continue
            record = run.train_step(batch)
            step = run.step
            if opts.eval_every and (step % opts.eval_every == 0 or step == opts.steps):
                if td.heldout is not None:
                    last_eval = simulated_acceptance(run.model, td.heldout, opts.ttt_steps)
                    record["heldout"] = last_eval
                if td.evals:
                    last_sets = {name: simulated_acceptance(run.model, d, opts.ttt_steps)
                                 for name, d in td.evals.items()}
                    record["eval"] = last_sets
            run.history.append(record)
            if bar is not None:
                bar.set_postfix(_postfix(record, last_eval, last_sets))
                bar.update(1)
            if opts.save_every and (step % opts.save_every == 0 or step >= opts.steps):
                run.save(n_batch, rng_epoch_start)
            if step >= opts.steps:
                break
    if bar is not None:
        bar.close()
    summary = _summary(run, target, last_eval, last_sets)
    run.model.cpu()
    save_checkpoint(run.model, out, target, summary, hf_target=opts.hf_target)
    atomic_write(out / "train_history.json", json.dumps(run.history))
    return summary


def _summary(run: _Run, target: GGUFFile, last_eval: dict[str, Any] | None,
             last_sets: dict[str, Any]) -> dict[str, Any]:
    opts, td, history = run.opts, run.td, run.history
    tail = history[-max(1, len(history) // 10):]
    full = [h["top1"] for h in tail if len(h["top1"]) == opts.ttt_steps]
    return {
        "steps": run.step, "epochs": run.epoch, "wall_time_s": round(run.wall(), 1), "train_rows": td.data.n_rows,
        "feature_tokens": td.features_tokens, "feature_dirs": [str(d) for d in td.dirs], "draft_vocab": len(td.d2t),
        "options": asdict(opts),
        "final_loss": float(np.mean([h["loss"] for h in tail])),
        "final_top1_per_step": np.mean(full, 0).round(4).tolist() if full else [],
        "heldout": last_eval,
        "eval": last_sets,
        "target": target.path.name, "layers": list(td.layers),
    }


def copy_rng_state(rng: np.random.Generator) -> dict:
    import copy

    return copy.deepcopy(dict(rng.bit_generator.state))
