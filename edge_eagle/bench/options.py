"""What `edge-eagle bench` runs: its options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BenchOptions:
    prompts: str = "mtbench"
    limit: int | None = None
    every: int = 1
    max_tokens: int = 96
    target: str | None = None  # None: the embedded default target
    drafters: list[str] = field(default_factory=lambda: ["default"])
    ks: list[int] = field(default_factory=lambda: [3])
    trees: list[int] = field(default_factory=list)  # tree node budgets to run (edge-eagle tree=N)
    auto: bool = True
    upstream: bool = True  # the C++ loop, when its binary is built (or build_upstream)
    build_upstream: bool = False
    prompt_lookup_k: int | None = 3  # None: no prompt-lookup runner
    ngram: bool = False  # llama.cpp's own n-gram speculators (runners.NGRAM_RUNNERS)
    draft_model: str | None = None  # a classic small draft GGUF for the target (upstream draft-simple)
    draft_model_k: int = 3
    n_ctx: int = 2048
    threads: int | None = None
    n_gpu_layers: int = 0  # layers on the GPU, for every runner (target and drafter)
    repack: str | None = None  # llama.cpp's CPU weight repacking for every runner (None: $EDGE_EAGLE_REPACK or auto)
    flash_attn: str | None = None  # llama.cpp's flash attention for every runner (None: auto, system.decide_flash_attn)
    memory: bool = True  # measure each runner's peak RSS in a child process
    #: times every runner decodes each prompt, in rotating order; a prompt's result per runner is
    #: its run with the median tokens/s (single runs on a noisy desktop swing by 5-10% a prompt)
    rounds: int = 1
    warmup: bool = True


def label(path: str) -> str:
    return "default" if path == "default" else Path(path).name.removesuffix(".gguf")
