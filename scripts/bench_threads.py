#!/usr/bin/env python
"""Speed on a busy desktop: the thread policy against fixed thread counts, `auto` against plain
decoding, and the first request after `serve` starts; idle and with other programs running.

    python scripts/bench_threads.py [--parts plain auto ttft] [--rounds 3] [-n 64] [--busy 1]
                                    [--limit 8] [--json OUT]

Busy = `--busy` busy-loop processes (default 1: one core's worth), started before a block and
stopped after it. Each round runs an idle block, then a busy one; within a block the
configurations run in rotating order. Speeds are decode tokens/s (prefill excluded).

- plain: plain decoding of the embedded SmolLM2 with
  - `policy, long-lived`: one engine made at the start on the idle machine, default thread policy
    (its governor must notice the load when it comes);
  - `policy, new`: an engine made inside the block (its decision sees the load);
  - `threads=N` for N = cores, cores - 1, 1 (forced);
  - `threads=cores, pool poll=P`: a persistent ggml thread pool at polling level P attached through
    llama_attach_threadpool (the waiting mode; llama.cpp's default makes a pool per graph, poll 50).
  Reported per condition: median and range over rounds x prompts, and each against the best fixed count.
- auto: per-prompt tokens/s ratio of k=auto to plain decoding on MT-bench first turns, one long-lived
  engine with the default drafter and thread policy, the two runs back to back in alternating order.
- ttft: `edge-eagle serve` as a process, first with an empty calibration cache, then with the cache it
  wrote: seconds until /health says ok (and whether it said "loading" before), and the time to the
  first streamed token of the first request, against the second request's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402
from edge_eagle.threads import usable_cores  # noqa: E402

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a bicycle gear system works.",
    "Describe a walk through a busy market in the morning.",
]
SPIN = ("import time\nend = time.time() + {limit}\nwhile time.time() < end:\n"
        "    t = time.perf_counter() + {duty} * 0.01\n    while time.perf_counter() < t:\n        pass\n"
        "    time.sleep((1 - {duty}) * 0.01)\n")


class Busy:
    """n busy-loop processes for the duration of a block, each busy `duty` of every 10 ms (1.0: a
    core's worth of load)."""

    def __init__(self, n: int, duty: float = 1.0, limit_s: float = 900):
        self.n, self.duty, self.limit_s = n, duty, limit_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Busy":
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(limit=self.limit_s, duty=self.duty)])
                      for _ in range(self.n)]
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)


class ThreadpoolParams(ctypes.Structure):
    """ggml.h's struct ggml_threadpool_params (GGML_MAX_N_THREADS = 512)."""

    _fields_ = [("cpumask", ctypes.c_bool * 512), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


class Pool:
    """A persistent ggml thread pool with a polling level, attached to a llama.cpp context (the
    waiting-mode variants: without one, llama.cpp makes a pool per graph at polling level 50)."""

    def __init__(self, ctx: Any, n_threads: int, poll: int):
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"))
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
        self.llama = ctypes.CDLL(str(lib / "libllama.so"))
        self.base.ggml_threadpool_params_default.restype = ThreadpoolParams
        self.base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
        self.cpu.ggml_threadpool_new.restype = ctypes.c_void_p
        self.cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
        self.cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
        self.llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.llama.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
        params = self.base.ggml_threadpool_params_default(n_threads)
        params.poll = poll
        self.pool = self.cpu.ggml_threadpool_new(ctypes.byref(params))
        if not self.pool:
            raise RuntimeError("ggml_threadpool_new failed")
        self.ctx = ctypes.cast(ctx, ctypes.c_void_p)
        self.llama.llama_attach_threadpool(self.ctx, self.pool, self.pool)

    def close(self) -> None:
        self.llama.llama_detach_threadpool(self.ctx)
        self.cpu.ggml_threadpool_free(self.pool)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def _decode_speed(engine: EdgeEagle, prompt: str, n: int, k: Any = 0) -> float:
    """Decode tokens/s of one greedy generation of `prompt` (a chat turn when it is plain text)."""
    if not prompt.startswith("<|"):
        prompt = engine.apply_chat_template([{"role": "user", "content": prompt}])
    gen = engine.generate(prompt, max_tokens=n, k=k).result()
    if gen.stats.generated < 2 or gen.stats.t_total <= 0:
        raise RuntimeError(f"the generation of {prompt[:40]!r} stopped at once; use a prompt that asks for more text")
    return gen.stats.generated / gen.stats.t_total


def part_plain(args: argparse.Namespace, bar: tqdm) -> dict[str, Any]:
    cores = usable_cores()
    counts = sorted({cores, max(1, cores - 1), 1}, reverse=True)
    fixed = {f"threads={c}": EdgeEagle(None, None, n_threads=c) for c in counts}
    pools = []
    for poll in args.polls:  # waiting modes: a persistent pool at this polling level, all cores
        eng = fixed[f"threads={cores}, pool poll={poll}"] = EdgeEagle(None, None, n_threads=cores)
        pools.append(Pool(eng.target.ctx, cores, poll))
    long_lived = EdgeEagle(None, None)
    speeds: dict[str, dict[str, list[float]]] = {"idle": {}, "busy": {}}
    threads_seen: dict[str, list[int]] = {"idle": [], "busy": []}
    try:
        for r in range(args.rounds):
            for cond in ("idle", "busy"):
                with Busy(args.busy if cond == "busy" else 0, args.duty):
                    new = EdgeEagle(None, None)  # decides under this block's load
                    runners: list[tuple[str, EdgeEagle]] = [("policy, long-lived", long_lived),
                                                            ("policy, new", new), *fixed.items()]
                    for i, prompt in enumerate(PROMPTS):
                        order = runners[(r + i) % len(runners):] + runners[:(r + i) % len(runners)]
                        for name, eng in order:
                            bar.set_postfix_str(f"plain {cond} {name}")
                            speeds[cond].setdefault(name, []).append(_decode_speed(eng, prompt, args.n))
                            bar.update(1)
                    threads_seen[cond].append(long_lived.target.n_threads)
                    new.close()
    finally:
        for pool in pools:
            pool.close()
        for eng in fixed.values():
            eng.close()
        events = [vars(e) for e in long_lived.governor.events] if long_lived.governor else []
        long_lived.close()
    out: dict[str, Any] = {"configs": {}, "governor_events": events[-16:],
                           "long_lived_threads_after_block": threads_seen}
    for cond, table in speeds.items():
        best_fixed = max(statistics.median(v) for k, v in table.items() if k.startswith("threads="))
        out["configs"][cond] = {name: {**_spread(v), "vs_best_fixed": round(statistics.median(v) / best_fixed, 3)}
                                for name, v in table.items()}
    return out


def part_auto(args: argparse.Namespace, bar: tqdm) -> dict[str, Any]:
    from scripts.eval_drafter import mtbench_first_turns

    prompts = [p["prompt"] for p in mtbench_first_turns()][:: max(1, 80 // args.limit)][: args.limit]
    engine = EdgeEagle()
    ratios: dict[str, list[float]] = {"idle": [], "busy": []}
    chosen: dict[str, list[float]] = {"idle": [], "busy": []}
    try:
        _decode_speed(engine, prompts[0], 16, k="auto")  # calibrate (cache) before timing
        for cond in ("idle", "busy"):
            with Busy(args.busy if cond == "busy" else 0, args.duty):
                for i, prompt in enumerate(prompts):
                    bar.set_postfix_str(f"auto {cond} {i}")
                    runs = [("plain", 0), ("auto", "auto")]
                    speeds = {}
                    for name, k in (runs if i % 2 == 0 else runs[::-1]):
                        speeds[name] = _decode_speed(engine, prompt, args.n_auto, k=k)
                        if name == "auto" and engine.last_stats is not None:
                            chosen[cond].append(engine.last_stats.draft_steps / max(1, engine.last_stats.verify_steps))
                    ratios[cond].append(speeds["auto"] / speeds["plain"])
                    bar.update(1)
    finally:
        threads = engine.target.n_threads
        engine.close()
    return {"prompts": len(prompts), "max_tokens": args.n_auto, "threads_at_end": threads,
            "auto_vs_plain": {c: _spread(v) for c, v in ratios.items()},
            "drafted_share_of_cycles": {c: _spread(v) for c, v in chosen.items() if v}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_once(cache: Path, bar: tqdm, label: str) -> dict[str, Any]:
    import httpx

    port = _free_port()
    env = {**os.environ, "EDGE_EAGLE_CALIBRATION": str(cache), "HF_HUB_OFFLINE": "1"}
    client = httpx.Client(timeout=5)  # one client: a new one per poll costs this process CPU (the server sees load)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "edge_eagle.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    statuses: list[str] = []
    try:
        deadline = t0 + 300
        while True:
            assert time.monotonic() < deadline, "the server did not become ready in 300 s"
            assert proc.poll() is None, "the server exited"
            try:
                r = client.get(f"http://127.0.0.1:{port}/health")
                status = r.json().get("status", "?")
                if not statuses or statuses[-1] != status:
                    statuses.append(status)
                if r.status_code == 200:
                    calibration = r.json().get("calibration", {})
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        ready_s = time.monotonic() - t0
        ttfts = []
        for i in range(2):
            bar.set_postfix_str(f"ttft {label} request {i + 1}")
            body = {"messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 16, "stream": True,
                    "temperature": 0}
            t = time.monotonic()
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if len(ttfts) == i and line.startswith("data:") and '"content"' in line:
                        ttfts.append(time.monotonic() - t)
        bar.update(1)
        return {"ready_s": round(ready_s, 3), "health_statuses": statuses, "calibration": calibration,
                "first_request_ttft_s": round(ttfts[0], 4), "second_request_ttft_s": round(ttfts[1], 4)}
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def part_ttft(args: argparse.Namespace, bar: tqdm) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "calibration.json"
        return {"empty_cache": _serve_once(cache, bar, "empty cache"),
                "cached": _serve_once(cache, bar, "cached")}


PARTS: dict[str, Callable[[argparse.Namespace, tqdm], dict[str, Any]]] = {
    "plain": part_plain, "auto": part_auto, "ttft": part_ttft}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=64, help="tokens per plain run")
    ap.add_argument("--n-auto", type=int, default=96, help="tokens per auto/plain run")
    ap.add_argument("--limit", type=int, default=8, help="MT-bench first turns for the auto part")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes in the busy condition")
    ap.add_argument("--polls", type=int, nargs="*", default=[0, 50],
                    help="also run plain decoding on all cores with a persistent ggml thread pool at these polling "
                         "levels (0: no spinning; default: 0 50)")
    ap.add_argument("--duty", type=float, default=1.0, help="share of a core each busy loop uses (default 1)")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    cores = usable_cores()
    total = {"plain": args.rounds * 2 * len(PROMPTS) * (2 + len({cores, max(1, cores - 1), 1}) + len(args.polls)),
             "auto": 2 * args.limit, "ttft": 2}
    report: dict[str, Any] = {"cpu": cpu_name(), "cores": cores, "busy_processes": args.busy, "duty": args.duty,
                              "date": time.strftime("%Y-%m-%d"),
                              "command": "python scripts/bench_threads.py " + " ".join(sys.argv[1:])}
    print(f"CPU: {report['cpu']}, {cores} cores", file=sys.stderr)
    with tqdm(total=sum(total[p] for p in args.parts), desc="bench_threads", file=sys.stderr) as bar:
        for part in args.parts:
            report[part] = PARTS[part](args, bar)
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
