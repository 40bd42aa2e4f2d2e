"""The thread policy (threads.py): the decision from its inputs (idle, busy, forced), the load
meter on a real and a written /proc/stat, and the governor that adapts the count while generating."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from edge_eagle.threads import LoadMeter, ThreadGovernor, current_decision, decide, usable_cores


def test_an_idle_machine_uses_a_thread_per_core_up_to_eight():
    assert decide(2, 0.05).threads == 2 and decide(2, 0.05).reason == "idle"
    assert decide(4, 0.2).threads == 4
    assert decide(32, 0.0).threads == 8


def test_cores_other_programs_keep_busy_are_left_to_them():
    one_busy = decide(2, 1.0)
    assert one_busy.threads == 1 and one_busy.reason == "busy"
    assert decide(2, 0.6).threads == 1  # a core used 60% by another program stalls every barrier
    assert decide(2, 3.0).threads == 1  # never fewer than one
    assert decide(8, 2.0).threads == 6
    assert decide(16, 1.0).threads == 8


def test_a_forced_count_wins_and_an_unknown_load_uses_the_cores():
    forced = decide(2, 2.0, forced=3)
    assert forced.threads == 3 and forced.reason == "forced"
    unknown = decide(4, None)
    assert unknown.threads == 4 and unknown.reason == "unknown load"
    with pytest.raises(ValueError):
        decide(2, 0.0, forced=-1)
    assert "forced by --threads" in forced.describe()
    assert forced.to_dict()["threads"] == 3


def _stat(path, busy0: int, busy1: int, idle: int = 1000) -> None:
    path.write_text(f"cpu  {busy0 + busy1} 0 0 {2 * idle} 0 0 0 0 0 0\n"
                    f"cpu0 {busy0} 0 0 {idle} 0 0 0 0 0 0\ncpu1 {busy1} 0 0 {idle} 0 0 0 0 0 0\nintr 1\n")


def test_the_meter_subtracts_this_process_from_the_cores_busy_time(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    stat, clock, own = tmp_path / "stat", [0.0], [0.0]
    _stat(stat, 0, 0)
    meter = LoadMeter(str(stat), clock=lambda: clock[0], own_cpu=lambda: own[0])
    tick = meter.tick
    # over 2 s: 3 s of busy time on the two cores, 1 s of it this process's own
    _stat(stat, 2 * tick, 1 * tick)
    clock[0], own[0] = 2.0, 1.0
    assert meter.sample() == pytest.approx(1.0)
    clock[0] += 1.0  # an idle second
    assert meter.sample() == pytest.approx(0.0)
    assert LoadMeter(str(tmp_path / "missing")).sample() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the load meter reads /proc/stat")
def test_a_child_process_this_one_waited_for_is_not_another_programs_load():
    meter = LoadMeter()
    subprocess.run([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"],
                   check=True, timeout=60)
    load = meter.sample()
    assert load is not None and load < 0.6  # the child's second of CPU is this process's own work


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the load meter reads /proc/stat")
def test_a_busy_loop_on_every_core_leaves_one_thread():
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_spin, args=(stop, time.time() + 30)) for _ in range(usable_cores())]
    for p in procs:
        p.start()
    try:
        time.sleep(0.3)
        busy = current_decision(interval=0.5)
        assert busy.threads == 1 and busy.reason in ("busy", "idle" if usable_cores() == 1 else "busy")
        assert busy.other_load is not None and busy.other_load > 0.5 * usable_cores()
        assert current_decision(forced=2).threads == 2
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)


def _spin(stop, deadline: float) -> None:
    while not stop.is_set() and time.time() < deadline:
        pass


class FakeMeter:
    def __init__(self):
        self.load: float | None = 0.0

    def sample(self, min_interval: float = 0.0):
        return self.load


def _governor(initial_threads=2, load=0.0):
    applied, clock, meter = [], [0.0], FakeMeter()
    meter.load = load
    gov = ThreadGovernor(applied.append, decide(2, load), meter, cost=lambda n: float(n), clock=lambda: clock[0],
                         check_every=4, recheck_s=1.0)
    gov.calibrated(0.010)
    return gov, applied, clock, meter


def _steps(gov, seconds: float, n: int = 8, tokens: int = 1) -> None:
    for _ in range(n):
        gov.observe(tokens, seconds * tokens)  # cost(n) = n: per-step time is `seconds`


def test_the_governor_holds_while_steps_cost_what_was_calibrated():
    gov, applied, _, _ = _governor()
    _steps(gov, 0.011, 40)
    _steps(gov, 0.012, 40, tokens=4)  # a 4-token batch normalised by c(4)
    assert applied == [] and gov.threads == 2


def test_a_slowed_step_takes_threads_away_and_an_idle_machine_gives_them_back():
    gov, applied, clock, meter = _governor()
    meter.load = 1.0  # another program took a core: steps take 5x as long
    _steps(gov, 0.050, 4)
    assert applied == [1] and gov.threads == 1
    assert "step time" in gov.events[-1].why
    _steps(gov, 0.014, 16)  # one thread under the load: the new reference
    assert gov.threads == 1
    clock[0] += 0.5
    meter.load = 0.0
    _steps(gov, 0.014, 8)
    assert gov.threads == 1  # not before recheck_s
    clock[0] += 1.0
    _steps(gov, 0.014, 4)
    assert applied == [1, 2]  # the load went: back to two, on trial
    _steps(gov, 0.010, 8)  # and faster: kept
    assert gov.threads == 2 and applied == [1, 2]


def test_more_threads_that_are_not_faster_are_taken_back_and_tried_later():
    gov, applied, clock, meter = _governor()
    meter.load = 1.0
    _steps(gov, 0.050, 4)
    _steps(gov, 0.014, 16)
    meter.load = 0.0  # the meter is wrong (a load it cannot see)
    clock[0] += 2.0
    _steps(gov, 0.014, 4)
    assert applied == [1, 2]
    _steps(gov, 0.050, 8)  # slower with two
    assert applied == [1, 2, 1] and "not faster" in gov.events[-1].why
    clock[0] += 1.5  # the next look waits twice as long
    _steps(gov, 0.014, 8)
    assert applied == [1, 2, 1]
    clock[0] += 1.0
    _steps(gov, 0.014, 4)
    assert applied == [1, 2, 1, 2]


def test_without_a_load_reading_the_governor_steps_down_by_one():
    gov, applied, _, meter = _governor()
    gov.initial = decide(4, None)
    gov.threads = 4
    meter.load = None
    gov.calibrated(0.010, 4)
    _steps(gov, 0.040, 4)
    assert applied == [3]
    _steps(gov, 0.030, 8)  # faster with three: kept
    assert applied == [3]


def test_forced_threads_are_never_changed():
    applied = []
    gov = ThreadGovernor(applied.append, decide(2, 1.0, forced=2), FakeMeter())
    gov.calibrated(0.010)
    _steps(gov, 0.5, 64)
    assert applied == [] and not gov.active


def test_a_slowdown_without_other_programs_keeps_the_threads():
    gov, applied, _, meter = _governor()
    meter.load = 0.0  # slower steps, but nothing else runs: threads are not the cause
    _steps(gov, 0.020, 32)
    assert applied == [] and gov.threads == 2
    assert gov.reference[2] > 0.015  # the reference follows the drift instead


def test_fewer_threads_that_are_not_faster_come_back_and_are_not_tried_again_at_once():
    gov, applied, clock, meter = _governor()
    meter.load = 0.4  # a light load: one thread is no better than two here
    _steps(gov, 0.014, 4)
    assert applied == [1]
    _steps(gov, 0.015, 4)
    assert applied == [1]  # judged on a full window
    _steps(gov, 0.015, 4)
    assert applied == [1, 2] and "not faster" in gov.events[-1].why
    _steps(gov, 0.030, 4)
    assert applied == [1, 2]  # held, even when slower ...
    clock[0] += 2.5
    _steps(gov, 0.030, 4)
    assert applied == [1, 2, 1]  # ... until twice recheck_s passed
