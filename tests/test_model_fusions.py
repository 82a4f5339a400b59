"""Programs that are not samples (tests/programs/model_fusions.tile: GEMM epilogues that reduce,
normalize or activate, batched and transposed products, 8-bit and f64 data, column and
whole-tensor reductions, masks, integer arithmetic, powers and the transcendental activations)
build and match the reference interpreter on fresh random inputs: on the CPU in every run, on the
GPU with `-m gpu`. Sizes: the runner's defaults (about 100: no tile multiple), all ones, and
sizes past one tile with ragged edges (batch dimensions, Nb and Nh, take the runner's small
defaults: the reference's work grows with their product, not the tiles' edges)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_text

PROGRAMS = Path(__file__).resolve().parent / "programs" / "model_fusions.tile"
SIZES = {
    "odd": None,
    "ones": {d: 1 for d in [*"ABCDEHIKLMNPRS", "Nb", "Nh"]},
    "ragged": dict(A=2, B=130, C=300, D=72, E=136, H=70, I=200, K=129, L=65, M=257, N=3, P=33,
                   R=67, S=190),
}


@pytest.mark.parametrize("sizes", SIZES)
def test_model_fusions_match_reference(sizes):
    results = check_text(PROGRAMS.read_text(), SIZES[sizes], name=PROGRAMS.name)
    assert len(results) == PROGRAMS.read_text().count("\nkernel ")


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", SIZES)
def test_model_fusions_match_reference_on_gpu(sizes):
    from test_cuda import GPU_OPTIONS, need_gpu
    need_gpu()
    check_text(PROGRAMS.read_text(), SIZES[sizes], name=PROGRAMS.name, target="cuda", options=GPU_OPTIONS)
