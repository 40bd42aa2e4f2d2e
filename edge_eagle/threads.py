"""How many CPU threads llama.cpp runs: chosen from the cores and what other programs use of
them, and adapted while generating when the machine gets busy or idle again.

Why the count matters more than anything else: llama.cpp's workers meet at a barrier after every
operation of the graph. When another program holds a core, every barrier waits for the
descheduled worker. Measured on a 2-core EPYC with one busy loop (docs/measurements.md): plain
decoding of SmolLM2 with 2 threads collapses to a fraction of the 1-thread speed, while 1 thread
keeps most of its idle speed. Spinning less at the barriers (a ggml thread pool with poll = 0)
did not help in the one try recorded; the thread count is the lever, so the waiting mode stays
llama.cpp's default and the policy chooses the count.

- decide(): the pure decision, from the usable cores, the other programs' load (in cores) and a
  forced count (`--threads`).
- LoadMeter: the other programs' load from /proc/stat (Linux; None elsewhere), this process's
  own CPU time subtracted.
- ThreadGovernor: watches each cycle's target time against the calibrated cost of one token at
  the current thread count. When it degrades far beyond it, it takes threads away (as many as
  the load says, at least one); when the load goes, it gives them back, and takes the change
  back if the step time did not improve.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

MAX_THREADS = 8  # llama.cpp's own default caps here too: more threads stop paying for small models
#: a core counts as taken when other programs use at least this share of it. Measured (2-core EPYC,
#: docs/measurements.md): against a loop busy 30% of the time, 2 threads beat 1 by 16%; at 50%
#: they tie; a loop busy all the time halves the speed of 2 threads while 1 keeps most of its own
BUSY_SHARE = 0.5
#: the same, for a load read while this process's own threads contend for the cores: the other
#: programs then get less than they want, so less of it counts
CONTENDED_SHARE = 0.3
WAITING = "llama.cpp default (workers spin briefly at barriers, then sleep)"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadDecision:
    """The policy in force: threads for llama.cpp, and why."""

    threads: int
    reason: str  # "forced", "idle", "busy", or "unknown load"
    cores: int
    other_load: float | None  # cores' worth of other programs' CPU use; None where unknown
    waiting: str = WAITING

    def describe(self) -> str:
        load = "unknown" if self.other_load is None else f"{self.other_load:.2f} cores"
        how = "forced by --threads" if self.reason == "forced" else self.reason
        return (f"{self.threads} thread{'s' if self.threads != 1 else ''} of {self.cores} cores ({how}; "
                f"other programs' load: {load}); waiting: {self.waiting}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(cores: int, other_load: float | None, forced: int | None = None,
           max_threads: int = MAX_THREADS, busy_share: float = BUSY_SHARE) -> ThreadDecision:
    """Threads for llama.cpp: `forced` when given; else one per core that other programs leave
    free (a core is taken when they use busy_share of it or more), at least one, at most
    max_threads; with an unknown load, one per core."""
    cores = max(1, int(cores))
    if forced:
        if forced < 1:
            raise ValueError(f"threads must be 1 or more, got {forced}")
        return ThreadDecision(int(forced), "forced", cores, other_load)
    if other_load is None:
        return ThreadDecision(min(cores, max_threads), "unknown load", cores, None)
    taken = min(cores, int(max(0.0, other_load) + 1.0 - busy_share))
    free = max(1, cores - taken)
    return ThreadDecision(min(free, max_threads), "busy" if taken else "idle", cores, round(other_load, 3))


class LoadMeter:
    """Other programs' CPU use on this process's cores, in cores (0.0 idle, 1.0 one busy core),
    between two calls of sample(): /proc/stat's busy time of those cores minus this process's
    own CPU time and its finished children's (a tool it ran and waited for, such as bench's
    llama.cpp runners, is its own work). None where /proc/stat is missing (macOS, Windows) or
    does not list the cores."""

    def __init__(self, stat_path: str = "/proc/stat", clock: Callable[[], float] = time.monotonic,
                 own_cpu: Callable[[], float] | None = None):
        self.stat_path, self.clock = stat_path, clock
        self.own_cpu = own_cpu or (lambda: sum(os.times()[:4]))  # user, system, children's user and system
        try:
            self.cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        except (AttributeError, OSError):
            self.cpus = set()
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    def _busy_s(self) -> float | None:
        try:
            with open(self.stat_path, "rb") as f:
                lines = f.read().decode().splitlines()
        except OSError:
            return None
        busy, seen = 0, 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if not name.startswith("cpu") or name == "cpu" or (self.cpus and name not in self.cpus):
                continue
            v = [int(x) for x in rest.split()]
            # user nice system idle iowait irq softirq steal: all but idle and iowait keep the core busy
            busy += sum(v[:3]) + sum(v[5:8])
            seen += 1
        if not seen or (self.cpus and seen < len(self.cpus)):
            return None
        return busy / self.tick

    def _read(self) -> tuple[float, float | None, float]:
        return self.clock(), self._busy_s(), self.own_cpu()

    def sample(self, min_interval: float = 0.0) -> float | None:
        """The other programs' load since the last sample (waiting until min_interval has passed)."""
        wait = min_interval - (self.clock() - self._last[0])
        if wait > 0:
            time.sleep(wait)
        now = self._read()
        (t0, b0, o0), (t1, b1, o1) = self._last, now
        self._last = now
        if b0 is None or b1 is None or t1 - t0 <= 0:
            return None
        return max(0.0, ((b1 - b0) - (o1 - o0)) / (t1 - t0))


def current_decision(forced: int | None = None, meter: LoadMeter | None = None,
                     interval: float = 0.25) -> ThreadDecision:
    """decide() for this machine now: the load over `interval` seconds (or since `meter` was made)."""
    if forced:
        return decide(usable_cores(), None, forced)
    meter = meter or LoadMeter()
    return decide(usable_cores(), meter.sample(min_interval=interval))


@dataclass
class GovernorEvent:
    at_cycle: int
    threads_from: int
    threads_to: int
    why: str


@dataclass
class ThreadGovernor:
    """Adapts the thread count of llama.cpp contexts while generating (not when forced).

    observe() takes each cycle's target seconds for n tokens, normalised by c(n) (the cost
    model's relative batch cost) to seconds per single-token step. Every `check_every` cycles,
    over the median of the last 8:
    - slowed (above `slowed` x the reference for the current count: the calibrated step time,
      or the first window measured at a count without one, following slow drifts such as a
      growing context) while the load meter finds other programs on the cores: as many threads
      as they leave cores; with no meter reading, beyond `degraded` x the reference: one fewer.
      On trial: when the next window is not faster, the count comes back, and fewer threads are
      not tried again for twice as long;
    - fewer threads than the decision at load time, and `recheck_s` since the last look: when
      the load meter says cores are free again, more threads, on trial: if the next window is
      not faster than before the change, it is taken back and the next look waits twice as long.
    """

    apply: Callable[[int], None]  # sets the thread count of every context
    initial: ThreadDecision
    meter: LoadMeter | None = None
    cost: Callable[[int], float] = float  # c(n): a batch of n tokens in single-token steps
    check_every: int = 4
    slowed: float = 1.3  # a step this much slower than the reference asks the load meter
    degraded: float = 1.6  # without a load reading, a step this much slower drops a thread
    recheck_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    threads: int = 0
    reference: dict[int, float] = field(default_factory=dict)  # threads -> seconds per step
    events: list[GovernorEvent] = field(default_factory=list)
    _window: deque = field(default_factory=lambda: deque(maxlen=8))  # (tokens, seconds) of recent cycles
    _cycles: int = 0
    _next_look: float = 0.0
    _backoff: float = 1.0
    _trial: tuple[int, float, bool] | None = None  # (threads before, their step time, fewer?) on trial
    _hold_down: float = 0.0  # no fewer threads before this time (after fewer were not faster)
    _meter_from: float = 0.0  # when the meter's current interval began
    _last_load: float | None = None

    def __post_init__(self) -> None:
        self.threads = self.threads or self.initial.threads
        self._next_look = self._meter_from = self.clock()
        self._next_look += self.recheck_s

    @property
    def active(self) -> bool:
        return self.initial.reason != "forced"

    def begin(self) -> None:
        """A generation starts: the load is measured from here (not over the pause before it)."""
        if self.meter is not None and self.active:
            self.meter.sample()
            self._meter_from, self._last_load = self.clock(), None

    def calibrated(self, step_s: float, threads: int | None = None) -> None:
        """The measured seconds of one single-token step at `threads` (default: the current count)."""
        self.reference[threads or self.threads] = step_s

    def observe(self, n_tokens: int, seconds: float) -> None:
        """One cycle's target seconds for a batch of n_tokens (cheap: the loop calls it every cycle;
        the normalising and the checks run every check_every cycles)."""
        self._window.append((n_tokens, seconds))
        self._cycles += 1
        # a changed count is judged on a full window (the first steps after a change are noisy)
        if self._cycles % self.check_every == 0 and len(self._window) >= (8 if self._trial else 4) and self.active:
            costs = {n: max(1.0, self.cost(n)) for n in {n for n, _ in self._window}}
            self._check(statistics.median([s / costs[n] for n, s in self._window]))

    def _check(self, step: float) -> None:
        self._tick_meter()
        now = self.clock()
        if self._trial is not None:  # a changed count: kept only if steps got faster
            before, before_step, down = self._trial
            self._trial = None
            if step > before_step * 0.95:
                self._backoff *= 2
                if down:
                    self._hold_down = now + self.recheck_s * self._backoff
                else:
                    self._next_look = now + self.recheck_s * self._backoff
                self._switch(before, f"{self.threads} thread{'s were' if self.threads != 1 else ' was'} not faster "
                             f"({step * 1e3:.1f} ms per step against {before_step * 1e3:.1f})")
                return
            self._backoff = 1.0
        ref = self.reference.get(self.threads)
        if ref is None:
            self.reference[self.threads] = step
            return
        if step > self.slowed * ref and self.threads > 1 and now >= self._hold_down:
            # slower: the load meter says whether other programs are the cause, and how many threads to
            # leave them (read while this process's threads contend, it understates what they want:
            # CONTENDED_SHARE); with no reading, only a step far beyond the reference counts, and one goes
            load = self._load()
            wanted = decide(self.initial.cores, load, busy_share=CONTENDED_SHARE).threads if load is not None else None
            if (wanted is not None and wanted < self.threads) or (load is None and step > self.degraded * ref):
                fewer = min(wanted, self.threads - 1) if wanted is not None else self.threads - 1
                self._trial = (self.threads, step, True)
                self._switch(fewer, f"step time {step / ref:.1f}x the reference"
                             + ("" if load is None else f", other programs' load {load:.2f} cores"))
                return
        # not slowed by others: the reference follows slow drifts (a longer context makes every step dearer)
        self.reference[self.threads] = ref + 0.25 * (step - ref)
        if self.threads < self.initial.threads and now >= self._next_look:
            self._next_look = now + self.recheck_s * self._backoff
            load = self._load()
            more = decide(self.initial.cores, load).threads if load is not None else self.threads + 1
            more = min(more, self.initial.threads)
            if more > self.threads:
                self._trial = (self.threads, step, False)
                self._switch(more, "the load went" if load is not None else "trying more threads again")

    def _load(self) -> float | None:
        """The other programs' load over the last second or so: the meter restarts its interval
        at every check that finds one second passed, so a reading is never older than two."""
        if self.meter is None:
            return None
        now = self.clock()
        if now - self._meter_from >= 0.25 or self._last_load is None:
            self._last_load, self._meter_from = self.meter.sample(), now
        return self._last_load

    def _tick_meter(self) -> None:
        if self.meter is not None and self.clock() - self._meter_from >= 1.0:
            self._last_load, self._meter_from = self.meter.sample(), self.clock()

    def _switch(self, threads: int, why: str) -> None:
        threads = max(1, threads)
        if threads == self.threads:
            return
        self.events.append(GovernorEvent(self._cycles, self.threads, threads, why))
        del self.events[:-32]
        self.apply(threads)
        self.threads = threads
        self._window.clear()
        if self.meter is not None:  # the next look measures the load from here
            self.meter.sample()
            self._meter_from, self._last_load = self.clock(), None

    def to_dict(self) -> dict[str, Any]:
        return {"threads": self.threads, "initial": self.initial.to_dict(), "active": self.active,
                "events": [asdict(e) for e in self.events[-8:]]}


def describe_events(events: Sequence[GovernorEvent]) -> list[str]:
    return [f"cycle {e.at_cycle}: {e.threads_from} -> {e.threads_to} threads ({e.why})" for e in events]
