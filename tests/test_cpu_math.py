"""The CPU device library's vectorizable math (tilec_cpu.h: exp, exp2, log, log2, log1p, tanh,
erf, erfc and the activations built on them) against numpy in double: the accuracy their comments
claim, the special values, with and without fused multiply-adds, and that they vectorize."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tilec

TEMPLATES = Path(tilec.__file__).parent / "templates"

PROGRAM = r"""
#include "tilec_cpu.h"
#include <cstdio>
#include <initializer_list>
int main() {
    float x;
    while (std::scanf("%a", &x) == 1) {
        for (float y : {FNS}) std::printf("%a ", y);
        std::printf("\n");
    }
}
"""


def evaluate(tmp: Path, march: str, fns: list, x: np.ndarray) -> np.ndarray:
    """tilec_cpu.h's functions `fns` (names, or calls of x such as `pow_f32(x, 0.5)`) of each x,
    built with -march=`march`: one row per x (skips where g++ or the -march is missing)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    src = tmp / "fns.cpp"
    src.write_text(PROGRAM.replace("FNS", ", ".join(f"tilec::{f}" if "(" in f else f"tilec::{f}(x)"
                                                    for f in fns)))
    exe = tmp / "fns"
    r = subprocess.run(["g++", "-std=c++17", "-O2", f"-march={march}", "-ffp-contract=off",
                        "-fno-math-errno", f"-I{TEMPLATES / 'cpu'}", f"-I{TEMPLATES / 'common'}",
                        str(src), "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0 and "march" in r.stderr:
        pytest.skip(f"g++ here does not take -march={march}")
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], input="\n".join(float(v).hex() for v in x),
                         capture_output=True, text=True, check=True).stdout.split()
    return np.array([float.fromhex(v) for v in out], np.float32).reshape(len(x), len(fns))


def inputs() -> np.ndarray:
    sweep = np.arange(-200.0, 200.0, 0.0137, dtype=np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 1e30, -1e30, 3.4e38, -3.4e38, 0.0, -0.0, 88.7,
                        88.72, 88.73, 89.0, 103.9, 104.0, 104.1, -87.3, -100.0, -103.97, -104.0,
                        -104.1, 1e-40, -1e-40, 1e-7, -1e-7], np.float32)
    return np.concatenate([sweep, special])


@pytest.mark.parametrize("march", ["native", "x86-64-v2"])
@pytest.mark.parametrize("fn", ["exp_f32", "exp2_f32"])
def test_exp_f32_accuracy_and_special_values(tmp_path, march, fn):
    with np.errstate(over="ignore"):  # (the largest inputs scale to inf: still special values)
        x = inputs() * np.float32(1.4426950408889634 if fn == "exp2_f32" else 1.0)
    got = evaluate(tmp_path, march, [fn], x)[:, 0]
    with np.errstate(over="ignore"):
        ref = (np.exp2 if fn == "exp2_f32" else np.exp)(x.astype(np.float64))
        ref32 = ref.astype(np.float32)  # the correctly rounded result (inf past FLT_MAX)
    assert np.isnan(got[np.isnan(x)]).all()
    assert (got[x == np.inf] == np.inf).all() and (got[x == -np.inf] == 0).all()
    finite = ~np.isnan(x)
    # overflow and underflow land where the correctly rounded result does
    assert (np.isinf(got[finite]) == np.isinf(ref32[finite])).all()
    normal = finite & (ref > np.finfo(np.float32).tiny) & np.isfinite(ref32)
    rel = np.abs(got[normal].astype(np.float64) - ref[normal]) / ref[normal]
    assert rel.max() <= 1.5e-7, (rel.max(), x[normal][rel.argmax()])
    # results below the normal range: within one subnormal step (2^-149)
    small = finite & (ref <= np.finfo(np.float32).tiny)
    assert (np.abs(got[small].astype(np.float64) - ref[small]) <= 2.0 ** -149).all()


@pytest.mark.parametrize("march", ["native", "x86-64-v2"])
def test_exp_of_an_argument_up_to_44_is_exp_f32_bit_for_bit(tmp_path, march):
    """exp_nonpos_f32 (one scale instead of two) gives exp_f32's bits for every x <= 44: the
    sweep, the subnormal results, -inf, -0 and NaN. The renderer takes it where the argument is
    at most 0 (softmax's exp(x - max(x)), sigmoid's exp(-|x|)) or at most 8 ln 2 (attention's
    scores against a max kept while new ones exceed it by that much)."""
    neg = -np.abs(np.concatenate([inputs(), np.arange(86.0, 105.0, 0.0011, dtype=np.float32)]))
    pos = np.concatenate([np.linspace(0.0, 44.0, 100001, dtype=np.float32),
                          np.nextafter(np.float32(44.0), np.float32(0.0), dtype=np.float32)[None]])
    x = np.concatenate([neg, pos])
    got = evaluate(tmp_path, march, ["exp_f32", "exp_nonpos_f32"], x)
    assert np.isnan(got[np.isnan(x)]).all()
    ok = ~np.isnan(x)
    assert (got[ok, 0].view(np.uint32) == got[ok, 1].view(np.uint32)).all(), \
        x[ok][got[ok, 0] != got[ok, 1]][:10]
    assert (got[ok, 1] < np.finfo(np.float32).tiny).sum() > 1000  # subnormal results were tried
    assert got[-1, 1] > 1e19  # the top of the domain was tried


_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _softplus(x):
    return np.logaddexp(0.0, x)


# each function's reference in double and its bound in units in the last place of the float
# result (below the normal range: in steps of 2^-149); the bounds are those the comments in
# tilec_cpu.h state, which a check of every float (bench/cpu_math_ulp.cpp) measured
MATH = {
    "log_f32": (np.log, 1.0),
    "log2_f32": (np.log2, 2.0),
    "log1p_f32": (np.log1p, 1.0),
    "sin_f32": (np.sin, 2.0),
    "cos_f32": (np.cos, 2.0),
    "tanh_f32": (np.tanh, 2.5),
    "erf_f32": (lambda x: _erf(x).astype(np.float64), 3.0),
    "erfc_f32": (lambda x: _erfc(x).astype(np.float64), 7.0),
    "sigmoid": (lambda x: np.exp(-np.logaddexp(0.0, -x)), 3.0),
    # (silu is x times a rounded sigmoid: where that is subnormal, results below 1e-36 are off by
    # up to about 100 steps of 2^-149; checked apart below)
    "silu": (lambda x: x * np.exp(-np.logaddexp(0.0, -x)), 4.0),
    "gelu": (lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)).astype(np.float64), 7.0),
    "softplus": (_softplus, 2.0),
    "mish": (lambda x: x * np.tanh(_softplus(x)), 5.0),
}


def math_inputs() -> np.ndarray:
    """inputs() plus every scale of positive and negative floats, subnormals to the largest, and
    a fine sweep near 0 (the small-argument paths)."""
    scales = np.logspace(-45, 38.5, 20000).astype(np.float32)
    # (and the floats nearest a multiple of pi/2 for sin and cos: 1.57079637, 2^23 k pi/2-ish)
    hard = np.array([1.5707964, 3.1415927, 4.712389, 6.2831855, 1e6, 16367173.0, 8.9e7, 1.4e10,
                     2.0 ** 60, 2.0 ** 100, 3.4e38], np.float32)
    near0 = np.linspace(-1.0, 1.0, 20001, dtype=np.float32)
    return np.concatenate([inputs(), scales, -scales, near0, hard, -hard,
                           np.array([1.0, -1.0, 2.0, 0.5, 1024.0, 20.0, -20.0, 9.5, 10.19, 14.41,
                                     -14.41, -150.0, -1e38], np.float32)])


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units in the last place of the float nearest ref (2^-149 below the normal
    range)."""
    mag = np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
    ulp = np.ldexp(1.0, np.frexp(mag)[1] - 24)
    return np.abs(got.astype(np.float64) - ref) / ulp


@pytest.mark.parametrize("march", ["native", "x86-64-v2"])
def test_log_tanh_erf_and_activations_accuracy_and_special_values(tmp_path, march):
    x = math_inputs()
    got = evaluate(tmp_path, march, list(MATH), x)
    x64 = x.astype(np.float64)
    for n, (fn, (reference, bound)) in enumerate(MATH.items()):
        with np.errstate(all="ignore"):
            ref = np.asarray(reference(x64), np.float64)
        g = got[:, n]
        assert (np.isnan(g) == np.isnan(ref)).all(), (fn, x[np.isnan(g) != np.isnan(ref)][:5])
        with np.errstate(over="ignore"):
            ref32 = ref.astype(np.float32)
        ok = ~np.isnan(ref)
        assert (g[ok & np.isinf(ref32)] == ref32[ok & np.isinf(ref32)]).all(), fn
        finite = ok & np.isfinite(ref32)
        if fn == "silu":
            tiny = finite & (np.abs(ref) < 1e-36)
            assert (np.abs(g[tiny] - ref[tiny]) <= 128 * 2.0 ** -149).all(), fn
            finite &= ~tiny
        err = ulp_error(g[finite], ref[finite])
        assert err.max() <= bound, (fn, march, err.max(), x[finite][err.argmax()])
        # zeros keep their sign: f(-0) = -0 for the odd functions and log1p, and results that
        # round to 0 have the sign of the value they round from
        zero = finite & (ref32 == 0)
        wrong_sign = np.signbit(g[zero]) != np.signbit(ref32[zero])
        assert not wrong_sign.any(), (fn, x[zero][wrong_sign][:5])


EXPONENTS = [-0.5, 1.5, -1.5, 2.2, 1 / 3, 0.25, 10.5, 7.0, -5.0, 6.0, -6.0, 1e-3, 37.0]


@pytest.mark.parametrize("march", ["native", "x86-64-v2"])
def test_pow_of_a_constant_exponent_is_within_one_ulp_with_c_special_values(tmp_path, march):
    """pow_f32(x, c) (x ** c for a constant c that is not a small integer, nor 0.5, which is
    sqrt as in numpy) against numpy's double power: within 1 ulp, and C's special values
    (negative x: NaN unless c is an integer, then signed by c's parity; zeros and infinities by
    c's sign and parity; 1 ** c = 1)."""
    x = np.concatenate([math_inputs(), np.array([1.0, -1.0, 2.0, -2.0, 0.0, -0.0], np.float32)])
    got = evaluate(tmp_path, march, [f"pow_f32(x, {c!r})" for c in EXPONENTS], x)
    for n, c in enumerate(EXPONENTS):
        with np.errstate(all="ignore"):
            ref = np.power(x.astype(np.float64), c)
            ref32 = ref.astype(np.float32)
        g = got[:, n]
        assert (np.isnan(g) == np.isnan(ref)).all(), (c, x[np.isnan(g) != np.isnan(ref)][:5])
        ok = ~np.isnan(ref)
        assert (g[ok & np.isinf(ref32)] == ref32[ok & np.isinf(ref32)]).all(), c
        finite = ok & np.isfinite(ref32)
        err = ulp_error(g[finite], ref[finite])
        assert err.max() <= 1.0, (c, march, err.max(), x[finite][err.argmax()])
        zero = finite & (ref32 == 0)
        assert (np.signbit(g[zero]) == np.signbit(ref32[zero])).all(), c


SPECIAL_PROGRAM = """
kernel k(X: f32[N]) -> (A: f32[N], B: f32[N], C: f32[N], D: f32[N], E: f32[N], F: f32[N],
                        G: f32[N], H: f32[N], I: f32[N], J: f32[N], K: f32[N], L: f32[N],
                        M: f32[N], P: f32[N], Q: f32[N]):
    A = X ** 0.5
    B = X ** 1.5
    C = X ** -2.5
    D = log(X)
    E = log2(X)
    F = tanh(X)
    G = sin(X)
    H = cos(X)
    I = erf(X)
    J = gelu(X)
    K = softplus(X)
    L = mish(X)
    M = silu(X)
    P = sigmoid(X)
    Q = X ** 7.0
"""


def test_generated_code_gives_the_references_special_values():
    """A built kernel (the renderer's choice of function included, e.g. x ** 0.5 as sqrt, as
    numpy has it) gives the reference interpreter's NaNs, infinities and signed zeros."""
    from conftest import build_text

    from tilec import interp
    from tilec.runner import call_library
    x = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0, 1.0, 1e-40, -1e-40, 3.4e38, -3.4e38,
                  -100.0, 100.0, -120.0, 2.0, 0.5], np.float32)
    m0, out = build_text(SPECIAL_PROGRAM, "special.tile")
    g = m0.graphs[0]
    dims = {"N": len(x)}
    got = call_library(out / "libspecial.so", g, {"X": x}, dims)
    with np.errstate(all="ignore"):
        ref = interp.run_graph(g, {"X": x}, dims)
    for name in ref:
        r, v = np.asarray(ref[name], np.float32), got[name]
        assert (np.isnan(v) == np.isnan(r)).all(), (name, x[np.isnan(v) != np.isnan(r)])
        ok = ~np.isnan(r)
        inf = ok & np.isinf(r)
        assert (np.isinf(v[ok]) == inf[ok]).all() and (v[inf] == r[inf]).all(), name
        zero = ok & (r == 0)
        assert (np.signbit(v[zero]) == np.signbit(r[zero])).all(), (name, x[zero])
        fin = ok & np.isfinite(r) & (r != 0)
        # (atol: silu's results below 1e-36, x times a subnormal sigmoid)
        assert np.allclose(v[fin], r[fin], rtol=1e-5, atol=2e-43), (name, x[fin], v[fin], r[fin])


@pytest.mark.parametrize("cxx", ["g++", "clang++"])
def test_a_kernel_of_every_math_function_compiles_with_strict_warnings(tmp_path, cxx):
    """The generated source of SPECIAL_PROGRAM (fifteen functions: powers, log, log2, tanh,
    sin, cos, erf, gelu, softplus, mish, silu, sigmoid) is warning-free under -Wall -Wextra
    -Werror with g++ and clang++, as docs/INTEGRATION.md promises of every generated source."""
    from test_abi import need

    from tilec import driver
    need(cxx)
    src = driver.Source("special.tile", SPECIAL_PROGRAM)
    m = driver.compile_module(driver.frontend(src), "cpu")
    driver.write_files(tmp_path, driver.render(src, m, "cpu"))
    sources = sorted(tmp_path.glob("*.cpp"))
    assert sources
    for f in sources:
        r = subprocess.run([cxx, "-std=c++17", "-fopenmp", "-O2", "-Wall", "-Wextra", "-Werror", "-c",
                            str(f), "-o", str(f.with_suffix(".o"))], capture_output=True, text=True)
        assert r.returncode == 0, f"{f.name}:\n{r.stderr[-3000:]}"


def test_sin_and_cos_reduce_with_the_table_the_generator_makes():
    """tilec_cpu.h's table of (2^e 2/pi) mod 4 is what tools/two_over_pi_table.py prints (2/pi
    from Machin's formula in integers), and that 2/pi agrees with math.pi's 53 bits."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "two_over_pi_table", Path(__file__).resolve().parents[1] / "tools" / "two_over_pi_table.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.c_table() in (TEMPLATES / "cpu" / "tilec_cpu.h").read_text()
    assert abs(gen.two_over_pi(60) / 2 ** 60 - 2 / math.pi) < 1e-16


ACTIVATIONS = ["exp_f32(x[i])", "exp2_f32(x[i])", "exp_nonpos_f32(x[i])", "gelu_tanh(x[i])",
               "relu(x[i])", "maximum(x[i], 0.5f)", "pow_f32(x[i], 1.5)", "round_f16(x[i])",
               "f16_to_f32(tilec::f32_to_f16(x[i] * 3.0f))",
               # (a where() as the CPU renderer writes it: g++ blends the two sides where
               # -fno-trapping-math lets it compute both)
               "exp_f32(x[i] > 0.0f ? x[i] * 2.0f : tilec::exp_f32(x[i]))"] + \
              [f"{fn}(x[i])" for fn in MATH]


@pytest.mark.parametrize("march", ["x86-64-v2", "x86-64-v3", "native"])
def test_activations_vectorize_on_every_instruction_set(tmp_path, march):
    """exp, log, sin, cos, tanh, erf, pow and the activations built on them vectorize inside
    `omp simd` loops with SSE, AVX2 and AVX-512 alike (g++'s own report). Float selects became
    branches that only AVX-512's masks vectorize: sigmoid's around a multiply (the default AVX2
    build of an elementwise chain with silu ran scalar, 6x slower), mish's clamp, log's special
    values around the whole function; sin's table gather of doubles needed a 64-bit index under
    AVX2, and a double floor or fmin became a libm call. f16 conversions with branches, or
    F16C's on one value, kept every loop that converts scalar (f16 programs ran up to 18x
    slower than f32 ones); so did a where() under -ftrapping-math (the Makefile's flags here)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    src = tmp_path / "act.cpp"
    src.write_text('#include "tilec_cpu.h"\n' + "".join(
        f"void f{n}(const float* __restrict x, float* __restrict y, long n) {{\n"
        f"    #pragma omp simd\n    for (long i = 0; i < n; ++i) y[i] = tilec::{e};\n}}\n"
        for n, e in enumerate(ACTIVATIONS)))
    r = subprocess.run(["g++", "-std=c++17", "-O3", f"-march={march}", "-fopenmp", "-ffp-contract=off",
                        "-fno-math-errno", "-fno-trapping-math", f"-I{TEMPLATES / 'cpu'}",
                        f"-I{TEMPLATES / 'common'}", "-fopt-info-vec-optimized", "-c", str(src),
                        "-o", str(tmp_path / "act.o")],
                       capture_output=True, text=True)
    if r.returncode != 0 and "march" in r.stderr:
        pytest.skip(f"g++ here does not take -march={march}")
    assert r.returncode == 0, r.stderr
    vectorized = {int(line.split(":")[1]) for line in r.stderr.splitlines()
                  if "loop vectorized" in line and line.startswith(str(src))}
    loops = [4 + 4 * n for n in range(len(ACTIVATIONS))]  # the line of each function's `for`
    missed = [e for n, e in enumerate(ACTIVATIONS) if loops[n] not in vectorized]
    assert not missed, (march, missed, r.stderr[-2000:])


@pytest.mark.parametrize("n", [1024, 2048, 1000])
def test_gemm_with_a_row_stride_of_whole_4k_pages_matches_the_reference(n):
    """B's rows 4 KiB apart (N = 1024, 2048 f32) are packed before the micro-kernel instead of
    read in place (every row of a panel in one L1 set); other strides keep the direct read. Both
    match the reference, ragged M and K included."""
    from conftest import check_text
    text = "kernel g(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n"
    check_text(text, dict(M=37, K=300, N=n))
