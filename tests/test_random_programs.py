"""Differential testing of the CPU build against the reference interpreter on random programs.

The generator (tests/random_programs.py) writes well-typed tensor-level kernels of 1-3
statements over 1-3 inputs (f32/f16/bf16/f64 tensors and scalars, i32 tensors used through
casts and comparisons) from elementwise ops, unary functions, where/comparisons, casts,
reductions with random axis=/keepdims=, softmax and norm-like epilogues, with one or more
outputs of different shapes. Values stay well conditioned, so every mismatch is a bug.

Each example is built with g++ (cached by content) and run by `check_text` on fresh random
inputs with dims drawn from {1, 3, 17, 64, 100, 257}. The program, dims and seed are printed on
failure (hypothesis `note`): save the program as prog.tile and run the printed `tilec run`
line, or add it to REGRESSIONS below.

    TILEC_RANDOM_EXAMPLES=1000 pytest tests/test_random_programs.py   # hunt harder
    python tests/random_programs.py 5                                   # print some programs
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import check_text, compile_text
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis import strategies as st
from random_programs import Generator, RandomChooser, Reject

from tilec import interp
from tilec.runner import choose_dims

# One g++ build per example (~0.3-1.5 s on 2 cores): 40 examples take ~15 s, 150 about a minute.
EXAMPLES = int(os.environ.get("TILEC_RANDOM_EXAMPLES", "40"))
# CI replays a fixed set of examples, so that a submission's result does not depend on luck;
# local runs draw new programs every time (set TILEC_RANDOM_EXAMPLES higher to hunt bugs).
DERANDOMIZE = os.environ.get("CI", "").lower() == "true"

# Generator switches that steer around a compiler bug: each name turns off the construct that
# triggered it (see the comment at the name in random_programs.py). All of these were found by
# this test and fixed in 2665394 or 95cc060; name one in TILEC_RANDOM_FILTERS=a,b to steer around it
# again while it is broken (and put it in ACTIVE_FILTERS if it stays broken for a while).
FILTER_BUGS = {
    "unary_prefix": "unary - and ~ rendered without parentheses around an infix operand: "
                    "-(x + y) became (-x + y) in C++",
    "output_alias": "of two outputs with the same value after CSE only one was written",
    "scalar_workspace": "a rank-0 value read by another kernel (a full reduction; a scalar "
                        "statement under `fuse off`) crashed the renderer (cpu._bytes_expr)",
    "nan_propagation": "relu(nan) gave 0 and max/min reductions skipped nan",
    "bool_workspace": "a bool value materialized between kernels had no C type (KeyError)",
    "size1_axis": "reductions over a constant size-1 axis next to other reductions of the same "
                  "rows: AssertionError '%N is on chip but used at another position'",
    "scalar_erf": "interp: erf/gelu of a rank-0 value returned a Python float (AttributeError)",
    "i64_floordiv": "`//` and `%` of i64 values by a literal did not compile (floormod<T>)",
    "f16_mean": "mean() of f16 divided the f16-rounded sum by the f16-rounded count (inf)",
    "fp_contract": "g++ contracted a*b - c into an FMA, so x*y - x*y != 0",
}
# (fixed in 95cc060; regressions bf16_softmax_of_logsumexp, square_transpose_*)
FILTER_BUGS["sixteen_bit_internals"] = (
    "16-bit softmax/logsumexp rounded their internal steps to 16 bits (bf16: several ulps off)")
FILTER_BUGS["square_transpose"] = ("x.T of a square [R, R] value next to a reduction over the "
                                   "same domain: AssertionError '%N is on chip but used at "
                                   "another position'")
FILTER_BUGS["gelu_tanh_cancellation"] = (  # regression gelu_tanh_of_large_negatives
    "gelu_tanh computed 0.5 * x * (1 + tanh(z)) in f32: 0 for x < -5 (interpreter: ~1e-10)")
ACTIVE_FILTERS: set = set()  # every bug found so far is fixed
# Bugs the generator cannot steer around (they depend on the fusion partition): examples failing
# with one of these messages are discarded while the bug is open, e.g. "cyclic_partition":
# r"^CyclicPartition" (fixed in 95cc060) or "fusion_order": r"kernel \d+ reads %\d+ before
# kernel \d+ writes it" (fixed in 2665394).
KNOWN_FAILURES: dict = {}
_env = os.environ.get("TILEC_RANDOM_FILTERS")
FILTERS = ACTIVE_FILTERS if _env is None else {f for f in _env.split(",") if f in FILTER_BUGS}
IGNORED = KNOWN_FAILURES


def check_output_dtypes(text: str, prog):
    """The front end's dtype of each output's value agrees with NumPy promotion (the generator's
    model): where the declared dtype differs from the model's, the output's value must be an
    implicit conversion *from the model's dtype*."""
    _, m0, _ = compile_text(text)
    g = m0.graphs[0]
    ops = g.op_map()
    result = {p.name: r for p, r in zip(g.outputs, g.results)}
    for (name, declared, _), model in zip(prog.outputs, prog.value_dtypes):
        if declared == model:
            continue
        op = ops[result[name]]
        assert op.kind == "cast", f"output {name}: value has dtype {op.type.dtype}, expected {model}"
        src = ops[op.args[0]]
        if model == "bool" and src.kind == "cast" and src.type.dtype == "i8":
            src = ops[src.args[0]]
        assert src.type.dtype == model, (f"output {name}: the front end types the value as "
                                         f"{src.type.dtype}; NumPy promotion gives {model}")


def well_scaled(text, dims, seed) -> bool:
    """False when an f16 output's reference values are all tiny: f16 subnormals (spacing 6e-8)
    cannot meet f16's relative tolerance there (e.g. softmax(x) ** 3 over rows of 257)."""
    _, m0, _ = compile_text(text)
    g = m0.graphs[0]
    d = choose_dims(g, {k: v for k, v in dims.items() if k in g.symbols})
    ref = interp.run_graph(g, interp.random_inputs(g, d, seed), d)
    # (fp8: below the smallest normal value, one code is a large fraction of the largest)
    tiny = {"f16": 2.0 ** -10, "fp8e4m3": 2.0 ** -6, "fp8e5m2": 2.0 ** -14}
    for p in g.outputs:
        v = np.abs(ref[p.name][np.isfinite(ref[p.name])])
        if p.type.dtype in tiny and v.size and 0 < v.max() < tiny[p.type.dtype]:
            return False
    return True


def run_program(text, dims, seed, prog=None):
    try:
        if prog is not None:
            check_output_dtypes(text, prog)
            if not well_scaled(text, dims, seed):
                reject()
        return check_text(text, dims=dims, seed=seed)
    except Exception as e:
        for name, pattern in IGNORED.items():
            if re.search(pattern, f"{type(e).__name__}: {e}"):
                note(f"discarded: known bug {name}")
                reject()
        raise


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much, HealthCheck.large_base_example])
@given(data=st.data())
def test_random_program(data):
    try:
        rng = data.draw(st.randoms(use_true_random=False), label="choices")
        prog = Generator(RandomChooser(rng), FILTERS).program()
    except Reject:
        reject()
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    dims = ",".join(f"{k}={v}" for k, v in prog.dims.items())
    note(f"\n{prog.text}\n# tilec run prog.tile --dims {dims} --seed {seed}")
    run_program(prog.text, prog.dims, seed, prog)


# ---- regressions --------------------------------------------------------------------------
# Small programs for tricky cases: (text, dims, seed, the bug it found or None). Bugs in
# OPEN_BUGS are expected to fail (strict xfail: when one passes, take it out of OPEN_BUGS).
OPEN_BUGS: set = set()
REGRESSIONS = {
    # -- found by hand (each was a bug)
    "gemm_epilogue_reads_size1_operand": ("""
kernel k(X: f32[1, 1], Y: f32[N, 1]) -> Z: f32[N, 1]:
    Z = Y @ X + X
""", {"N": 37}, 1, None),
    # -- found by the random search (each was a bug)
    # a column reduction of a row-softmax result feeds a value that an epilogue of the row
    # kernel reads back: both the greedy and the conservative partition were cyclic
    "conservative_partition_cycle": ("""
kernel rnd(x0: f32[R, C], x1: f32[R, C], x2: f32[R, C]) -> (out2: f32[R, C], out1: f32[R, C], out0: f32[C]):
    t0 = maximum(softmax(where(~(x2 < 0.0), -inf, x2), axis=1), x0)
    out0 = softmax(max(t0, axis=0), axis=-1)
    out1 = 0.5 + abs(where(~((out0) < 0.0), x0, t0))
    out2 = out1
""", {"R": 5, "C": 3}, 0, None),
    "output_is_input": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = X
""", {"R": 3, "C": 5}, 1, None),
    "two_outputs_same_input": ("""
kernel k(X: f32[R, C]) -> (Y: f32[R, C], Z: f32[R, C]):
    Y = X
    Z = X
""", {"R": 3, "C": 5}, 1, "output_alias"),
    "output_is_output": ("""
kernel k(X: f32[R, C]) -> (Y: f32[R, C], Z: f32[R, C]):
    Y = X + 0.5
    Z = Y
""", {"R": 3, "C": 5}, 1, None),
    "outputs_equal_after_cse": ("""
kernel k(X: f32[R, C]) -> (Y: f32[R, C], Z: f32[R, C]):
    Y = exp(X)
    Z = exp(X)
""", {"R": 3, "C": 5}, 1, "output_alias"),
    "pow": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = X ** 2 + (X * X + 1.0) ** -1
""", {"R": 3, "C": 5}, 1, None),
    "neg_of_sum": ("""
kernel k(X: f32[R, C], Z: f32[R, C]) -> Y: f32[R, C]:
    Y = -(X + Z)
""", {"R": 3, "C": 5}, 1, "unary_prefix"),
    "neg_of_named_difference": ("""
kernel k(X: i32[R, C], Z: i32[R, C]) -> Y: i32[R, C]:
    t = X - Z
    Y = -t
""", {"R": 3, "C": 5}, 1, "unary_prefix"),
    "neg_of_logsumexp": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, 1]:
    Y = -logsumexp(X, axis=1, keepdims=True)
""", {"R": 3, "C": 5}, 1, "unary_prefix"),
    "neg_of_transpose": ("""
kernel k(X: f32[R, C], Z: f32[R, C]) -> Y: f32[C, R]:
    Y = -transpose(X + Z)
""", {"R": 3, "C": 5}, 1, "unary_prefix"),
    "invert_comparison": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = f32(~(X < 0.0))
""", {"R": 3, "C": 5}, 1, "unary_prefix"),
    "scalar_reduction_workspace": ("""
kernel k(X: f32[R, C], Z: f32[R]) -> Y: f32[R]:
    Y = Z - max(X)
""", {"R": 3, "C": 5}, 1, "scalar_workspace"),
    "scalar_statement_fuse_off": ("""
kernel k(X: f32[R, C], s: f32) -> Y: f32[R, C]:
    t = s * 2.0
    Y = X * t

schedule k:
    target cpu:
        fuse off
""", {"R": 3, "C": 5}, 1, "scalar_workspace"),
    "scalar_param_in_two_statements_fuse_off": ("""
kernel k(X: f64[R], s: f32) -> (A: f64[R], Y: f64[R]):
    A = X * s
    Y = X + s

schedule k:
    target cpu:
        fuse off
""", {"R": 5}, 1, "scalar_workspace"),
    "relu_of_nan": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = relu(log(X))
""", {"R": 3, "C": 5}, 1, "nan_propagation"),
    "max_reduction_of_nan": ("""
kernel k(X: f32[R, C]) -> Y: f32[R]:
    Y = max(log(X), axis=1)
""", {"R": 3, "C": 5}, 1, "nan_propagation"),
    "bool_workspace": ("""
kernel k(X: f32[R, C], Z: f32[C]) -> Y: f32[R, C]:
    Y = where(sum(Z) > 0.0, X, 0.0)
""", {"R": 3, "C": 5}, 1, "bool_workspace"),
    "reduce_size1_and_other_axis": ("""
kernel k(X: f32[1, C]) -> Y: f32[1, C]:
    Y = X - max(X, axis=(0, 1), keepdims=True)
""", {"C": 5}, 1, "size1_axis"),
    "softmax_size1_axis_of_reduction": ("""
kernel k(X: f32[B, 1, C]) -> Y: f32[1, C]:
    Y = softmax(sum(X, axis=0), axis=0)
""", {"B": 3, "C": 5}, 1, "size1_axis"),
    "softmax_size1_axis_after_softmax": ("""
kernel k(X: f32[R, 1]) -> Y: f32[R, 1]:
    Y = softmax(softmax(X, axis=0), axis=1)
""", {"R": 5}, 1, "size1_axis"),
    "f16_scalar_param": ("""
kernel k(X: f32[R, C], s: f16) -> Y: f32[R, C]:
    Y = X * s
""", {"R": 3, "C": 5}, 1, None),
    "erf_of_scalar": ("""
kernel k(X: f32[R, C], s: f32) -> Y: f32[R, C]:
    Y = X * erf(s) + gelu(s)
""", {"R": 3, "C": 5}, 1, "scalar_erf"),
    "fma_contraction": ("""
kernel k(X: f32[R, C], Z: f32[R, C]) -> Y: f32[R, C]:
    Y = X * Z - (X * Z + 0.0)
""", {"R": 64, "C": 64}, 1, "fp_contract"),
    "i64_floormod": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = where(index(X, 1) % 2 == 0, X, 0.0)
""", {"R": 3, "C": 5}, 1, "i64_floordiv"),
    "fusion_order": ("""
kernel k(X: f32[R, C]) -> (Y: f32[R, 1], Z: f32[R, C], W: f32[R, C]):
    Z = X + 1.0
    Y = sum(Z, axis=1, keepdims=True)
    W = Y + Z
""", {"R": 3, "C": 5}, 1, "fusion_order"),
    "f16_mean_of_65535": ("""
kernel k(X: f16[R, C]) -> Y: f16[1, 1]:
    Y = mean(X, axis=(0, 1), keepdims=True)
""", {"R": 257, "C": 255}, 1, "f16_mean"),
    "cyclic_partition_lse_of_lse": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, 1]:
    t = logsumexp(X, axis=1, keepdims=True)
    Y = t + logsumexp(t, axis=0)
""", {"R": 17, "C": 17}, 1, "cyclic_partition"),
    "square_transpose_minus_its_max": ("""
kernel k(X: f32[R, R]) -> Y: f32[R, R]:
    Y = X.T - max(X.T, axis=-1, keepdims=True)
""", {"R": 3}, 1, "square_transpose"),
    "square_transpose_of_softmax": ("""
kernel k(X: f32[R, R]) -> Y: f32[R]:
    t = softmax(X, axis=1)
    Y = logsumexp(t.T, axis=-1)
""", {"R": 3}, 1, "square_transpose"),
    "gelu_tanh_of_large_negatives": ("""
kernel k(X: f32[R]) -> Y: f32[R]:
    Y = gelu_tanh(X - 6.0)
""", {"R": 100}, 1, "gelu_tanh_cancellation"),
    "bf16_softmax_of_logsumexp": ("""
kernel k(X: bf16[R, C]) -> Y: bf16[R]:
    Y = softmax(logsumexp(X, axis=1), axis=0)
""", {"R": 257, "C": 257}, 1, "sixteen_bit_internals"),
    # -- tricky cases that work (keep them working)
    "reduce_middle_axis_3d": ("""
kernel k(X: f32[B, R, C], b: f16[C]) -> (Y: f32[B, C], Z: bf16[B, 1, C]):
    Y = sum(X * b, axis=1)
    Z = max(X, axis=-2, keepdims=True) - min(X, axis=(1,), keepdims=True)
""", {"B": 3, "R": 100, "C": 17}, 1, None),
    "reduce_outer_axes_3d": ("""
kernel k(X: f32[B, R, C]) -> (Y: f32[R], Z: f32[1, R, 1]):
    Y = mean(X, axis=(0, 2))
    Z = logsumexp(X, axis=(-1, 0), keepdims=True)
""", {"B": 2, "R": 17, "C": 257}, 1, None),
    "softmax_axis0_and_tuple": ("""
kernel k(X: f32[R, C]) -> (Y: f32[R, C], Z: f16[R, C]):
    Y = softmax(X, axis=0)
    Z = softmax(X * 4.0, axis=(0, 1))
""", {"R": 257, "C": 3}, 1, None),
    "layernorm_bf16_rows_of_257": ("""
kernel k(X: bf16[R, C], g: f32[C], s: f32) -> (Y: bf16[R, C], mu: f32[R, 1]):
    x = f32(X)
    mu = mean(x, axis=-1, keepdims=True)
    d = x - mu
    Y = d * rsqrt(mean(d * d, axis=-1, keepdims=True) + s) * g
""", {"R": 3, "C": 257}, 1, None),
    "norms_over_axis0": ("""
kernel k(X: f16[R, C]) -> Y: f16[R, C]:
    Y = X * rsqrt(mean(f32(X) * f32(X), axis=0, keepdims=True) + 1e-5) / max(abs(X), axis=0)
""", {"R": 100, "C": 64}, 1, None),
    "causal_masked_softmax": ("""
kernel k(X: f32[R, C]) -> Y: f16[R, C]:
    Y = softmax(where(index(X, -1) > index(X, -2), -inf, X), axis=-1)
""", {"R": 17, "C": 100}, 1, None),
    "log_softmax_f64": ("""
kernel k(X: f64[R, C]) -> (Y: f64[R, C], Z: f64[R, C]):
    Y = X - logsumexp(X, axis=1, keepdims=True)
    Z = gelu(X) + gelu_tanh(X) + erf(X) + mish(X) + softplus(X) + silu(X)
""", {"R": 3, "C": 100}, 1, None),
    "cxx_keyword_names": ("""
kernel k(int: f32[R, C], new: f16[C], char: f32) -> (float: f32[R, C], auto: f16[R]):
    tilec_x = int * new + char
    float = tilec_x
    auto = max(tilec_x, axis=-1)
""", {"R": 17, "C": 3}, 1, None),
    "python_floor_division": ("""
kernel k(X: i32[R, C], Z: i32[C]) -> (Y: i32[R, C], W: i32[R, C], V: i32[R]):
    Y = X // -3 + X % 3
    W = X % (Z * Z + 1) - X // (Z * Z + 1)
    V = sum(X * Z, axis=1)
""", {"R": 64, "C": 17}, 1, None),
    "i32_promotes_to_f64": ("""
kernel k(X: i32[R, C], Y: f32[R, C], Z: f16[C]) -> (A: f64[R, C], B2: f64[R, C]):
    A = X * Y + exp(X * 0.25)
    B2 = mean(X, axis=0) + Z * X
""", {"R": 3, "C": 17}, 1, None),
    "bool_outputs": ("""
kernel k(X: f32[R, C], Z: bf16[R, 1]) -> (M: u8[R, C], F: f16[R, C], I: i32[R, C]):
    M = (X > Z) | (X < -0.5)
    F = f16(X >= 0.0) * X
    I = i32(X > Z) + i32(X < 0.0)
""", {"R": 100, "C": 257}, 1, None),
    "dims_as_scalars": ("""
kernel k(X: f32[R, C]) -> Y: f32[R, C]:
    Y = X * rsqrt(f32(C)) + X / R - sum(X, axis=1, keepdims=True) / C
""", {"R": 17, "C": 257}, 1, None),
    "f16_rounding_between_ops": ("""
kernel k(X: f16[R, C], W: bf16[R, C]) -> (Y: f16[R, C], Z: bf16[R, C]):
    Y = exp(X) * X + sigmoid(X) / (X * X + 1.0)
    Z = W * W * W + f16(W) - bf16(X)
""", {"R": 64, "C": 257}, 1, None),
}


def _params():
    for name in sorted(REGRESSIONS):
        text, dims, seed, bug = REGRESSIONS[name]
        marks = [pytest.mark.xfail(strict=True, reason=f"open bug {bug}")] if bug in OPEN_BUGS \
            else []
        yield pytest.param(text, dims, seed, id=name, marks=marks)


@pytest.mark.parametrize("text,dims,seed", list(_params()))
def test_regression(text, dims, seed):
    check_text(text, dims=dims, seed=seed)
