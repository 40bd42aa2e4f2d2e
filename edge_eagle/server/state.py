"""The server's options, and the state one app keeps over its engine (the worker, the metrics,
the model's id), which the routes receive through the get_state dependency."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from fastapi import Request

from ..api import EdgeEagle
from ..learn.idle import IdleAdapter
from .metrics import Metrics
from .responses import finish_reason
from .worker import Job, Worker


@dataclass
class ServerOptions:
    api_key: str | None = None
    max_queue: int = 8  # requests that may wait behind the running one; more get 503
    cors_origins: tuple[str, ...] = ()
    k: int | str | None = None  # draft length for every request (None: the engine's)
    retry_after_s: int = 2
    max_body_bytes: int = 8 << 20  # larger request bodies get 413
    strict_model: bool = False  # True: a request naming another model gets 404 (else any name serves this one)


class ServerState:
    """One engine served: its worker thread, the Prometheus metrics, the model's id. The
    options' k is resolved here (None becomes the engine's)."""

    def __init__(self, engine: EdgeEagle, options: ServerOptions | None = None):
        opts = options or ServerOptions()
        if opts.k is None:
            opts = dataclasses.replace(opts, k=engine.k)
        self.engine = engine
        self.options = opts
        self.metrics = Metrics()
        self.metrics.drafter_version.set(engine.drafter_version)
        self.model_id = os.path.basename(engine.target.path).removesuffix(".gguf")
        #: the engine's adaptation in idle time (learn/idle.py), told when requests wait in the queue
        self.adapter: IdleAdapter | None = engine.adapter
        self.worker = Worker(engine, opts.max_queue, on_finish=self._finished, on_change=self._queue_changed,
                             prepare=self._prepare, idle_task=self._recheck)

    @property
    def drafter_name(self) -> str:
        """The engine's drafter now (an adapted version replaces it between requests)."""
        return self.engine.drafter.name if self.engine.drafter is not None else "none"

    def _prepare(self) -> None:
        """Before ready: the batch costs, measured or from the calibration cache."""
        with self.engine._acquire():
            self.engine.prepare_costs()

    def _recheck(self, should_stop) -> None:
        """When idle: a cached calibration measured again (abandoned when a request comes)."""
        if self.engine.calibration.get("source") == "cache":
            self.engine.recheck_costs(should_stop)

    def _finished(self, job: Job) -> None:
        gen = job.generation
        if gen is None:  # the job ended before a generation started
            return
        # Prometheus tells a client that left ("abort") from one that was served
        reason = "abort" if gen.finish_reason == "cancelled" else finish_reason(gen.finish_reason)
        self.metrics.record(gen.stats, len(gen.tokens), reason)
        self.metrics.drafter_version.set(gen.drafter_version)

    def _queue_changed(self, running: int, waiting: int) -> None:
        self.metrics.running.set(running)
        self.metrics.waiting.set(waiting)
        if self.adapter is not None:  # a request admitted: background adaptation stops at once
            self.adapter.activity(running + waiting)

    def close(self) -> None:
        """Stop the worker (after the job it runs); the engine, and its background adaptation, stay open."""
        self.worker.close()


def get_state(request: Request) -> ServerState:
    """The dependency that gives a route (or an exception handler) its app's state."""
    return request.app.state.server
