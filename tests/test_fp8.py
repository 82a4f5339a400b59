"""8-bit floats (fp8e4m3, fp8e5m2): the reference interpreter's rounding against a brute-force
nearest-even search over every code; the C header's, the CPU library's and the CUDA library's
(host side) conversions against the reference, bit for bit (every code decoded; floats around
every rounding boundary, ties, subnormals, saturation, infinities and NaN encoded); fp8 programs
on the CPU target, and on a GPU with CUDA (the device's conversions, the sm_80 GEMM on f16 and
Hopper's on fp8 wgmma), against the reference; the HIP target refuses them with a located
error."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from conftest import check_text
from test_cuda import GPU_OPTIONS, ON_CI, need_gpu

from tilec import driver
from tilec.diagnostics import TilecError
from tilec.interp import FP8, fp8_bits, fp8_values, round_fp8

FORMATS = sorted(FP8)


def probes(dtype: str) -> np.ndarray:
    """Floats that exercise every rounding decision: each finite fp8 value, the midpoints
    between neighbours (ties) and just either side of them, past the largest value, tiny
    values, infinities, NaN, and random values over the whole range."""
    vals = fp8_values(np.arange(256), dtype)
    grid = np.unique(vals[np.isfinite(vals)])
    mids = (grid[1:] + grid[:-1]) / 2
    f32 = [grid, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
           np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
           [FP8[dtype][2] * 1.03, FP8[dtype][2] * 1.1, 1e30, -1e30, 1e-30, -1e-30, 0.0, -0.0,
            np.inf, -np.inf, np.nan],
           np.random.default_rng(5).standard_normal(4000) * np.exp2(
               np.random.default_rng(6).integers(-20, 18, 4000))]
    return np.concatenate([np.asarray(x, dtype=np.float64) for x in f32]).astype(np.float32)


@pytest.mark.parametrize("dtype", FORMATS)
def test_reference_rounds_to_the_nearest_code_saturating(dtype):
    x = probes(dtype).astype(np.float64)
    vals = fp8_values(np.arange(256), dtype)
    grid = np.unique(vals[np.isfinite(vals)])
    top = FP8[dtype][2]
    got = round_fp8(x, dtype)
    for v, r in zip(x, got):
        if np.isnan(v):
            assert np.isnan(r)
            continue
        c = np.clip(v, -top, top)
        d = np.abs(grid - c)
        near = grid[d == d.min()]
        # a tie goes to the code with an even mantissa (the lower bits of its code)
        want = near[0] if len(near) == 1 else next(
            g for g in near if int(fp8_bits(np.array([g]), dtype)[0]) % 2 == 0)
        assert (r == want and np.signbit(r) == np.signbit(v)) or (r == 0 and want == 0), \
            (v, r, want)
    # codes round-trip
    codes = np.arange(256)
    fin = np.isfinite(vals)
    assert np.array_equal(fp8_bits(vals[fin], dtype), codes[fin].astype(np.uint8))


PROGRAM = r"""
#include "k.h"
#include "LIBRARY"
#include <cstdio>
#include <cstring>
int main() {
    float x;
    unsigned u;
    while (std::scanf("%x", &u) == 1) {
        std::memcpy(&x, &u, sizeof x);
        std::printf("%u %u %u %u\n", tilec_fp8e4m3_from_float(x), tilec::f32_to_fp8e4m3(x),
                    tilec_fp8e5m2_from_float(x), tilec::f32_to_fp8e5m2(x));
    }
    for (int c = 0; c < 256; ++c) {
        const float v[4] = {tilec_fp8e4m3_to_float((uint8_t)c), tilec::fp8e4m3_to_f32((uint8_t)c),
                            tilec_fp8e5m2_to_float((uint8_t)c), tilec::fp8e5m2_to_f32((uint8_t)c)};
        unsigned b[4];
        std::memcpy(b, v, sizeof b);
        std::printf("D %08x %08x %08x %08x\n", b[0], b[1], b[2], b[3]);
    }
    return 0;
}
"""

COMPILERS = {"cpu": ("g++", ["-std=c++17", "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror"],
                     "main.cpp"),
             "cuda": ("nvcc", ["-std=c++17", "-O2", "-Xcompiler", "-Wall,-Wextra", "-Werror",
                               "all-warnings"], "main.cu")}


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_c_and_library_conversions_match_the_reference(tmp_path, target):
    """The header's C helpers (for users) and the target's device library's (the generated code:
    tilec_cpu.h, or tilec_cuda.h's host side, which is its sm_80 device code too) give the
    reference's codes and values."""
    cxx, flags, main = COMPILERS[target]
    if shutil.which(cxx) is None:
        if target == "cuda" and ON_CI:
            pytest.fail("nvcc is not installed on this CI machine: the CUDA tests need it")
        pytest.skip(f"{cxx} not found")
    # the header's helpers as a generated header holds them (any kernel's)
    src = driver.Source("k.tile", "kernel k(X: f32[N]) -> Y: f32[N]:\n    Y = X\n")
    m = driver.compile_module(driver.frontend(src), target)
    files = driver.render(src, m, target)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    library = driver.get_target(target).device_library
    (tmp_path / main).write_text(PROGRAM.replace("LIBRARY", library))
    exe = tmp_path / "conv"
    r = subprocess.run([cxx, *flags, main, "-o", str(exe)], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    xs = np.unique(np.concatenate([probes(d) for d in FORMATS]).view(np.uint32))
    out = subprocess.run([str(exe)], input="\n".join(f"{u:x}" for u in xs), capture_output=True,
                         text=True, check=True).stdout.splitlines()
    enc = np.array([[int(v) for v in line.split()] for line in out[:len(xs)]])
    x = xs.view(np.float32).astype(np.float64)
    for col, dtype in ((0, "fp8e4m3"), (2, "fp8e5m2")):
        want = fp8_bits(round_fp8(x, dtype), dtype)
        assert np.array_equal(enc[:, col], want), dtype
        assert np.array_equal(enc[:, col + 1], want), dtype
    dec = np.array([[int(v, 16) for v in line.split()[1:]] for line in out[len(xs):]],
                   dtype=np.uint32).view(np.float32).astype(np.float64)
    for col, dtype in ((0, "fp8e4m3"), (2, "fp8e5m2")):
        want = fp8_values(np.arange(256), dtype)
        for c in (col, col + 1):
            assert np.array_equal(dec[:, c], want, equal_nan=True), dtype


FP8_PROGRAMS = """
kernel fp8_gemm(A: fp8e4m3[M, K], W: fp8e4m3[N, K], bias: f32[N]) -> C: f16[M, N]:
    C = f16(relu(A @ W.T + bias))

kernel fp8_out(X: f32[R, C]) -> (Y: fp8e4m3[R, C], Z: fp8e5m2[R, C]):
    Y = fp8e4m3(X * 1000.0)
    Z = fp8e5m2(exp(X * 12.0) * 8.0)

kernel fp8_rows(X: fp8e5m2[R, C], s: fp8e4m3) -> Y: fp8e4m3[R, C]:
    Y = fp8e4m3(softmax(f32(X) * f32(s), axis=-1))

kernel fp8_ints(X: fp8e4m3[R, C], Q: u4[R, C], I: i8[R, C]) -> Y: f32[R, C]:
    Y = f32(Q * X + I * X)
"""


@pytest.mark.parametrize("dims", [dict(M=37, N=70, K=300, R=5, C=130),
                                  dict(M=128, N=256, K=256, R=1, C=4096)])
def test_fp8_programs_on_the_cpu_match_the_reference(dims):
    """GEMMs of fp8 operands, fp8 outputs (saturating: X * 1000 passes fp8e4m3's 448, exp(12 X)
    * 8 fp8e5m2's 57344), a row kernel on fp8 data with an fp8 scalar, and fp8 values with
    4- and 8-bit integers (f16 arithmetic, NumPy's promotion of 8-bit ints with a 16-bit float)."""
    check_text(FP8_PROGRAMS, dims, name="fp8.tile", target="cpu")


# the GPU sizes: tile multiples of the sm_80 GEMM (128 x 128 x 64) and of Hopper's fp8 tile
# (128 x 256 x 128), and sizes that are not (K = 300 and 1040: TMA needs 16-byte rows, so the
# first runs the sm_80 kernel on Hopper too)
GPU_DIMS = [dict(M=37, N=70, K=300, R=5, C=130), dict(M=256, N=512, K=512, R=3, C=4096),
            dict(M=200, N=300, K=1040, R=1, C=100000)]


@pytest.mark.gpu
@pytest.mark.parametrize("dims", GPU_DIMS)
def test_fp8_programs_on_gpu_match_the_reference(dims):
    """The fp8 programs on a CUDA GPU: the device's conversions (cvt .satfinite on sm_89 and
    later), the fp8 GEMM (sm_80: operands converted to f16 in the tile copies; sm_90a: wgmma
    on e4m3 from shared memory, both operands K-major)."""
    need_gpu()
    check_text(FP8_PROGRAMS, dims, name="fp8.tile", target="cuda", options=GPU_OPTIONS)


def test_f32_outputs_of_fp8_products_get_a_16_bit_tolerance_on_matrix_units():
    """Hopper's tensor cores accumulate fp8 products in less than f32 precision within a K tile:
    on a target with matrix units, a kernel multiplying fp8 matrices is checked with f16's
    tolerance for its f32 outputs; the CPU (exact f32 sums) and kernels without such a product
    keep f32's."""
    from tilec.interp import tolerance
    from tilec.runner import reduced_precision
    text = FP8_PROGRAMS + """
kernel fp8_f32(A: fp8e5m2[M, K], B: fp8e5m2[K, N]) -> C: f32[M, N]:
    C = f32(A) @ f32(B)

kernel mixed(A: fp8e5m2[M, K], B: f16[K, N]) -> C: f32[M, N]:
    C = A @ B
"""
    m = driver.frontend(driver.Source("r.tile", text))
    got = {t: {g.name for g in m.graphs if reduced_precision(m, g, driver.get_target(t))}
           for t in ("cpu", "cuda")}
    assert got == {"cpu": set(), "cuda": {"fp8_gemm", "fp8_f32"}}
    assert tolerance("f32", 256, reduced=True) == tolerance("f16", 256) > tolerance("f32", 256)


def test_hip_refuses_fp8_tensors():
    src = driver.Source("g.tile", FP8_PROGRAMS)
    with pytest.raises(TilecError, match="fp8e4m3 is not supported on target hip") as e:
        driver.compile_module(driver.frontend(src), "hip")
    assert e.value.loc.line == 2
