"""A CPU engine's thread count follows the cores that other programs leave free.

torch splits each op's work evenly over its threads, so one thread that shares its core with another program holds
up every parallel region of a step: the engine then runs several times slower than on fewer threads (`docs/CPU.md`,
"A busy core" has the figures). Every `INTERVAL_S` of serving, the loop thread compares the CPU time its process
used with what the machine's cores (those this process may run on) did: what others used is the rest, and the engine
takes the cores they leave, rounded, at least one and at most the threads it started with.
Off where the user chose a count (`OMP_NUM_THREADS`), with `MINIPIC_ADAPT_THREADS=0`, or on CUDA (one host thread
there: `fewer_cpu_threads`). A change of thread count can move float32 sums by a rounding (MKL's matmul splits its
work by threads): a run on a busy machine need not repeat an idle run's logits bit for bit.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
INTERVAL_S = 0.5  # seconds of serving between two looks at the machine
ENV_SWITCH = "MINIPIC_ADAPT_THREADS"


def threads_for(max_threads: int, num_cores: int, machine_busy: float, own_busy: float) -> int:
    """Threads to run on `num_cores` cores when, over the last interval, they were busy `machine_busy` cores' worth
    and this process `own_busy` of it: the cores other programs left, rounded half up, within [1, max_threads]."""
    others = max(0.0, machine_busy - own_busy)
    return max(1, min(max_threads, int(num_cores - others + 0.5)))


def busy_seconds(stat: str, cores: set[int], ticks_per_s: float) -> float:
    """Seconds the given cores spent on anything but idle and I/O wait, from /proc/stat's text (per-core lines)."""
    total = 0.0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
            ticks = [int(f) for f in fields]
            total += sum(ticks[:8]) - ticks[3] - ticks[4]  # user nice system idle iowait irq softirq steal
    return total / ticks_per_s


class ThreadGovernor:
    def __init__(self, clock=time.monotonic, process_time=time.process_time, read_stat=None):
        self.max_threads = torch.get_num_threads()
        self.cores = os.sched_getaffinity(0)
        self._clock, self._process_time = clock, process_time
        self._read_stat = read_stat or (lambda: Path("/proc/stat").read_text())
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._last = None  # (wall, own CPU, machine busy) at the last look

    @classmethod
    def for_device(cls, device: torch.device) -> ThreadGovernor | None:
        """A governor for a CPU engine where the user left the thread count to torch and Linux's /proc/stat is there."""
        chosen = "OMP_NUM_THREADS" in os.environ or os.environ.get(ENV_SWITCH, "1") == "0"
        wanted = device.type == "cpu" and not chosen and torch.get_num_threads() > 1
        return cls() if wanted and Path("/proc/stat").exists() else None

    def after_step(self) -> None:
        """Called by the loop after each step: every INTERVAL_S, set torch's thread count from the last interval."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < INTERVAL_S:
            return
        sample = (now, self._process_time(), busy_seconds(self._read_stat(), self.cores, self._ticks_per_s))
        if self._last is not None:
            wall = sample[0] - self._last[0]
            machine, own = (sample[2] - self._last[2]) / wall, (sample[1] - self._last[1]) / wall
            threads = threads_for(self.max_threads, len(self.cores), machine, own)
            if threads != torch.get_num_threads():
                logger.info("torch threads %d -> %d (other programs used %.1f of %d cores)", torch.get_num_threads(),
                            threads, max(0.0, machine - own), len(self.cores))  # fmt: skip
                torch.set_num_threads(threads)
        self._last = sample

    def idle(self) -> None:
        """The loop waits for work: the next interval starts at the next step (a wait is not serving)."""
        self._last = None
