"""One engine, one generation at a time: a worker thread takes jobs first come, first served
from a bounded queue and streams each job's tokens back to its asyncio request handler."""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..api import EdgeEagle, Generation


@dataclass
class Job:
    """A generation request: the prompt's token ids and generate() options."""

    tokens: list[int]
    options: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    generation: Generation | None = None

    def emit(self, kind: str, value: Any = None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def cancel(self) -> None:
        """The client went away: stop at the next step (both caches stay consistent)."""
        self.cancelled.set()
        if self.generation is not None:
            self.generation.cancel()


class Worker:
    """Runs jobs on `engine` one after another, in arrival order. At most 1 + max_queue jobs
    are admitted (the running one and those waiting); submit() refuses the rest."""

    def __init__(self, engine: EdgeEagle, max_queue: int, on_change=None, on_finish=None,
                 prepare: Callable[[], None] | None = None, idle_task: Callable[[Callable[[], bool]], Any] |
                 None = None, idle_after_s: float = 1.0):
        self.engine = engine
        # prepare() runs first in the worker's thread (the batch-cost calibration); `ready` is set
        # after it, and jobs admitted before then wait in the queue. idle_task(should_stop) runs
        # once, when no job has come for idle_after_s seconds; should_stop() turns true when one
        # arrives, and it then gives up (the background re-check of a cached calibration).
        self._prepare, self._idle_task, self._idle_after_s = prepare, idle_task, idle_after_s
        self.ready = threading.Event()
        self.prepare_error: BaseException | None = None
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.admitted = 0  # running + waiting
        self.running = 0
        self._on_change = on_change or (lambda running, waiting: None)
        self._on_finish = on_finish or (lambda job: None)  # every generation that ran, cancelled ones too
        self._thread = threading.Thread(target=self._run, name="edge-eagle-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        with self._lock:
            if self.admitted >= 1 + self.max_queue:
                return False
            self.admitted += 1
            self._changed()
        self._jobs.put(job)
        return True

    def _changed(self) -> None:
        self._on_change(self.running, self.admitted - self.running)

    def _run(self) -> None:
        try:
            if self._prepare is not None:
                self._prepare()
        except Exception as exc:  # generation still works (it calibrates itself); /health says why
            self.prepare_error = exc
        self.ready.set()
        while True:
            if self._idle_task is not None:
                try:
                    job = self._jobs.get(timeout=self._idle_after_s)
                except queue.Empty:
                    task, self._idle_task = self._idle_task, None
                    try:
                        task(lambda: not self._jobs.empty())
                    except Exception:  # a failed re-check leaves the cached costs in use
                        pass
                    continue
            else:
                job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self.running = 1
                self._changed()
            try:
                self._generate(job)
            finally:
                with self._lock:
                    self.admitted -= 1
                    self.running = 0
                    self._changed()

    def _generate(self, job: Job) -> None:
        if job.cancelled.is_set():  # the client left while it waited
            job.emit("end")
            return
        try:
            gen = self.engine.generate(job.tokens, **job.options)
            job.generation = gen
            if job.cancelled.is_set():
                gen.cancel()
            for tok in gen:
                job.emit("token", tok)
            self._on_finish(job)
        except Exception as exc:  # reported to the client as a 500 / an error chunk
            job.emit("error", exc)
        job.emit("end")

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)
