"""The CPU engine's thread count follows the cores other programs leave free (cpu_threads.py): the rule, the reading
of /proc/stat, a governor on a stand-in clock and machine, when one is made, and the engine loop driving it."""

import os
import threading
from types import SimpleNamespace

import pytest
import torch

from minipic_lite import cpu_threads
from minipic_lite.cpu_threads import INTERVAL_S, ThreadGovernor, busy_seconds, threads_for
from minipic_lite.engine_loop import EngineLoop
from tests.test_engine_loop_edges import CountingEngine, request
from tests.waits import WAIT_S, run_with_timeout


@pytest.mark.parametrize(
    "max_threads, num_cores, machine, own, expected",
    [(2, 2, 2.0, 2.0, 2),  # only this process: every thread
     (2, 2, 2.0, 1.1, 1),  # another program took 0.9 of a core: one thread
     (2, 2, 1.4, 1.0, 2),  # 0.4 of a core: rounded, still two
     (2, 2, 2.0, 0.0, 1),  # both cores taken by others: one thread at least
     (4, 8, 3.0, 0.0, 4),  # five cores free: the threads it started with at most
     (8, 8, 8.0, 4.5, 5),  # 3.5 cores taken: 4.5 left, rounded half up
     (8, 8, 1.0, 1.2, 8),  # this process's time above the machine's (sampling skew): nobody else
     (16, 8, 1.0, 2.0, 8)],  # the same with more threads than cores: the cores, not one more per skewed core
)  # fmt: skip
def test_threads_for_takes_the_cores_others_leave_rounded(max_threads, num_cores, machine, own, expected):
    assert threads_for(max_threads, num_cores, machine, own) == expected


STAT = """cpu  900 0 300 5000 100 0 0 0 0 0
cpu0 100 0 50 1000 40 0 10 0 0 0
cpu1 200 10 40 2000 60 5 0 5 0 0
cpu2 600 0 210 2000 0 0 0 0 7 0
intr 12345 0 0
ctxt 99
"""


def test_busy_seconds_adds_the_given_cores_busy_ticks():
    """Busy = user + nice + system + irq + softirq + steal (not idle, not I/O wait); guest is inside user already."""
    assert busy_seconds(STAT, {0}, 100) == pytest.approx(1.6)  # 100 + 50 + 10 ticks
    assert busy_seconds(STAT, {0, 1}, 100) == pytest.approx(1.6 + 2.6)  # cpu1: 200 + 10 + 40 + 5 + 5
    assert busy_seconds(STAT, {2}, 50) == pytest.approx(16.2)  # another tick rate
    assert busy_seconds(STAT, set(), 100) == 0.0


class Machine:
    """A stand-in clock, process CPU time and /proc/stat for cores 0 and 1."""

    def __init__(self):
        self.wall = self.own = self.busy = 0.0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.wall += seconds
        self.own += seconds * own_cores
        self.busy += seconds * (own_cores + other_cores)

    def stat(self) -> str:
        ticks = round(self.busy * 100 / 2)  # split over the two cores
        return f"cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 {ticks} 0 0 0 0 0 0 0 0 0\ncpu1 {ticks} 0 0 0 0 0 0 0 0 0\n"


def governed(monkeypatch, cores: set[int]):
    """(machine, governor of 2 threads on `cores`, torch's thread count as a one-item list) on a stand-in machine."""
    machine = Machine()
    governor = ThreadGovernor(lambda: machine.wall, lambda: machine.own, machine.stat)
    governor.cores, governor.max_threads, governor._ticks_per_s = cores, 2, 100
    threads = [2]
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(cpu_threads.torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    return machine, governor, threads


def test_a_governor_drops_to_the_free_cores_and_comes_back(monkeypatch):
    machine, governor, threads = governed(monkeypatch, {0, 1})
    governor.after_step()  # the first look: nothing to compare yet
    machine.run(0.3, own_cores=1.1, other_cores=0.9)
    governor.after_step()  # within INTERVAL_S of the first look: no look
    assert threads == [2]
    machine.run(INTERVAL_S, own_cores=1.1, other_cores=0.9)
    governor.after_step()  # a program beside it took 0.9 of a core
    assert threads == [1]
    machine.run(INTERVAL_S, own_cores=1.0, other_cores=1.0)
    governor.after_step()
    assert threads == [1]  # it still runs: one thread stays
    governor.idle()  # the loop waits: the other program ends meanwhile, and the wait is not counted
    machine.run(10.0, own_cores=0.0, other_cores=0.5)
    governor.after_step()
    assert threads == [1]
    machine.run(INTERVAL_S, own_cores=1.0, other_cores=0.0)
    governor.after_step()
    assert threads == [2]  # the machine is free again: every thread


def test_a_governor_looks_once_exactly_interval_s_has_passed(monkeypatch):
    """The look is due at INTERVAL_S itself, not one step after it (times in binary fractions: exact sums)."""
    machine, governor, threads = governed(monkeypatch, {0, 1})
    governor.after_step()  # the first look, at 0 s
    machine.run(INTERVAL_S / 2, own_cores=1.0, other_cores=1.0)
    governor.after_step()
    assert threads == [2]  # half the interval: no look yet
    machine.run(INTERVAL_S / 2, own_cores=1.0, other_cores=1.0)
    assert machine.wall == INTERVAL_S
    governor.after_step()
    assert threads == [1]  # the interval exactly: a look, and another program held a core


def test_a_governor_counts_the_cores_it_may_run_on_not_its_threads(monkeypatch):
    """Four cores, two threads: others busy on two of them leave two free, so both threads stay (counting the threads
    as the cores would leave none)."""
    machine, governor, threads = governed(monkeypatch, {0, 1, 2, 3})
    governor.after_step()
    machine.run(INTERVAL_S, own_cores=2.0, other_cores=2.0)
    governor.after_step()
    assert threads == [2]
    machine.run(INTERVAL_S, own_cores=1.0, other_cores=3.0)
    governor.after_step()
    assert threads == [1]  # three taken: one left


def test_a_governor_waits_an_interval_on_a_clock_that_does_not_start_at_zero(monkeypatch):
    """The interval runs from the last look, not from the clock's origin (time.monotonic starts anywhere)."""
    machine, governor, threads = governed(monkeypatch, {0, 1})
    machine.wall = 1000.0
    governor.after_step()  # the first look, at 1000 s
    machine.run(INTERVAL_S / 2, own_cores=1.0, other_cores=1.0)
    governor.after_step()
    assert threads == [2]  # half the interval: no look yet
    machine.run(INTERVAL_S / 2, own_cores=1.0, other_cores=1.0)
    governor.after_step()
    assert threads == [1]


def test_a_governor_takes_its_cores_from_its_own_affinity():
    """The cores this process may run on, which a launcher (taskset) may narrow below the machine's, not another
    process's."""
    cores = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cores)})  # NOTE: the calling thread only (pid 0): torch's pool keeps its cores
        assert ThreadGovernor().cores == {min(cores)}
    finally:
        os.sched_setaffinity(0, cores)


def test_a_governor_is_made_only_where_the_thread_count_is_left_to_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(cpu_threads.ENV_SWITCH, raising=False)
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: 2)
    assert isinstance(ThreadGovernor.for_device(torch.device("cpu")), ThreadGovernor)
    assert ThreadGovernor.for_device(torch.device("cuda")) is None  # one host thread there
    monkeypatch.setenv(cpu_threads.ENV_SWITCH, "0")
    assert ThreadGovernor.for_device(torch.device("cpu")) is None
    monkeypatch.delenv(cpu_threads.ENV_SWITCH)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user chose
    assert ThreadGovernor.for_device(torch.device("cpu")) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: 1)  # nothing to take away
    assert ThreadGovernor.for_device(torch.device("cpu")) is None
    monkeypatch.setattr(cpu_threads.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(cpu_threads, "Path", lambda path: SimpleNamespace(exists=lambda: False))
    assert ThreadGovernor.for_device(torch.device("cpu")) is None  # no /proc/stat (not Linux): nothing to read


def test_the_loop_tells_its_governor_of_each_step_and_of_each_wait(monkeypatch):
    calls = []
    governor = SimpleNamespace(after_step=lambda: calls.append("step"), idle=lambda: calls.append("idle"))
    monkeypatch.setattr(ThreadGovernor, "for_device", classmethod(lambda cls, device: governor))
    loop = run_with_timeout(EngineLoop, CountingEngine)
    for name in ("a", "b"):
        finished = threading.Event()
        loop.submit([request(name, max_tokens=1)], lambda out, done=finished: done.set())
        assert finished.wait(WAIT_S)
        run_with_timeout(loop.call, lambda engine: None)  # returns once the loop took it: it has waited since the step
    run_with_timeout(loop.close)
    runs = [c for i, c in enumerate(calls) if i == 0 or c != calls[i - 1]]  # a wait woken by a call waits again
    assert runs == ["idle", "step", "idle", "step", "idle"]


def test_a_loop_serving_a_request_tells_its_governor_of_no_wait_between_its_steps(monkeypatch):
    """Steps back to back are serving, not waiting: a wait reported between two of them would restart the governor's
    interval at every step, and the thread count would never follow the machine."""
    calls = []
    governor = SimpleNamespace(after_step=lambda: calls.append("step"), idle=lambda: calls.append("idle"))
    monkeypatch.setattr(ThreadGovernor, "for_device", classmethod(lambda cls, device: governor))
    loop = run_with_timeout(EngineLoop, CountingEngine)
    finished = threading.Event()
    loop.submit([request("a", max_tokens=3)], lambda out: out.finished and finished.set())
    assert finished.wait(WAIT_S)
    run_with_timeout(loop.close)
    first = calls.index("step")
    assert calls[first : first + 3] == ["step"] * 3
