"""A short key for this processor's instruction set (for caches of -march=native builds).

llama.cpp builds with GGML_NATIVE by default, so a wheel built on one processor can stop with
"Illegal instruction" on another (a machine that moves between processor generations keeps its
pip cache). The key hashes the machine type and the processor's feature flags; the model name
is left out because virtual machines often report a generic one. Standard library only: the
Makefile and the build scripts run this file with any python3 (`python3 edge_eagle/cpu_key.py`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess


def cpuinfo(key: str, path: str = "/proc/cpuinfo") -> str | None:
    """The first /proc/cpuinfo value for `key` (Linux); None elsewhere."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def features(path: str = "/proc/cpuinfo") -> str:
    flags = cpuinfo("flags", path) or cpuinfo("Features", path)  # x86, arm
    if flags is not None:
        return " ".join(sorted(flags.split()))
    try:  # macOS
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                             timeout=10).stdout
        return out.strip()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def cpu_key(path: str = "/proc/cpuinfo") -> str:
    text = f"{platform.machine()} {features(path)}"
    return f"{platform.machine()}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def build_key(cmake_args: str | None = None) -> str:
    """The name of one llama.cpp build in a cache: cpu_key, and a hash of CMAKE_ARGS (default:
    the environment's) when set. The Makefile, scripts/install_llama.sh, scripts/build_upstream.sh
    and bench's upstream lookup all use it."""
    args = os.environ.get("CMAKE_ARGS", "") if cmake_args is None else cmake_args
    key = cpu_key()
    return f"{key}-{hashlib.sha1(args.encode()).hexdigest()[:8]}" if args else key


if __name__ == "__main__":
    print(build_key())
