"""The runners of one bench: built from the options, owning their models."""

from __future__ import annotations

from pathlib import Path

from ..errors import EdgeEagleError
from .options import BenchOptions, label
from .prompts import BenchPrompt
from .runners import (
    NGRAM_RUNNERS,
    EngineRunner,
    NgramRunner,
    PromptLookupRunner,
    Runner,
    UpstreamRunner,
    upstream_binary,
)


class Bench:
    """Builds the runners for a set of options and owns their models."""

    def __init__(self, opts: BenchOptions):
        from .. import defaults
        from ..api import EdgeEagle

        self.opts = opts
        self.target_path = str(opts.target or defaults.default_target())
        self.drafter_paths = [self._drafter_path(d) for d in opts.drafters if d != "none"]
        self.engines: list[EdgeEagle] = []
        self._first_answers: dict[str, str] = {}
        self.runners: list[Runner] = []
        self.skipped: list[dict[str, str]] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _drafter_path(self, d: str) -> str:
        from .. import defaults

        if d != "default":
            if not Path(d).is_file():
                raise EdgeEagleError(f"Drafter {d} not found; pass an eagle3 GGUF path or 'default'.")
            return d
        path = defaults.default_drafter() if self.opts.target is None else None
        if path is None:
            raise EdgeEagleError("There is no default drafter for this target; pass --drafter PATH.gguf.")
        return str(path)

    def _build(self) -> None:
        self._engine_runners()
        binary = None
        if self.opts.upstream or self.opts.draft_model or self.opts.ngram:
            binary = upstream_binary(build=self.opts.build_upstream)
            if binary is None:
                self.skipped.append({"runner": "llama.cpp (C++ loop)", "why": "llama-speculative-simple is not "
                                     "built; run scripts/build_upstream.sh or pass --build-upstream"})
        if binary is not None and self.opts.upstream:
            self._upstream_runners(binary)
        if binary is not None and self.opts.ngram:
            for spec_type, name, flags in NGRAM_RUNNERS:
                self.runners.append(NgramRunner(binary, self.target_path, spec_type, name, flags, self.opts.n_ctx,
                                                self.opts.threads, prompt_echo=self._echo,
                                                n_gpu_layers=self.opts.n_gpu_layers, repack=self.opts.repack,
                                                flash_attn=self.opts.flash_attn))
        if self.opts.prompt_lookup_k:
            target = self.engines[0].target
            eos = {t for t in range(target.n_vocab) if target.is_eog(t)} if target.n_vocab < 300_000 else {target.eos}
            self.runners.append(PromptLookupRunner(self.target_path, self.opts.prompt_lookup_k, self.opts.n_ctx,
                                                   self.opts.threads, eos, n_gpu_layers=self.opts.n_gpu_layers,
                                                   repack=self.opts.repack, flash_attn=self.opts.flash_attn))
        if self.opts.draft_model:
            self._draft_model_runner(binary)

    def _engine_runners(self) -> None:
        """plain, then per drafter: edge-eagle at each fixed k and auto (one engine per drafter)."""
        from ..api import EdgeEagle

        o = self.opts
        many = len(self.drafter_paths) > 1
        k_max = max([8] + list(o.ks))
        if not self.drafter_paths:  # plain decoding and the non-EAGLE runners only
            self.engines.append(EdgeEagle(self.target_path, None, n_ctx=o.n_ctx, n_threads=o.threads,
                                          n_gpu_layers=o.n_gpu_layers, repack=o.repack, flash_attn=o.flash_attn))
            self.runners.append(EngineRunner(self.engines[0], None))
        for i, dpath in enumerate(self.drafter_paths):
            eng = EdgeEagle(self.target_path, dpath, n_ctx=o.n_ctx, n_threads=o.threads, k_max=k_max,
                            n_gpu_layers=o.n_gpu_layers, repack=o.repack, flash_attn=o.flash_attn)
            self.engines.append(eng)
            if i == 0:
                self.runners.append(EngineRunner(eng, None))
            shapes: list[int | str] = [*o.ks, *(["auto"] if o.auto else [])]
            for k in shapes:
                self.runners.append(EngineRunner(eng, k, dpath, label=label(dpath) if many else None,
                                                 history=k == "auto"))
            for n in o.trees:
                self.runners.append(EngineRunner(eng, None, dpath, label=label(dpath) if many else None, tree=n))

    def _echo(self, tokens: list[int]) -> str:
        """The text llama.cpp's tools print for a prompt (special tokens as text)."""
        target = self.engines[0].target
        return "".join(target.token_bytes(t, special=True).decode("utf-8", "replace") for t in tokens)

    def _upstream_runners(self, binary: Path) -> None:
        many = len(self.drafter_paths) > 1
        for dpath in self.drafter_paths:
            for k in self.opts.ks:
                name = f"llama.cpp draft-eagle3 k={k}" + (f" [{label(dpath)}]" if many else "")
                self.runners.append(UpstreamRunner(binary, self.target_path, dpath, k, self.opts.n_ctx,
                                                   self.opts.threads, name=name, prompt_echo=self._echo,
                                                   n_gpu_layers=self.opts.n_gpu_layers, repack=self.opts.repack,
                                                flash_attn=self.opts.flash_attn))

    def _draft_model_runner(self, binary: Path | None) -> None:
        o = self.opts
        if o.draft_model is None:
            return
        if not Path(o.draft_model).is_file():
            raise EdgeEagleError(f"Draft model {o.draft_model} not found; pass a GGUF path to --draft-model.")
        if binary is not None:
            self.runners.append(UpstreamRunner(binary, self.target_path, o.draft_model, o.draft_model_k, o.n_ctx,
                                               o.threads, spec_type="draft-simple",
                                               name=f"draft-model k={o.draft_model_k}", prompt_echo=self._echo,
                                               n_gpu_layers=o.n_gpu_layers, repack=o.repack, flash_attn=o.flash_attn))

    def messages(self, p: BenchPrompt) -> list[dict[str, str]]:
        """The conversation a prompt asks for: one user turn, a recorded session, or a second turn
        after the target's own (plain, greedy) answer to the first."""
        if p.messages:
            return [dict(m) for m in p.messages]
        if len(p.turns) > 1:
            first = self._first_answers.get(p.id)
            if first is None:
                eng = self.engines[0]
                ask = [{"role": "user", "content": p.turns[0]}]
                first = eng.chat(ask, max_tokens=self.opts.max_tokens, speculative=False, history=False).result().text
                self._first_answers[p.id] = first
            return [{"role": "user", "content": p.turns[0]}, {"role": "assistant", "content": first},
                    {"role": "user", "content": p.turns[1]}]
        return [{"role": "user", "content": p.text}]

    def prompt_tokens(self, p: BenchPrompt) -> tuple[list[int], str]:
        """The chat-formatted prompt, tokenized as llama.cpp's tools do (special tokens parsed). A
        conversation too long for the window loses its oldest messages (the last one stays)."""
        eng = self.engines[0]
        if not eng.target.chat_template:
            text = p.text
        else:
            msgs = self.messages(p)
            while True:
                text = eng.apply_chat_template(msgs)
                n = len(eng.target.tokenize(text, add_special=True, parse_special=True))
                if n + self.opts.max_tokens + 16 <= self.opts.n_ctx or len(msgs) <= 1:
                    break
                msgs = msgs[1:]
        tokens = eng.target.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) + self.opts.max_tokens + 16 > self.opts.n_ctx:
            # the last message alone is too long: keep its end, after the tokens the tokenizer
            # starts every text with (BOS), and give the tools that text with its special tokens
            # written out, so they read the same prompt (a plain detokenization would drop the
            # chat template's markers, and llama.cpp's tools would continue a different text)
            head = eng.target.tokenize("", add_special=True, parse_special=True)
            tail = tokens[len(head):][-(self.opts.n_ctx - self.opts.max_tokens - 16 - len(head)):]
            tokens = head + tail
            text = self._echo(tail)
        return tokens, text

    def close(self) -> None:
        for r in self.runners:
            r.close()
        for e in self.engines:
            e.close()
        self.runners, self.engines = [], []
