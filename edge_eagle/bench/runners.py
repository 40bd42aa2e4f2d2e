"""The ways to decode that `edge-eagle bench` compares, behind one interface.

Every runner gets the same prompt token ids (the target's chat template, tokenized the way
llama.cpp's own tools do it) and generates up to n tokens greedily. Speed is decode
throughput after the prompt (generated tokens / seconds after prefill), measured by the
runner itself: Python timers for in-process runners, llama.cpp's own timer for the C++ loop.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from llama_cpp.llama_speculative import LlamaDraftModel

from .._llama import llama_cpp_python_repack
from ..cpu_key import build_key
from ..errors import EdgeEagleError
from ..fsutil import cache_dir
from ..stats import SpecStats
from ..system import flash_attn_for, repack_for

UPSTREAM_VERSION = "0.3.36"


@dataclass
class RunResult:
    text: str  # the generated text
    tokens: list[int] | None  # generated ids (None: the runner only reports text)
    generated: int
    seconds: float  # decode wall time after the prompt
    #: the counts (None: the runner has none); its t_* fields are meaningful iff `timed`
    stats: SpecStats | None = None
    timed: bool = False  # the runner split its time into verify / draft / overhead
    peak_rss: int | None = None  # bytes, for runners in their own process

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0


class Runner:
    name: str = "runner"
    kind: str = "plain"  # plain | edge-eagle | upstream | prompt-lookup | draft-model
    k: int | str | None = None
    tree: int | None = None  # edge-eagle drafting trees of this many nodes
    drafter: str | None = None

    def run(self, tokens: Sequence[int], prompt_text: str, n: int) -> RunResult:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EngineRunner(Runner):
    """Plain decoding (k None), or edge-eagle with a fixed k, "auto", or trees of `tree` nodes,
    on an EdgeEagle engine."""

    def __init__(self, engine, k: int | str | None, drafter: str | None = None, label: str | None = None,
                 tree: int | None = None, history: bool = False):
        self.engine, self.k, self.drafter, self.tree = engine, k, drafter, tree
        # history: this runner's answers join the engine's cross-request history (auto's, which
        # drafts from it); the others add nothing, so no runner sees another's answer to a prompt
        self.history = history
        if k is None and tree is None:
            self.name, self.kind = "plain", "plain"
        else:
            self.kind = "edge-eagle"
            label = f" [{label}]" if label else ""
            shape = f"tree={tree}" if tree else ("auto" if k == "auto" else f"k={k}")
            self.name = f"edge-eagle {shape}{label}"

    def run(self, tokens: Sequence[int], prompt_text: str, n: int) -> RunResult:
        speculative = self.k is not None or self.tree is not None
        gen = self.engine.generate(list(tokens), max_tokens=n, speculative=speculative,
                                   k=self.k if self.k is not None else 0, tree=self.tree or 0,
                                   history=self.history).result()
        s = gen.stats
        return RunResult(text=gen.text, tokens=list(gen.tokens), generated=s.generated, seconds=s.t_total,
                         stats=s, timed=True)


class _RecordingDraft(LlamaDraftModel):
    """Wraps a llama-cpp-python draft model and records each proposal (context length, draft)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, input_ids, **kwargs):
        draft = self.inner(input_ids, **kwargs)
        self.calls.append((len(input_ids), [int(t) for t in draft]))
        return draft


def acceptance_from_calls(calls: Sequence[tuple[int, Sequence[int]]], seq: Sequence[int]) -> SpecStats:
    """Per-step acceptance of recorded greedy proposals against the sequence that resulted:
    draft i of a call at context length L is accepted iff drafts 0..i equal seq[L:L+i+1]."""
    stats = SpecStats()
    for length, draft in calls:
        if length >= len(seq):
            continue  # proposed after the last token we kept: never verified
        draft = list(draft)[: len(seq) - length]
        n_acc = 0
        while n_acc < len(draft) and draft[n_acc] == seq[length + n_acc]:
            n_acc += 1
        stats.record_step(len(draft), n_acc)
    return stats


class PromptLookupRunner(Runner):
    """llama-cpp-python's own prompt-lookup decoding (Llama(draft_model=LlamaPromptLookupDecoding))."""

    kind = "prompt-lookup"

    def __init__(self, target: str, k: int, n_ctx: int, n_threads: int | None, eos: set[int],
                 n_gpu_layers: int = 0, repack: str | None = None, flash_attn: str | None = None):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.k, self.name, self.eos = k, f"prompt-lookup k={k}", eos
        self.draft = _RecordingDraft(LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=k))
        self.target, self.n_ctx, self.n_gpu_layers, self.repack = target, n_ctx, n_gpu_layers, repack
        self.threads = n_threads or min(8, os.cpu_count() or 1)
        # flash attention as edge-eagle's engines decide it, per prompt (system.decide_flash_attn,
        # FlashAttnDecision.for_prompt): another setting shifts logits enough to flip near-ties.
        # llama-cpp-python's Llama takes on or off when it is made, so there is one Llama per setting
        # used (llama.cpp's own AUTO, with layers on a GPU, enables it there)
        self.fa = flash_attn_for(n_gpu_layers, flash_attn)
        self.llms: dict[bool, Any] = {}
        self._llm(self.fa.setting != "off")  # loaded now, as before any prompt

    def _llm(self, flash_attn: bool):
        from llama_cpp import Llama

        if flash_attn not in self.llms:
            # logits_all=True: with a draft model, llama-cpp-python sizes its logits buffer by
            # n_batch unless logits_all is passed, and overflows once the sequence passes n_batch
            with llama_cpp_python_repack(self.n_gpu_layers, self.repack):  # AMX kernels crash (system.py)
                self.llms[flash_attn] = Llama(model_path=self.target, n_ctx=self.n_ctx, n_threads=self.threads,
                                              n_threads_batch=self.threads, draft_model=self.draft, logits_all=True,
                                              flash_attn=flash_attn, verbose=False, n_gpu_layers=self.n_gpu_layers)
        return self.llms[flash_attn]

    def run(self, tokens: Sequence[int], prompt_text: str, n: int) -> RunResult:
        self.fa = self.fa.for_prompt(len(tokens))
        llm = self._llm(self.fa.setting != "off")
        self.draft.calls.clear()
        out: list[int] = []
        t_first = 0.0
        for tok in llm.generate(list(tokens), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                     reset=True):
            if not out:
                t_first = time.perf_counter()
                self.draft.calls.clear()  # proposals before the first token belong to no verify step
            if tok in self.eos:
                break
            out.append(int(tok))
            if len(out) >= n:
                break
        seconds = time.perf_counter() - t_first if out else 0.0
        seq = list(tokens) + out
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        # the first token comes from the prompt pass; decode throughput counts the rest
        return RunResult(text=text, tokens=out, generated=max(0, len(out) - 1), seconds=seconds,
                         stats=acceptance_from_calls(self.draft.calls, seq))

    def close(self) -> None:
        for llm in self.llms.values():
            llm.close()


def upstream_binary(build: bool = False) -> Path | None:
    """The cached llama-speculative-simple built by scripts/build_upstream.sh (built now if asked)."""
    env = os.environ.get("EDGE_EAGLE_UPSTREAM_BIN")
    if env:
        return Path(env) if Path(env).is_file() else None
    cache = Path(os.environ.get("EDGE_EAGLE_CACHE") or cache_dir())
    binary = cache / f"llama.cpp-{UPSTREAM_VERSION}-{build_key()}" / "bin" / "llama-speculative-simple"
    if binary.is_file():
        return binary
    if not build:
        return None
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_upstream.sh"
    if not script.is_file():
        raise EdgeEagleError("scripts/build_upstream.sh is missing; run bench from a source checkout of edge-eagle.")
    subprocess.run(["bash", str(script)], check=True, stdout=subprocess.DEVNULL)
    return binary if binary.is_file() else None


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_N = {name: re.compile(rf"{name}\s*=\s*(\d+)") for name in ("n_predict", "n_drafted", "n_accept")}
_CALLS = re.compile(r"#calls\(b,g,a\) = \s*(\d+)\s+(\d+)\s+(\d+)")
_PER_POS = re.compile(r"#acc rate/pos = \(([^)]*)\)")


class UpstreamRunner(Runner):
    """llama.cpp's C++ loop, examples/speculative-simple, as a subprocess per prompt:
    `--spec-type draft-eagle3` (EAGLE-3 drafter) or `draft-simple` (a classic draft model)."""

    def __init__(self, binary: Path, target: str, drafter: str, k: int, n_ctx: int, n_threads: int | None,
                 spec_type: str = "draft-eagle3", name: str | None = None, prompt_echo=None,
                 n_gpu_layers: int = 0, repack: str | None = None, flash_attn: str | None = None):
        self.binary, self.target, self.drafter, self.k = binary, target, drafter, k
        self.repack = repack
        # the attention kernel edge-eagle's engines use (system.decide_flash_attn), so that every
        # runner is the same llama.cpp computing the same attention
        # (per prompt, as an engine routes it: FlashAttnDecision.for_prompt)
        self.fa = flash_attn_for(n_gpu_layers, flash_attn)
        self.n_gpu_layers = n_gpu_layers
        self.n_ctx, self.spec_type = n_ctx, spec_type
        self.threads = n_threads or min(8, os.cpu_count() or 1)
        self.kind = "upstream" if spec_type == "draft-eagle3" else "draft-model"
        self.name = name or (f"llama.cpp draft-eagle3 k={k}" if spec_type == "draft-eagle3"
                             else f"draft-model k={k}")
        self.prompt_echo = prompt_echo  # tokens -> the text upstream prints for the prompt

    def spec_args(self) -> list[str]:
        return ["-md", str(self.drafter), "--spec-type", self.spec_type, "--spec-draft-n-max", str(self.k),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]

    def command(self, prompt_file: str, n: int) -> list[str]:
        """The command line (--no-escape: the prompt file is read as it is; by default llama.cpp's
        tools turn escapes such as \\" in it into the characters, so a prompt quoting JSON or code
        would read differently)."""
        return [str(self.binary), "-m", self.target, *self.spec_args(), "-f", prompt_file, "-n", str(n),
                "--temp", "0", "--top-k", "1", "--repeat-penalty", "1.0",
                "-c", str(self.n_ctx), "-b", str(self.n_ctx), "-t", str(self.threads), "-td", str(self.threads),
                "--seed", "0", "-lv", "4", "--no-escape", "-fa", self.fa.flag] + (
                [] if repack_for(0, None, self.repack).use_extra_bufts else ["--no-repack"]) + (
                ["-ngl", str(self.n_gpu_layers), "-ngld", str(self.n_gpu_layers)] if self.n_gpu_layers else [])

    def run(self, tokens: Sequence[int], prompt_text: str, n: int) -> RunResult:
        self.fa = self.fa.for_prompt(len(tokens))
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(prompt_text + "\n")  # `-f` drops one trailing newline; keep the prompt's own
        try:
            rc, out, err, rss = run_measured(self.command(f.name, n))
        finally:
            os.unlink(f.name)
        m = _DECODED.search(err)
        if rc != 0 or m is None:
            tail = "\n".join(err.strip().splitlines()[-5:])
            raise EdgeEagleError(f"llama-speculative-simple failed (exit {rc}): {tail}")
        found = {k: r.search(err) for k, r in _N.items()}
        nums = {k: int(m_k.group(1)) if m_k else 0 for k, m_k in found.items()}
        generated, seconds = int(m.group(1)), float(m.group(2))
        steps = nums["n_predict"] - nums["n_accept"]  # each verify step emits accepted + 1 tokens
        calls = _CALLS.search(err)
        n_calls = int(calls.group(3)) if calls else steps
        pos = _PER_POS.search(err)
        rates = [float(x) for x in pos.group(1).split(",") if x.strip()] if pos else []
        # upstream's per-position rates are per accept call; with p_min 0 every call drafts k
        accepted_at = [round(r * n_calls) for r in rates]
        stats = SpecStats(verify_steps=steps, accepted=nums["n_accept"], drafted=nums["n_drafted"],
                          drafted_at=[n_calls] * len(accepted_at), accepted_at=accepted_at, generated=generated)
        text = out
        if self.prompt_echo is not None:
            echo = "\n\n" + self.prompt_echo(tokens)
            text = out[len(echo):] if out.startswith(echo) else out
        text = text[:-2] if text.endswith("\n\n") else text
        return RunResult(text=text, tokens=None, generated=generated, seconds=seconds, stats=stats, peak_rss=rss)


#: llama.cpp's n-gram speculators that bench runs: (spec type, label, extra flags). Their defaults
#: (drafts of 48-64 tokens after 12-24-token matches) suit a GPU; the CPU settings draft at most
#: 8 tokens after shorter matches, as a batch of 9 already costs ~4.5 single steps on a 2-core CPU.
#: "no drafts" needs a match of NO_DRAFT_MATCH tokens, which never comes: llama.cpp's own loop
#: decoding plainly, so the table shows how much of an n-gram runner's ratio to edge-eagle's plain
#: decoding is its loop's (the binary has no plain mode).
NO_DRAFT_MATCH = 1024  # the most llama.cpp accepts
NGRAM_RUNNERS: tuple[tuple[str, str, list[str]], ...] = (
    ("ngram-mod", "defaults", []),
    ("ngram-map-k", "defaults", []),
    ("ngram-mod", "cpu", ["--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2",
                          "--spec-ngram-mod-n-max", "8"]),
    ("ngram-map-k", "cpu", ["--spec-ngram-map-k-size-n", "4", "--spec-ngram-map-k-size-m", "8"]),
    ("ngram-mod", "no drafts", ["--spec-ngram-mod-n-match", str(NO_DRAFT_MATCH), "--spec-ngram-mod-n-min",
                                str(NO_DRAFT_MATCH), "--spec-ngram-mod-n-max", str(NO_DRAFT_MATCH)]),
)


class NgramRunner(UpstreamRunner):
    """llama.cpp's own n-gram speculators in its C++ loop (llama-speculative-simple with
    `--spec-type ngram-*`, no draft model). The binary has no plain mode, so its speed is compared
    with edge-eagle's plain decoding: the same llama.cpp, the same threads."""

    def __init__(self, binary: Path, target: str, spec_type: str, label: str, flags: Sequence[str], n_ctx: int,
                 n_threads: int | None, prompt_echo=None, n_gpu_layers: int = 0, repack: str | None = None,
                 flash_attn: str | None = None):
        super().__init__(binary, target, "", 0, n_ctx, n_threads, spec_type=spec_type,
                         name=f"llama.cpp {spec_type} [{label}]", prompt_echo=prompt_echo, n_gpu_layers=n_gpu_layers,
                         repack=repack, flash_attn=flash_attn)
        self.kind, self.drafter, self.flags = "ngram", None, list(flags)

    def spec_args(self) -> list[str]:
        return ["--spec-type", self.spec_type, *self.flags]


# Peak RSS of a child: ru_maxrss survives fork and exec, so a child of this (large) process
# would report our own high-water mark. A fresh, small launcher process forks the real
# command and reports that grandchild's ru_maxrss, which is then its own.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("\\nEDGE_EAGLE_PEAK_RSS_KB=%d\\n" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""
_PEAK = re.compile(r"\nEDGE_EAGLE_PEAK_RSS_KB=(\d+)\n$")


def run_measured(cmd: Sequence[str], timeout: float = 900.0) -> tuple[int, str, str, int | None]:
    """Run a command; return (exit code, stdout, stderr, its own peak RSS in bytes)."""
    try:
        proc = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EdgeEagleError(f"{Path(cmd[0]).name} ran longer than {timeout:.0f} s; lower -n or use fewer "
                             "prompts.") from None
    err = proc.stderr.decode("utf-8", "replace")
    m = _PEAK.search(err)
    rss = int(m.group(1)) * 1024 if m else None
    if m:
        err = err[: m.start()]
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), err, rss

