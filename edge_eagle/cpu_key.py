"""A short key for this processor's instruction set (for caches of -march=native builds).

llama.cpp builds with GGML_NATIVE by default, so a wheel built on one processor can stop with
"Illegal instruction" on another (a machine that moves between processor generations keeps its
pip cache). The key hashes the machine type and the processor's feature flags; the model name
is left out because virtual machines often report a generic one. Standard library only: the
Makefile and the build scripts run this file with any python3 (`python3 edge_eagle/cpu_key.py`).
"""

import hashlib
import platform
import subprocess


def features(cpuinfo: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, arm
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    try:  # macOS
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                             timeout=10).stdout
        return out.strip()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def cpu_key(cpuinfo: str = "/proc/cpuinfo") -> str:
    text = f"{platform.machine()} {features(cpuinfo)}"
    return f"{platform.machine()}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"


if __name__ == "__main__":
    print(cpu_key())
