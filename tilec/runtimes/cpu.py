"""Host memory: tensors are numpy arrays passed by address; calls are timed with a host clock."""

from __future__ import annotations

import ctypes
import time


def cpu_use(window: float) -> float:
    """Cores this process kept busy (all its threads) over the next `window` seconds."""
    import resource
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(window)
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    return (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (w1 - w0)


def wait_until_quiet(limit: float = 1.0, window: float = 0.02) -> float:
    """Wait (at most `limit` seconds) until this process's threads are idle, before timing a
    kernel: numpy's OpenBLAS pool spins for a while after numpy is imported and after each of
    its products, and on a machine with few cores that spinning thread takes a core from the
    kernel's OpenMP threads (a 3x100x300x72 GEMM timed 0.13 ms quiet and 5-8 ms in 5 of 8
    runs on 2 cores). Returns the seconds waited."""
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < limit and cpu_use(window) > 0.05:
            pass
    except ImportError:  # no `resource` (not a Unix): time as it is
        pass
    return time.perf_counter() - t0


class Runtime:
    name = "cpu"

    def __init__(self):
        self._keep = []

    def upload(self, array):
        self._keep.append(array)
        return ctypes.c_void_p(array.ctypes.data)

    def output(self, array):
        """Memory for an output, initialized with `array`'s (poison) contents."""
        self._keep.append(array)
        return ctypes.c_void_p(array.ctypes.data)

    def download(self, handle, array):
        return array  # the library wrote the host array itself

    def trailing_args(self) -> list:
        return []

    def time(self, call, repeat: int, batch: int = 1) -> list:
        """Seconds per call: `repeat` samples of `batch` calls each, by the host's clock."""
        if repeat > 1:
            wait_until_quiet()
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            n, status = 0, 0
            while n < batch and status == 0:  # (a failing call ends the sample)
                status = call()
                n += 1
            out.append((time.perf_counter() - t0) / n)
            if status != 0:
                break
        return out

    def close(self):
        self._keep.clear()
