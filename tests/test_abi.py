"""The generated header as a C/C++ user meets it: it compiles as C and C++ with strict warnings,
its f16/bf16 helpers round like the reference, NAME_info() describes the arguments, and the
generated sources compile warning-free with -Wall -Wextra -Werror under g++ and clang++."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import SAMPLES, build_text

from tilec import driver
from tilec.targets.abi import ABI_VERSION

ON_CI = os.environ.get("CI", "").lower() == "true"


def need(tool: str):
    if shutil.which(tool) is None:
        if ON_CI:
            pytest.fail(f"{tool} is not installed on this CI machine: the ABI tests need it")
        pytest.skip(f"{tool} not found")


def emit(tmp_path, sample: str = "w4a16", target: str = "cpu"):
    src = driver.Source(f"{sample}.tile", (SAMPLES / f"{sample}.tile").read_text())
    m = driver.compile_module(driver.frontend(src), target)
    driver.write_files(tmp_path, driver.render(src, m, target))
    return tmp_path


CONVERT = r"""
#include "w4a16.h"
#include <stdio.h>

int main(void) {
    unsigned h;
    float f;
    for (h = 0; h < 65536u; ++h)
        printf("%a\n", (double)tilec_f16_to_float((tilec_f16)h));
    for (h = 0; h < 65536u; ++h)
        printf("%a\n", (double)tilec_bf16_to_float((tilec_bf16)h));
    while (scanf("%a", &f) == 1)
        printf("%u %u\n", (unsigned)tilec_f16_from_float(f), (unsigned)tilec_bf16_from_float(f));
    return 0;
}
"""


def test_f16_and_bf16_helpers_round_to_nearest_even_from_c(tmp_path):
    """Built as C99 with -Wall -Wextra -Werror -pedantic: every f16/bf16 bit pattern converts
    to the float NumPy gives, and floats (ties, subnormals, overflow, NaN) round as NumPy does."""
    need("gcc")
    out = emit(tmp_path)
    (out / "convert.c").write_text(CONVERT)
    exe = out / "convert"
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
                        "-I", str(out), str(out / "convert.c"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, np.inf, -np.inf,
                         2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * 0.999,
                         1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8],
                        np.float32)
    floats = np.concatenate([specials, -specials,
                             rng.standard_normal(3000).astype(np.float32) * 100,
                             (rng.standard_normal(3000) * 1e-6).astype(np.float32)])
    stdin = "\n".join(float(x).hex() for x in floats) + "\n"
    r = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    to_f16 = np.array([float.fromhex(x) for x in lines[:65536]])
    to_bf16 = np.array([float.fromhex(x) for x in lines[65536:131072]])
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want16 = bits.view(np.float16).astype(np.float64)
    assert np.array_equal(to_f16, want16, equal_nan=True)
    with np.errstate(all="ignore"):  # NaN payloads and overflow to inf are the point here
        want_b = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        want_h = floats.astype(np.float16).view(np.uint16)
    assert np.array_equal(to_bf16, want_b, equal_nan=True)
    got = np.array([[int(v) for v in line.split()] for line in lines[131072:]])
    assert np.array_equal(got[:, 0], want_h)
    from tilec.interp import round_bf16, to_storage
    assert np.array_equal(got[:, 1], to_storage(round_bf16(floats.astype(np.float64)), "bf16"))


class ArgInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_char_p),
                ("rank", ctypes.c_int), ("shape", ctypes.POINTER(ctypes.c_char_p))]


class KernelInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("doc", ctypes.c_char_p), ("abi_version", ctypes.c_int),
                ("target", ctypes.c_char_p), ("num_args", ctypes.c_int),
                ("args", ctypes.POINTER(ArgInfo)), ("num_assumes", ctypes.c_int),
                ("assumes", ctypes.POINTER(ctypes.c_char_p))]


def test_info_describes_the_arguments():
    _, out = build_text((SAMPLES / "w4a16.tile").read_text(), "w4a16.tile")
    fn = ctypes.CDLL(str(out / "libw4a16.so")).w4a16_info
    fn.restype = ctypes.POINTER(KernelInfo)
    info = fn().contents
    assert (info.name, info.abi_version, info.target) == (b"w4a16", ABI_VERSION, b"cpu")
    args = [info.args[i] for i in range(info.num_args)]
    assert [(a.name, a.kind, a.dtype, a.rank) for a in args] == [
        (b"A", 0, b"f16", 2), (b"Wq", 0, b"u4", 2), (b"scales", 0, b"f16", 2),
        (b"C", 1, b"f16", 2), (b"M", 3, None, 0), (b"K", 3, None, 0), (b"N", 3, None, 0)]
    assert [args[2].shape[i] for i in range(2)] == [b"K // 128", b"N"]
    assert [info.assumes[i] for i in range(info.num_assumes)] == [b"K % 128 == 0"]


@pytest.mark.parametrize("cxx", ["g++", "clang++"])
@pytest.mark.parametrize("sample", ["gemm_bias_relu", "attention", "w4a16", "layernorm",
                                    "multi_output", "gemm_gelu_softmax"])
def test_generated_sources_compile_with_strict_warnings(tmp_path, cxx, sample):
    need(cxx)
    out = emit(tmp_path, sample)
    for f in sorted(out.glob("*.cpp")):
        r = subprocess.run([cxx, "-std=c++17", "-fopenmp", "-O2", "-Wall", "-Wextra", "-Werror",
                            "-c", str(f), "-o", str(f.with_suffix(".o"))],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{f.name}:\n{r.stderr[-3000:]}"
    user = out / "user.c"  # a user's file that includes the header
    user.write_text(f'#include "{sample}.h"\nint main(void) {{ return 0; }}\n')
    for lang, std in (("c", "-std=c99"), ("c++", "-std=c++11")):
        comp = "gcc" if cxx == "g++" and lang == "c" else ("clang" if lang == "c" else cxx)
        need(comp)
        r = subprocess.run([comp, "-x", lang, std, "-Wall", "-Wextra", "-Werror", "-pedantic",
                            "-I", str(out), "-fsyntax-only", str(user)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{sample}.h as {lang}:\n{r.stderr[-3000:]}"


UNREAD_SCALAR = """kernel unread(x: i32[R, C], s: f64, y: f16[R, C]) -> out: f16[C]:
    out = max(y, axis=0)
"""


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_scalar_no_kernel_reads_leaves_no_unused_variable(tmp_path, target):
    """A scalar parameter that no kernel reads (found by compiling random programs for CUDA:
    `s` here) gets no launcher local, so the launcher compiles warning-free (-Wall -Wextra
    -Werror with g++; nvcc's own warnings for CUDA)."""
    compiler = "g++" if target == "cpu" else os.environ.get("NVCC", "nvcc")
    need(compiler)
    src = driver.Source("unread.tile", UNREAD_SCALAR)
    m = driver.compile_module(driver.frontend(src), target)
    files = driver.render(src, m, target, {"arch": ("sm_90",)} if target == "cuda" else None)
    driver.write_files(tmp_path, files)
    ext = ".cpp" if target == "cpu" else ".cu"
    cmd = [compiler, "-std=c++17", "-fopenmp", "-O2", "-Wall", "-Wextra", "-Werror"] \
        if target == "cpu" else [compiler, "-std=c++17", "-O1", "-arch=sm_90"]
    for f in sorted(tmp_path.glob(f"*{ext}")):
        r = subprocess.run(cmd + ["-c", str(f), "-o", str(f.with_suffix(".o"))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "warning" not in r.stderr.lower(), r.stderr[-3000:]
        assert "(void)s;" in f.read_text()


def test_tile_scratch_is_kept_per_calling_thread_and_released_on_request():
    """A kernel's tile buffers live in a cache of the calling thread: calls from two threads at
    once, each growing its cache (a row longer than any before) and releasing it between calls,
    all give the reference's results; the release function is in the header and the library."""
    import threading
    _, out = build_text((SAMPLES / "softmax.tile").read_text(), "softmax.tile")
    assert "void softmax_rows_release_scratch(void);" in (out / "softmax.h").read_text()
    lib = ctypes.CDLL(str(out / "libsoftmax.so"))
    lib.softmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.softmax_rows_release_scratch.restype = None
    errors = []

    def worker(seed: int):
        rng = np.random.default_rng(seed)
        for n, cols in enumerate((100, 3000, 50, 20000, 7, 20000)):
            x = rng.standard_normal((5, cols)).astype(np.float32)
            y = np.full_like(x, np.nan)
            status = lib.softmax_rows(x.ctypes.data, y.ctypes.data, 5, cols)
            e = np.exp(x - x.max(axis=1, keepdims=True))
            ref = e / e.sum(axis=1, keepdims=True)
            if status != 0 or not np.allclose(y, ref, rtol=1e-5, atol=1e-7):
                errors.append((seed, cols, status))
            if n % 3 == 2:
                lib.softmax_rows_release_scratch()
    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
