"""The engine's options, in one place: EngineOptions. The CLI flags of `generate`, `chat`,
`serve` and `bench` are built from it (add_arguments), so no front end can drop or miss one;
the library (EdgeEagle.from_options), the TUI (ChatOptions extends it), the server and the bench
take it.

A field with a `flag` in its metadata is a command-line option; the others are for the library.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .system import FLASH_ATTN_MODES, REPACK_MODES

TREE_PATHS = 16  # root-to-leaf paths a verified tree may have: llama.cpp sequences of the target
LEARN_TOKENS = 2_000_000  # the learn store's default cap (learn/store.py)


def k_arg(value: str) -> int | str:
    """--k: 'auto' or a number (the engine refuses a negative one with its own message)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {value!r}") from None


def tree_arg(value: str) -> int:
    """--tree: a node budget of 1 or more."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--tree takes a node budget of 1 or more, e.g. --tree 7 (got {value!r})")
    return n


def flag(name: str, help: str, type: Callable[[str], Any] | None = None, **argparse_kw: Any) -> dict[str, Any]:
    """A field's metadata that makes it the command-line option `name`."""
    return {"flag": name, "help": help, "type": type, **argparse_kw}


@dataclass
class EngineOptions:
    """What an EdgeEagle engine is made of and how it drafts by default."""

    target: str | None = field(default=None, metadata=flag(
        "--target", "target GGUF (default: the embedded SmolLM2-135M-Instruct)"))
    drafter: str | None = field(default="default", metadata=flag(
        "--drafter", "eagle3 GGUF, 'ngram' (prompt lookup), 'none' (plain decoding) or 'default'"))
    n_ctx: int = field(default=4096, metadata=flag("--n-ctx", "context window in tokens (default %(default)s)", int))
    n_gpu_layers: int = field(default=0, metadata=flag("--gpu-layers", "layers to offload to the GPU (-1: all)", int))
    n_threads: int | None = field(default=None, metadata=flag(
        "--threads", "CPU threads (default: one per core that other programs leave free, up to 8, adapted "
        "while generating; a number fixes it)", int))
    repack: str | None = field(default=None, metadata=flag(
        "--repack", "llama.cpp CPU weight repacking (default auto: off only where its AMX kernels would run, since "
        "they crash; also $EDGE_EAGLE_REPACK)", choices=list(REPACK_MODES)))
    flash_attn: str = field(default="auto", metadata=flag(
        "--flash-attn", "llama.cpp's flash attention (default auto: on, and on a CPU off for prompts from 512 "
        "tokens until one under 256, where off is faster; on or off fixes it)",
        choices=list(FLASH_ATTN_MODES)))
    k: int | str = field(default="auto", metadata=flag(
        "--k", "draft length, or 'auto' (the default: picked per cycle, never slower than plain)", k_arg))
    tree: int | None = field(default=None, metadata=flag(
        "--tree", "draft a tree of N nodes per cycle (EAGLE-2 style, verified in one batch) instead of a chain of "
        "--k; EAGLE drafters only", tree_arg, metavar="N"))
    p_min: float = field(default=0.0, metadata=flag("--p-min", "stop drafting below this drafter confidence", float))
    history: bool = field(default=True, metadata=flag(
        "--no-history", "keep no cross-request history for suffix drafts (on a shared server, timing can reveal "
        "whether a request repeats another's text)", None, action="store_false"))
    history_tokens: int = field(default=200_000, metadata=flag(
        "--history-tokens", "the most tokens of earlier requests the suffix index keeps in memory (default "
        "%(default)s; oldest requests go first)", int))
    learn: bool = field(default=False, metadata=flag(
        "--learn", "keep each finished request's token ids (prompt and answer: that is its text) in a local store "
        "under the cache directory, to adapt the drafter to your traffic (see `edge-eagle learn status`)", None,
        action="store_true"))
    learn_tokens: int = field(default=LEARN_TOKENS, metadata=flag(
        "--learn-tokens", "the learn store's cap in tokens (default %(default)s; the oldest requests go first)", int))
    learn_idle: float = field(default=5.0, metadata=flag(
        "--learn-idle", "with --learn: adapt the drafter in the background after this many seconds without "
        "requests (default %(default)s; 0: never, `edge-eagle learn adapt` by hand)", float))
    learn_min_new: int = field(default=16, metadata=flag(
        "--learn-min-new", "with --learn: adapt again once this many more requests are kept (default %(default)s)",
        int))
    capture: str = "auto"  # how the target's features are captured: auto, layer_inp or callback
    k_max: int = 8  # the longest chain k="auto" may choose
    tree_paths: int = TREE_PATHS  # the most root-to-leaf paths a verified tree may have (0: no trees)

    @classmethod
    def flags(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, only: Iterable[str] | None = None,
                      defaults: dict[str, Any] | None = None) -> None:
        """Add the options' flags to a parser (`only`: these fields; `defaults`: other defaults)."""
        keep = None if only is None else set(only)
        defaults = defaults or {}
        for f in cls.flags():
            if keep is not None and f.name not in keep:
                continue
            meta = dict(f.metadata)
            name, type_ = meta.pop("flag"), meta.pop("type")
            kw: dict[str, Any] = {"dest": f.name, "default": defaults.get(f.name, f.default), **meta}
            if type_ is not None:
                kw["type"] = type_
            if "choices" not in kw and kw.get("action") not in ("store_true", "store_false"):
                kw.setdefault("metavar", name.lstrip("-").replace("-", "_").upper())
            parser.add_argument(name, **kw)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> "EngineOptions":
        """The options a parsed command line gives (flags it lacks keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {name: getattr(args, name) for name in names if hasattr(args, name)}
        return cls(**{**given, **overrides})

    def engine_kwargs(self) -> dict[str, Any]:
        """EdgeEagle's keyword arguments (everything but target and drafter)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineOptions)}
        del out["target"], out["drafter"]
        return out
