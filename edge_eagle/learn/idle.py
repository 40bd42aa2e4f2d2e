"""Adapting in idle time (`--learn` in chat and serve, learn=True in the library): a child process
runs one `learn adapt` while no request is active, stopped the moment one arrives, and an accepted
version is swapped in between requests. The engine owns it (EdgeEagle.adapter) and says when a
generation holds it; the server also says when requests wait in its queue.

- **When:** no request has been admitted for `idle_s` seconds and the store holds at least
  `min_new` requests more than at the last adaptation.
- **How:** `python -m edge_eagle.learn.child`, niced (`nice`) with at most `threads` threads
  (torch's and llama.cpp's), writing its report to a file and its messages to adapt.log.
- **Yielding:** when a request is admitted (or a generation starts), the child is suspended at
  once (SIGSTOP; on Windows, where there is none, psutil's suspend, which suspends its threads):
  it stops mid-step, holding its memory but no core, so the request waits for nothing. It
  resumes (SIGCONT, or psutil's resume) after `idle_s` seconds without requests. Windows also
  has no `nice`: the child is started in the below-normal priority class there.
- **Swap:** an accepted version becomes the engine's drafter through EdgeEagle.swap_drafter,
  which waits for the engine's lock: between requests, the target and its caches untouched.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("edge_eagle.learn")
LOG = "adapt.log"  # the last background adaptation's messages, beside the store
SIGNALS = hasattr(signal, "SIGSTOP")  # POSIX; Windows suspends through psutil


def can_suspend() -> bool:
    """Whether a child process can be stopped mid-step here (SIGSTOP, or psutil on Windows)."""
    if SIGNALS:
        return True
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def suspend(child: subprocess.Popen, signals: bool = SIGNALS) -> None:
    if signals:
        child.send_signal(signal.SIGSTOP)
    else:
        import psutil

        psutil.Process(child.pid).suspend()


def resume(child: subprocess.Popen, signals: bool = SIGNALS) -> None:
    if signals:
        child.send_signal(signal.SIGCONT)
    else:
        import psutil

        psutil.Process(child.pid).resume()


class IdleAdapter:
    def __init__(self, engine: Any, base_drafter: str | os.PathLike[str], *, idle_s: float = 5.0, min_new: int = 16,
                 threads: int | None = None, nice: int = 10, steps: int = 900, minutes: float = 10.0,
                 lr: float = 2e-4, general_prompts: int = 24, samples: int = 4, tick_s: float = 0.2,
                 recount_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if engine.learn_store is None:
            raise ValueError("an IdleAdapter needs an engine made with learn=True")
        self.engine, self.base = engine, Path(base_drafter)
        self.idle_s, self.min_new, self.nice = idle_s, min_new, nice
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.steps, self.minutes, self.lr, self.general_prompts = steps, minutes, lr, general_prompts
        self.samples = samples  # answers sampled per training prompt (AdaptOptions.samples)
        self.tick_s, self.recount_s, self.clock = tick_s, recount_s, clock
        self._lock = threading.Lock()
        self._queued = 0  # requests admitted and not finished (the server's queue)
        self._running = 0  # generations holding the engine
        self._last_activity = clock()
        self._child: subprocess.Popen | None = None
        self._paused = False
        self._held = False  # hold(): stopped and not started, whatever the idle time
        self._report_path: Path | None = None
        self._learned_at = self._kept()  # requests ever kept when the last adaptation started
        self._new_requests = False  # a generation ended since the store was last counted
        self._counted_at = clock()
        self.reports: list[dict[str, Any]] = []  # every finished adaptation's report, oldest first
        self.state = "waiting"  # waiting, training, paused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edge-eagle-learn", daemon=True)
        self._thread.start()

    def _kept(self) -> int:
        return self.engine.learn_store.added()

    def _enough_new(self) -> bool:
        """Whether min_new requests were kept since the last adaptation began. The store is read
        after a generation ended, or every recount_s (another process may share the store)."""
        now = self.clock()
        if not self._new_requests and now - self._counted_at < self.recount_s:
            return False
        self._new_requests, self._counted_at = False, now
        kept = self._kept()
        if kept < self._learned_at:  # the store was reset
            self._learned_at = 0
        return kept - self._learned_at >= self.min_new

    # --- called by the engine and the server -----------------------------------------------------

    def activity(self, active: int) -> None:
        """The number of requests admitted and not finished changed (the server's queue): with
        one or more, the child stops at once."""
        with self._lock:
            self._queued = active
            self._touch()

    def busy(self, delta: int) -> None:
        """A generation took (+1) or left (-1) the engine (EdgeEagle._acquire)."""
        with self._lock:
            self._running = max(0, self._running + delta)
            self._new_requests = self._new_requests or delta < 0
            self._touch()

    def hold(self, on: bool = True) -> None:
        """Keep background adaptation stopped (and none started) until hold(False): for an
        application that needs the cores for a while without a generation."""
        with self._lock:
            self._held = on
            self._touch()

    def _touch(self) -> None:
        """Activity now (the lock held): the idle time starts again, and a running child stops."""
        self._last_activity = self.clock()
        if (self._active or self._held) and self._child is not None and not self._paused \
                and self._child.poll() is None:
            suspend(self._child)
            self._paused, self.state = True, "paused"

    @property
    def _active(self) -> int:
        return self._queued + self._running

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=10)

    # --- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self._tick()
            except Exception as e:  # the server keeps serving whatever happens here
                log.warning("edge-eagle learn: background adaptation failed (%s); it is tried again later.", e)
                with self._lock:
                    self._child, self._paused, self.state = None, False, "waiting"

    def _tick(self) -> None:
        with self._lock:
            idle = not self._active and not self._held and self.clock() - self._last_activity >= self.idle_s
            child = self._child
            if child is not None and self._paused and idle:
                resume(child)
                self._paused, self.state = False, "training"
        if child is not None:
            if child.poll() is not None:
                self._finished(child)
            return
        if idle and self._enough_new():
            self._start()

    def _start(self) -> None:
        store = self.engine.learn_store
        fd, name = tempfile.mkstemp(prefix="adapt-", suffix=".json", dir=store.directory)
        os.close(fd)
        self._report_path = Path(name)
        self._learned_at = self._kept()
        cmd = [sys.executable, "-m", "edge_eagle.learn.child", "--target", str(self.engine.target.path),
               "--drafter", str(self.base), "--store", str(store.directory), "--report", name,
               "--threads", str(self.threads), "--nice", str(self.nice), "--steps", str(self.steps),
               "--minutes", str(self.minutes), "--lr", str(self.lr), "--general-prompts", str(self.general_prompts),
               "--samples", str(self.samples)]
        with self._lock:
            if self._active or self._held:  # a request came meanwhile: start later
                return
            # its messages (llama.cpp logs a lot) go to a file: a pipe nobody reads would block it
            with open(store.directory / LOG, "wb") as err:
                below_normal = getattr(subprocess, "BELOW_NORMAL_PRIORITY_CLASS", 0)  # Windows: no nice
                self._child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                               creationflags=below_normal if self.nice else 0)
            self._paused, self.state = False, "training"

    def _finished(self, child: subprocess.Popen) -> None:
        try:
            err = (self.engine.learn_store.directory / LOG).read_text(errors="replace").strip()
        except OSError:
            err = ""
        with self._lock:
            self._child, self._paused, self.state = None, False, "waiting"
        report: dict[str, Any] = {}
        if self._report_path is not None and self._report_path.is_file():
            try:
                report = json.loads(self._report_path.read_text() or "{}")
            except ValueError:
                report = {}
            self._report_path.unlink(missing_ok=True)
        if child.returncode != 0 or not report:
            last = err.splitlines()[-1] if err else f"exit code {child.returncode}"
            log.warning("edge-eagle learn: a background adaptation ended without a result (%s).", last)
            return
        self.reports.append(report)
        if report.get("accepted") and report.get("written"):
            self.engine.swap_drafter(report["written"], version=int(report["version"]))  # waits for the lock
            log.info("edge-eagle learn: drafter version %s in use (tau on held-out requests %.3f -> %.3f).",
                     report["version"], report["tau_before"], report["tau_after"])
