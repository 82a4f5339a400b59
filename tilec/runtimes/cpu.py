"""Host memory: tensors are numpy arrays passed by address; calls are timed with a host clock."""

from __future__ import annotations

import ctypes
import time


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

    def time(self, call, repeat: int) -> list:
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            status = call()
            out.append(time.perf_counter() - t0)
            if status != 0:
                return out
        return out

    def close(self):
        self._keep.clear()
