"""Atomic file writes: a reader never sees a half-written file, and a crash leaves the old
file (or none) in place. Every file edge-eagle writes goes through here."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def cache_dir() -> Path:
    """edge-eagle's cache folder: ($XDG_CACHE_HOME or ~/.cache)/edge-eagle."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-eagle"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary file beside `path` for a writer that wants a file name (GGUFWriter,
    np.savez, safetensors): renamed over `path` when the block ends, removed if it raises.
    The result has the usual permissions (mkstemp makes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` through a temporary file in the same directory, then rename."""
    raw = data.encode(encoding) if isinstance(data, str) else data
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def emit_report(report: object, path: str | os.PathLike[str] | None, indent: int = 2) -> None:
    """Print a script's JSON report to stdout and, with a path, also write it there."""
    import json

    text = json.dumps(report, indent=indent)
    print(text)
    if path:
        atomic_write(path, text + "\n")
