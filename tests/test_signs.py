"""Sign facts of graph values (tilec/passes/signs.py): `exp` of an argument known to be <= 0
lowers to the cheaper `exp_nonpos`, and nothing that could be positive does."""

from __future__ import annotations

import pytest
from conftest import check_text, compile_text

from tilec.ir import tile as T
from tilec.passes.rewrite import map_exprs


def exp_fns(text: str, target: str = "cpu") -> list:
    """The exp functions in the Tile IR of every kernel of `text`, in order."""
    _, _, m = compile_text(text, target=target)
    found = []

    def see(e):
        if isinstance(e, T.Unary) and e.fn.startswith("exp"):
            found.append(e.fn)
    for k in (k for p in m.programs for k in p.kernels):
        for st in k.body:
            map_exprs(st, see)  # (every expression, nested statements' too)
    return found


NONPOSITIVE = {
    "softmax": "Y = softmax(X * 0.5, axis=-1)",
    "written out": "Y = exp(X - max(X, axis=-1, keepdims=True))",
    "leading axis dropped": "Y = exp(X - max(X, axis=0))",
    "elementwise maximum": "Y = exp(X - maximum(X, Z))",
    "minus abs": "Y = exp(-abs(X))",
    "scaled difference": "Y = exp(0.25 * (X - max(X, axis=-1, keepdims=True)))",
    "where of two": "Y = exp(where(X > Z, -relu(X), minimum(Z, -2.0)))",
    "squared": "Y = exp(-(X * X) / 4.0)",
    "divided by a dimension": "Y = exp(-abs(X) / f32(C))",
}
UNKNOWN = {
    "plain": "Y = exp(X)",
    "min subtracted": "Y = exp(X - min(X, axis=-1, keepdims=True))",
    "reversed": "Y = exp(max(X, axis=-1, keepdims=True) - X)",
    "another tensor's max": "Y = exp(X - max(Z, axis=-1, keepdims=True))",
    "product of unknowns": "Y = exp((X - Z) * X)",
    "one side of where": "Y = exp(where(X > Z, -relu(X), Z))",
    "maximum of unknowns": "Y = exp(maximum(-abs(X), Z))",
    # a zero divisor's sign flips the quotient (1 / -0.0 is -inf): relu, sqrt and abs can give
    # zeros, and rsqrt(-0.0) is -inf
    "divided by a maybe negative zero": "Y = exp(-(1.0 / relu(X)))",
    "rsqrt": "Y = exp(-rsqrt(X))",
    "divided by minus zero": "Y = exp(-abs(X) / -0.0)",
}


def program(line: str, dtype: str = "f32") -> str:
    return (f"kernel k(X: {dtype}[R, C], Z: {dtype}[R, C]) -> Y: {dtype}[R, C]:\n"
            f"    {line}\n")


@pytest.mark.parametrize("name", sorted(NONPOSITIVE))
def test_exp_of_a_provably_nonpositive_argument_is_exp_nonpos(name):
    assert exp_fns(program(NONPOSITIVE[name])) == ["exp_nonpos"]


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_exp_of_an_argument_that_may_be_positive_stays_exp(name):
    assert exp_fns(program(UNKNOWN[name])) == ["exp"]


def test_integer_differences_prove_nothing():
    """i8 arithmetic wraps: X - max(X) of i8 values can come out positive (-100 - 100 = 56)."""
    assert exp_fns(program("Y = f32(exp(f32(X - max(X, axis=-1, keepdims=True))))", "i8")
                   .replace("-> Y: i8", "-> Y: f32")) == ["exp"]


def test_attention_on_the_cpu_takes_exp_nonpos():
    """The online softmax's exp(score - running max) and its rescale exp(old max - new max)."""
    text = ("kernel attn(Q: f32[L, D], K: f32[S, D], V: f32[S, D]) -> O: f32[L, D]:\n"
            "    O = softmax(Q @ K.T, axis=-1) @ V\n")
    assert exp_fns(text) == ["exp_nonpos", "exp_nonpos"]


@pytest.mark.parametrize("dims", [dict(R=3, C=1000), dict(R=67, C=33)])
def test_exp_nonpos_kernels_match_the_reference(dims):
    lines = [NONPOSITIVE[n] for n in ("softmax", "written out", "leading axis dropped",
                                      "elementwise maximum", "scaled difference")]
    text = "".join(program(line).replace("kernel k(", f"kernel k{n}(")
                   for n, line in enumerate(lines))
    text += program(NONPOSITIVE["softmax"], "f16").replace("kernel k(", "kernel h(")
    check_text(text, dims)
