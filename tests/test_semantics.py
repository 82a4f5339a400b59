"""Small programs for language corners the samples do not reach, each built for the CPU and
checked against the reference interpreter."""

from __future__ import annotations

import pytest
from conftest import check_text, compile_text

from tilec import driver, interp

PROGRAMS = {
    "integer_division_by_zero_is_zero": """
kernel k(X: i32[N], Y: i32[N]) -> (Q: i32[N], R: i32[N]):
    Q = X // (Y - 3)
    R = X % (Y - 3)
""",
    "powers": """
kernel k(X: f32[N]) -> Y: f32[N]:
    Y = X ** 2 + (X * X + 1.0) ** -1 + (X * X) ** 0.5 + X ** 100000
""",
    "saturating_integer_outputs": """
kernel k(X: f32[N]) -> (A: i8[N], B: u8[N], C: i16[N]):
    A = X * 1000.0
    B = X * 300.0
    C = X * 1e6
""",
    "bool_and_comparisons": """
kernel k(X: f32[R, C], t: f32) -> (M: u8[R, C], Y: f32[R, C]):
    big = (X > t) | (X < -t)
    M = big & ~(X == 0.0)
    Y = where(big, X, 0.0)
""",
    "f64_and_int_promotion": """
kernel k(X: f64[R, C], I: i32[C]) -> Y: f64[R, C]:
    Y = X * I + I / 3
""",
    "integer_matmul": """
kernel k(A: i8[M, K], B: i8[K, N]) -> C: i32[M, N]:
    C = A @ B
""",
    "f16_scalar_and_dims_as_values": """
kernel k(X: f16[R, C], s: f16) -> Y: f32[R, C]:
    Y = f32(X) * s / f32(C) + f32(R * 2)
""",
    "dequant_with_zero_tensor_i4": """
kernel k(A: f32[M, K], W: i4[K, N], s: f32[K // 32, N], z: f32[K // 32, N]) -> C: f32[M, N]:
    assume K % 32 == 0
    C = A @ dequant(W, s, zero=z, group=32)
""",
    "reductions_over_other_axes": """
kernel k(X: f32[B, R, C]) -> (S0: f32[R, C], S1: f32[B, 1, C], M: f32[B], L: f32[B, C]):
    S0 = sum(X, axis=0)
    S1 = max(X, axis=1, keepdims=True)
    M = mean(X, axis=(1, 2))
    L = logsumexp(X, axis=-2)
""",
    "softmax_not_last_axis_and_transpose": """
kernel k(X: f32[R, C]) -> (P: f32[R, C], T: f32[C, R]):
    P = softmax(X, axis=0)
    T = X.T * 2.0
""",
    "batched_matmul_broadcast_both_sides": """
kernel k(A: f32[B, 1, M, K], W: f32[H, K, N]) -> C: f32[B, H, M, N]:
    C = relu(A @ W)
""",
    "all_the_functions": """
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    a = abs(X) + exp(X) + exp2(X) + log(X * X + 1.0) + log2(X * X + 2.0) + sqrt(X * X)
    b = rsqrt(X * X + 1.0) + sin(X) + cos(X) + tanh(X) + erf(X) + sigmoid(X) + relu(X)
    c = gelu(X) + gelu_tanh(X) + silu(X) + softplus(X) + mish(X) + leaky_relu(X, 0.1)
    Y = a + b + c + clamp(X, -0.5, 0.5) + maximum(X, 0.25) + minimum(X, pi) - X * inf * 0.0
""",
}


def test_minus_zero_keeps_its_sign():
    """0.0 == -0.0 in Python, and they hash alike: common subexpression elimination once merged
    a -0.0 constant into the 0.0 before it (the literal -0.0 is the negation of 0.0), so
    x / -0.0 divided by +0.0 (an infinity of the wrong sign)."""
    text = """
kernel k(X: f32[N]) -> (Y: f32[N], Z: f32[N]):
    Y = (abs(X) + 1.0) / -0.0
    Z = (abs(X) + 1.0) / 0.0 + X * -0.0
"""
    canon = driver.compile_module(driver.frontend(driver.Source("k.tile", text)), "cpu",
                                  stop_after="canonicalize")
    zeros = [o.attr("value") for o in canon.graphs[0].ops if o.kind == "const"
             and o.attr("value") == 0.0]
    assert sorted(str(z) for z in zeros) == ["-0.0", "0.0"]
    results = check_text(text, {"N": 5})
    assert results["k"].errors == {"Y": 0.0, "Z": 0.0}
    # the Tile IR's constants too: CUDA hoists kernel-wide values, and once shared one for both
    hoisted = """
kernel h(X: f32[N], s: f32) -> (Y: f32[N], Z: f32[N]):
    Y = (abs(X) + 1.0) / (s * s * 0.0)
    Z = (abs(X) + 1.0) / (s * s * -0.0)
"""
    for target in ("cpu", "cuda"):
        _, _, m = compile_text(hoisted, target=target)
        ir = driver.print_stage(m, "lowered")
        assert "s * s * 0.0" in ir and "s * s * (-0.0)" in ir, ir
    check_text(hoisted, {"N": 5})


def test_a_power_of_one_half_is_sqrt_for_every_target():
    """numpy's x ** 0.5 is sqrt(x): (-0) ** 0.5 is -0 and (-inf) ** 0.5 NaN, where C's pow gives
    +0 and +inf. Canonicalization makes it a sqrt before any target sees it (other exponents
    stay powers)."""
    text = "kernel k(X: f32[N]) -> Y: f32[N]:\n    Y = X ** 0.5 + X ** 1.5\n"
    canon = driver.compile_module(driver.frontend(driver.Source("k.tile", text)), "cpu",
                                  stop_after="canonicalize")
    ops = canon.graphs[0].ops
    assert [o.attr("fn") for o in ops if o.kind == "unary"] == ["sqrt"]
    assert [o.attr("exponent") for o in ops if o.kind == "binary" and o.attr("fn") == "pow"] == [1.5]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program(name):
    text = PROGRAMS[name]
    check_text(text)
    check_text(text, {"N": 1, "R": 1, "C": 1, "M": 1, "K": 32, "B": 1, "H": 1})


def test_output_that_is_an_input_is_copied():
    """`Y = X` (and an output assigned another output) still writes the output."""
    check_text("""
kernel k(X: f32[R, C], Y: f16[C]) -> (A: f32[R, C], B: f32[R, C], Z: f16[C]):
    A = X
    B = A
    Z = Y
""")


def test_user_names_never_clash_with_generated_names():
    """Dims and tensors named like tilec's own loop variables, buffers and C++ keywords."""
    check_text("""
kernel names(new: f32[r0, c0], class: f32[c0, nr], src: f32[nr], acc: f32) -> (out: f32[r0, nr], v: f32[r0]):
    int = new @ class + src * acc
    out = int
    v = sum(softmax(int, axis=-1), axis=-1)
""")
    check_text("""
kernel loops(i: f32[bx, j], k: f32[j], row: f32) -> (acc: f32[bx, j], tilec_b: f32[bx]):
    acc = i * k + row
    tilec_b = max(i, axis=1)
""")


LONG_ROWS = """
kernel long_sum(X: f32[R, C]) -> S: f32[R]:
    S = sum(X * X, axis=-1)

kernel long_softmax(X: f32[R, C]) -> Y: f32[R, C]:
    Y = softmax(X * 4.0, axis=-1)

kernel long_mean(X: f32[R, C]) -> Y: f32[R]:
    Y = mean(X + 1.0, axis=-1)
"""


def test_long_row_sums_keep_the_short_row_tolerance():
    """A sum over millions of elements is as accurate as one over a few hundred: blocks summed
    in vector lanes, the blocks in double (a single f32 running sum drifts by about the count
    times an ulp: 1e-2 relative at these lengths)."""
    res = check_text(LONG_ROWS, dict(R=2, C=3_000_001), seed=4)
    for name, r in res.items():
        for out, err in r.errors.items():
            assert err <= interp.TOLERANCE["f32"], (name, out, err)


ROUNDED = """
kernel two_products(A: f16[M, K], B: f16[K, N], C: f16[N, P]) -> D: f32[M, P]:
    D = f16(A @ B) @ C

kernel one_product(A: f16[M, K], B: f16[K, N]) -> D: f32[M, N]:
    D = A @ B + 1.0

kernel widened(X: f16[R, C], Y: f32[R, C]) -> Z: f32[R, C]:
    Z = f32(X) * Y
"""


def test_an_f32_output_of_16_bit_intermediates_gets_their_tolerance():
    """An output is checked at the tolerance of the least precise value computed on its way
    (inputs aside): an f32 product of an f16-rounded product may round that intermediate to its
    neighbouring f16 value (its sums run in another order than the reference's), so it is
    checked at f16's tolerance; f32 values of f16 inputs keep f32's."""
    from tilec.runner import rounded_to
    _, _, m = compile_text(ROUNDED)
    got = {g.name: rounded_to(g, 0) for g in m.graphs}
    assert got == {"two_products": "f16", "one_product": "f32", "widened": "f32"}
    res = check_text(ROUNDED, dict(M=257, K=130, N=67, P=129, R=3, C=5), seed=2863546975)
    assert res["two_products"].tolerances["D"] == interp.TOLERANCE["f16"]
    assert res["one_product"].tolerances["D"] == interp.TOLERANCE["f32"]


def test_an_integer_output_of_float_values_may_round_the_other_way(monkeypatch):
    """`tilec run` compares an integer output computed from floats with a slack of 1 (a value
    near .5 may round either way after the targets' own order of float operations); integer
    outputs of integers, and float outputs, exactly as before."""
    seen = []
    real = interp.rel_error

    def spy(got, ref, slack=0.0):
        seen.append(slack)
        return real(got, ref, slack)
    monkeypatch.setattr(interp, "rel_error", spy)
    text = """
kernel mixed(X: f32[N], I: i32[N], Y: f32[M]) -> (A: i32[N], B: i32[N], C: f32[M]):
    A = i32(gelu(X) * 100.0)
    B = I * 3 + 1
    C = Y * 2.0
"""
    check_text(text, dict(N=10, M=12))
    assert seen == [1.0, 0.0, 0.0]  # (A, B, C)


def test_a_tile_level_output_gets_the_tolerance_of_its_least_precise_tile_or_conversion():
    """A tile-level kernel has no ops: its outputs are checked at the tolerance of the least
    precise of their own dtype, its float tiles and the conversions it writes (an f16 output of
    values rounded to fp8 on the way: fp8's)."""
    from tilec import driver
    from tilec.runner import rounded_to
    text = """
kernel t(X: f32[N]) -> (Y: f16[N], Z: f32[N]):
    with grid(cdiv(N, 64), threads=64) as (bx):
        h = fragment(f16, [64])
        for j in parallel(64):
            h[j] = X[min(bx * 64 + j, N - 1)]
            if bx * 64 + j < N:
                Y[bx * 64 + j] = CONV(X[bx * 64 + j] * 3.0)
                Z[bx * 64 + j] = X[bx * 64 + j] + 1.0
"""
    for conv, want in (("f16", "f16"), ("fp8e5m2", "fp8e5m2"), ("f32", "f16")):
        (g,) = driver.frontend(driver.Source("t.tile", text.replace("CONV", conv))).graphs
        assert rounded_to(g, 0) == want and rounded_to(g, 1) == ("fp8e5m2" if conv == "fp8e5m2"
                                                                  else "f16"), conv
