"""Differential testing of the CPU build on random GEMM fusions (tests/random_gemm_fusions.py):
prologues, transposes, batches, epilogue chains and row reductions around one product, each
checked against the reference interpreter on fresh random inputs at dims that are and are not
tile multiples (1 among them). CI replays a fixed set of programs; local runs draw new ones
(TILEC_GEMM_EXAMPLES=200 to hunt harder). On a failure the program, dims and seed are printed."""

from __future__ import annotations

import os

from conftest import check_text
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from random_gemm_fusions import program

EXAMPLES = int(os.environ.get("TILEC_GEMM_EXAMPLES", "8"))
DERANDOMIZE = os.environ.get("CI", "").lower() == "true"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), seed=st.integers(0, 2**32 - 1),
       dims=st.sampled_from([{"M": 33, "K": 70, "N": 129, "B": 2},
                             {"M": 1, "K": 1, "N": 5, "B": 1},
                             {"M": 130, "K": 257, "N": 3, "B": 3}]))
def test_random_gemm_fusion(rng, seed, dims):
    text = program(rng)
    note(f"\n{text}\n# tilec run prog.tile --dims "
         f"{','.join(f'{k}={v}' for k, v in dims.items())} --seed {seed}")
    check_text(text, dims=dims, seed=seed)  # (asserts every output within its tolerance)
