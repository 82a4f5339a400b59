"""Integer arithmetic: results wrap around in their dtype (two's complement, as NumPy's fixed-width
integers do; 4-bit ones too, though C holds them in 32 bits); conversions (casts, literals,
assignments from floats) saturate. The generated code, the Tile IR and the reference interpreter
agree on inputs that span each dtype's whole range, so overflow happens in nearly every element."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import check_text
from test_cuda import need_gpu, need_nvcc
from test_tile_level import agree

from tilec import interp

WRAP = """
kernel narrow(A: i8[N], B: i8[N], U: u8[N], V: u8[N], H: i16[N]) -> (C: i8[N], D: u8[N], E: i16[N], F: i8[N]):
    C = (A + B) * A - (-B)
    D = (U - V) * V + ~U
    E = H * H + H ** 3 - abs(H)
    F = abs(A) + relu(B) * 3

kernel wide(A: i32[N], B: i32[N], X: i64[N], Y: i64[N]) -> (C: i32[N], Z: i64[N], P: i64[N]):
    C = A * B + A - B * 7
    Z = X * Y - (X + Y)
    P = X ** 37 + i64(A ** 300) - i64(i8(B) ** 5)

kernel sums(A: i8[R, C], B: i32[R, C]) -> (S: i8[R], T: i32[R], M: i8[R]):
    S = sum(A * A, axis=-1)
    T = sum(B, axis=-1)
    M = max(A + A, axis=-1)

kernel packed(P: i4[R, N], Q: u4[R, N]) -> (C4: i8[R, N], D4: u8[R, N], M4: i8[R], E4: i16[R, N]):
    C4 = i8(abs(P) + P * P - (-P))
    D4 = u8(Q * Q + Q * 7 - (Q + Q))
    M4 = max(abs(P) * 3, axis=-1)
    E4 = i16(Q * N) + i16(P * R)

kernel products4(P: i4[M, K], Q: u4[K, N], U: u4[M, K]) -> (C: i32[M, N], D: i32[M, N]):
    C = P @ Q
    D = U @ Q

kernel casts(A: i32[N], X: f32[N]) -> (C: i8[N], D: u8[N], E: i16[N]):
    C = i8(A)
    D = u8(A) + 200
    E = i16(X * 100000.0)
"""

DIMS = [dict(N=1000, R=7, C=300, M=33, K=101), dict(N=17, R=3, C=5000, M=130, K=64)]


def test_wrap_semantics_of_the_reference():
    """The reference is NumPy's fixed-width arithmetic for operations, and saturation for
    conversions."""
    a = np.array([100, -128, 127], np.int64)
    assert interp.wrap(a + a, "i8").tolist() == (a.astype(np.int8) + a.astype(np.int8)).tolist()
    assert interp.wrap(np.array([0 - 1]), "u8").tolist() == [255]
    assert interp.quantize(np.array([300, -5]), "u8").tolist() == [255, 0]
    assert interp.wrap(np.array([2**31]), "i32").tolist() == [-2**31]


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"N{d['N']}")
def test_integer_programs_match_the_reference_exactly_on_the_cpu(dims):
    res = check_text(WRAP, dims, full_ints=True)
    for name, r in res.items():
        assert all(e == 0 for e in r.errors.values()), (name, r.errors)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_integer_programs_tile_ir_agrees_with_the_reference(target):
    agree(WRAP, target, DIMS[0], seed=5, full_ints=True)


@pytest.mark.nvcc
def test_integer_programs_compile_for_cuda():
    need_nvcc()
    from conftest import build_text
    build_text(WRAP, "ints.tile", "cuda", {"arch": ("sm_80",)})


@pytest.mark.gpu
def test_integer_programs_match_the_reference_exactly_on_gpu():
    need_gpu()
    for dims in DIMS:
        res = check_text(WRAP, dims, target="cuda", options={"arch": ("sm_90",)}, full_ints=True)
        for name, r in res.items():
            assert all(e == 0 for e in r.errors.values()), (name, r.errors)


def test_a_product_of_4_bit_integers_multiplies_them_as_i8_into_i32():
    """`A @ B` of 4-bit integers returns i32, as of i8 (it returned the 4-bit dtype, and the GPU
    targets failed inside the compiler on its 4-bit operand tiles): each operand converts to i8
    first, which holds every 4-bit value, and the targets multiply i8 tiles."""
    from tilec import driver
    for a, b in (("u4", "u4"), ("i4", "i4"), ("i4", "u4"), ("u4", "i8")):
        text = f"kernel p(A: {a}[M, K], B: {b}[K, N]) -> C: i32[M, N]:\n    C = A @ B\n"
        m0 = driver.frontend(driver.Source("p.tile", text))
        (mm,) = [o for o in m0.graphs[0].ops if o.kind == "matmul"]
        assert mm.type.dtype == "i32" and \
            [m0.graphs[0].ops[x].type.dtype for x in mm.args] == ["i8", "i8"], (a, b)
        for target in ("cpu", "cuda", "hip"):
            driver.compile_module(m0, target)


def test_integer_powers_are_exact_integer_code_on_every_target():
    """An integer power is ipow_wrap in every target's code (the CUDA renderer sent exponents
    above 4 to the float pow, whose result also broke an index)."""
    from tilec import driver
    text = "kernel p(X: i64[N]) -> Y: i64[N]:\n    Y = X ** 37 + X ** 2\n"
    m0 = driver.frontend(driver.Source("p.tile", text))
    for target in ("cpu", "cuda", "hip"):
        m = driver.compile_module(m0, target)
        src = "".join(v for k, v in driver.render(driver.Source("p.tile", text), m, target).items()
                      if k.endswith((".cpp", ".cu", ".hip")))
        assert src.count("tilec::ipow_wrap<int64_t>(") >= 2 and \
            not re.search(r"[^_]pow\(", src), target
