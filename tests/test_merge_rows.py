"""A batched GEMM by one 2-D weight runs as one GEMM of all its rows (passes/merge_rows.py):
the kernels see [B * S, K] where the program says [B, S, K], wherever every op of the graph
keeps to those rows; elsewhere the graph is left as it is. TILEC_MERGE_ROWS=0 turns it off."""

import pytest
from conftest import check_text, compile_text
from test_cuda import need_gpu

from tilec.ir import tile as T
from tilec.passes import merge_rows

MERGED = """
kernel linear3(X: f16[B, S, K], W: f16[N, K], b: f16[N]) -> Y: f16[B, S, N]:
    Y = gelu(X @ W.T + b)

kernel norm_linear_softmax(X: f32[B, S, K], g: f32[K], W: f32[K, N]) -> Y: f32[B, S, N]:
    Z = X - mean(X, axis=-1, keepdims=True)
    Y = softmax((Z * g) @ W, axis=-1)

kernel heads_row_sums(X: f32[B, H, S, K], W: f32[K, N]) -> Y: f32[B, H, S]:
    Z = X @ W
    Y = sum(Z * f32(index(Z, -1)), axis=-1)
"""

# each mixes the rows with other positions: a tensor broadcast over B only, a reduction over a
# row axis, the index of a row axis, a transposed batched operand, a batched B
KEPT = """
kernel per_position(X: f32[B, S, K], W: f32[K, N], P: f32[S, N]) -> Y: f32[B, S, N]:
    Y = X @ W + P

kernel batch_mean(X: f32[B, S, K], W: f32[K, N]) -> Y: f32[S, N]:
    Y = mean(X @ W, axis=0)

kernel position_index(X: f32[B, S, K], W: f32[K, N]) -> Y: f32[B, S, N]:
    Z = X @ W
    Y = Z + f32(index(Z, 1))

kernel transposed_rows(X: f32[B, K, S], W: f32[K, N]) -> Y: f32[B, S, N]:
    Y = X.T @ W

kernel batched_b(A: f32[B, S, K], Bm: f32[B, K, N]) -> Y: f32[B, S, N]:
    Y = A @ Bm
"""


def _compiled(text: str, target: str = "cpu", options=None):
    return compile_text(text, "rows.tile", target, options=options)[2]


def test_rows_of_a_batched_gemm_by_one_weight_are_merged():
    m = _compiled(MERGED)
    for g in m.graphs:
        v = merge_rows.view(g)
        assert v is not None, g.name
        # the view's tensors have one row dim; the program's signature stays its own
        x, y = v.params[0].type, v.outputs[0].type
        rows = "B * H * S" if g.name == "heads_row_sums" else "B * S"
        assert str(x.shape[0]) == str(y.shape[0]) == rows and x.rank == 2, g.name
        assert g.params[0].type.rank == x.rank + (2 if rows == "B * H * S" else 1)
    # the kernels see the view: the GEMM's X and Y as [B * S, ...]; printed as a tile-level
    # kernel, B and S are declared dimensions (no input names them as an axis)
    k = next(k for p in m.programs for k in p.kernels if k.name == "linear3_k0")
    assert "(X: f16[B * S, K], W: f16[N, K], b: f16[N], B: dim, S: dim) -> Y: f16[B * S, N]" \
        in T.print_kernel(k)


def test_graphs_that_mix_rows_with_other_positions_keep_their_shapes():
    for g in _compiled(KEPT).graphs:
        assert merge_rows.view(g) is None, g.name


def test_merged_gemms_for_cuda_take_decode_and_tma_variants_on_all_rows():
    """On CUDA the decode variants test B * S (B = 8 calls of one row each: one GEMM of 8 rows
    reading the weight once), and the sm_90a kernel's TMA maps cover all rows."""
    m = _compiled(MERGED.split("\nkernel norm")[0], "cuda", {"arch": ("sm_90a",)})
    kernels = {k.name: k for p in m.programs for k in p.kernels}
    assert "B * S <= 16" in str(kernels["linear3_k0_m16"].when)
    assert "(X: f16[B * S, K], W: f16[N, K], b: f16[N], B: dim, S: dim) -> Y: f16[B * S, N]" \
        in T.print_kernel(kernels["linear3_k0_tma"])


@pytest.mark.parametrize("dims", [dict(B=3, S=37, H=2, K=70, N=45), dict(B=2, S=1, H=1, K=64, N=33)],
                         ids=["ragged", "decode"])
def test_merged_and_kept_graphs_match_the_reference(dims):
    check_text(MERGED + KEPT, dims, name="rows.tile", target="cpu")


def test_the_knob_at_0_leaves_the_rows_alone(monkeypatch):
    monkeypatch.setenv("TILEC_MERGE_ROWS", "0")
    assert all(merge_rows.view(g) is None for g in _compiled(MERGED).graphs)


def test_the_tiled_dump_of_merged_kernels_parses_back_as_tile_level_kernels():
    """`dump-ir --stage tiled` prints kernels to edit and build as tile-level kernels: the
    merged kernels declare B and S (`B: dim`), which their shapes use only in B * S."""
    from tilec import driver
    m0 = driver.frontend(driver.Source("rows.tile", MERGED))
    dump = driver.print_stage(driver.stage_module(m0, "tiled", "cuda", options={"arch": ("sm_80",)}),
                              "tiled")
    assert "B: dim, S: dim" in dump
    back = driver.frontend(driver.Source("dump.tile", dump))
    assert {g.name for g in back.graphs} >= {"linear3_k0", "norm_linear_softmax_k1"}
    g = next(g for g in back.graphs if g.name == "linear3_k0")
    assert g.symbols[:2] == ("B", "S")


@pytest.mark.gpu
def test_merged_gemms_on_gpu():
    """sm_90a and sm_80 kernels on all rows: decode rows (the GEMV and small-M variants), rows
    that are not a tile multiple per batch (197 tokens), and the TMA variants' maps over B * S
    rows."""
    need_gpu()
    for arch in ("sm_90a", "sm_80"):
        for dims in (dict(B=8, S=1, H=2, K=256, N=136), dict(B=3, S=197, H=2, K=264, N=200),
                     dict(B=2, S=130, H=3, K=64, N=512)):
            check_text(MERGED, dims, name="rows_gpu.tile", target="cuda", options={"arch": (arch,)})
