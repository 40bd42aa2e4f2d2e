"""Child process of `edge-eagle bench`'s memory phase: load one runner, run one prompt, exit.
The parent reads this process's peak RSS from wait4().

    python -m edge_eagle.bench.memory '{"kind": "plain", "target": ..., ...}'
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from ..api import EdgeEagle

    if spec["kind"] == "prompt-lookup":
        from .runners import PromptLookupRunner

        with EdgeEagle(spec["target"], None, n_ctx=spec["n_ctx"], n_threads=spec["threads"]) as ee:
            text = ee.apply_chat_template([{"role": "user", "content": spec["prompt"]}])
            tokens = ee.target.tokenize(text, add_special=True, parse_special=True)
            eos = {ee.target.eos}
        runner = PromptLookupRunner(spec["target"], spec["k"], spec["n_ctx"], spec["threads"], eos)
        runner.run(tokens, text, spec["max_tokens"])
        runner.close()
        return 0
    drafter = spec["drafter"] if spec["kind"] == "edge-eagle" else None
    with EdgeEagle(spec["target"], drafter, n_ctx=spec["n_ctx"], n_threads=spec["threads"]) as ee:
        k = spec["k"] if spec["kind"] == "edge-eagle" else 0
        ee.chat([{"role": "user", "content": spec["prompt"]}], max_tokens=spec["max_tokens"], k=k,
                speculative=spec["kind"] == "edge-eagle").result()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
