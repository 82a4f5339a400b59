"""Every sample compiles for the CPU, runs on fresh random inputs and matches the reference
interpreter, at sizes that are and are not multiples of its tiles (and at the smallest size)."""

from __future__ import annotations

import pytest
from conftest import SAMPLES, check_text

SAMPLE_FILES = sorted(SAMPLES.glob("*.tile"))

# Sizes that are multiples of every default CPU tile the sample's kernels use.
TILE_MULTIPLES = {
    "gemm_bias_relu": dict(M=128, N=512, K=512),
    "gemm_gelu_softmax": dict(M=256, N=256, K=256),
    "batched_matmul": dict(B=2, M=256, N=256, K=256),
    "w4a16": dict(M=128, N=256, K=512),
    "w4a16_kmajor": dict(M=128, N=256, K=512),
    "attention": dict(B=1, H=2, L=128, S=128, D=64),
    "causal_attention": dict(B=2, H=1, L=128, D=32),
    "elementwise_chain": dict(R=16, C=2048),
    "softmax": dict(R=64, C=1024),
    "rmsnorm": dict(R=64, C=1024),
    "layernorm": dict(R=32, C=512),
    "multi_output": dict(R=32, C=256),
    "linear_tf32": dict(M=128, N=256, K=256),
}


def test_every_sample_has_tile_multiple_sizes():
    assert {f.stem for f in SAMPLE_FILES} == set(TILE_MULTIPLES)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("sizes", ["odd", "tile_multiple", "ones"])
def test_sample_matches_reference(path, sizes):
    text = path.read_text()
    if sizes == "odd":
        dims = None  # the runner's defaults: 100-ish, not a multiple of any tile
    elif sizes == "tile_multiple":
        dims = TILE_MULTIPLES[path.stem]
    else:
        # (the W4A16 samples assume K % 128 == 0)
        dims = {k: (128 if path.stem.startswith("w4a16") and k == "K" else 1)
                for k in TILE_MULTIPLES[path.stem]}
    results = check_text(text, dims, name=path.name)
    assert results, "the sample defines no kernel"
