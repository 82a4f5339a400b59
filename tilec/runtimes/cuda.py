"""Device memory through the CUDA runtime library (ctypes on libcudart, no PyTorch needed):
inputs are copied to the device, outputs back; calls are timed with CUDA events on the default
stream."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

from ..diagnostics import TilecError

_H2D, _D2H = 1, 2


def _find_cudart() -> str:
    if os.environ.get("TILEC_CUDART"):
        return os.environ["TILEC_CUDART"]
    found = ctypes.util.find_library("cudart")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/opt/cuda"]
    pats = [os.path.join(r, "lib64", "libcudart.so*") for r in roots if r]
    pats += [os.path.join(p, "nvidia", "*", "lib", "libcudart.so*") for p in sys.path]
    pats += [os.path.join(p, "nvidia", "cu*", "lib", "libcudart.so*") for p in sys.path]
    for pat in pats:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    raise TilecError("tilec run --target cuda needs the CUDA runtime library (libcudart.so); "
                     "install the CUDA toolkit or set TILEC_CUDART to its path")


def arch_for(major: int, minor: int, choices) -> str | None:
    """The --arch that builds for a device of compute capability major.minor: its own sm_XY
    (sm_90a on an H100/H200: the Hopper kernels), None when `choices` has none."""
    for arch in (f"sm_{major}{minor}a", f"sm_{major}{minor}"):
        if arch in choices:
            return arch
    return None


class Runtime:
    name = "cuda"

    def __init__(self):
        try:
            self.rt = ctypes.CDLL(_find_cudart())
        except OSError as e:
            raise TilecError(f"cannot load the CUDA runtime: {e}") from None
        self.rt.cudaGetErrorString.restype = ctypes.c_char_p
        n = ctypes.c_int(0)
        if self.rt.cudaGetDeviceCount(ctypes.byref(n)) != 0 or n.value == 0:
            raise TilecError("tilec run --target cuda: no CUDA device is available")
        self._ptrs = []

    def device_arch(self, choices) -> str | None:
        """arch_for the current device (None if it cannot be read or is not in `choices`)."""
        dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if self.rt.cudaGetDevice(ctypes.byref(dev)) != 0:
            return None
        for attr, out in ((75, major), (76, minor)):  # cudaDevAttrComputeCapabilityMajor/Minor
            if self.rt.cudaDeviceGetAttribute(ctypes.byref(out), attr, dev) != 0:
                return None
        return arch_for(major.value, minor.value, choices)

    def _check(self, code: int, what: str):
        if code != 0:
            msg = self.rt.cudaGetErrorString(code).decode()
            raise TilecError(f"CUDA error in {what}: {msg} ({code})")

    def _alloc(self, nbytes: int):
        p = ctypes.c_void_p()
        self._check(self.rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(nbytes, 1))),
                    "cudaMalloc")
        self._ptrs.append(p)
        return p

    def upload(self, array):
        p = self._alloc(array.nbytes)
        self._check(self.rt.cudaMemcpy(p, ctypes.c_void_p(array.ctypes.data),
                                       ctypes.c_size_t(array.nbytes), _H2D), "cudaMemcpy")
        return p

    def output(self, array):
        return self.upload(array)  # poisoned contents: an element the kernel skips shows up

    def download(self, handle, array):
        self._check(self.rt.cudaDeviceSynchronize(), "the kernel")
        self._check(self.rt.cudaMemcpy(ctypes.c_void_p(array.ctypes.data), handle,
                                       ctypes.c_size_t(array.nbytes), _D2H), "cudaMemcpy")
        return array

    def trailing_args(self) -> list:
        return [ctypes.c_void_p(0)]  # the default stream

    def time(self, call, repeat: int, batch: int = 1) -> list:
        """Seconds per call: `repeat` samples, each `batch` calls between two CUDA events on the
        default stream (the caller's checked call came first: the warm-up). In a batch the host
        issues the next call while the device runs the last, so a short kernel is not timed with
        the host's idle gaps."""
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.rt.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
        self._check(self.rt.cudaEventCreate(ctypes.byref(end)), "cudaEventCreate")
        out = []
        try:
            for _ in range(repeat):
                self.rt.cudaEventRecord(start, ctypes.c_void_p(0))
                n, status = 0, 0
                while n < batch and status == 0:  # (a failing call ends the sample)
                    status = call()
                    n += 1
                self.rt.cudaEventRecord(end, ctypes.c_void_p(0))
                self._check(self.rt.cudaEventSynchronize(end), "the kernel")
                ms = ctypes.c_float()
                self.rt.cudaEventElapsedTime(ctypes.byref(ms), start, end)
                out.append(ms.value / 1e3 / n)
                if status != 0:
                    break
        finally:
            self.rt.cudaEventDestroy(start)
            self.rt.cudaEventDestroy(end)
        return out

    def close(self):
        for p in self._ptrs:
            self.rt.cudaFree(p)
        self._ptrs.clear()
