"""Adapted drafter versions, kept beside a learn store: versions/v0001.gguf, v0002.gguf, ...
and current.json, which names the version in use (0: the drafter the store belongs to).

Every file is written whole to a temporary name and renamed (fsutil), GGUF first and
current.json last, so a crash or kill at any point leaves current.json naming a complete,
loadable file. `rollback` goes back one accepted version (to the base drafter after the first).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import EdgeEagleError
from ..fsutil import atomic_write

CURRENT = "current.json"


class Versions:
    def __init__(self, store_dir: str | Path):
        self.dir = Path(store_dir)
        self.path = self.dir / CURRENT

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"current": 0, "versions": []}
        except (OSError, ValueError) as e:
            raise EdgeEagleError(f"{self.path} is damaged ({e}); delete it to go back to the base drafter.") from e
        return data

    @property
    def current(self) -> int:
        """The version in use (0: the base drafter)."""
        return int(self._read().get("current", 0))

    def current_path(self) -> Path | None:
        """The GGUF of the version in use, or None for the base drafter (also when its file is gone)."""
        data = self._read()
        n = int(data.get("current", 0))
        for v in data.get("versions", []):
            if v["version"] == n:
                path = self.dir / v["file"]
                return path if path.is_file() else None
        return None

    def history(self) -> list[dict[str, Any]]:
        return list(self._read().get("versions", []))

    def add(self, write: Any, record: dict[str, Any]) -> tuple[int, Path]:
        """A new accepted version: write(path) writes its GGUF (to a temporary name: the rename
        comes after), then current.json names it. Returns (its number, its path)."""
        data = self._read()
        n = max([v["version"] for v in data.get("versions", [])] + [0]) + 1
        name = f"versions/v{n:04d}.gguf"
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        entry = {**record, "version": n, "file": name, "previous": int(data.get("current", 0)),
                 "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = {"current": n, "versions": [*data.get("versions", []), entry]}
        atomic_write(self.path, json.dumps(data, indent=1) + "\n")
        return n, path

    def rollback(self) -> int:
        """Go back to the version before the current one; returns the version now in use."""
        data = self._read()
        n = int(data.get("current", 0))
        if n == 0:
            raise EdgeEagleError("The base drafter is already in use; there is no earlier version to go back to.")
        previous = next((int(v.get("previous", 0)) for v in data.get("versions", []) if v["version"] == n), 0)
        atomic_write(self.path, json.dumps({**data, "current": previous}, indent=1) + "\n")
        return previous
