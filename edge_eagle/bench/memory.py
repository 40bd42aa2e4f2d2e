"""`edge-eagle bench`'s memory phase: each in-process runner alone in a child process
(`python -m edge_eagle.bench.memory SPEC`) that loads it, runs one prompt and exits; the
parent reads the child's peak RSS from wait4() (runners.run_measured).
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Callable

from ..errors import EdgeEagleError
from .prompts import BenchPrompt
from .runners import UpstreamRunner, run_measured

if TYPE_CHECKING:
    from .suite import Bench


def memory_phase(bench: "Bench", prompt: BenchPrompt, progress: Callable[[int], object]) -> dict[str, int]:
    """Peak RSS of each in-process runner alone (plain target; target + drafter; ...), each
    measured in a fresh child process running one prompt."""
    out: dict[str, int] = {}
    o = bench.opts
    for r in bench.runners:
        if isinstance(r, UpstreamRunner):
            continue
        spec = {"kind": r.kind, "k": r.k, "drafter": getattr(r, "drafter", None), "target": bench.target_path,
                "n_ctx": o.n_ctx, "threads": o.threads, "prompt": prompt.text, "max_tokens": o.max_tokens,
                "n_gpu_layers": o.n_gpu_layers, "repack": o.repack}
        rc, _, err, rss = run_measured([sys.executable, "-m", "edge_eagle.bench.memory", json.dumps(spec)])
        if rc != 0:
            raise EdgeEagleError(f"measuring memory of {r.name} failed: {err.strip().splitlines()[-1:]}")
        if rss is not None:  # None: the platform has no wait4() figure
            out[r.name] = rss
        progress(1)
    return out



def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from ..api import EdgeEagle

    if spec["kind"] == "prompt-lookup":
        from .runners import PromptLookupRunner

        with EdgeEagle(spec["target"], None, n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                       n_gpu_layers=spec["n_gpu_layers"], repack=spec["repack"]) as ee:
            text = ee.apply_chat_template([{"role": "user", "content": spec["prompt"]}])
            tokens = ee.target.tokenize(text, add_special=True, parse_special=True)
            eos = {ee.target.eos}
        runner = PromptLookupRunner(spec["target"], spec["k"], spec["n_ctx"], spec["threads"], eos,
                                    n_gpu_layers=spec["n_gpu_layers"], repack=spec["repack"])
        runner.run(tokens, text, spec["max_tokens"])
        runner.close()
        return 0
    drafter = spec["drafter"] if spec["kind"] == "edge-eagle" else None
    with EdgeEagle(spec["target"], drafter, n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                   n_gpu_layers=spec["n_gpu_layers"], repack=spec["repack"]) as ee:
        k = spec["k"] if spec["kind"] == "edge-eagle" else 0
        ee.chat([{"role": "user", "content": spec["prompt"]}], max_tokens=spec["max_tokens"], k=k,
                speculative=spec["kind"] == "edge-eagle").result()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
