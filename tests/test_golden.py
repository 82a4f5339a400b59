"""Golden dumps of every pipeline stage and of generated C++ for a few samples.

Regenerate with `pytest tests/test_golden.py --update-golden` and review the diff; never edit
the files by hand.
"""

from __future__ import annotations

import pytest
from conftest import ROOT, SAMPLES

from tilec import driver

GOLDEN = ROOT / "tests" / "golden"
CASES = ["gemm_bias_relu", "rmsnorm", "attention", "w4a16"]
STAGES = ["graph", "canonical", "fused", "tiled", "lowered"]


def _check(path, text, update):
    if update:
        path.write_text(text)
    assert path.exists(), f"{path.name} missing: run pytest --update-golden and review it"
    assert text == path.read_text(), f"{path.name} changed: review, then --update-golden"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", CASES)
def test_stage_dump(name, stage, update_golden):
    src = driver.read_source(str(SAMPLES / f"{name}.tile"))
    m = driver.stage_module(driver.frontend(src), stage, "cpu", verify=True)
    _check(GOLDEN / f"{name}.{stage}.txt", driver.print_stage(m, stage), update_golden)


def test_generated_cpp(update_golden):
    src = driver.read_source(str(SAMPLES / "gemm_bias_relu.tile"))
    m = driver.compile_module(driver.frontend(src), "cpu")
    files = driver.render(src, m, "cpu")
    for name in ("gemm_bias_relu.cpp", "gemm_bias_relu.h", "Makefile"):
        _check(GOLDEN / name, files[name], update_golden)


def test_generated_cuda_for_hopper(update_golden):
    """The warp-specialized GEMM as tilec prints it for --arch sm_90a: its lowered Tile IR and
    the CUDA source (both variants: TMA + wgmma, and the mma.sync fallback)."""
    src = driver.read_source(str(SAMPLES / "gemm_bias_relu.tile"))
    options = {"arch": ("sm_90a",)}
    m = driver.compile_module(driver.frontend(src), "cuda", options=options)
    _check(GOLDEN / "gemm_bias_relu.sm90a.lowered.txt", driver.print_stage(m, "lowered"),
           update_golden)
    _check(GOLDEN / "gemm_bias_relu.sm90a.cu",
           driver.render(src, m, "cuda", options)["gemm_bias_relu.cu"], update_golden)
