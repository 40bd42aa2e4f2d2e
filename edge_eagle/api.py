"""The library API for desktop apps: one object, streaming generate() and chat().

    from edge_eagle import EdgeEagle
    with EdgeEagle() as ee:                      # embedded default target + drafter
        gen = ee.chat([{"role": "user", "content": "Hi!"}], max_tokens=64)
        for tok in gen:
            print(tok.text, end="", flush=True)  # tok.origin: "draft" or "target"
        print(gen.stats.tau)
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import defaults
from .compat import LlamaCompat
from .controller import KController
from .costs import BatchCosts, CostModel
from .drafter import NO_DRAFTER, Drafter, NgramDrafter
from .eagle import EagleDrafter
from .engine_costs import EngineCosts
from .errors import ContextOverflowError, EdgeEagleError
from .gguf_file import read_gguf
from .grammar import Grammar
from .learn import LearnStore, Versions
from .learn.idle import IdleAdapter, can_suspend
from .options import LEARN_TOKENS, TREE_PATHS, EngineOptions
from .policy import DraftPolicy, Fixed, FixedTree
from .sampling import Sampler, SamplingParams
from .speculative import speculate
from .stats import SpecStats
from .suffix import new_index
from .target import Target
from .threads import LoadMeter, ThreadDecision, ThreadGovernor, decide, usable_cores

AUTO_TREE_SIZES = (4, 8, 15)  # tree node budgets that k="auto" weighs against chains
LOOKUP_NODES, LOOKUP_PATHS = 12, 4  # the largest suffix-lookup tree k="auto" weighs
MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    origin: str  # "draft": an accepted draft token; "target": sampled by the target
    #: with generate(logprobs=n): the token's log-probability under the target (its raw logits,
    #: log-softmax, as llama-cpp-python reports), and the n most probable tokens' (id, logprob)
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    z = rows.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class Generation:
    """A streaming generation: iterate for Tokens; then read text, stats, finish_reason.

    Iterating holds the engine's lock, so concurrent generations run one after another.
    Breaking out, close() or cancel() ends it early with both KV caches consistent.
    """

    def __init__(self, engine: "EdgeEagle", prompt: list[int], *, max_tokens: int, k: int | str, stop: Sequence[str],
                 sampling: SamplingParams, speculative: bool, p_min: float, tree: int | None = None,
                 logprobs: int | None = None, grammar: Grammar | None = None, history: bool = True):
        self._engine, self._prompt = engine, prompt
        self._history = history
        self._grammar = grammar
        self._logprobs = logprobs
        self._max_tokens, self._k, self._stop = max_tokens, k, [s for s in stop if s]
        self._tree = tree
        self._sampling, self._speculative, self._p_min = sampling, speculative, p_min
        self._cancel = threading.Event()
        self._iter: Iterator[Token] | None = None
        self.stats = SpecStats()
        self.text = ""
        self.tokens: list[int] = []
        self.finish_reason: str | None = None  # "stop", "length", "context" (window full) or "cancelled"
        self.dropped_messages = 0  # chat(): oldest messages dropped to fit the context window
        self.drafter_name = "none"  # the drafter that ran this generation, and its adapted version (0: as given)
        self.drafter_version = 0
        #: flash attention this generation ran with: "on", "off", or "auto" (llama.cpp's own choice)
        self.flash_attn: str | None = None

    def __iter__(self) -> Iterator[Token]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    def cancel(self) -> None:
        """Stop at the next step boundary (thread-safe)."""
        self._cancel.set()

    def close(self) -> None:
        if self._iter is not None:
            self._iter.close()  # type: ignore[attr-defined]

    def result(self) -> "Generation":
        """Run to the end; return self."""
        for _ in self:
            pass
        return self

    def _run(self) -> Iterator[Token]:
        eng = self._engine
        with eng._acquire():
            drafter = eng.drafter if self._speculative and eng.drafter is not None else NO_DRAFTER
            self.drafter_name, self.drafter_version = drafter.name, eng.drafter_version
            sampler = Sampler(self._sampling, self._grammar)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            held: list[tuple[int, str, str, float | None, tuple | None]] = []  # text that might start a stop string
            rows: collections.deque[np.ndarray] = collections.deque()  # log-softmax rows, one per token to come
            on_rows = None if self._logprobs is None else (lambda logits: rows.extend(_log_softmax(logits)))
            try:
                k = self._k if drafter is not NO_DRAFTER else 0
                eng._route_attention(len(self._prompt))
                self.flash_attn = eng.target.flash_attn.flag
                if eng.governor is not None or k == "auto":
                    eng.prepare_costs()
                policy = eng.policy(k, self._tree if drafter is not NO_DRAFTER else None)
                steps = speculate(eng.target, drafter, self._prompt, max_tokens=self._max_tokens,
                                  policy=policy, sampler=sampler, stats=self.stats, p_min=self._p_min,
                                  governor=eng.governor, on_rows=on_rows)
                for new, origins in steps:
                    for tok, origin in zip(new, origins):
                        lp, top = self._token_logprobs(rows, tok)
                        if eng.target.is_eog(tok):
                            self.finish_reason = "stop"
                            break
                        self.tokens.append(tok)
                        piece = decoder.decode(eng.target.token_bytes(tok))
                        held.append((tok, piece, origin, lp, top))
                        text = self.text + "".join(h[1] for h in held)
                        cut = _find_stop(text, self._stop, len(self.text))
                        if cut is not None:
                            yield from self._release(held, cut, truncate=True)
                            self.finish_reason = "stop"
                            break
                        yield from self._release(held, len(text) - _partial_stop(text, self._stop))
                    if self.finish_reason or self._cancel.is_set():
                        break
                if self.finish_reason is None:
                    self.finish_reason = ("cancelled" if self._cancel.is_set() else
                                          "context" if self.stats.context_full else "length")
                yield from self._release(held, None)  # empty after a stop string
            finally:
                if self.finish_reason is None:
                    self.finish_reason = "cancelled"
                eng.stats.merge(self.stats)
                eng.last_stats = self.stats
                if self._grammar is not None:
                    self._grammar.close()
                eng.suffix.finish(self._prompt + self.tokens, keep=self._history)
                if self.finish_reason in ("stop", "length", "context") and self.tokens:
                    eng._learn(self._prompt, self.tokens)

    def _token_logprobs(self, rows: "collections.deque[np.ndarray]", tok: int
                        ) -> tuple[float | None, tuple[tuple[int, float], ...] | None]:
        if self._logprobs is None or not rows:
            return None, None
        row = rows.popleft()
        n = self._logprobs
        top: tuple[tuple[int, float], ...] = ()
        if n > 0:
            ids = np.argpartition(-row, n)[:n]
            ids = ids[np.argsort(-row[ids], kind="stable")]
            top = tuple((int(i), float(row[i])) for i in ids)
        return float(row[tok]), top

    def _release(self, held: list[tuple[int, str, str, float | None, tuple | None]], upto: int | None,
                 truncate: bool = False) -> Iterator[Token]:
        """Emit held tokens whose text ends by char `upto` of the full text (all if None).
        With truncate (a stop string begins at upto), the straddling token is cut there
        and the rest dropped."""
        while held:
            tok, piece, origin, lp, top = held[0]
            if upto is not None and len(self.text) + len(piece) > upto:
                if truncate:
                    held.clear()
                    piece = piece[: max(0, upto - len(self.text))]
                    if piece:
                        self.text += piece
                        yield Token(tok, piece, origin, lp, top)
                return
            held.pop(0)
            self.text += piece
            yield Token(tok, piece, origin, lp, top)


def _find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    """Index where the earliest stop string begins in text[start - longest:], or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start - len(s)))
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                longest = max(longest, n)
                break
    return longest


def _check_k(k: int | str) -> int | str:
    if k == "auto" or (isinstance(k, int) and k >= 0):
        return k
    raise EdgeEagleError(f"k must be 'auto' or a draft length of 0 or more, got {k!r}; pass --k auto or --k 4.")


def check_logit_bias(logit_bias: Mapping[int, float] | None, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """logit_bias as SamplingParams takes it; EdgeEagleError for a token outside the vocabulary."""
    bias = tuple((int(t), float(b)) for t, b in (logit_bias or {}).items())
    bad = [t for t, _ in bias if not 0 <= t < n_vocab]
    if bad:
        raise EdgeEagleError(f"logit_bias names token {bad[0]}, outside the vocabulary (0 to {n_vocab - 1}); "
                             "use token ids of this model.")
    return bias


def _check_tree(tree: int | None, drafter: Drafter | None) -> int | None:
    if tree is None or tree == 0:
        return None
    if not isinstance(tree, int) or tree < 0:
        raise EdgeEagleError(f"tree must be a node budget of 1 or more, got {tree!r}; pass e.g. --tree 7.")
    if drafter is None or not drafter.supports_trees:
        raise EdgeEagleError("Tree drafting needs an EAGLE drafter; pass --drafter default or an eagle3 GGUF.")
    return tree


def render_chat(target: Target, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """Format messages (and, for a template that renders them, `tools`) with the target's own
    chat template: a sandboxed Jinja2 render, with tojson writing JSON as Python's json does
    (no HTML escaping), as Hugging Face renders templates."""
    template = target.chat_template
    if not template:
        raise EdgeEagleError(f"{os.path.basename(target.path)} has no chat template; use generate() "
                             "with a plain prompt instead.")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise EdgeEagleError(f"The chat template rejected the messages: {message}")

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    eos = target.detokenize([target.eos]) if target.eos >= 0 else ""
    extra = {"tools": list(tools)} if tools else {}
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                            eos_token=eos, bos_token="", **extra)


def drafter_choice(drafter: str | os.PathLike[str] | None, default_target: bool) -> str | os.PathLike[str] | None:
    """What a drafter argument names: None (no drafter), "ngram" (prompt lookup) or a GGUF path.
    "default" is the shipped drafter with the embedded target, else "ngram"."""
    if drafter is None or drafter == "none":
        return None
    if drafter == "default":
        return (defaults.default_drafter() if default_target else None) or "ngram"
    return drafter


def make_drafter(drafter: str | os.PathLike[str] | Drafter | None, target: Target, default_target: bool,
                 n_gpu_layers: int, n_threads: int | None, repack: str | None) -> Drafter | None:
    """The drafter a drafter argument names (drafter_choice), loaded against `target`; a Drafter as given."""
    if isinstance(drafter, Drafter):
        return drafter
    choice = drafter_choice(drafter, default_target)
    if choice is None:
        return None
    if choice == "ngram":
        return NgramDrafter()
    return EagleDrafter(choice, target, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                        gguf=read_gguf(choice), repack=repack)


class EdgeEagle(LlamaCompat, EngineCosts):
    """A target model, optionally a drafter, and the options to run them.

    target: path to a target GGUF (None: the embedded SmolLM2-135M-Instruct).
    drafter: path to an eagle3 GGUF, "default" (the shipped drafter for the default
        target, else prompt lookup), "ngram" (prompt lookup), a Drafter, or None (plain).
    repack: llama.cpp CPU weight repacking, "auto" (off only where its AMX kernels would
        run, which crash), "on" or "off"; None reads $EDGE_EAGLE_REPACK (default auto).
    flash_attn: llama.cpp's flash attention for the target and drafter, "auto" (None: llama.cpp's
        own choice, on; with attention on the CPU, off for a request whose prompt has 512 tokens
        or more, until one has fewer than 256: the contexts are made again when it switches,
        route_attention()), "on" or "off" (system.decide_flash_attn).
    tree: draft a tree of this many nodes each cycle instead of a chain (EAGLE drafters);
        k="auto" may choose trees by itself. tree_paths: the most root-to-leaf paths a
        verified tree may have (llama.cpp sequences; 0: no trees).
    learn: keep each finished request's prompt and answer token ids (that is, its text) in the
        local store of this target and drafter (learn/store.py; at most learn_tokens tokens,
        the oldest requests going first). Off unless asked for: nothing is stored without it.
        With an eagle3 drafter and learn_idle > 0 (on Windows with psutil installed), the drafter also adapts
        in the background after learn_idle seconds without a generation, once learn_min_new more
        requests are kept (learn/idle.py; self.adapter); an accepted version is swapped in
        between generations.
    """

    def __init__(self, target: str | os.PathLike[str] | None = None, drafter: str | os.PathLike[str] | Drafter |
                 None = "default", *, k: int | str = "auto", p_min: float = 0.0, n_ctx: int = 4096,
                 n_gpu_layers: int = 0, n_threads: int | None = None, capture: str = "auto", k_max: int = 8,
                 repack: str | None = None, tree: int | None = None, tree_paths: int = TREE_PATHS,
                 history: bool = True, history_tokens: int = 200_000, learn: bool = False,
                 learn_tokens: int = LEARN_TOKENS, learn_idle: float = 5.0, learn_min_new: int = 16,
                 flash_attn: str | None = None):
        k = _check_k(k)
        #: suffix drafts' index: this engine's current request and, with history, earlier ones
        self.suffix = new_index(max_tokens=history_tokens, history=history)
        using_default_target = target is None
        target_path = defaults.default_target() if target is None else target
        meter = None if n_threads else LoadMeter()  # other programs' load, measured while the models load
        self.target = Target(target_path, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, n_threads=n_threads,
                             capture=capture, repack=repack, tree_paths=tree_paths, flash_attn=flash_attn)
        self.k, self.p_min, self.k_max = k, p_min, k_max
        self.controller: KController | None = None  # created, and calibrated, on first use of k="auto"
        self.drafter: Drafter | None
        try:
            self.drafter = make_drafter(drafter, self.target, using_default_target, n_gpu_layers, n_threads, repack)
        except BaseException:
            self.target.close()
            raise
        try:
            self.tree = _check_tree(tree, self.drafter)
        except BaseException:
            if self.drafter is not None:
                self.drafter.close()
            self.target.close()
            raise
        self.stats = SpecStats()
        self.last_stats: SpecStats | None = None
        self.attention_switches = 0  # contexts made again for another flash attention setting (route_attention)
        self._lock = threading.Lock()
        self._owner: int | None = None
        # the thread policy (threads.py): the count for this machine's load now, adapted while generating
        self.threads: ThreadDecision = decide(usable_cores(), meter.sample(min_interval=0.1) if meter else None,
                                              n_threads)
        self.governor = ThreadGovernor(self._set_threads, self.threads, meter, self._relative_cost) \
            if self.threads.reason != "forced" else None
        if self.threads.threads != self.target.n_threads:
            self._set_threads(self.threads.threads)
        self.costs: CostModel | None = None  # measured batch costs (calibrate()), shared with the controller
        self.calibration: dict[str, object] = {"source": None}
        self._costs_stale = False
        self._costs_by_attention: dict[str, tuple[BatchCosts, int]] = {}
        #: the opt-in store of finished requests (None: learning is off, nothing is stored)
        self.learn_store: LearnStore | None = None
        self._learn_warned = False
        self._drafter_load = (n_gpu_layers, repack)
        #: the adapted drafter version in use (learn/versions.py; 0: the drafter as given)
        self.drafter_version = 0
        self.learn_base: str | None = None  # with learn: the eagle3 GGUF the store and its versions belong to
        self.adapter: IdleAdapter | None = None  # with learn: the background adaptation (learn/idle.py)
        if learn:
            try:
                self.learn_store = LearnStore.for_models(target_path, self._drafter_identity(),
                                                         max_tokens=learn_tokens)
                if isinstance(self.drafter, EagleDrafter):
                    self.learn_base = self.drafter.path
                versions = Versions(self.learn_store.directory)
                adapted = versions.current_path() if isinstance(self.drafter, EagleDrafter) else None
                if adapted is not None:  # --learn runs the latest accepted adaptation
                    self.swap_drafter(adapted, version=versions.current)
                if self.learn_base is not None and learn_idle > 0 and can_suspend():
                    self.adapter = IdleAdapter(self, self.learn_base, idle_s=learn_idle, min_new=learn_min_new)
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_options(cls, options: EngineOptions) -> "EdgeEagle":
        """An engine made as `options` say (options.EngineOptions; the CLI builds them from its flags)."""
        return cls(options.target, options.drafter, **options.engine_kwargs())

    def swap_drafter(self, path: str | os.PathLike[str], *, version: int | None = None) -> None:
        """Run the eagle3 drafter at `path` from the next request on (an adapted version of the
        one in use). Waits for the request in progress; the target and its caches stay as they
        are, so greedy output stays the target's, and the controller's acceptance estimates start
        afresh. The old drafter stays in use if the new one cannot be loaded."""
        n_gpu_layers, repack = self._drafter_load
        with self._acquire():
            new = EagleDrafter(path, self.target, n_gpu_layers=n_gpu_layers, n_threads=self.target.n_threads,
                               gguf=read_gguf(path), repack=repack)
            old, self.drafter = self.drafter, new
            if old is not None:
                old.close()
            self.controller = None  # new acceptance: estimated afresh
            self.tree = _check_tree(self.tree, new)
            self.drafter_version = version if version is not None else self.drafter_version + 1

    def _drafter_identity(self) -> str | None:
        """What keys the learn store beside the target: the drafter's file, or its kind."""
        if self.drafter is None:
            return None
        return getattr(self.drafter, "path", None) or self.drafter.name

    def _learn(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        """Keep a finished request in the learn store; a store that cannot be written costs the
        request nothing (one warning)."""
        store = self.learn_store
        if store is None:
            return
        try:
            store.add(prompt, answer)
        except Exception as e:  # a full disk, a store locked past its timeout
            if not self._learn_warned:
                self._learn_warned = True
                logging.getLogger("edge_eagle.learn").warning(
                    "edge-eagle could not write the learn store %s (%s); requests are not being kept.",
                    store.path, e)

    # --- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                 k: int | str | None = None,
                 stop: Sequence[str] = (), speculative: bool = True, p_min: float | None = None,
                 add_special: bool = True, tree: int | None = None, logprobs: int | None = None,
                 logit_bias: Mapping[int, float] | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, penalty_last_n: int = 64,
                 grammar: str | None = None, history: bool = True) -> Generation:
        """Stream a completion of `prompt` (text, or token ids). tree: a node budget (draft
        trees instead of chains; None: the engine's setting; 0: chains). logprobs: each Token
        carries its log-probability under the target and the `logprobs` most probable tokens'
        (0: its own only; None: off; greedy cycles then run step by step, not natively).
        logit_bias: {token id: value added to its logit} (-100 bans a token), applied to every
        verified row, so speculation stays lossless. presence_penalty, frequency_penalty,
        repeat_penalty: llama.cpp's penalties over the last penalty_last_n tokens (the prompt
        included), each verified row judged with the drafts before it, so these stay lossless too.
        grammar: a llama.cpp GBNF grammar the output follows (grammar.py; json_schema_grammar()
        makes one from a JSON schema), applied to each verified row along its drafted path.
        history=False: this request's text is not added to the engine's cross-request history
        (suffix drafts may still use the history already there)."""
        tokens = self.target.tokenize(prompt, add_special=add_special) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise EdgeEagleError("The prompt is empty; give some text to continue.")
        if max_tokens < 1:
            raise EdgeEagleError(f"max_tokens must be at least 1, got {max_tokens}.")
        if len(tokens) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"The prompt ({len(tokens)} tokens) does not fit the context window ({self.target.n_ctx} tokens); "
                "shorten it or raise n_ctx.")
        if temperature < 0 or not 0 <= top_p <= 1 or top_k < 0 or not 0 <= min_p <= 1:
            raise EdgeEagleError("Sampling needs temperature >= 0, 0 <= top_p <= 1, 0 <= min_p <= 1 and top_k >= 0.")
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise EdgeEagleError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {logprobs}.")
        if repeat_penalty <= 0 or penalty_last_n < 0:
            raise EdgeEagleError("repeat_penalty must be above 0 (1 is off) and penalty_last_n 0 or more.")
        bias = check_logit_bias(logit_bias, self.target.n_vocab)
        k = self.k if k is None else _check_k(k)
        tree = self.tree if tree is None else _check_tree(tree, self.drafter)
        constraint = Grammar(self.target, grammar) if grammar else None
        return Generation(self, tokens, max_tokens=max_tokens, k=k, stop=stop,
                          sampling=SamplingParams(temperature, top_k, top_p, seed, min_p, bias, presence_penalty,
                                                  frequency_penalty, repeat_penalty, penalty_last_n,
                                                  grammar or None),
                          speculative=speculative,
                          p_min=self.p_min if p_min is None else p_min, tree=tree, logprobs=logprobs,
                          grammar=constraint, history=history)

    def policy(self, k: int | str, tree: int | None = None) -> DraftPolicy:
        """The draft policy: FixedTree(tree) when a tree budget is given, else Fixed(k), or the
        engine's adaptive controller for "auto"."""
        if tree:
            return FixedTree(tree)
        return self.auto_controller() if k == "auto" else Fixed(int(k))

    def auto_controller(self) -> KController:
        """The engine's k controller over the engine's batch costs (calibrate())."""
        if self.controller is None:
            costs = self.costs if self.costs is not None else self.calibrate()
            trees = self.drafter is not None and self.drafter.supports_trees
            sizes = tuple(n for n in AUTO_TREE_SIZES if n <= self.target.tree_paths) if trees else ()
            paths = min(LOOKUP_PATHS, self.target.tree_paths)
            self.controller = KController(k_max=self.k_max, costs=costs, lookup=self.suffix, lookup_max=self.k_max,
                                          lookup_nodes=LOOKUP_NODES if paths else self.k_max,
                                          lookup_paths=max(1, paths), tree_sizes=sizes)
        return self.controller

    # --- threads and batch costs -----------------------------------------------------------

    def _set_threads(self, n: int) -> None:
        self.target.set_threads(n)
        if self.drafter is not None:
            self.drafter.set_threads(n)
        self._costs_stale = True  # c(n) was measured at another thread count

    def _relative_cost(self, n: int) -> float:
        return self.costs.c(n) if self.costs is not None and n > 1 else float(n > 0)

    @property
    def cost_n_max(self) -> int:
        return self.k_max + 1

    def chat(self, messages: Sequence[Mapping[str, str]], *, truncate: bool = True, **kwargs) -> Generation:
        """Stream the assistant's reply to `messages`, formatted by the target's chat template.

        Context policy: when the conversation no longer leaves room for the reply (max_tokens,
        or a quarter of the window if that is less), the oldest messages after any system
        messages are dropped, one at a time, until it does; the newest message is always kept.
        gen.dropped_messages says how many were dropped. With truncate=False, or when even the
        newest message does not fit, ContextOverflowError. A reply that fills the window stops
        with finish_reason "context"."""
        messages = list(messages)
        n_ctx = self.target.n_ctx
        reserve = max(1, min(int(kwargs.get("max_tokens", 256)), n_ctx // 4))
        system = messages[:1] if messages and messages[0].get("role") == "system" else []
        rest = messages[len(system):]
        dropped = 0
        while True:
            ids = self.target.tokenize(self.apply_chat_template(system + rest), add_special=False)
            n = len(ids)
            if n + reserve <= n_ctx:
                break
            if not truncate or len(rest) <= 1:
                raise ContextOverflowError(
                    f"The conversation ({n} tokens) leaves no room for a reply in the context window ({n_ctx} "
                    "tokens); start a new chat, shorten the message or raise n_ctx.")
            rest = rest[1:]
            dropped += 1
        gen = self.generate(ids, **kwargs)  # already tokenized: generate() need not do it again
        gen.dropped_messages = dropped
        return gen

    def reset_history(self) -> None:
        """Forget the earlier requests' text that suffix drafts draw on (it lives in memory only)."""
        with self._acquire():
            self.suffix.reset()

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        return render_chat(self.target, messages, tools=tools)

    # --- lifecycle -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _acquire(self) -> Iterator[None]:
        """Hold the engine for one generation; other threads wait, this thread may not nest."""
        if self._owner == threading.get_ident():
            raise EdgeEagleError("This thread is still iterating another generation; finish or close() "
                                 "it before starting the next.")
        adapter = self.adapter
        if adapter is not None:  # background adaptation stops now, not once the lock is ours
            adapter.busy(+1)
        try:
            with self._lock:
                self._owner = threading.get_ident()
                try:
                    yield
                finally:
                    self._owner = None
        finally:
            if adapter is not None:
                adapter.busy(-1)

    def close(self) -> None:
        if self.adapter is not None:  # first: its child and its swaps need the engine
            self.adapter.close()
        with self._lock:
            if self.drafter is not None:
                self.drafter.close()
            self.target.close()

    def __enter__(self) -> "EdgeEagle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
