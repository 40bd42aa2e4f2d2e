"""Measured batch costs c(n) (costs.BatchCosts: seconds per batch size at a context, and per further
context token), cached per machine, model and thread count, so that a start with a
cache pays nothing and a first request never pays for measuring.

The cache is one JSON file ($EDGE_EAGLE_CALIBRATION, else ($XDG_CACHE_HOME or ~/.cache)/
edge-eagle/calibration.json), written atomically, with the newest MAX_ENTRIES entries. An
entry's key names the CPU, the usable cores, the model file (path, size, modification time),
the thread count, the GPU layers, the weight layout (repack), flash attention and the
llama-cpp-python version: a change of any of them measures again."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from .costs import BatchCosts
from .fsutil import atomic_write, cache_dir

MAX_ENTRIES = 64
_lock = threading.Lock()


def cache_path() -> Path:
    explicit = os.environ.get("EDGE_EAGLE_CALIBRATION")
    if explicit:
        return Path(explicit).expanduser()
    return cache_dir() / "calibration.json"


def key(target: Any, threads: int, n_max: int) -> str:
    """The cache key of `target` (a Target) decoding with `threads` threads, sizes 1..n_max."""
    import llama_cpp

    from .system import cpu_name
    from .threads import usable_cores

    st = os.stat(target.path)
    parts = {"cpu": cpu_name(), "cores": usable_cores(), "model": os.path.realpath(target.path),
             "size": st.st_size, "mtime_ns": st.st_mtime_ns, "threads": threads, "n_max": n_max,
             "gpu_layers": getattr(target, "n_gpu_layers", 0),
             "repack": bool(getattr(getattr(target, "repack", None), "use_extra_bufts", False)),
             "flash_attn": getattr(getattr(target, "flash_attn", None), "setting", None),
             "llama_cpp_python": llama_cpp.__version__}
    return json.dumps(parts, sort_keys=True)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again (and rewrite it whole)
    return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {}


def load(cache_key: str) -> BatchCosts | None:
    """The cached costs for this key, or None (also for an entry from before the context slopes:
    it is measured again)."""
    entry = _read(cache_path()).get("entries", {}).get(cache_key)
    if not isinstance(entry, dict):
        return None
    try:
        costs = {int(n): float(s) for n, s in entry["verify_s"].items()}
        slope = {int(n): float(s) for n, s in entry["slope_s"].items()}
        context = int(entry["context"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return BatchCosts(costs, context, slope) if costs.get(1, 0) > 0 else None


def store(cache_key: str, costs: BatchCosts) -> None:
    """Record a measurement (keeping the newest MAX_ENTRIES); a cache that cannot be written is
    not an error: the next start measures again."""
    path = cache_path()
    with _lock:
        entries = _read(path).get("entries", {})
        entries.pop(cache_key, None)
        entries[cache_key] = {"verify_s": {str(n): s for n, s in sorted(costs.verify_s.items())},
                              "context": costs.context,
                              "slope_s": {str(n): s for n, s in sorted(costs.slope_s.items())},
                              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:
            atomic_write(path, json.dumps({"version": 1, "entries": entries}, indent=1) + "\n")
        except OSError:
            pass


def differs(old: Mapping[int, float], new: Mapping[int, float], tolerance: float = 0.2) -> bool:
    """Whether a re-check moved the relative costs c(n) by more than `tolerance` anywhere (both
    seconds per batch size at the same context)."""
    from .costs import relative_costs

    n_max = min(max(old), max(new))
    a, b = relative_costs(old, n_max), relative_costs(new, n_max)
    return any(abs(x / y - 1) > tolerance for x, y in zip(a[1:], b[1:]) if y > 0)
