"""`edge-eagle learn --from PATH...`: a user's own files as requests to adapt on, before any use.

- A `.jsonl` file: one JSON object per line with a "prompt" (a user message, chat-formatted by
  the target's template) and optionally an "answer" (or "completion", "response"). Without an
  answer, `--regenerate` has the target write one (greedy); else the line is refused.
- Any other file (source code, documents, in a folder too): its text in chunks of CHUNK tokens,
  each a request whose first PROMPT_TOKENS tokens are the prompt and the rest the answer, so the
  drafter learns to continue such text. Files that are not UTF-8 text are skipped and counted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import EdgeEagleError

CHUNK = 512
PROMPT_TOKENS = 32
MAX_FILE_BYTES = 4 << 20  # larger files are cut here
ANSWER_KEYS = ("answer", "completion", "response")


@dataclass
class FromFiles:
    requests: list[tuple[list[int], list[int]]] = field(default_factory=list)
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # not UTF-8 text
    regenerated: int = 0


def _walk(paths: Sequence[str | os.PathLike[str]]) -> Iterator[Path]:
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise EdgeEagleError(f"{p} does not exist; pass files or folders to learn from.")
        if p.is_dir():
            for sub in sorted(p.rglob("*")):
                if sub.is_file() and not any(part.startswith(".") for part in sub.relative_to(p).parts):
                    yield sub
        else:
            yield p


def read_requests(ee: Any, paths: Sequence[str | os.PathLike[str]], *, regenerate: bool = False,
                  max_new: int = 256, progress: bool = False) -> FromFiles:
    """The requests these files make, for the engine's target (an EdgeEagle: its tokenizer,
    chat template and, with regenerate, plain greedy decoding)."""
    out = FromFiles()
    files = list(_walk(paths))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc="files", unit="file")
    try:
        for path in files:
            out.files += 1
            if bar is not None:
                bar.update(1)
            if path.suffix == ".jsonl":
                _jsonl(ee, path, out, regenerate, max_new)
                continue
            try:
                with open(path, "rb") as f:
                    text = f.read(MAX_FILE_BYTES).decode("utf-8")
            except UnicodeDecodeError:
                out.skipped.append(str(path))
                continue
            ids = ee.target.tokenize(text, add_special=False)
            for i in range(0, len(ids), CHUNK):
                chunk = ids[i:i + CHUNK]
                if len(chunk) > PROMPT_TOKENS + 8:
                    out.requests.append((chunk[:PROMPT_TOKENS], chunk[PROMPT_TOKENS:]))
    finally:
        if bar is not None:
            bar.close()
    return out


def _jsonl(ee: Any, path: Path, out: FromFiles, regenerate: bool, max_new: int) -> None:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise EdgeEagleError(f"{path} line {n} is not JSON ({e}); give one JSON object per line.") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise EdgeEagleError(f"{path} line {n} has no \"prompt\" string; give {{\"prompt\": ...}} per line.")
        prompt = ee.target.tokenize(ee.apply_chat_template([{"role": "user", "content": row["prompt"]}]),
                                    add_special=False)
        answer_text = next((row[k] for k in ANSWER_KEYS if isinstance(row.get(k), str)), None)
        if answer_text is None:
            if not regenerate:
                raise EdgeEagleError(f"{path} line {n} has a prompt and no answer; add --regenerate to have the "
                                     "target write the answers.")
            answer = ee.generate(prompt, max_tokens=max_new, speculative=False, history=False).result().tokens
            out.regenerated += 1
        else:
            answer = ee.target.tokenize(answer_text, add_special=False)
        if answer:
            out.requests.append((prompt, answer))
