"""The engine loop lets idle OpenMP pools go (engine_loop.release_openmp_threads): a caller's as it hands the loop
work, the loop's own once it waits for some. Counted as the process's threads (/proc/self/task) in a fresh
interpreter, where no other test's pools stand, with torch on two threads: a pool is then one worker thread."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or not torch.backends.openmp.is_available(), reason="Linux + OpenMP torch"
)

SCRIPT = textwrap.dedent(
    """
    import os, threading, time
    from types import SimpleNamespace
    import torch
    torch.set_num_threads(2)
    from minipic_lite.engine_loop import EngineLoop, release_openmp_threads
    from minipic_lite.outputs import RequestMetrics, RequestOutput

    x = torch.arange(1 << 20, dtype=torch.float32) / (1 << 20)
    def work():  # one parallel region: an elementwise op far above torch's grain size
        assert torch.equal(x.exp(), torch.exp(x))

    def threads():
        return len(os.listdir("/proc/self/task"))

    def settle(expected):  # the loop lets its pool go as it starts to wait: a moment after the last output
        deadline = time.monotonic() + 10
        while threads() != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        return threads()

    class Engine:  # a stand-in: each step runs torch work on the loop thread, a request ends after one step
        runner = SimpleNamespace(device=torch.device("cpu"))
        def __init__(self):
            self.waiting = []
        def add(self, req):
            self.waiting.append(req.request_id)
        def step(self):
            work()
            done, self.waiting = self.waiting, []
            return [RequestOutput(r, None, [1], "", [7], 0, True, "length", RequestMetrics(0.0)) for r in done]

    release_openmp_threads()  # NOTE: building x ran parallel regions already
    base = threads()
    work()
    print("main pool", threads() - base)
    print("released", release_openmp_threads(), threads() - base)
    work()
    print("again", threads() - base)
    loop = EngineLoop(Engine)  # the caller's pool goes as the loop builds: one thread more, the loop's
    print("loop built", settle(base + 1) - base)
    finished = threading.Event()
    loop.submit([SimpleNamespace(request_id="a")], lambda out: finished.set())
    assert finished.wait(10)
    print("loop idle", settle(base + 1) - base)
    work()
    print("main pool beside the loop", threads() - base)
    loop.call(lambda engine: work())  # the caller's pool goes as it queues the call; the loop's once it waits
    print("after a call", settle(base + 1) - base)
    loop.close()
    """
)


def test_idle_openmp_pools_are_let_go():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "main pool 1",  # torch's first parallel region on a thread starts its pool
        "released True 0",
        "again 1",  # and the next starts a new one: torch works on after a release
        "loop built 1",
        "loop idle 1",
        "main pool beside the loop 2",
        "after a call 1",
    ]
