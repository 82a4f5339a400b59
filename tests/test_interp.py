"""The reference interpreter itself, and canonicalization checked against it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SAMPLES

from tilec import driver, interp
from tilec.passes import canonicalize
from tilec.runner import choose_dims


def test_bf16_rounding_is_nearest_even():
    # bf16 keeps 7 mantissa bits: ties go to the even neighbour
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7 + 2**-9, -2.0, np.inf])
    assert list(interp.round_bf16(x)) == [1.0, 1 + 2**-6, 1 + 2**-7, -2.0, np.inf]


def test_integer_conversion_saturates_and_rounds_to_even():
    got = interp.quantize(np.array([1e10, -1e10, 2.5, 3.5, -2.5, np.nan]), "i8")
    assert list(got) == [127, -128, 2, 4, -2, 0]


def test_packed_u4_storage_round_trip():
    v = np.array([[1, 2, 3], [15, 0, 7]])
    packed = interp.to_storage(v, "u4")
    assert packed.tolist() == [[0x21, 0x03], [0x0F, 0x07]]


def test_rel_error_flags_nan_and_shape():
    assert interp.rel_error(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == np.inf
    assert interp.rel_error(np.ones(3), np.ones(4)) == np.inf
    assert interp.rel_error(np.array([1.0, 2.0]), np.array([1.0, 2.5])) == pytest.approx(0.2)


def test_rel_error_slack_lets_an_integer_round_the_other_way():
    """An integer output of float values may round the other way at .5: `tilec run` gives
    such outputs a slack of 1 (differences up to it count as none), not more."""
    got, ref = np.array([12.0, -3.0, 0.0]), np.array([13.0, -3.0, 1.0])
    assert interp.rel_error(got, ref) == pytest.approx(1 / 13)
    assert interp.rel_error(got, ref, slack=1.0) == 0.0
    assert interp.rel_error(got - 1, ref, slack=1.0) == pytest.approx(1 / 13)


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.tile")), ids=lambda p: p.stem)
def test_canonicalize_preserves_meaning(path):
    """The oracle runs the graph as written; the compiler sees the canonical form."""
    m = driver.frontend(driver.read_source(str(path)))
    canon = canonicalize.run(m)
    for g, c in zip(m.graphs, canon.graphs):
        dims = choose_dims(g, {})
        inputs = interp.random_inputs(g, dims, seed=11)
        a, b = interp.run_graph(g, inputs, dims), interp.run_graph(c, inputs, dims)
        for name in a:
            assert interp.rel_error(b[name], a[name]) <= max(interp.tolerance(
                g.outputs[[o.name for o in g.outputs].index(name)].type.dtype), 1e-6), name


def test_f32_tolerance_grows_with_the_reduction_length():
    assert interp.tolerance("f32", 1) == interp.tolerance("f32", 256) == interp.TOLERANCE["f32"]
    assert interp.tolerance("f32", 8192) > 5 * interp.TOLERANCE["f32"]
    assert interp.tolerance("f16", 8192) == interp.TOLERANCE["f16"]  # final rounding dominates


def test_the_reference_prints_no_numpy_warnings(recwarn):
    """Overflow to inf in a conversion, inf - inf: the program's results, not numpy's warnings
    (`tilec run` printed RuntimeWarnings)."""
    from tilec import driver
    text = "kernel o(X: f32[N]) -> Y: f32[N]:\n    Y = f32(exp(f64(X) * 1000.0)) - exp(X * 100.0)\n"
    (g,) = driver.frontend(driver.Source("o.tile", text)).graphs
    y = interp.run_graph(g, {"X": np.array([1.0, -1.0])}, {"N": 2})["Y"]
    assert np.isnan(y[0]) and abs(y[1]) < 1e-40
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
