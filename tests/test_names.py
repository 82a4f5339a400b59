"""Names from a .tile file that C, C++, their headers or the generated code already use are
mangled predictably (a trailing underscore) or rejected with a located error: never a compiler
error, never a wrong status."""

from __future__ import annotations

import pytest
from conftest import check_text

from tilec import driver
from tilec.diagnostics import TilecError

HOSTILE = ["NULL", "M_PI", "INT64_MAX", "SIZE_MAX", "FLT_EPSILON", "EOF", "errno", "assert",
           "exp", "memcpy", "omp_get_thread_num", "TILEC_OK", "tilec_status", "cudaStream_t",
           "ws0", "k_k0", "size_t", "int32_t", "std", "bool", "true", "threadIdx", "_Private"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_parameter_and_dimension_names_build_and_run(name):
    text = f"""
kernel params({name}: f32[N], Z: f32[N]) -> Y: f32[N]:
    Y = {name} * 2.0 + Z

kernel dims(X: f32[{name}]) -> Y: f32[{name}]:
    Y = X * f32({name})
"""
    check_text(text, {"N": 7, name: 5})


def test_hostile_names_in_a_tile_level_kernel():
    text = """
kernel tk(X: f32[N]) -> Y: f32[N]:
    with grid(cdiv(N, 64), threads=64) as (INT64_MAX):
        M_PI = fragment(f32, [64])
        for NULL in parallel(64):
            if INT64_MAX * 64 + NULL < N:
                EOF = X[INT64_MAX * 64 + NULL]
                M_PI[NULL] = EOF * 2.0
                Y[INT64_MAX * 64 + NULL] = M_PI[NULL]
"""
    check_text(text, {"N": 130})


@pytest.mark.parametrize("name", ["NULL", "exp", "memcpy", "TILEC_OK", "tilec_cpu", "M_PI",
                                  "omp_get_num_threads", "main", "half"])
def test_kernel_names_c_already_takes_are_errors(name):
    with pytest.raises(TilecError, match=r"is taken in C/C\+\+"):
        driver.frontend(driver.Source("k.tile", f"kernel {name}(X: f32[N]) -> Y: f32[N]:\n"
                                                f"    Y = X\n"))
