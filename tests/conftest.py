"""Shared helpers: compile .tile text for the CPU, build it (cached), run it against the oracle."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tilec import driver
from tilec.build import cached_build
from tilec.runner import choose_dims, reduced_precision, run_kernel
from tilec.targets.abi import library_of

# A fusion bug fails the tests instead of falling back to unfused kernels (the users' default)
os.environ.setdefault("TILEC_STRICT_FUSION", "1")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/* from the current compiler output")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs kernels on a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "nvcc: compiles CUDA sources with nvcc (no GPU needed)")
    config.addinivalue_line("markers", "hipcc: compiles HIP sources with hipcc (no GPU needed)")


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden")


def compile_text(text: str, name: str = "test.tile", target: str = "cpu", verify: bool = True,
                 options=None):
    """(source, parsed module, compiled module) for .tile source text."""
    src = driver.Source(name, text)
    m0 = driver.frontend(src)
    m = driver.compile_module(m0, target, verify=verify, options=options)
    return src, m0, m


def build_text(text: str, name: str = "test.tile", target: str = "cpu", options=None) -> tuple:
    """Build all kernels of `text` into the compile cache; returns (parsed module, build dir)."""
    src, m0, m = compile_text(text, name, target, options=options)
    files = driver.render(src, m, target, options)
    return m0, cached_build(files, driver.get_target(target))


def check_text(text: str, dims: dict | None = None, seed: int | None = None, name="test.tile",
               target: str = "cpu", options=None, full_ints: bool = False):
    """Build and run every kernel of `text` on fresh random inputs; assert each output is within
    its dtype's tolerance of the reference interpreter. Returns {kernel: RunResult}."""
    m0, out = build_text(text, name, target, options)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    results = {}
    runtime = driver.get_target(target).runtime
    for g in m0.graphs:
        d = choose_dims(g, {k: v for k, v in (dims or {}).items() if k in g.symbols})
        r = run_kernel(out / f"lib{library_of(name, g.name, False)}.so", g, d, seed, repeat=1,
                       runtime=runtime, full_ints=full_ints,
                       reduced=reduced_precision(m0, g, driver.get_target(target)))
        for o in r.errors:
            assert r.errors[o] <= r.tolerances[o], (
                f"{g.name}.{o} dims={d} seed={seed}: max rel error {r.errors[o]:.3e} > "
                f"tolerance {r.tolerances[o]:.0e}")
        results[g.name] = r
    return results
