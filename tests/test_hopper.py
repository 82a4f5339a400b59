"""The Hopper (sm_90a) path of the CUDA target: warp-specialized GEMMs on TMA and wgmma.

Without a GPU (CI): with `--arch sm_90a` a GEMM group gets a warp-specialized, persistent variant
(the Tile IR says so), its CUDA source compiles warning-free for sm_90a without spills, its PTX
holds wgmma, TMA copies and setmaxnreg, and its SASS HGMMA and UTMALDG (read by cuobjdump or
nvdisasm); other architecture lists, `warp_specialize off` and operands TMA cannot read keep the
mma.sync kernel.

With a GPU (`pytest -m gpu`, an H100/H200): the variant alone (the others removed, so a launch
condition that fails is an error, not a silent fallback) matches the reference at sizes that are
and are not tile multiples, f16 and bf16, B row-major and transposed, batched with A transposed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import check_text, compile_text
from test_cuda import (
    kept_ptx,
    kept_sass,
    need_gpu,
    need_nvcc,
    nvcc_each,
    ptxas_lines,
    sass_functions,
    variants_only,
)
from test_tile_level import in_shape_of

from tilec import driver
from tilec.diagnostics import TilecError
from tilec.ir import tile as T
from tilec.ir.types import Dim
from tilec.passes import tile as tile_pass

HOPPER = {"arch": ("sm_90a",)}

GEMMS_A_K_MAJOR = """
kernel hop_bias_relu(A: f16[M, K], B: f16[K, N], bias: f16[N]) -> C: f16[M, N]:
    C = relu(A @ B + bias)

kernel hop_bf16_bt(A: bf16[M, K], W: bf16[N, K]) -> C: f32[M, N]:
    C = A @ W.T
"""
GEMMS = GEMMS_A_K_MAJOR + """
kernel hop_batched(A: f16[Z, K, M], B: f16[Z, K, N]) -> C: f16[Z, M, N]:
    C = A.T @ B * 0.5
"""


# fp8: wgmma multiplies e4m3 / e5m2 from shared memory with both operands K-major (A @ W.T)
GEMMS_FP8 = """
kernel hop_fp8(A: fp8e4m3[M, K], W: fp8e4m3[N, K], s: f32) -> C: bf16[M, N]:
    C = bf16((A @ W.T) * s)

kernel hop_e5m2_batched(A: fp8e5m2[Z, M, K], W: fp8e5m2[Z, N, K]) -> C: f32[Z, M, N]:
    C = A @ W.T
"""


# tf32: f32 operands under `precision tf32`, K-major (A @ W.T), on wgmma's tf32 form (k-steps of 8)
GEMMS_TF32 = """
kernel hop_tf32(X: f32[M, K], W: f32[N, K], b: f32[N]) -> C: f32[M, N]:
    C = gelu(X @ W.T + b)

kernel hop_tf32_batched(A: f32[Z, M, K], W: f32[Z, N, K]) -> C: f32[Z, M, N]:
    C = A @ W.T * 0.5

schedule hop_tf32:
    target cuda:
        precision tf32

schedule hop_tf32_batched:
    target cuda:
        precision tf32
"""


# fp8 and tf32 operands stored MN-major (wgmma's fp8 and tf32 forms take K-major ones only): A
# as stored, B row-major, A transposed (A.T), B broadcast over a batch or batched itself
GEMMS_MN_MAJOR = """
kernel mn_tf32(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C: f32[M, N]:
    C = relu(A @ B + b)

kernel mn_tf32_at(A: f32[Z, K, M], B: f32[Z, K, N]) -> C: f32[Z, M, N]:
    C = A.T @ B * 0.5

kernel mn_e4m3(A: fp8e4m3[M, K], B: fp8e4m3[K, N]) -> C: bf16[M, N]:
    C = A @ B

kernel mn_e5m2_at(A: fp8e5m2[K, M], W: fp8e5m2[N, K]) -> C: f32[M, N]:
    C = A.T @ W.T

kernel mn_e4m3_batched(A: fp8e4m3[Z, M, K], B: fp8e4m3[K, N]) -> C: f16[Z, M, N]:
    C = A @ B

schedule mn_tf32:
    target cuda:
        precision tf32

schedule mn_tf32_at:
    target cuda:
        precision tf32
"""
# (the operands each program copies transposed)
MN_MAJOR = {"mn_tf32": {"B"}, "mn_tf32_at": {"A", "B"}, "mn_e4m3": {"B"}, "mn_e5m2_at": {"A"},
            "mn_e4m3_batched": {"B"}}


def _kernels(text: str, options=HOPPER) -> list:
    """The CUDA kernels of `text` built with `options` (None: the default architectures)."""
    _, _, m = compile_text(text, "hop.tile", "cuda", options=options)
    return [k for p in m.programs for k in p.kernels]


def _tma_variants_only(monkeypatch, suffix: str = "_tma"):
    """Build the warp-specialized variants (`suffix`: `_tma`, `_tma_pairs` in clusters of 2 or
    `_tma_waves` of the second tile) alone, where a group has them: a condition of theirs that
    fails is then an error, not a fall-through to another kernel (the second tile's choice by
    waves apart: it runs at every size)."""
    variants_only(monkeypatch, lambda s: s == suffix)


def _hopper_variants(prog) -> list:
    """The variants of `prog` (each the tuple of kernels it launches) that end in a
    warp-specialized kernel."""
    return [parts for variants in prog.slots() for parts in variants
            if parts[-1].warp_specialize]


def _tiles_match_reference(g, k, dims: dict, out: str):
    """Kernel `k` (tiled Tile IR; or a tuple of kernels, a variant's launches) of graph `g`,
    run by the Tile IR interpreter on fresh random inputs at `dims`, computes output `out` as
    the reference interpreter does."""
    from tilec import interp
    from tilec.interp_tile import run_program
    inputs = interp.random_inputs(g, dims, 1, False)
    ref = interp.run_graph(g, inputs, dims)
    got = run_program(list(k) if isinstance(k, tuple) else [k], inputs, dims, [out])
    err = interp.rel_error(in_shape_of(got[out], ref[out]), ref[out])
    assert err <= interp.tolerance(g.outputs[0].type.dtype), (g.name, dims)


def test_gemms_get_a_warp_specialized_persistent_variant():
    ks = {k.name: k for k in _kernels(GEMMS)}
    for name in ("hop_bias_relu", "hop_bf16_bt", "hop_batched"):
        k = ks[f"{name}_k0_tma"]
        assert k.warp_specialize == 2 and k.persistent and k.threads == 384
        text = T.print_kernel(k)
        assert re.search(r"for k in warp_specialized\(\w+, stages=4\)", text)
        assert "wgmma(warpgroups 2 of 64x256" in text and "TMA 128-byte swizzle" in text
        assert "# warp roles: consumers = warpgroups 0-1, producer = warpgroup 2" in text
        assert "# persistent grid" in text
        # TMA needs 16-byte row strides and addresses: the variant says so; the mma.sync kernel
        # stays as the fallback
        assert "% 8 == 0" in str(k.when) and k.aligned
        assert f"{name}_k0" in ks


def test_b_rows_off_128_byte_lines_take_clusters_of_2_first(monkeypatch):
    """Where B's rows (N of A @ B, K of A @ W.T) may start off 128-byte lines, a variant in
    clusters of 2 sharing B tiles comes before the plain one, with that as its run-time
    condition; not for batched GEMMs, nor where the extents say the rows start on lines, nor
    with TILEC_WGMMA_PAIRS=0."""
    ks = _kernels(GEMMS)
    names = [k.name for k in ks]
    for name, row in (("hop_bias_relu", "N"), ("hop_bf16_bt", "K")):
        k = ks[names.index(f"{name}_k0_tma_pairs")]
        assert names.index(f"{name}_k0_tma_pairs") + 2 == names.index(f"{name}_k0_tma_waves") + 1 \
            == names.index(f"{name}_k0_tma")
        assert k.cluster == 2 and ks[names.index(f"{name}_k0_tma")].cluster == 1
        assert f"{row} % 64 != 0" in str(k.when) and "% 8 == 0" in str(k.when)
        assert "clusters of 2" in T.print_kernel(k)
    assert "hop_batched_k0_tma_pairs" not in names
    on_lines = "kernel t(A: f16[M, K], B: f16[K, 4096]) -> C: f16[M, 4096]:\n    C = A @ B\n"
    # (then the variant on padded copies, for K off 16 bytes)
    assert [k.name for k in _kernels(on_lines) if k.warp_specialize] == [
        "t_k0_tma_waves", "t_k0_tma", "t_k0_tma_pad"]
    off = _kernels(on_lines.replace("4096", "4088"))
    assert [k.name for k in off if k.warp_specialize] == ["t_k0_tma_pairs", "t_k0_tma_waves",
                                                          "t_k0_tma", "t_k0_tma_pad"]
    assert "% 64" not in str(off[0].when)  # (known true: TMA's own conditions alone)
    monkeypatch.setenv("TILEC_WGMMA_PAIRS", "0")
    assert not any(k.cluster > 1 for k in _kernels(GEMMS))


def test_a_second_tile_runs_where_it_fills_the_waves_better(monkeypatch):
    """16-bit GEMMs get a variant of 192 x 128 tiles (three consumer warpgroups) before the
    128 x 256 one, taken where its waves of tiles over the device's multiprocessors (the
    launcher asks the runtime) cost a tenth less; batched GEMMs count every matrix's tiles.
    Not for fp8, nor beside a TILEC_WGMMA tile, nor with TILEC_WGMMA_WAVES=0."""
    ks = _kernels(GEMMS)
    names = [k.name for k in ks]
    for name in ("hop_bias_relu", "hop_bf16_bt", "hop_batched"):
        k = ks[names.index(f"{name}_k0_tma_waves")]
        assert k.threads == 512 and k.warp_specialize == 3 and T.SMS in k.when.symbols()
        assert "warpgroups 3 of 64x128" in T.print_kernel(k)
    k = ks[names.index("hop_bias_relu_k0_tma_waves")]
    sms = {T.SMS: 132, "K": 768}
    # (linear layers measured on an H100: the 192 x 128 tiles where they won)
    for (M, N), wins in {(6304, 768): True, (6304, 3072): True, (4096, 4096): False,
                         (4096, 11008): False, (2048, 2048): False, (8192, 8192): False,
                         (128, 256): True}.items():
        # (one wave either way: the smaller tile's blocks each compute less)
        assert bool(tile_pass.fuller_waves(Dim.sym("M"), Dim.sym("N"), (), (128, 256), (192, 128))
                    .eval({**sms, "M": M, "N": N})) == wins, (M, N)
    batched = ks[names.index("hop_batched_k0_tma_waves")]
    assert "* Z" in str(batched.when) or "Z *" in str(batched.when)
    src, _, m = compile_text(GEMMS, "hop.tile", "cuda", options=HOPPER)
    cu = "".join(driver.render(src, m, "cuda", HOPPER).values())
    assert "const int64_t tilec_sms = (int64_t)std::max(tilec::sm_count(), 1);" in cu
    assert not any(k.name.endswith("_waves") for k in _kernels(GEMMS_FP8))
    for var, value in (("TILEC_WGMMA", "128x128,6"), ("TILEC_WGMMA_WAVES", "0")):
        with monkeypatch.context() as mp:
            mp.setenv(var, value)
            assert not any(k.name.endswith("_waves") for k in _kernels(GEMMS))
    # the knob's own tile (192 columns: wgmma n192), and one the registers cannot hold
    monkeypatch.setenv("TILEC_WGMMA_WAVES", "192x192")
    k = next(k for k in _kernels(GEMMS) if k.name == "hop_bias_relu_k0_tma_waves")
    assert k.threads == 512 and "warpgroups 3 of 64x192" in T.print_kernel(k)
    monkeypatch.setenv("TILEC_WGMMA_WAVES", "192x256")
    with pytest.raises(TilecError, match="TILEC_WGMMA_WAVES='192x256'"):
        _kernels(GEMMS)


@pytest.mark.parametrize("options, sched", [
    ({"arch": ("sm_90",)}, ""), ({"arch": ("sm_80", "sm_90")}, ""),
    (HOPPER, "schedule t:\n    target cuda:\n        warp_specialize off\n")])
def test_other_archs_and_warp_specialize_off_keep_mma_sync(options, sched):
    text = "kernel t(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:\n    C = A @ B\n" + sched
    assert not any(k.warp_specialize for k in _kernels(text, options))


MIXED = {"arch": ("sm_80", "sm_90a")}


def test_a_mixed_build_holds_hopper_kernels_for_h100s_alone():
    """sm_80 + sm_90a build one library: the warp-specialized kernel is sm_90a code (a stub
    elsewhere), launched only where the device is an H100/H200; the PTX for newer GPUs is
    sm_90's (arch-specific code runs only on the GPU it names)."""
    assert any(k.warp_specialize for k in _kernels(GEMMS, MIXED))
    src, _, m = compile_text(GEMMS, "hop.tile", "cuda", options=MIXED)
    files = driver.render(src, m, "cuda", MIXED)
    cu = files["hop_bias_relu.cu"]
    body = cu[cu.index("hop_bias_relu_k0_tma("):]
    body = body[:body.index("\n}\n")]
    assert "#if defined(TILEC_SM90A)" in body and "__trap();" in body
    # (a variant whose tensor map the driver refuses falls through to the next: the one on
    # padded copies, for rows off 16 bytes, then the mma.sync kernel; the padded one's first
    # launch is no Hopper kernel, its condition still asks for the device)
    assert re.search(r"tilec::aligned16\(C\) && tilec::sm90a_device\(\) && \(tilec_status = "
                     r"tilec_launch_hop_bias_relu_k0_tma\([^)]*\)\) != TILEC_ERR_UNSUPPORTED\) \{"
                     r"\s+// [^\n]*\n\s+\} else if \([^\n]*% 8 != 0[^\n]*"
                     r"tilec::sm90a_device\(\)\) \{\s+tilec_status = "
                     r"tilec_launch_hop_bias_relu_k0_tma_pad_A\([^\n]*\n[^\n]*"
                     r"tilec_launch_hop_bias_relu_k0_tma_pad_B\([^\n]*\n[^\n]*"
                     r"tilec_launch_hop_bias_relu_k0_tma_pad\([^\n]*\n"
                     r"\s+\} else if \(true\) \{\s+tilec_status = "
                     r"tilec_launch_hop_bias_relu_k0\(", cu)
    assert "arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90" in files["Makefile"]


# programs of the kinds users write, none a sample: A transposed with a broadcast or batched
# operand, both operands transposed, two outputs of one product, 4-D operands (addressed as 3:
# their leading dims merged), one of them broadcast; attention with Dv != Dk, head dims fixed at
# part of a panel, causal with heads
HOPPER_MIX = """
kernel mix_4d(A: f16[Y, Z, M, K], B: f16[Y, Z, K, N]) -> C: f16[Y, Z, M, N]:
    C = A @ B

kernel mix_4d_linear(X: bf16[Y, Z, M, K], W: bf16[N, K]) -> C: bf16[Y, Z, M, N]:
    C = silu(X @ W.T)

kernel mix_at_bcast(A: bf16[K, M], B: bf16[Z, K, N]) -> C: bf16[Z, M, N]:
    C = A.T @ B

kernel mix_at_bt(A: f16[K, M], B: f16[N, K], b: f32[M, 1]) -> C: f32[M, N]:
    C = f32(A.T @ B.T) + b

kernel mix_at_two_outputs(A: f16[K, M], B: f16[K, N]) -> (C: f16[M, N], s: f32[M]):
    Z = A.T @ B
    C = tanh(Z)
    s = sum(f32(Z), axis=1)

kernel mix_att_dk64_dv128(Q: f16[Z, L, 64], K: f16[Z, S, 64], V: f16[Z, S, 128]) -> O: f16[Z, L, 128]:
    O = f16(softmax(Q @ K.T, axis=-1)) @ V

kernel mix_att_d48(Q: bf16[L, 48], K: bf16[S, 48], V: bf16[S, 48]) -> O: bf16[L, 48]:
    O = bf16(softmax(Q @ K.T * 0.14, axis=-1)) @ V

kernel mix_att_d112_causal(Q: f16[Z, H, L, 112], K: f16[Z, H, L, 112], V: f16[Z, H, L, 112]) \
        -> O: f16[Z, H, L, 112]:
    S = (Q @ K.T) * 0.09
    S = where(index(S, -1) > index(S, -2), -inf, S)
    O = f16(softmax(S, axis=-1)) @ V
"""


def test_programs_of_other_shapes_get_the_hopper_kernels():
    ks = {k.name for k in _kernels(HOPPER_MIX)}
    names = re.findall(r"^kernel (\w+)\(", HOPPER_MIX, re.M)
    assert len(names) == 8 and all(f"{n}_k0_tma" in ks for n in names), sorted(ks)


def test_four_dim_gemm_tiles_compute_what_the_reference_does():
    """The tiled Tile IR of the Hopper variant of 4-D GEMMs (both operands 4-D, and a 2-D
    weight), run by the Tile IR interpreter: the merged batch index walks every (Y, Z) pair."""
    text = HOPPER_MIX[:HOPPER_MIX.index("kernel mix_at_bcast")]
    m0 = driver.frontend(driver.Source("hop.tile", text))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    assert len(mod.graphs) == 2
    for g, prog in zip(mod.graphs, mod.programs):
        (k,) = [k for k in prog.kernels if k.name.endswith("_tma")]
        for dims in (dict(Y=2, Z=3, M=130, N=264, K=72), dict(Y=1, Z=2, M=1, N=8, K=8)):
            _tiles_match_reference(g, k, dims, "C")


@pytest.mark.gpu
def test_programs_of_other_shapes_on_gpu(monkeypatch):
    """HOPPER_MIX's Hopper variants alone against the reference, at sizes that are and are not
    tile multiples (M a multiple of 8: TMA reads a transposed A's rows of M values)."""
    need_gpu()
    _tma_variants_only(monkeypatch)
    for dims in (dict(M=136, N=200, K=72, Y=2, Z=2, H=3, L=130, S=300),
                 dict(M=256, N=256, K=256, Y=3, Z=1, H=1, L=257, S=1)):
        check_text(HOPPER_MIX, dims, name="hop_mix.tile", target="cuda", options=HOPPER)


@pytest.mark.parametrize("text", [
    # two fp8 kinds, A transposed (wgmma takes the pair; tilec does not issue it); an operand
    # computed on chip (f32 inputs converted)
    "kernel t(A: fp8e4m3[K, M], B: fp8e5m2[N, K]) -> C: f16[M, N]:\n    C = f16(A.T @ B.T)\n",
    "kernel t(A: f32[M, K], B: f16[K, N]) -> C: f32[M, N]:\n    C = f16(A) @ B\n"])
def test_operands_tma_cannot_read_keep_mma_sync(text):
    ks = _kernels(text)
    assert ks and not any(k.warp_specialize for k in ks)


def test_fp8_gemms_get_the_warp_specialized_variant_on_fp8_wgmma():
    """Two K-major fp8 operands of one dtype stay fp8 through TMA into wgmma: the target's fp8
    tile (128 x 128, K tiles of 128 values in the same 128-byte rows), each K tile's products
    promoted (added to the accumulators in f32); two fp8 kinds take the mma.sync kernel on f16
    (the operands converted in the tile copies), and so does a row-major fp8 B, but for the
    variants that copy it transposed."""
    ks = {k.name: k for k in _kernels(GEMMS_FP8)}
    for name, dt in (("hop_fp8", "fp8e4m3"), ("hop_e5m2_batched", "fp8e5m2")):
        k = ks[f"{name}_k0_tma"]
        assert k.warp_specialize == 2 and k.persistent
        text = T.print_kernel(k)
        assert re.search(rf"A_s = shared\({dt}, \[6, 128, 128\]\)", text)
        assert re.search(rf"B_s = shared\({dt}, \[6, 128, 128\]\)", text)
        assert "transpose_b=True, promote=128)" in text
        assert "% 16 == 0" in str(k.when)  # (16-byte rows: K a multiple of 16 values)
        assert "A_s = shared(f16" in T.print_kernel(ks[f"{name}_k0"])
    for text, ws in (
            ("kernel t(A: fp8e4m3[M, K], B: fp8e4m3[K, N]) -> C: f16[M, N]:\n    C = A @ B\n",
             ["t_k0_tma", "t_k0_tma_pad"]),
            ("kernel t(A: fp8e4m3[M, K], W: fp8e5m2[N, K]) -> C: f16[M, N]:\n    C = A @ W.T\n",
             [])):
        ks = _kernels(text)
        assert [k.name for k in ks if k.warp_specialize] == ws
        assert "A_s = shared(f16" in T.print_kernel(next(k for k in ks if k.name == "t_k0"))


@pytest.mark.parametrize("var, value, text", [
    *[("TILEC_FP8_PROMOTE", v, GEMMS_FP8) for v in ("100", "-128", "x", "128,2")],
    *[("TILEC_FP8_PAIRS", v, GEMMS_FP8) for v in ("2", "x", "1,1")],
    *[(var, v, GEMMS) for var in ("TILEC_DEFER_EPILOGUE", "TILEC_WGMMA_PAIRS", "TILEC_WGMMA_WAVES",
                                  "TILEC_WGMMA_TF32",
                                  "TILEC_MERGE_ROWS")
      for v in ("2", "x", "1,0")],
    *[("TILEC_PAD_LEAST", v, GEMMS) for v in ("-1", "x", "1,0")],
    *[("TILEC_TRANSPOSE_WORK", v, GEMMS_MN_MAJOR) for v in ("-1", "x", "1,0")]])
def test_a_malformed_knob_is_a_user_error(monkeypatch, var, value, text):
    monkeypatch.setenv(var, value)
    with pytest.raises(TilecError, match=var):
        _kernels(text)


@pytest.mark.parametrize("pairs", ["", "0"])
def test_promoted_k_tiles_go_in_pairs(monkeypatch, pairs):
    """Each K tile promoted (the default): the K tiles go in pairs, each into a partial of its
    own, the second's wgmmas issued before the first's partial is added, both complete before
    the loop repeats, and an odd last one alone; TILEC_FP8_PAIRS=0 one at a time."""
    if pairs:
        monkeypatch.setenv("TILEC_FP8_PAIRS", pairs)
    src = _kernel_source(GEMMS_FP8)
    body = src[src.index("float tilec_part[64]"):]
    body = body[:body.index("fence_regs<64>(acc)")]
    if pairs == "0":
        assert "tilec_part2" not in body and body.count("wgmma_tile<") == 1
        return
    loop = body[body.index("for (int64_t tilec_p = 0;"):body.index("the odd last K tile")]
    order = [loop.index(s) for s in ("wgmma_tile<128, 128, false, tilec::sm90::WG_E4M3>(tilec_part,",
                                     "wgmma_tile<128, 128, false, tilec::sm90::WG_E4M3>(tilec_part2,",
                                     "wgmma_wait<1>", "promote<64>(acc, tilec_part)",
                                     "wgmma_wait<0>", "promote<64>(acc, tilec_part2)")]
    assert order == sorted(order), loop
    tail = body[body.index("the odd last K tile"):]
    assert tail.count("wgmma_tile<") == 1 and "wgmma_wait<0>" in tail


@pytest.mark.nvcc
@pytest.mark.parametrize("promote", ["", "256", "off", "pairs=0"])
def test_fp8_gemms_compile_to_fp8_wgmma(monkeypatch, promote):
    """Promoted each K tile in pairs (the default) or one at a time (TILEC_FP8_PAIRS=0), each
    two and never (TILEC_FP8_PROMOTE)."""
    if promote == "pairs=0":
        monkeypatch.setenv("TILEC_FP8_PAIRS", "0")
        promote = ""
    elif promote:
        monkeypatch.setenv("TILEC_FP8_PROMOTE", promote)
    need_nvcc()
    ks = [k for k in _kernels(GEMMS_FP8) if k.warp_specialize and not k.padded]
    gemms = [s for k in ks for s in T.walk_stmts(k.body) if isinstance(s, T.Gemm)]
    assert len(gemms) == 2 and {g.promote for g in gemms} == {
        {"": 128, "256": 256, "off": 0}[promote]}
    # the promoted loop (a 64-register partial beside the accumulators): no spills, and no
    # warpgroup.arrive that ptxas injects where registers a wgmma uses are touched in between
    ptx = ""
    for f, r, folder in nvcc_each(GEMMS_FP8, "hop8.tile", [
            "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o", "k.o",
            "--keep"], HOPPER):
        assert r.returncode == 0 and "warning" not in r.stderr.lower(), r.stderr
        ptx += kept_ptx(folder, f, "compute_90a")
        assert "C7519" not in r.stderr and "warpgroup.arrive" not in r.stderr, r.stderr
        report = ptxas_lines(r.stderr)
        assert report and not any(spills for _, spills in report.values()), r.stderr
        # (the launch gives each thread the kernel's count: setmaxnreg's counts add up to it;
        # the warp-specialized kernels are those taking tensor maps)
        assert all(regs == 168 for (name, _), (regs, _) in report.items()
                   if "CUtensorMap" in name), report
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3", ptx)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e5m2\.e5m2", ptx)
    assert "cp.async.bulk.tensor.2d" in ptx and "cp.async.bulk.tensor.3d" in ptx


def _kernel_source(text: str) -> str:
    """The CUDA sources of every kernel of `text` (built for sm_90a), one after the other."""
    src, _, m = compile_text(text, "hop.tile", "cuda", options=HOPPER)
    files = driver.render(src, m, "cuda", HOPPER)
    return "".join(v for k, v in files.items() if k.endswith(".cu"))


def test_warp_specialized_source_structure():
    cu = _kernel_source(GEMMS)
    k = cu[cu.index("hop_bias_relu_k0_tma("):]
    k = k[:k.index("\n}\n")]
    # the warp index from lane 0: warp-uniform to ptxas (a warpgroup's descriptors in uniform
    # registers); kernels that are not warp-specialized compute it in each lane
    assert "const int tilec_warp = __shfl_sync(0xffffffffu, tilec_tid >> 5, 0);" in k
    mma = cu[cu.index("hop_bias_relu_k0("):]
    assert "const int tilec_warp = tilec_tid >> 5;" in mma[:mma.index("\n}\n")]
    # nor do fp8 ones, whose descriptors are rebuilt per k-step (slower in uniform registers)
    src, _, m = compile_text(GEMMS_FP8, "hop.tile", "cuda", options=HOPPER)
    fp8 = "".join(v for f, v in driver.render(src, m, "cuda", HOPPER).items() if f.endswith(".cu"))
    for name in ("hop_fp8_k0_tma(", "hop_e5m2_batched_k0_tma("):
        k8 = fp8[fp8.index(name):]
        k8 = k8[:k8.index("\n}\n")]
        assert "const int tilec_warp = tilec_tid >> 5;" in k8 and "__shfl_sync" not in k8
    # roles: registers move to the consumers; the producer's one thread waits for free stages
    assert k.index("setmaxnreg_dec<40>") < k.index("setmaxnreg_inc<232>")
    assert re.search(r"mbar_wait\(&tilec_empty\[tilec_s\], \(\(tilec_it / 4\) & 1\) \^ 1\)", k)
    assert re.search(r"mbar_wait\(&tilec_full\[tilec_s\], \(tilec_it / 4\) & 1\)", k)
    # B row-major: 4 panels of 64 columns, one expected-bytes arrival per stage (A 16 + B 32 KiB)
    assert len(re.findall(r"tma_load_2d\(B_s", k)) == 4
    assert "mbar_arrive_expect_tx(&tilec_full[tilec_s], 49152)" in k
    assert "wgmma_tile<256, 64, true, tilec::sm90::WG_F16>" in k
    # A transposed (hop_batched): read MN-major too, its tile K rows of 2 panels of 64 M columns,
    # a consumer warpgroup's panel 64 x 64 values after the other's
    kb = cu[cu.index("hop_batched_k0_tma("):]
    kb = kb[:kb.index("\n}\n")]
    assert len(re.findall(r"tma_load_3d\(A_s", kb)) == 2
    assert "wgmma_tile<256, 64, true, tilec::sm90::WG_F16, 128, true>(acc, A_s + tilec_s * 8192 " \
        "+ (tilec_warp / 4) * 4096, B_s + tilec_s * 16384)" in kb
    # the persistent loop over tiles in both roles, and no block-wide barrier after the split
    assert k.count("tilec_b += gridDim.x") == 2
    assert "__syncthreads" not in k[k.index("if (tilec_warp >= 8)"):]
    # the launcher: cached tensor maps, a grid of at most one block per SM
    assert "tilec::tensor_map(&tilec_map_A" in cu and "tilec::sm_count()" in cu
    assert re.search(r"tilec::aligned16\(A\) && tilec::aligned16\(B\)", cu)


def test_whole_output_tiles_leave_by_tma_stores(monkeypatch):
    """The epilogue of a whole tile writes each consumer warpgroup's 64 rows into shared memory,
    128 bytes of a row per panel (64 16-bit or 32 f32 columns) in two alternating buffers, and
    one thread per warpgroup stores each panel by TMA (3-D for a batched output); a tile at the
    ragged edge stores from registers. The output's alignment joins the variant's conditions.
    (The epilogue as it runs at the end of its own tile: TILEC_DEFER_EPILOGUE=0.)"""
    monkeypatch.setenv("TILEC_DEFER_EPILOGUE", "0")
    ks = {k.name: k for k in _kernels(GEMMS)}
    src, _, m = compile_text(GEMMS, "hop.tile", "cuda", options=HOPPER)
    cu = "".join(v for f, v in driver.render(src, m, "cuda", HOPPER).items() if f.endswith(".cu"))
    for name, dtype, panels, cols, rank in (("hop_bias_relu", "f16", 4, 64, 2),
                                            ("hop_bf16_bt", "f32", 8, 32, 2),
                                            ("hop_batched", "f16", 4, 64, 3)):
        k = ks[f"{name}_k0_tma"]
        assert k.tma_stores == (("C", "C_st"),) and "C" in k.aligned
        text = T.print_kernel(k)
        assert f"C_st = shared({dtype}, [4, 64, {cols}])" in text
        assert "# epilogue: a whole tile of C leaves through C_st" in text
        conds = str(k.when).split(" & ")
        assert len(conds) == len(set(conds))  # (no condition twice)
        body = cu[cu.index(f"{name}_k0_tma("):]
        body = body[:body.index("\n}\n")]
        whole, edge = body.split("} else {\n                #pragma unroll")[-2:]
        assert f"for (int tilec_p = 0; tilec_p < {panels}; ++tilec_p)" in whole
        assert "staging_free<1>(4 + tilec_warp / 4)" in whole
        assert f"C_st + ((tilec_warp / 4) * 2 + tilec_p % 2) * {64 * cols} + " \
            f"tilec::sm90::sw128<{4 if dtype == 'f32' else 2}>(i % 64, tilec_j0 % {cols})" in whole
        assert whole.index("staging_ready(") < whole.index(f"tma_store_{rank}d(&tilec_map_C")
        assert f"tilec_p * {cols}), (int32_t)(by * 128 + (tilec_warp / 4) * 64)" in whole
        assert "tma_store" not in edge and "store_vec<2" in edge
        assert "tilec::sm90::bulk_wait<0>()" in body
    assert "C: boxes of 32 columns x 64 rows" in cu and "CU_TENSOR_MAP_DATA_TYPE_FLOAT32" in cu


def test_deferred_epilogue_stores_under_the_next_tiles_wgmmas(monkeypatch):
    """By default a persistent GEMM whose whole tiles of 16-bit values leave by TMA keeps each
    tile's values in registers, packed in pairs, and stores them during the next tile's K loop:
    panel k of the pending tile after K tile k's wgmmas are issued, the panels of a K loop
    shorter than that after it, and the block's last tile after its tile loop. An f32 output
    (64 more registers than the accumulators leave) stores at the end of its own tile."""
    ks = {k.name: k for k in _kernels(GEMMS)}
    assert ks["hop_bias_relu_k0_tma"].deferred_stores and ks["hop_batched_k0_tma"].deferred_stores
    assert not ks["hop_bf16_bt_k0_tma"].deferred_stores
    assert "during the next tile's first K tiles (deferred" in T.print_kernel(ks["hop_batched_k0_tma"])
    cu = _kernel_source(GEMMS)
    for name, rank in (("hop_bias_relu", 2), ("hop_batched", 3)):
        body = cu[cu.index(f"{name}_k0_tma("):]
        body = body[:body.index("\n}\n")]
        consumer = body[body.index("the consumer warpgroups"):]
        flush = consumer[consumer.index("auto tilec_flush"):consumer.index("for (int64_t tilec_b")]
        assert "uint32_t tilec_pend_C[64];" in consumer
        assert "staging_free<1>(4 + tilec_warp / 4)" in flush
        assert "tilec::sm90::store32(C_st + ((tilec_warp / 4) * 2 + tilec_p % 2) * 4096 + " \
            "tilec::sm90::sw128<2>(tilec_i % 64, tilec_j0 % 64), tilec_pend_C[tilec_q]);" in flush
        assert flush.index("staging_ready(") < flush.index(f"tma_store_{rank}d(&tilec_map_C")
        assert "(int32_t)(tilec_pend_C_at[0] + tilec_p * 64), (int32_t)(tilec_pend_C_at[1])" in flush
        loop = consumer[consumer.index("for (int tilec_k_i"):]
        hook = "if (tilec_pend && k < 4) tilec_flush((int)k, (int)k + 1);"
        assert loop.index("wgmma_commit()") < loop.index(hook) < loop.index("wgmma_wait<1>()")
        rest = "tilec_flush((int)tilec::imin(host2, (int64_t)4), 4);"
        whole = consumer[consumer.index("the block's whole tile lies inside"):]
        whole = whole[:whole.index("} else {")]
        assert consumer.index("wgmma_wait<0>()") < consumer.index(rest) < \
            consumer.index("the block's whole tile lies inside")
        assert re.search(r"tilec_pend_C\[tilec_q\] = tilec::sm90::pack16x2\(tilec_st\d+\);", whole)
        assert "tilec_pend = true;" in whole and "tma_store" not in whole
        assert consumer.index("if (tilec_pend) tilec_flush(0, 4);  // the block's last tile") < \
            consumer.index("bulk_wait<0>()")
    f32 = cu[cu.index("hop_bf16_bt_k0_tma("):]
    assert "tilec_flush" not in f32[:f32.index("\n}\n")]
    monkeypatch.setenv("TILEC_DEFER_EPILOGUE", "0")
    assert not any(k.deferred_stores for k in _kernels(GEMMS))
    assert "tilec_flush" not in _kernel_source(GEMMS)


# epilogues that read more than the accumulators (a residual tile, a bias) beside a
# deferred tile: 64 registers of packed values beside the 128 accumulators
DEFERRED_HEAVY = """
kernel d_gelu_res(A: f16[M, K], B: f16[K, N], bias: f16[N], R: f16[M, N]) -> C: f16[M, N]:
    C = gelu(A @ B + bias) + R

kernel d_linear_res(X: bf16[M, K], W: bf16[N, K], b: bf16[N], R: bf16[M, N]) -> C: bf16[M, N]:
    C = X @ W.T + b + R

"""


def _tma_spills(text: str, name: str, monkeypatch) -> dict:
    """{sm_90a warp-specialized kernel: bytes of spill stores and loads per thread} of `text`
    built as the build does (ptxas -v): every kernel's file compiles and has such kernels. (The
    variant in clusters of 2 is left out: its epilogue is the same, and the compile time twice;
    test_warp_specialized_kernels_compile_for_sm90a_on_wgmma_and_tma checks its spills.)"""
    monkeypatch.setenv("TILEC_WGMMA_PAIRS", "0")
    spills = {}
    for f, r, _ in nvcc_each(text, name, [
            "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o", "k.o"], HOPPER):
        assert r.returncode == 0, r.stderr
        found = {k: spill for (k, _), (_, spill) in ptxas_lines(r.stderr).items() if "_k0_tma" in k}
        assert found, (f, r.stderr)
        spills.update(found)
    return spills


@pytest.mark.nvcc
def test_deferred_epilogues_compile_without_spills(monkeypatch):
    """The pending tile's registers beside the accumulators leave room for epilogues that read
    a residual tile and a bias: no spills in the sm_90a kernels (the staging offsets of the
    pending tile are computed where it is stored, not held through the K loop)."""
    need_nvcc()
    assert all(k.deferred_stores for k in _kernels(DEFERRED_HEAVY) if k.name.endswith("_tma"))
    spills = _tma_spills(DEFERRED_HEAVY, "heavy.tile", monkeypatch)
    assert not any(spills.values()), spills


GELU_EPILOGUES = """
kernel g_gelu_res(A: f16[M, K], B: f16[K, N], R: f16[M, N]) -> C: f16[M, N]:
    C = gelu(A @ B) + R

kernel g_mish_res(A: f16[M, K], B: f16[K, N], R: f16[M, N]) -> C: f16[M, N]:
    C = mish(A @ B) + R
"""


@pytest.mark.nvcc
def test_gelu_epilogues_spill_little(monkeypatch):
    """GELU in f32 through erf, as PyTorch computes it, not erfc (twice the instructions and
    special-function calls): the whole-tile epilogue beside the 128 accumulators and the pending
    tile spilled 264-376 bytes per thread with erfc, and cost 44% of the GEMM at 4096^3 on an
    H100; with erf at most a few words. Mish in f32 through one exp and one division, not exp,
    log1p and tanh (68 bytes of spill stores before, none now)."""
    need_nvcc()
    spills = _tma_spills(GELU_EPILOGUES, "gelu.tile", monkeypatch)
    # (stores and loads: 16-28 bytes each)
    assert all(spill <= 64 for spill in spills.values()), spills


@pytest.mark.parametrize("text, staged", [
    # two outputs: the second one's buffers would not fit beside the stages
    ("kernel t(A: f16[M, K], B: f16[K, N]) -> (C: f16[M, N], D: f16[M, N]):\n"
     "    C = A @ B\n    D = relu(C)\n", (("C", "C_st"),)),
    # integers (no tensor-map type here); a transposed store; one at a shifted position
    ("kernel t(A: f16[M, K], B: f16[K, N]) -> C: i32[M, N]:\n    C = i32(A @ B)\n", ()),
    ("kernel t(A: f16[M, K], B: f16[K, N]) -> C: f16[N, M]:\n    C = (A @ B).T\n", ())])
def test_tma_stores_only_where_the_output_tile_is_the_accumulators(text, staged):
    (k,) = [k for k in _kernels(text) if k.name == "t_k0_tma"]
    assert k.tma_stores == staged
    assert sum(isinstance(a, T.Alloc) and a.name.endswith("_st") for a in T.walk_stmts(k.body)) \
        == len(staged)


def test_ping_pong_takes_turns_on_its_own_tiles(monkeypatch):
    """TILEC_WGMMA=...,pingpong: each consumer warpgroup walks every other tile of the block,
    skipping the other's K tiles in the ring, after the other's K loop (order barriers)."""
    monkeypatch.setenv("TILEC_WGMMA", "128x128,6,pingpong")
    (k,) = [k for k in _kernels(GEMMS) if k.name == "hop_bias_relu_k0_tma"]
    assert k.pingpong and "ping-pong: each of 2 warpgroups 128x128" in T.print_kernel(k)
    cu = _kernel_source(GEMMS)
    body = cu[cu.index("hop_bias_relu_k0_tma("):]
    body = body[:body.index("\n}\n")]
    assert "mbar_init(&tilec_empty[tilec_s], 4)" in body  # one warpgroup's 4 warps
    assert "tilec_b = blockIdx.x + (int64_t)tilec_wg * gridDim.x" in body
    assert "tilec_b += 2 * (int64_t)gridDim.x" in body
    assert "uint32_t tilec_it = tilec_wg * (uint32_t)host2" in body
    assert body.index("mbar_wait(&tilec_order[tilec_wg]") < body.index("mbar_wait(&tilec_full")
    assert body.index("mbar_arrive(&tilec_order[1 - tilec_wg])") < body.index("wgmma_wait<0>")
    # two wgmma rows of 64 per K tile: the second half's accumulators and A rows
    assert "wgmma_tile<128, 64, true, tilec::sm90::WG_F16>(acc + 64, A_s + tilec_s * 8192 + 4096" in body


def test_clusters_share_the_b_tile_by_multicast(monkeypatch):
    """TILEC_WGMMA=...,cluster2: blocks pair up on neighbouring M tiles; each loads half of the B
    tile (half its panels, or half the rows of a one-panel tile) for both, and frees each stage
    in both blocks; batched GEMMs keep no cluster."""
    monkeypatch.setenv("TILEC_WGMMA", "128x256,4,cluster2")
    ks = {k.name: k for k in _kernels(GEMMS)}
    assert ks["hop_bias_relu_k0_tma"].cluster == 2 and ks["hop_batched_k0_tma"].cluster == 1
    src, _, m = compile_text(GEMMS, "hop.tile", "cuda", options=HOPPER)
    files = driver.render(src, m, "cuda", HOPPER)
    for name, boxes in (("hop_bias_relu", 4), ("hop_bf16_bt", 2)):
        cu = files[f"{name}.cu"]
        body = cu[cu.index(f"{name}_k0_tma("):]
        body = body[:body.index("\n}\n")]
        loads = re.findall(r"if \(tilec_rank == (\d)\) tilec::sm90::tma_load_2d_multicast\(", body)
        assert sorted(loads) == sorted(["0", "1"] * (boxes // 2))
        assert "mbar_init(&tilec_empty[tilec_s], 16)" in body  # 8 consumer warps x 2 blocks
        assert "mbar_arrive_remote(&tilec_empty[tilec_prev], tilec_rank ^ 1)" in body
        assert body.count("cluster_sync()") == 2  # after the barriers' set-up, before leaving
        assert "by = 2 * (" in body and "tilec::launch_pairs(" in cu


@pytest.mark.parametrize("text, name, knob, kernel", [
    (GEMMS_A_K_MAJOR, "hop_bf16_bt", "", "_tma_pairs"),
    (GEMMS_TF32, "hop_tf32", "", "_tma_pairs"),
    # (the knob's clusters of 2 reach the plain tile too)
    (GEMMS_TF32, "hop_tf32", "128x256,4,cluster2", "_tma")])
def test_each_block_of_a_pair_loads_its_half_of_a_one_panel_b_tile(monkeypatch, text, name, knob,
                                                                   kernel):
    """A one-panel B tile (rows of K: 128 bytes of each, 64 16-bit or 32 f32 values) is shared
    out as halves of its rows: block 1's box lands half a stage after block 0's, at half the
    tile's rows (the offset once assumed 64-value panels, and tf32 in clusters computed wrong
    results on an H200)."""
    if knob:
        monkeypatch.setenv("TILEC_WGMMA", knob)
    src, _, m = compile_text(text, "hop.tile", "cuda", options=HOPPER)
    cu = driver.render(src, m, "cuda", HOPPER)[f"{name}.cu"]
    body = cu[cu.index(f"{name}_k0{kernel}("):]
    body = body[:body.index("\n}\n")]
    stage = int(re.search(r"tma_load_2d_multicast\(B_s \+ tilec_s \* (\d+),", body)[1])
    halves = re.findall(r"if \(tilec_rank == (\d)\) tilec::sm90::tma_load_2d_multicast\(B_s \+ "
                        r"tilec_s \* \d+( \+ \d+)?, .*?\(int32_t\)\(bx \* 256\)( \+ 128)?, 3\);", body)
    assert halves == [("0", "", ""), ("1", f" + {stage // 2}", " + 128")], halves


@pytest.mark.parametrize("knob", ["128x320,4", "128x128,6,pingpong,cluster2", "256x128,4,pingpong",
                                  "192x256,3", "128x256,1", "128x256", "128x256,4,fast"])
def test_a_malformed_wgmma_knob_is_a_user_error(monkeypatch, knob):
    """TILEC_WGMMA values the kernel cannot take (a BN wgmma lacks, ping-pong with clusters, a
    ping-pong or cooperative tile whose accumulators exceed the registers, one stage, no
    stages, an unknown form) are refused, naming the variable, before anything is built."""
    from tilec.diagnostics import TilecError
    monkeypatch.setenv("TILEC_WGMMA", knob)
    with pytest.raises(TilecError, match=r"TILEC_WGMMA=.*expected BMxBN,stages"):
        _kernels(GEMMS)


@pytest.mark.nvcc
@pytest.mark.gpu  # (no GPU needed: also run with `-m gpu` on the device)
@pytest.mark.parametrize("knob", ["", "128x128,6,pingpong", "192x128,5", "128x256,4,cluster2"])
def test_warp_specialized_kernels_compile_for_sm90a_on_wgmma_and_tma(monkeypatch, knob):
    need_nvcc()
    if knob:
        monkeypatch.setenv("TILEC_WGMMA", knob)
    built, ptx = set(), ""
    # (a knob changes the sm_90a kernels alone: the other architectures' code only without one)
    others = [] if knob else ["-gencode", "arch=compute_80,code=sm_80",
                              "-gencode", "arch=compute_90,code=compute_90"]
    for f, r, folder in nvcc_each(GEMMS, "hop.tile", [
            *others, "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o",
            "k.o", "--keep"], MIXED):
        assert r.returncode == 0, r.stderr
        assert "warning" not in r.stderr.lower(), r.stderr
        ptx += kept_ptx(folder, f, "compute_90a")
        report = ptxas_lines(r.stderr)
        for name, variant in re.findall(r"__launch_bounds__\(\d+, \d+\) (\w+)_k0(_tma\w*)\(",
                                        (folder / f).read_text()):
            built.add(name + variant)
            # (the sm_90a entry holds the real kernel, its accumulators in registers; the
            # other architectures' stub takes a handful)
            entry = [v for (k, a), v in report.items()
                     if a == "sm_90a" and re.search(rf"{name}_k0{variant}E", k)]
            assert len(entry) == 1 and entry[0][1] == 0 and entry[0][0] > 40, r.stderr
        sass = kept_sass(folder, f)
        assert "HGMMA" in sass and "UTMALDG" in sass
        # (the variant on padded copies: the same wgmma mainloop on TMA copies, its epilogue
        # from registers)
        padded = [code for k, code in sass_functions(sass).items() if "_tma_padE" in k]
        assert len(padded) == 1 and all(x in padded[0] for x in ("HGMMA", "UTMALDG")) and \
            "UTMASTG" not in padded[0]
        # (the TMA-store epilogue: where its buffers fit beside the stages)
        staged = any(k.tma_stores for k in _kernels(GEMMS, MIXED))
        assert ("UTMASTG" in sass) == staged and \
            staged == (knob in ("", "128x256,4,cluster2"))
    # (where the knob leaves clusters off: a variant in clusters of 2 for B rows off 128-byte
    # lines, batched GEMMs apart)
    pairs = {"", "192x128,5"}
    # (and without the knob a variant of 192 x 128 tiles, where it fills the waves better; and
    # the kernel on padded copies, for rows off 16 bytes)
    assert built == {"hop_bias_relu_tma", "hop_bf16_bt_tma", "hop_batched_tma",
                     "hop_bias_relu_tma_pad", "hop_bf16_bt_tma_pad", "hop_batched_tma_pad"} | (
        {"hop_bias_relu_tma_pairs", "hop_bf16_bt_tma_pairs"} if knob in pairs else set()) | (
        {"hop_bias_relu_tma_waves", "hop_bf16_bt_tma_waves", "hop_batched_tma_waves"}
        if not knob else set())
    n = 128 if knob and "cluster2" not in knob else 256
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.f16\.f16", ptx)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.bf16\.bf16", ptx)
    # the immediates that transpose A and B: K-major A times B row-major (hop_bias_relu) and
    # transposed (hop_bf16_bt), A transposed times B row-major (hop_batched)
    assert {m for m in re.findall(r"wgmma\.mma_async[^;]*, p, 1, 1, ([01], [01]);", ptx)} == \
        {"0, 1", "0, 0", "1, 1"}
    assert "cp.async.bulk.tensor.2d" in ptx and "cp.async.bulk.tensor.3d" in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 {152 if knob == '192x128,5' else 232}" in ptx


# ---- on the GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("knob", ["", "128x128,6,pingpong", "64x256,5,pingpong", "192x128,5",
                                  "128x256,4,cluster2", "sm_80,sm_90a", "waves"])
def test_warp_specialized_gemms_on_gpu(monkeypatch, knob):
    """The default tile, and (TILEC_WGMMA) ping-pong with 2 and 1 wgmma rows of 64 per warpgroup,
    3 cooperative consumer warpgroups (152 registers each), and clusters of 2 blocks sharing B
    tiles by multicast (odd M tile counts: a block of the last pair computes no row); and
    sm_80 + sm_90a in one library (the device check picks the Hopper kernel); and the variant
    of 192 x 128 tiles in 4 stages chosen by waves (its epilogue by TMA stores, deferred)."""
    need_gpu()
    options = HOPPER
    if knob == "sm_80,sm_90a":
        options = MIXED
    elif knob and knob != "waves":
        monkeypatch.setenv("TILEC_WGMMA", knob)
    _tma_variants_only(monkeypatch, "_tma_waves" if knob == "waves" else "_tma")
    for dims in (dict(M=256, N=512, K=256, Z=2), dict(M=200, N=136, K=72, Z=1),
                 dict(M=1, N=8, K=8, Z=3), dict(M=130, N=1000, K=1000, Z=1),
                 dict(M=1000, N=264, K=520, Z=2), dict(M=2104, N=2000, K=256, Z=1),
                 dict(M=2056, N=2056, K=72, Z=1)):
        # (more tiles than SMs with ragged edges and a 2-tile K loop: a deferred epilogue's
        # panels after its K loop, an edge tile after a pending whole one)
        # (A transposed: TMA reads rows of M values, whose strides must be 16-byte multiples;
        # elsewhere the variant does not apply, an error here)
        text = GEMMS if dims["M"] % 8 == 0 else GEMMS_A_K_MAJOR
        check_text(text, dims, name="hop_only.tile", target="cuda", options=options)


@pytest.mark.gpu
def test_gemms_on_rows_off_128_byte_lines_in_clusters_on_gpu(monkeypatch):
    """The variant in clusters of 2 alone (B's rows start off 128-byte lines at every size
    here; a failing condition is an error): B's rows as N (A @ B) and as K (A @ W.T), one M
    tile (a block of the pair computes no row), ragged M, N and K, more tiles than SMs."""
    need_gpu()
    _tma_variants_only(monkeypatch, "_tma_pairs")
    for dims in (dict(M=200, N=136, K=72), dict(M=1, N=8, K=8), dict(M=130, N=1000, K=1000),
                 dict(M=1000, N=264, K=520), dict(M=2104, N=2000, K=264),
                 dict(M=4100, N=1032, K=584)):
        check_text(GEMMS_A_K_MAJOR, dims, name="hop_pairs.tile", target="cuda", options=HOPPER)


# sizes whose rows TMA cannot read as they are (K off 16 bytes in every dtype here; M or N too,
# for the transposed A and the row-major B): ragged tiles, M = 1, more tiles than SMs
PADDED_DIMS = (dict(M=200, N=130, K=70, Z=2), dict(M=130, N=1001, K=999, Z=1),
               dict(M=1, N=9, K=7, Z=3), dict(M=2104, N=2003, K=265, Z=1),
               dict(M=1000, N=262, K=522, Z=2))


def test_rows_off_16_bytes_take_padded_copies_into_the_hopper_kernel(monkeypatch):
    """Where an operand's rows may be off 16 bytes, a variant after the TMA ones copies each such
    operand into a workspace with rows padded to 128-byte multiples, then runs the
    warp-specialized kernel on the copies (their bytes, and the variant, only where some row is
    off and the product is large enough); operands whose rows are known multiples are read as
    they are. The variant's launches, run by the Tile IR interpreter at such sizes, compute
    what the reference does: the copies' padding is zero (the interpreter starts workspaces as
    NaN). TILEC_PAD_LEAST=0 drops the variant."""
    m0 = driver.frontend(driver.Source("hop.tile", GEMMS + GEMMS_FP8 + GEMMS_TF32))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    for g, prog in zip(mod.graphs, mod.programs):
        (parts,) = [p for p in _hopper_variants(prog) if p[-1].padded]
        *pads, gemm = parts
        assert [k.name for k in parts] == [f"{g.name}_k0_tma_pad_{src}" for src, _ in
                                           gemm.padded] + [f"{g.name}_k0_tma_pad"]
        assert not gemm.tma_stores and not gemm.aligned  # (C's rows are mostly off too)
        ws = {w.name: w for w in prog.workspaces}
        decls = {p.name: p for k in parts for p in k.params}
        for (src, copy), pad in zip(gemm.padded, pads):
            assert ws[copy].when == gemm.when and [p.name for p in pad.params] == [src, copy]
        for dims in PADDED_DIMS[:3]:
            dims = {s: v for s, v in dims.items() if s in g.symbols}
            for src, copy in gemm.padded:  # (the shortest rows of 128-byte multiples)
                row, padded = (decls[n].shape[-1].eval(dims) for n in (src, copy))
                size = {"f32": 4, "f16": 2, "bf16": 2}.get(decls[src].dtype, 1)
                assert padded * size % 128 == 0 and 0 <= (padded - row) * size < 128
            _tiles_match_reference(g, parts, dims, "C")
            # (the condition: some row off 16 bytes, and a product of at least 2^24 values)
            when = {**dims, "M": 1100, "N": 1104, "K": 1023, "Z": 1}
            assert gemm.when.eval(when) and not gemm.when.eval({**when, "M": 5})
            assert not gemm.when.eval({**when, "M": 1104, "K": 1024})
    # known multiples of 16 bytes: no copy, the tensor read as it is
    ks = _kernels("kernel t(A: f16[M, 4096], W: f16[N, 4096]) -> C: f16[M, N]:\n    C = A @ W.T\n")
    assert not any(k.padded for k in ks)
    ks = _kernels("kernel t(A: f16[M, 4096], B: f16[4096, N]) -> C: f16[M, N]:\n    C = A @ B\n")
    (gemm,) = [k for k in ks if k.padded]
    assert [src for src, _ in gemm.padded] == ["B"] and gemm.aligned == ("A",)
    monkeypatch.setenv("TILEC_PAD_LEAST", "0")
    assert not any(k.padded for k in _kernels(GEMMS))


@pytest.mark.gpu
def test_padded_copies_into_the_hopper_kernel_on_gpu(monkeypatch):
    """The variant on padded copies alone (a failing condition is an error, not a fall-through),
    16-bit, fp8 and tf32, at sizes whose rows TMA cannot read as they are."""
    need_gpu()
    _tma_variants_only(monkeypatch, "_tma_pad")
    for dims in PADDED_DIMS:
        for text in (GEMMS, GEMMS_FP8, GEMMS_TF32):
            check_text(text, dims, name="hop_pad.tile", target="cuda", options=HOPPER)


def test_mn_major_operands_take_transposed_copies_into_the_hopper_kernel(monkeypatch):
    """An fp8 or tf32 GEMM operand stored MN-major (which wgmma's fp8 and tf32 forms cannot
    read) is copied transposed, its rows padded to 128-byte multiples, and the warp-specialized
    kernel reads the copy K-major: in `_tma` (its epilogue by TMA stores, where the output's
    rows allow) and in `_tma_pad` (from registers, for the other outputs). The variants'
    launches, run by the Tile IR interpreter at sizes that are not tile multiples, compute what
    the reference does. They run where the product does at least 512 multiply-adds per value
    copied (M for B, N for A, times the batch dims the operand lacks) and has 2^24 values; the
    other operand is read as it is. The default kernel keeps its own variant on padded copies.
    TILEC_TRANSPOSE_WORK=0 or TILEC_PAD_LEAST=0 drop them."""
    m0 = driver.frontend(driver.Source("mn.tile", GEMMS_MN_MAJOR))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    big = {"M": 1024, "N": 1024, "K": 1024, "Z": 1}
    for g, prog in zip(mod.graphs, mod.programs):
        variants = _hopper_variants(prog)
        assert [parts[-1].name for parts in variants] == [f"{g.name}_k0_tma",
                                                          f"{g.name}_k0_tma_pad"]
        for parts in variants:
            *copies, gemm = parts
            assert set(gemm.transposed) == MN_MAJOR[g.name] and \
                gemm.register_stores == gemm.name.endswith("_pad")
            assert [k.name for k in copies] == [f"{gemm.name}_{n}" for n in gemm.transposed]
            (mm,) = [s for s in T.walk_stmts(gemm.body) if isinstance(s, T.Gemm)]
            assert not mm.transpose_a and mm.transpose_b  # (both K-major)
            decls = {p.name: p for k in parts for p in k.params}
            for (src, copy), kernel in zip(gemm.padded, copies):
                assert [p.name for p in kernel.params] == [src, copy]
                a, c = decls[src].shape, decls[copy].shape
                assert c[:-2] == a[:-2] and c[-2] == a[-1]
                size = {"f32": 4}.get(decls[src].dtype, 1)
                rows, padded = a[-2].eval(big | {"K": 999}), c[-1].eval(big | {"K": 999})
                assert padded * size % 128 == 0 and 0 <= (padded - rows) * size < 128
                # (where the product pays for the copy)
                other = "M" if src == "B" else "N"
                assert gemm.when.eval(big) and not gemm.when.eval({**big, other: 500})
            for dims in (dict(M=200, N=130, K=70, Z=2), dict(M=1, N=9, K=7, Z=3)):
                _tiles_match_reference(g, parts, {s: v for s, v in dims.items()
                                                  if s in g.symbols}, "C")
    # (`_tma` stores its epilogue by TMA, which needs the output's rows on 16 bytes)
    ks = {k.name: k for k in _kernels(GEMMS_MN_MAJOR)}
    for name in MN_MAJOR:
        tma, pad = ks[f"{name}_k0_tma"], ks[f"{name}_k0_tma_pad"]
        assert tma.tma_stores and not pad.tma_stores
        assert not tma.when.eval({**big, "N": 1022}) and pad.when.eval({**big, "N": 1022})
    # B broadcast over the batch: each of its values meets Z x M rows of A
    when = _hopper_variants(mod.programs[-1])[0][-1].when
    assert when.eval({"M": 300, "N": 1024, "K": 1024, "Z": 2}) and \
        not when.eval({"M": 300, "N": 1024, "K": 1024, "Z": 1})
    assert any(parts[-1].name == "mn_tf32_k0_pad" for v in mod.programs[0].slots() for parts in v)
    for var in ("TILEC_TRANSPOSE_WORK", "TILEC_PAD_LEAST"):
        monkeypatch.setenv(var, "0")
        assert not any(k.warp_specialize for k in _kernels(GEMMS_MN_MAJOR))
        monkeypatch.delenv(var)


@pytest.mark.nvcc
def test_transposed_copies_compile_without_spills():
    """The transposing copy kernels and the warp-specialized kernels reading their copies
    (fp8 and tf32 wgmma) compile for sm_90a warning-free and without spills."""
    need_nvcc()
    ptx, built = "", set()
    for f, r, folder in nvcc_each(GEMMS_MN_MAJOR, "mn.tile", [
            "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o", "k.o",
            "--keep"], HOPPER):
        assert r.returncode == 0 and "warning" not in r.stderr.lower(), r.stderr
        ptx += kept_ptx(folder, f, "compute_90a")
        for (kernel, _), (_, spills) in ptxas_lines(r.stderr).items():
            assert spills == 0, (kernel, r.stderr)
            built |= set(re.findall(r"_k0(_tma\w*?)E", kernel))  # (the name's end: E)
    assert built == {"_tma", "_tma_A", "_tma_B", "_tma_pad", "_tma_pad_A", "_tma_pad_B"}
    for form in ("tf32.tf32", "e4m3.e4m3", "e5m2.e5m2"):
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.f32\.{form}", ptx)


@pytest.mark.gpu
def test_transposed_copies_into_the_hopper_kernel_on_gpu(monkeypatch):
    """The variants of transposed copies alone, `_tma_pad` then `_tma` (a failing condition is
    an error, not a fall-through; TILEC_TRANSPOSE_WORK=1 and TILEC_PAD_LEAST=1: at every size),
    fp8 and tf32, at sizes
    that are not tile multiples (K a multiple of 16: the operand read as it is takes TMA)."""
    need_gpu()
    monkeypatch.setenv("TILEC_TRANSPOSE_WORK", "1")
    monkeypatch.setenv("TILEC_PAD_LEAST", "1")
    _tma_variants_only(monkeypatch, "_tma_pad")
    for dims in (dict(M=200, N=130, K=80, Z=2), dict(M=1, N=9, K=16, Z=3),
                 dict(M=1000, N=262, K=528, Z=2), dict(M=130, N=1001, K=1008, Z=1)):
        check_text(GEMMS_MN_MAJOR, dims, name="hop_mn_pad.tile", target="cuda", options=HOPPER)
    # (`_tma`, its epilogue by TMA stores: the output's rows on 16 bytes)
    monkeypatch.undo()
    monkeypatch.setenv("TILEC_TRANSPOSE_WORK", "1")
    monkeypatch.setenv("TILEC_PAD_LEAST", "1")
    _tma_variants_only(monkeypatch, "_tma")
    for dims in (dict(M=200, N=136, K=80, Z=2), dict(M=1, N=8, K=16, Z=3),
                 dict(M=1000, N=264, K=528, Z=2)):
        check_text(GEMMS_MN_MAJOR, dims, name="hop_mn.tile", target="cuda", options=HOPPER)


@pytest.mark.gpu
def test_fp8_wgmma_gemms_on_gpu(monkeypatch):
    """The fp8 variant alone (a failing launch condition is an error), at sizes that are and
    are not tile multiples (K a multiple of 16: TMA's 16-byte rows)."""
    need_gpu()
    _tma_variants_only(monkeypatch)
    for dims in (dict(M=256, N=512, K=256, Z=2), dict(M=200, N=136, K=80, Z=1),
                 dict(M=1, N=8, K=16, Z=3), dict(M=1000, N=264, K=528, Z=2),
                 dict(M=2100, N=2000, K=1024, Z=1)):
        check_text(GEMMS_FP8, dims, name="hop8_only.tile", target="cuda", options=HOPPER)


def test_tf32_gemms_get_the_warp_specialized_variant_on_tf32_wgmma(monkeypatch):
    """K-major f32 operands under `precision tf32` go through TMA into wgmma: the 16-bit tile's
    bytes (K tiles of 32 values), the gemm marked tf32, TMA's 16-byte rows a run-time condition.
    A row-major B (tf32 wgmma takes K-major operands only) reaches wgmma through transposed
    copies alone; `precision ieee` and TILEC_WGMMA_TF32=0 keep the mma.sync or FMA kernels; the
    unbatched one also takes clusters of 2 (B's rows off 128-byte lines), as the 16-bit GEMMs
    do."""
    ks = {k.name: k for k in _kernels(GEMMS_TF32)}
    assert ks["hop_tf32_k0_tma_pairs"].cluster == 2 and "hop_tf32_batched_k0_tma_pairs" not in ks
    for name, tile in (("hop_tf32_k0_tma", "[4, 128, 32]"), ("hop_tf32_batched_k0_tma",
                                                              "[4, 128, 32]"),
                       ("hop_tf32_k0_tma_waves", "[4, 192, 32]")):
        k = ks[name]
        assert k.warp_specialize and k.persistent
        text = T.print_kernel(k)
        assert f"A_s = shared(f32, {tile})" in text, text
        assert "transpose_b=True, precision=tf32)" in text
        assert "% 4 == 0" in str(k.when)  # (16-byte rows: K a multiple of 4 values)
    plain = GEMMS_TF32.replace("X @ W.T", "X @ W").replace("W: f32[N, K]", "W: f32[K, N]")
    assert [k.name for k in _kernels(plain) if k.name.startswith("hop_tf32_k0") and
            k.warp_specialize] == ["hop_tf32_k0_tma", "hop_tf32_k0_tma_pad"]
    ieee = GEMMS_TF32.split("schedule")[0]
    assert not any(k.warp_specialize for k in _kernels(ieee))
    monkeypatch.setenv("TILEC_WGMMA_TF32", "0")
    assert not any(k.warp_specialize for k in _kernels(GEMMS_TF32))


def test_tf32_gemm_tiles_compute_what_the_reference_does():
    """The tiled Tile IR of the tf32 variants (K tiles of 32 values), run by the Tile IR
    interpreter at sizes that are and are not tile multiples, within tf32's tolerance (the
    interpreter multiplies exactly)."""
    m0 = driver.frontend(driver.Source("hop32.tile", GEMMS_TF32))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    for g, prog in zip(mod.graphs, mod.programs):
        variants = _hopper_variants(prog)
        assert variants
        for parts in variants:
            for dims in (dict(Z=2, M=130, N=264, K=72), dict(Z=1, M=3, N=8, K=36)):
                _tiles_match_reference(g, parts, dims, "C")


@pytest.mark.nvcc
def test_tf32_gemms_compile_to_tf32_wgmma():
    """The tf32 variants' PTX multiplies with wgmma's tf32 form (k-steps of 8), warning-free
    and without spills."""
    need_nvcc()
    ptx = ""
    for f, r, folder in nvcc_each(GEMMS_TF32, "hop32.tile", [
            "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o", "k.o",
            "--keep"], HOPPER):
        assert "warning" not in r.stderr.lower(), r.stderr
        ptx += kept_ptx(folder, f, "compute_90a")
        report = ptxas_lines(r.stderr)
        assert report and not any(spills for _, spills in report.values()), r.stderr
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k8\.f32\.tf32\.tf32", ptx)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k8\.f32\.tf32\.tf32", ptx)
    assert "cp.async.bulk.tensor.2d" in ptx and "cp.async.bulk.tensor.3d" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("suffix", ["_tma", "_tma_waves", "_tma_pairs"])
def test_tf32_wgmma_gemms_on_gpu(monkeypatch, suffix):
    """Each tf32 warp-specialized variant alone (a failing launch condition is an error), at
    sizes that are and are not tile multiples (K a multiple of 4: TMA's 16-byte rows, W's rows
    on and off 128-byte lines; in clusters of 2, off them only): within tf32's tolerance, and
    visibly rounded (exact f32 products are off by ~1e-7), so the tensor cores ran."""
    need_gpu()
    _tma_variants_only(monkeypatch, suffix)
    for dims in (dict(M=256, N=512, K=256, Z=2), dict(M=200, N=136, K=84, Z=1),
                 dict(M=1, N=8, K=4, Z=3), dict(M=1000, N=264, K=532, Z=2),
                 dict(M=2100, N=2000, K=1028, Z=1)):
        if suffix == "_tma_pairs" and dims["K"] * 4 % 128 == 0:
            continue  # (clusters of 2 take B's rows off 128-byte lines only)
        for name, r in check_text(GEMMS_TF32, dims, name="hop32_only.tile", target="cuda",
                                  options=HOPPER).items():
            assert r.errors["C"] > 1e-6, (name, dims, r.errors)


@pytest.mark.gpu
def test_gemm_samples_on_gpu_for_sm90a():
    """The GEMM samples built for sm_90a (the TMA variant where the strides allow it, the
    mma.sync one elsewhere: K = 70 here) match the reference."""
    need_gpu()
    from conftest import SAMPLES
    for name, sizes in (("gemm_bias_relu", [dict(M=200, N=130, K=72), dict(M=256, N=384, K=320),
                                             dict(M=100, N=70, K=70)]),
                        ("batched_matmul", [dict(B=2, M=130, N=72, K=64)])):
        text = (SAMPLES / f"{name}.tile").read_text()
        for dims in sizes:
            check_text(text, dims, name=f"{name}.tile", target="cuda", options=HOPPER)


def test_run_builds_for_the_devices_own_architecture():
    """`tilec run --target cuda` without --arch builds for the device it runs on: sm_90a on an
    H100/H200 (the Hopper kernels), the device's sm_XY elsewhere."""
    from tilec.runtimes.cuda import arch_for
    from tilec.targets.cuda import CUDA
    assert arch_for(9, 0, CUDA.arch_choices) == "sm_90a"
    assert arch_for(8, 0, CUDA.arch_choices) == "sm_80"
    assert arch_for(8, 9, CUDA.arch_choices) == "sm_89"
    assert arch_for(7, 5, CUDA.arch_choices) is None  # (the default list then)


# ---- attention -----------------------------------------------------------------------------
ATTENTION = """
kernel hop_attention(Q: f16[B, H, L, D], K: f16[B, H, S, D], V: f16[B, H, S, D]) -> O: f16[B, H, L, D]:
    O = f16(softmax((Q @ K.T) * rsqrt(f32(D)), axis=-1)) @ V

kernel hop_causal_bf16(Q: bf16[B, L, D], K: bf16[B, L, D], V: bf16[B, L, D]) -> O: bf16[B, L, D]:
    S = (Q @ K.T) * rsqrt(f32(D))
    S = where(index(S, -1) > index(S, -2), -inf, S)
    O = bf16(softmax(S, axis=-1)) @ V
"""


def test_attention_gets_a_warp_specialized_variant():
    """Attention's Hopper variant, per head-dim capacity (64 and 128: TMA's 64-column panels):
    the producer copies the block's Q tile once and K and V tiles into 2 stages; the consumer
    warpgroups compute S = Q K^T from shared memory and O += P V with P from registers, both
    on wgmma; 4-D tensors are addressed as 3-D (batch and heads merged); a persistent grid walks
    the query tiles. Tried first."""
    ks = {k.name: k for k in _kernels(ATTENTION)}
    tma = sorted(n for n in ks if "_tma" in n)
    assert tma == sorted(f"{base}_k0_tma_D{d}{x}" for base in ("hop_attention", "hop_causal_bf16")
                         for d in (64, 128) for x in ("", "exact"))
    for name in tma:
        k = ks[name]
        assert k.warp_specialize == 2 and k.persistent and k.threads == 384
        assert k.aligned == ("K", "Q", "V")
        text = T.print_kernel(k)
        assert re.search(r"copy_async\(Q\[.*\], Q_s\)\n", text)
        assert re.search(r"for k in warp_specialized\(.*, stages=3\)", text)
        assert re.search(r"gemm\(P, V_s\[k % 3\], O1?\)", text)
        # key tiles no mask touches skip the masks' selects (one uniform test per tile; the
        # loop itself is not split: both roles walk it); the scale folded into the exponent,
        # the unmasked scores are left as they are (no self-assignment)
        assert re.search(r"\n            if \(?(S|L) - k \* 128 - 128 < 0", text), text
        assert not re.search(r"(S\d?)\[i, j\] = \1\[i, j\]\n", text)
        assert text.count("warp_specialized(") == 1
    src, _, m = compile_text(ATTENTION, "hop.tile", "cuda", options=HOPPER)
    files = driver.render(src, m, "cuda", HOPPER)
    cu = files["hop_attention.cu"]
    body = cu[cu.index("hop_attention_k0_tma_D128exact("):]
    body = body[:body.index("\n}\n")]
    assert "tilec::mbar_init(tilec_once, 1)" in body.replace("sm90::", "")
    assert re.search(r"tma_load_3d\(Q_s \+ 8192, &tilec_map_Q, tilec_once, \(int32_t\)\(0\) \+ 64, "
                     r"\(int32_t\)\(bx \* 128\), \(int32_t\)\(\(bz / H\) \* H \+ bz % H\)\)", body)
    assert "mbar_arrive_expect_tx(&tilec_full[tilec_s], 65536)" in body  # K + V, 128 x 128 each
    assert "wgmma_tile<128, 128, false, tilec::sm90::WG_F16, 128>(S1, Q_s + (tilec_warp / 4) * 4096, " \
        "K_s + tilec_s * 16384)" in body
    # (P V of the previous key tile, in the overlapped order: test_attention_products_overlap)
    assert "wgmma_tile_rs<128, 128, true, tilec::sm90::WG_F16>(O1, P, V_s + tilec_prev * 16384)" \
        in body
    # (Q of the block's tile, on its own barrier, waited for by the parity of the tile count)
    consumer = body.index("// the consumer warpgroups")
    assert body.index("mbar_wait(tilec_once, tilec_t & 1)") < \
        body.index("mbar_wait(&tilec_full", consumer)
    assert "(uint64_t)((uint64_t)(B) * (uint64_t)(H))" in cu  # the merged leading dims
    causal = files["hop_causal_bf16.cu"]
    assert "wgmma_tile_rs<128, 128, true, tilec::sm90::WG_BF16>(O1, P, V_s + tilec_prev * 16384)" \
        in causal
    # the launcher tries the Hopper variants first
    launch = cu[cu.index("int tilec_status = TILEC_OK;"):]
    assert launch.index("tilec_launch_hop_attention_k0_tma_D64exact") < \
        launch.index("tilec_launch_hop_attention_k0_D64exact")


def _attention_body(monkeypatch, knob: str) -> str:
    """The D128 warp-specialized attention kernel's CUDA source under TILEC_WGMMA_ATTENTION."""
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    src, _, m = compile_text(ATTENTION, "hop.tile", "cuda", options=HOPPER)
    cu = driver.render(src, m, "cuda", HOPPER)["hop_attention.cu"]
    body = cu[cu.index("hop_attention_k0_tma_D128exact("):]
    return body[:body.index("\n}\n")]


def test_attention_products_overlap(monkeypatch):
    """The default: FlashAttention-3's order within a warpgroup. Iteration k issues Q K^T of key
    tile k, then P V of tile k - 1 (its O rescaled and P written by the iteration before); the
    softmax of tile k runs after the wait for all but one group (Q K^T), while P V runs; O and P
    are touched only after its wait. Nothing is in flight across the loop's back edge (tile 0
    is peeled off, the last P V follows the loop), so ptxas does not serialize the wgmmas
    (test_warp_specialized_attention_compiles_for_sm90a). The warpgroups issue independently
    (the default); with TILEC_WGMMA_ATTENTION=3,1,1 they take turns issuing (warpgroup 0
    first), and warpgroup 0 takes the other's last pass at the end."""
    default = _attention_body(monkeypatch, "")
    assert "turn_" not in default
    body = _attention_body(monkeypatch, "3,1,1")
    first = body.index("// key tile 0: S1 and its softmax, no O1 before it")
    loop = body[body.index("for (int tilec_k_i = 1;"):]
    assert first < body.index("for (int tilec_k_i = 1;")
    order = ["K_s + tilec_s * 16384", "V_s + tilec_prev * 16384", "wgmma_wait<1>();  // this tile's S1",
             "quad_allreduce<tilec::OpSum>(rowsum)", "wgmma_wait<0>();  // the previous tile's O1",
             "O1[tilec_q * 2", "tilec::set16(P"]
    at = [loop.index(x) for x in order]
    assert at == sorted(at), order
    w0 = loop.index("wgmma_wait<0>();  // the previous tile's O1")
    assert "fence_regs<32>(P)" in loop[w0:w0 + 200]
    # the wait in both arms of O's rescaling vote, each arm its own basic block after the
    # softmax (_softmax_runs_beside_p_v reads what ptxas makes of it)
    vote = loop.index("if (tilec::warp_any(alpha[0] != 1.0f || alpha[1] != 1.0f)) {")
    arms = loop[vote:loop.index("tilec::set16(P", vote)].split("} else {")
    assert len(arms) == 2 and all(a.count("wgmma_wait<0>();") == 1 for a in arms), arms
    assert "O1[tilec_q * 2" in arms[0] and "O1[tilec_q * 2" not in arms[1]
    assert "if (k == 0)" not in loop  # (no conditional wait)
    last = body.index("// O1 of the last key tile")
    assert body.index("V_s + tilec_prev * 16384", last) > last
    # turns: the first tile, each loop iteration and the last P V are one turn each
    assert body.count("turn_wait(tilec_warp / 4)") == 3 and body.count("turn_pass(tilec_warp / 4)") == 3
    assert body.index("if (tilec_warp / 4 == 1) tilec::sm90::turn_pass(1);") < first < \
        body.index("if (tilec_warp / 4 == 0) tilec::sm90::turn_wait(0);")
    # without turns (the default, 3,1,0): the same order, no named barriers
    assert _attention_body(monkeypatch, "3,1,0") == default


def test_attention_p_in_two_buffers(monkeypatch):
    """TILEC_WGMMA_ATTENTION's seventh field, 2 (the default: measured faster at D = 128, see
    docs/PERFORMANCE.md):
    where S, O and two buffers of P fit in a consumer thread's registers (cuda.py's
    DOUBLE_P_REGISTERS: D up to 128 with 128-key tiles) and no mask reads the query rows, P has two
    buffers taken in turn: the key loop runs in pairs of iterations, then an odd one; each
    iteration converts its P into the buffer that its P V in flight does not read, before the
    wait for that P V, and the last P V reads the buffer the last iteration wrote. The producer
    keeps 24 registers and the consumers take 240, which is all the block was launched with.
    176-key tiles (S 88 and P 44 registers), causal masks and the warpgroups' turns keep one
    buffer, as the field 1 does; a field other than 1 or 2 is a user error."""
    body = _attention_body(monkeypatch, "")
    assert "uint32_t P[32];" in body and "uint32_t P2[32];" in body
    assert body.index("setmaxnreg_dec<24>") < body.index("setmaxnreg_inc<240>")
    pairs = body[body.index("for (; tilec_k_i + 1 < (int)host1; tilec_k_i += 2) {"):]
    odd = pairs.index("const bool tilec_odd = tilec_k_i < (int)host1;")
    second = pairs.index("const int64_t k = tilec_k_i + 1;")
    last = pairs.index("// O1 of the last key tile")
    for start, end, p_in, p_out in ((0, second, "P", "P2"), (second, odd, "P2", "P"),
                                    (odd, last, "P", "P2")):
        part = pairs[start:end]
        order = [f"wgmma_tile_rs<128, 128, true, tilec::sm90::WG_F16>(O1, {p_in}, V_s",
                 "quad_allreduce<tilec::OpSum>(rowsum)", f"tilec::set16({p_out}, ",
                 "wgmma_wait<0>();  // the previous tile's O1", f"fence_regs<32>({p_in});",
                 "O1[tilec_q * 2 + tilec_v] = O1[tilec_q * 2 + tilec_v] * alpha"]
        at = [part.index(x) for x in order]
        assert at == sorted(at), (p_in, order)
        assert f"tilec::set16({p_in}, " not in part
    tail = pairs[last:]
    assert tail.index("if (tilec_odd) {") < tail.index("(O1, P2, V_s") < \
        tail.index("} else {") < tail.index("(O1, P, V_s")
    assert body == _attention_body(monkeypatch, "3,1,0,1,0,128,2")
    for knob in ("3,1,0,1,0,128,1", "3,1,1,1,0,128,2", "2,1,0,1,1,176,2"):
        monkeypatch.delenv("TILEC_WGMMA_ATTENTION", raising=False)
        one = _attention_body(monkeypatch, knob)
        assert "P2" not in one and "setmaxnreg_inc<232>" in one, knob
    monkeypatch.delenv("TILEC_WGMMA_ATTENTION", raising=False)
    src, _, m = compile_text(ATTENTION, "hop.tile", "cuda", options=HOPPER)
    causal = driver.render(src, m, "cuda", HOPPER)["hop_causal_bf16.cu"]
    assert "P2" not in causal and "setmaxnreg_inc<232>" in causal
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,1,0,128,3")
    with pytest.raises(TilecError, match=r"p buffers 1 or 2"):
        _kernels(ATTENTION)


def test_setmaxnreg_counts_fit_the_launch_allocation():
    """setmaxnreg moves registers within what the block was launched with (the kernel's count a
    thread: 65536 over the threads, a multiple of 8; the compile tests check that ptxas reports
    168 at 384 threads): the producer's and the consumers' counts add up to at most that, or
    the consumers' setmaxnreg.inc waits forever (32 + 240 + 240 at 384 threads hung a kernel
    on an H100). Attention's two P buffers take FlashAttention-3's producer of 24, which leaves
    its consumers 240."""
    from tilec.targets.cuda import PRODUCER_REGS, PRODUCER_REGS_DOUBLE_P, consumer_regs
    for consumers in (2, 3):  # (384 and 512 threads: 168 and 128 registers at launch)
        threads = 128 * (consumers + 1)
        launch = 65536 // threads // 8 * 8
        for producer in (PRODUCER_REGS, PRODUCER_REGS_DOUBLE_P):
            c = consumer_regs(consumers, producer)
            assert c % 8 == 0 and launch <= c <= 240 and producer <= launch
            assert 128 * producer + 128 * consumers * c <= launch * threads
    assert consumer_regs(2) == 232 and consumer_regs(2, PRODUCER_REGS_DOUBLE_P) == 240
    assert consumer_regs(3) == 152


def test_attention_serial_order_knob(monkeypatch):
    """TILEC_WGMMA_ATTENTION=3,0,0: each product completes (wgmma_wait<0>) before the statements
    after it read its result (measured slower: docs/PERFORMANCE.md); a malformed knob is a user
    error."""
    body = _attention_body(monkeypatch, "3,0,0")
    loop = body[body.index("for (int tilec_k_i"):]
    assert loop.count("wgmma_wait<0>();") == 2 and "wgmma_wait<1>" not in loop
    assert loop.index("wgmma_tile<128, 128") < loop.index("quad_allreduce<tilec::OpMax>") < \
        loop.index("wgmma_tile_rs<128")
    assert "V_s + tilec_s * 16384" in loop and "turn_" not in body
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "4,1,0")
    from tilec.diagnostics import TilecError
    with pytest.raises(TilecError, match="TILEC_WGMMA_ATTENTION=4,1,0: expected stages,overlap,pingpong"):
        _kernels(ATTENTION)


def test_persistent_attention_loads_the_next_q_during_the_tile(monkeypatch):
    """TILEC_WGMMA_ATTENTION=3,1,0,1: a persistent grid walks the query tiles (causal ones in
    pairs: test_persistent_causal_attention_walks_pairs_of_even_work). Q is a ring
    of one stage: the consumer warps free it (8 arrivals) once the key loop's last Q K^T is
    complete, before the last P V and the epilogue, and the producer waits for that before it
    loads the next tile's Q, right after the tile's first K/V stage (alone where there are no
    key tiles); both roles wait by the parity of their own tile count. The default; a three-field
    knob keeps the target's choice, a fourth field 0 gives one block per query tile; a flag
    other than 0 or 1 is a user error."""
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,1")
    ks = {k.name: k for k in _kernels(ATTENTION) if "_tma" in k.name}
    assert ks and all(k.persistent for k in ks.values())
    text = T.print_kernel(ks["hop_attention_k0_tma_D128exact"])
    assert "# persistent grid" in text and "# Q_s: copied once per tile" in text
    assert not any(k.tma_stores for k in ks.values())  # (stored from registers)
    body = _attention_body(monkeypatch, "3,1,0,1")
    assert "tilec::sm90::mbar_init(tilec_once_free, 8);" in body
    producer = body[body.index("// the producer warpgroup"):body.index("// the consumer warpgroups")]
    consumer = body[body.index("// the consumer warpgroups"):]
    assert "for (int64_t tilec_b = blockIdx.x; tilec_b < tilec_tiles; tilec_b += gridDim.x)" in \
        producer and "tilec_b += gridDim.x" in consumer
    # (the tile's first K/V stage is issued before the wait for Q's, whose copy follows it)
    order = ["mbar_wait(&tilec_empty", "++tilec_it;", "if (k == 0) {",
             "mbar_wait(tilec_once_free, (tilec_t & 1) ^ 1)", "mbar_arrive_expect_tx(tilec_once, "
             "32768)", "tma_load_3d(Q_s, &tilec_map_Q, tilec_once", "if (host1 <= 0) {",
             "mbar_wait(tilec_once_free", "tma_load_3d(Q_s, &tilec_map_Q, tilec_once",
             "++tilec_t;"]
    pos = 0
    for x in order:  # (in this order: each found after the one before)
        pos = producer.index(x, pos) + 1
    order = ["mbar_wait(tilec_once, tilec_t & 1)", "// key tile 0", "int tilec_k_i = 1;",
             "mbar_arrive(tilec_once_free)", "// O1 of the last key tile", "store_vec<",
             "++tilec_t;"]
    at = [consumer.index(x) for x in order]
    assert at == sorted(at), order
    assert consumer.count("mbar_arrive(tilec_once_free)") == 1
    # the serial order frees Q after its loop too: after the loop body's last line, closed
    serial = _attention_body(monkeypatch, "3,0,0,1")
    last = serial.rindex("++tilec_it;")
    free = serial.index("mbar_arrive(tilec_once_free)")
    assert serial.count("mbar_arrive(tilec_once_free)") == 1
    assert last < free < serial.index("store_vec<") and "}" in serial[last:free]
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,0")
    assert not any(k.persistent for k in _kernels(ATTENTION))
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0")  # (the target's choice: persistent)
    assert all(k.persistent for k in _kernels(ATTENTION) if "_tma" in k.name)
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,2")
    with pytest.raises(TilecError, match=r"TILEC_WGMMA_ATTENTION=3,1,0,2: expected stages,"
                                         r"overlap,pingpong\[,persistent\[,split\[,keys\[,p\]\]\]\]"):
        _kernels(ATTENTION)


def test_split_rings_free_k_after_its_product(monkeypatch):
    """TILEC_WGMMA_ATTENTION=3,1,0,0,1: K and V on rings of their own. The producer issues key
    tile k's K, then tile k - 1's V (the order the consumers take them), and the last tile's V
    after its loop; the consumers free a stage's K once its Q K^T is complete (before the
    softmax), wait for the previous tile's V just before its P V, and free that V after P V's
    wait. Without the fifth field, with turns or in the serial order, the kernel is the one
    without the split."""
    body = _attention_body(monkeypatch, "3,1,0,0,1")
    assert "uint64_t* tilec_full_v = tilec_empty + 3;" in body
    assert "uint64_t* tilec_once = tilec_empty_v + 3;" in body
    assert "mbar_init(&tilec_full_v[tilec_s], 1);" in body and \
        "mbar_init(&tilec_empty_v[tilec_s], 8);" in body
    producer = body[body.index("// the producer warpgroup"):body.index("// the consumer warpgroups")]
    consumer = body[body.index("// the consumer warpgroups"):]
    order = ["mbar_wait(&tilec_empty[tilec_s]", "arrive_expect_tx(&tilec_full[tilec_s], 32768)",
             "tma_load_3d(K_s + tilec_s * 16384", "if (k > 0) {",
             "const uint32_t tilec_sv = (tilec_it - 1) % 3;",
             "mbar_wait(&tilec_empty_v[tilec_sv], (((tilec_it - 1) / 3) & 1) ^ 1)",
             "arrive_expect_tx(&tilec_full_v[tilec_sv], 32768)",
             "tma_load_3d(V_s + tilec_sv * 16384, &tilec_map_V, &tilec_full_v[tilec_sv], "
             "(int32_t)(0), (int32_t)((k - 1) * 128)", "++tilec_it;", "if (host1 > 0) {",
             "(int32_t)((host1 - 1) * 128)"]
    at = [producer.index(x) for x in order]
    assert at == sorted(at), order
    assert producer.count("tma_load_3d(V_s") == 4  # (two copies of two 64-column panels)
    first = consumer[consumer.index("// key tile 0"):consumer.index("int tilec_k_i = 1;")]
    assert first.index("wgmma_wait<0>();") < first.index("mbar_arrive(&tilec_empty[tilec_s])") < \
        first.index("quad_allreduce<tilec::OpMax>")
    loop = consumer[consumer.index("int tilec_k_i = 1;"):consumer.index("// O1 of the last")]
    order = ["mbar_wait(&tilec_full[tilec_s]", "wgmma_tile<128",
             "mbar_wait(&tilec_full_v[tilec_prev], ((tilec_it - 1) / 3) & 1);",
             "wgmma_tile_rs<128", "wgmma_wait<1>();", "mbar_arrive(&tilec_empty[tilec_s])",
             "quad_allreduce<tilec::OpMax>", "wgmma_wait<0>();",
             "mbar_arrive(&tilec_empty_v[tilec_prev])", "++tilec_it;"]
    at = [loop.index(x) for x in order]
    assert at == sorted(at), order
    last = consumer[consumer.index("// O1 of the last"):]
    assert last.index("mbar_wait(&tilec_full_v[tilec_prev]") < last.index("wgmma_tile_rs<128") \
        < last.index("mbar_arrive(&tilec_empty_v[tilec_prev])")
    # the default: one ring, a stage freed once, after its P V
    monkeypatch.delenv("TILEC_WGMMA_ATTENTION")
    assert "tilec_empty_v" not in _attention_body(monkeypatch, "")
    assert _attention_body(monkeypatch, "3,1,1,1,1") == _attention_body(monkeypatch, "3,1,1")
    assert _attention_body(monkeypatch, "3,0,0,1,1") == _attention_body(monkeypatch, "3,0,0")


@pytest.mark.nvcc
def test_wgmma_with_a_from_registers_has_no_176_column_form(tmp_path):
    """tilec_cuda.h's wgmma_rs takes 64, 128 or 256 columns: 176 (a width only the
    descriptor form has, for attention's 176-key Q K^T) is a compile error, not a 64-column
    wgmma."""
    need_nvcc()
    # (the device library and the headers it includes, as tilec writes them beside a source)
    src, _, m = compile_text("kernel k(X: f32[N]) -> Y: f32[N]:\n    Y = X\n", "k.tile", "cuda",
                             options=HOPPER)
    driver.write_files(tmp_path, driver.render(src, m, "cuda", HOPPER))
    (tmp_path / "rs.cu").write_text(
        '#include "tilec_cuda.h"\n'
        "__global__ void k(float* d, const uint32_t* a) {\n"
        "    tilec::sm90::wgmma_rs<COLUMNS, 0, tilec::sm90::WG_F16>(d, a, 0, 1);\n}\n")
    for n, ok in ((128, True), (176, False)):
        r = subprocess.run([os.environ.get("NVCC", "nvcc"), "-std=c++17", f"-DCOLUMNS={n}", "-gencode",
                            "arch=compute_90a,code=sm_90a", "-c", "rs.cu", "-o", "rs.o"],
                           cwd=tmp_path, capture_output=True, text=True)
        assert (r.returncode == 0) == ok, r.stderr
        assert ok or "64, 128 or 256 columns" in r.stderr, r.stderr


def test_key_tiles_of_176_where_no_mask_cuts_them(monkeypatch):
    """TILEC_WGMMA_ATTENTION's sixth field: 176 keys per tile (m64n176k16 for Q K^T, 11 k-steps
    of P V; 2 stages, as FlashAttention-3's D128 forward). A kernel whose scores are masked by
    their indices (causal) keeps tiles of 128 keys; 3 stages of 176 keys do not fit in shared
    memory and are a user error, as another tile length."""
    body = _attention_body(monkeypatch, "2,1,0,1,1,176")
    assert "wgmma_tile<176, 128, false, tilec::sm90::WG_F16, 128>(S1, Q_s" in body
    assert "wgmma_tile_rs<128, 176, true, tilec::sm90::WG_F16>(O1, P, V_s + tilec_prev * 22528)" \
        in body
    assert "mbar_arrive_expect_tx(&tilec_full[tilec_s], 45056)" in body  # (K alone: own rings)
    assert "float S1[88];" in body and "uint32_t P[44];" in body
    ks = {k.name: k for k in _kernels(ATTENTION) if "_tma" in k.name}
    text = T.print_kernel(ks["hop_causal_bf16_k0_tma_D128exact"])
    assert "K_s = shared(bf16, [2, 128, 128])" in text, text
    assert "K_s = shared(f16, [2, 176, 128])" in T.print_kernel(ks["hop_attention_k0_tma_D128exact"])
    from tilec.diagnostics import TilecError
    for bad in ("3,1,0,1,1,176", "2,1,0,1,1,192"):
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", bad)
        with pytest.raises(TilecError, match=f"TILEC_WGMMA_ATTENTION={bad}: expected .*keys 128 "
                                             "or 176 with 2 stages at most"):
            _kernels(ATTENTION)


@pytest.mark.parametrize("knob", ["", "2,1,0,1,1,176"])
def test_hopper_attention_tiles_compute_what_the_reference_does(monkeypatch, knob):
    """The tiled Tile IR of the warp-specialized attention variants (128- and 176-key tiles),
    run by the Tile IR interpreter against the reference: key counts that are and are not
    multiples of either tile, a key tile of one key, query tiles cut short, head dims 128 and
    64. (The GPU runs the same tiles: test_warp_specialized_attention_on_gpu.)"""
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    m0 = driver.frontend(driver.Source("hop.tile", ATTENTION))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    for g, prog in zip(mod.graphs, mod.programs):
        (k,) = [k for k in prog.kernels if k.name.endswith("_tma")]
        keys = 176 if knob and "causal" not in g.name else 128
        assert f"K_s = shared({'f16' if 'causal' not in g.name else 'bf16'}, [{keys}, D])" \
            in T.print_kernel(k)
        for dims in (dict(B=1, H=2, L=130, S=500, D=128), dict(B=2, H=1, L=64, S=177, D=64),
                     dict(B=1, H=1, L=200, S=352, D=128), dict(B=1, H=1, L=1, S=1, D=64)):
            if "causal" in g.name:  # (B, L, D: L keys)
                dims = dict(B=dims["B"] * dims["H"], L=dims["S"], D=dims["D"])
            _tiles_match_reference(g, k, dims, "O")


# head dims fixed in the program, of part of a 64-column panel: the tiles take whole panels
ATTENTION_FIXED_D = """
kernel hop_att80(Q: f16[B, H, L, 80], K: f16[B, H, S, 80], V: f16[B, H, S, 80]) -> O: f16[B, H, L, 80]:
    O = f16(softmax((Q @ K.T) * 0.1, axis=-1)) @ V

kernel hop_causal_32_96(Q: bf16[B, L, 32], K: bf16[B, L, 32], V: bf16[B, L, 96]) -> O: bf16[B, L, 96]:
    S = (Q @ K.T) * 0.2
    S = where(index(S, -1) > index(S, -2), -inf, S)
    O = bf16(softmax(S, axis=-1)) @ V
"""
FIXED_D_DIMS = (dict(B=1, H=2, L=130, S=300), dict(B=2, H=1, L=64, S=1), dict(B=1, H=1, L=257, S=129))


def test_fixed_head_dims_of_part_of_a_panel_take_whole_panels():
    """A head dim fixed at 80, 32 or 96 gets the warp-specialized attention, its tiles 128 or 64
    columns wide (TMA reads zeros past the tensor's columns; only the real ones are stored):
    the tiled Tile IR, run by the Tile IR interpreter, matches the reference. (On the GPU:
    test_fixed_head_dims_on_gpu.)"""
    m0 = driver.frontend(driver.Source("hop.tile", ATTENTION_FIXED_D))
    mod = driver.stage_module(m0, "tiled", "cuda", options=HOPPER)
    widths = {"hop_att80": ("f16", 128, 128), "hop_causal_32_96": ("bf16", 64, 128)}
    for g, prog in zip(mod.graphs, mod.programs):
        (k,) = [k for k in prog.kernels if k.name.endswith("_tma")]
        text = T.print_kernel(k)
        dt, wk, wv = widths[g.name]
        for tile in (f"Q_s = shared({dt}, [128, {wk}])", f"K_s = shared({dt}, [128, {wk}])",
                     f"V_s = shared({dt}, [128, {wv}])", f"O1 = fragment(f32, [128, {wv}])"):
            assert tile in text, tile
        for dims in FIXED_D_DIMS:
            if "causal" in g.name:
                dims = dict(B=dims["B"] * dims["H"], L=dims["S"])
            _tiles_match_reference(g, k, dims, "O")


@pytest.mark.gpu
def test_fixed_head_dims_on_gpu(monkeypatch):
    """ATTENTION_FIXED_D's Hopper variants alone (a failing condition is an error) against the
    reference, at key counts that are and are not multiples of the key tile."""
    need_gpu()
    _tma_variants_only(monkeypatch)
    for dims in FIXED_D_DIMS:
        check_text(ATTENTION_FIXED_D, dims, name="hop_fixed_d.tile", target="cuda", options=HOPPER)


ATTENTION_2D_PLAIN = """
kernel hop_att2d(Q: f16[L, 128], K: f16[S, 128], V: f16[S, 128]) -> O: f16[L, 128]:
    O = f16(softmax(Q @ K.T, axis=-1)) @ V
"""
ATTENTION_2D_CAUSAL = """
kernel hop_causal2d(Q: bf16[L, 64], K: bf16[L, 64], V: bf16[L, 64]) -> O: bf16[L, 64]:
    S = (Q @ K.T) * 0.125
    S = where(index(S, -1) > index(S, -2), -inf, S)
    O = bf16(softmax(S, axis=-1)) @ V
"""
ATTENTION_2D = ATTENTION_2D_PLAIN + ATTENTION_2D_CAUSAL


@pytest.mark.parametrize("knob", ["", "2,1,0,1,1,176", "3,1,0,0"])
def test_attention_without_batch_dims_renders(monkeypatch, knob):
    """Attention of 2-D tensors (no batch or head dims: a grid of query tiles alone) gets the
    warp-specialized kernel on the persistent grid too, walking one block variable (the
    persistent walk had read a second one, an internal error)."""
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    src, _, m = compile_text(ATTENTION_2D, "hop2d.tile", "cuda", options=HOPPER)
    ks = [k for p in m.programs for k in p.kernels if "_tma" in k.name]
    assert ks and all(k.persistent == (knob != "3,1,0,0") and len(k.block_vars) == 1 for k in ks)
    files = driver.render(src, m, "cuda", HOPPER)
    for name in ("hop_att2d", "hop_causal2d"):
        cu = files[f"{name}.cu"]
        body = cu[cu.index(f"{name}_k0_tma("):]
        body = body[:body.index("\n}\n")]
        walk = "tilec_p += gridDim.x" if "causal" in name else "tilec_b += gridDim.x"
        assert (walk in body) == (knob != "3,1,0,0")


@pytest.mark.gpu
@pytest.mark.parametrize("knob", ["", "2,1,0,1,1,176"])
def test_attention_without_batch_dims_on_gpu(monkeypatch, knob):
    """2-D attention, plain and causal, on the warp-specialized kernel alone, against the
    reference: more query tiles than SMs (the persistent walk), ragged L and S. (The causal
    kernel's scores are L x L: at L = 40000 the reference's 13 GB of them ran past the time
    limit, so it takes 2100 rows.)"""
    need_gpu()
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    _tma_variants_only(monkeypatch)
    for text, dims in ((ATTENTION_2D_PLAIN, dict(L=130, S=300)), (ATTENTION_2D_PLAIN, dict(L=40000, S=200)),
                       (ATTENTION_2D_CAUSAL, dict(L=130)), (ATTENTION_2D_CAUSAL, dict(L=2100))):
        check_text(text, dims, name="hop2d_only.tile", target="cuda", options=HOPPER)


def test_persistent_causal_attention_walks_pairs_of_even_work(monkeypatch):
    """A causal bound gives later query tiles more key tiles. On a persistent grid the blocks
    walk them in pairs, x = last - j then x = j, whose key tiles add up alike, so that the
    static shares are even; with fewer pairs than blocks, one tile a step, the longest first.
    The two roles walk the same tiles (the walk itself: test_pair_walk_visits_every_tile_once).
    """
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,1")
    ks = {k.name: k for k in _kernels(ATTENTION) if "_tma" in k.name}
    causal = ks["hop_causal_bf16_k0_tma_D128exact"]
    assert causal.persistent and causal.longest_first
    assert not ks["hop_attention_k0_tma_D128exact"].longest_first
    assert "# tiles in pairs of even work (bx = last - j, then j)" in T.print_kernel(causal)
    src, _, m = compile_text(ATTENTION, "hop.tile", "cuda", options=HOPPER)
    cu = driver.render(src, m, "cuda", HOPPER)["hop_causal_bf16.cu"]
    body = cu[cu.index("hop_causal_bf16_k0_tma_D128exact("):]
    body = body[:body.index("\n}\n")]
    walk = ("const int tilec_per = tilec_pairs >= (int64_t)gridDim.x ? 2 : 1;",
            "for (int tilec_m = 0; tilec_m < tilec_per; ++tilec_m) {",
            "if (tilec_m == 1 && 2 * tilec_j + 1 == tilec_grid[0]) continue;")
    producer = body[body.index("// the producer warpgroup"):body.index("// the consumer warpgroups")]
    consumer = body[body.index("// the consumer warpgroups"):]
    for line in walk:
        assert producer.count(line) == 1 and consumer.count(line) == 1, line
    # (x from the pair walk's index as it is, not counted down again)
    assert "const int64_t bx = (tilec_b) % tilec_grid[0];" in consumer


PAIR_WALK_HARNESS = """
#include <cstdint>
#include <cstdio>
#include <cstdlib>
// the generated walk on the host: blockIdx.x and gridDim.x are the harness's
int main(int argc, char** argv) {
    const int64_t tilec_grid[3] = {atoll(argv[1]), atoll(argv[2]), 1};
    const int64_t tilec_tiles = tilec_grid[0] * tilec_grid[1] * tilec_grid[2];
    const int64_t tilec_resident = atoll(argv[3]);  // (the launcher's persistent grid)
    const struct { unsigned x; } gridDim = {
        (unsigned)(tilec_resident < tilec_tiles ? tilec_resident : tilec_tiles)};
    for (unsigned b = 0; b < gridDim.x; ++b) {
        const struct { unsigned x; } blockIdx = {b};
        WALK
            printf("%u %lld %lld\\n", b, (long long)bx, (long long)bz);
        }
    }
    return 0;
}
"""


def test_pair_walk_visits_every_tile_once(monkeypatch, tmp_path):
    """The persistent causal walk as generated (its lines compiled for the host with g++): each
    tile of the grid exactly once; where the pairs are many, even shares of key tiles."""
    monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,1")
    src, _, m = compile_text(ATTENTION, "hop.tile", "cuda", options=HOPPER)
    cu = driver.render(src, m, "cuda", HOPPER)["hop_causal_bf16.cu"]
    body = cu[cu.index("hop_causal_bf16_k0_tma_D128exact("):]
    body = body[body.index("// the consumer warpgroups"):]
    start = body.index("const int64_t tilec_half")
    walk = body[start:body.index("\n", body.index("const int64_t bz = ", start)) + 1]
    (tmp_path / "walk.cpp").write_text(PAIR_WALK_HARNESS.replace("WALK", walk))
    r = subprocess.run(["g++", "-O1", "-o", str(tmp_path / "walk"), str(tmp_path / "walk.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for g0, rest, blocks in [(1, 1, 132), (2, 5, 3), (3, 9, 1), (8, 40, 132), (15, 36, 132),
                             (32, 128, 132), (32, 1, 132), (33, 10, 132), (8, 66, 132)]:
        out = subprocess.run([str(tmp_path / "walk"), str(g0), str(rest), str(blocks)],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        rows = [tuple(map(int, line.split())) for line in out if line]
        assert sorted((z, x) for _, x, z in rows) == [(z, x) for z in range(rest)
                                                      for x in range(g0)], (g0, rest, blocks)
        work = {}
        for b, x, _ in rows:  # (a causal query tile x runs x + 1 key tiles)
            work[b] = work.get(b, 0) + x + 1
        if (g0, rest) == (8, 66):  # (pairs a multiple of the blocks: even shares)
            assert len(set(work.values())) == 1, work
        if (g0, rest) == (32, 128):  # (B 4, H 32, L 4096: 15.5 pairs a block)
            assert max(work.values()) <= 1.04 * sum(work.values()) / len(work), work


@pytest.mark.parametrize("text", [
    # K stored transposed ([D, S]: not the K-major tile wgmma reads); P kept in f32; D past 128
    "kernel t(Q: f16[L, D], Kt: f16[D, S], V: f16[S, D]) -> O: f16[L, D]:\n"
    "    O = f16(softmax(Q @ Kt, axis=-1)) @ V\n",
    "kernel t(Q: f16[L, D], K: f16[S, D], V: f32[S, D]) -> O: f32[L, D]:\n"
    "    O = softmax(f32(Q @ K.T), axis=-1) @ V\n",
    "kernel t(Q: f16[L, 256], K: f16[S, 256], V: f16[S, 256]) -> O: f16[L, 256]:\n"
    "    O = f16(softmax(Q @ K.T, axis=-1)) @ V\n"])
def test_attention_tma_cannot_read_keeps_mma_sync(text):
    ks = _kernels(text)
    assert ks and not any(k.warp_specialize for k in ks)


def _softmax_runs_beside_p_v(sass: str):
    """In the SASS of every overlapped key loop, the wait for all but one product group (Q K^T
    complete, P V of the tile before in flight) is followed by the softmax's exponentials, one
    per score a thread holds, before the wait for P V: ptxas, left to schedule that wait within
    the softmax's basic block, issued it before the exponentials, and they never overlapped
    P V (overlapped_loop)."""
    loops = 0
    for fn in re.split(r"\n\s*(?:\.text\.|Function : )", sass):
        # (attention's kernels: P V takes P from registers; a GEMM's mainloop waits alike)
        if "_tma" not in fn.split("\n", 1)[0] or not re.search(r"HGMMA\S* R\d+, R\d+, gdesc", fn):
            continue
        for part in fn.split("WARPGROUP.DEPBAR.LE gsb0, 0x1")[1:]:
            loops += 1
            before = part.split("WARPGROUP.DEPBAR.LE gsb0, 0x0")[0]
            assert before.count("MUFU.EX2") >= 64, before[:2000]
    assert loops, "no overlapped key loop in the SASS"


@pytest.mark.nvcc
@pytest.mark.gpu  # (no GPU needed: also run with `-m gpu` on the device)
@pytest.mark.parametrize("knob", ["", "3,1,0,1", "3,1,0,0,1", "3,1,0,1,1", "2,1,0,1,1,176",
                                  "3,1,0,1,0,128,1"])
def test_warp_specialized_attention_compiles_for_sm90a(monkeypatch, knob):
    """Warning-free, no spills, no wgmma serialized, also with the persistent grid, with K
    and V on rings of their own and with 176-key tiles; the PTX
    multiplies P V with A from registers (wgmma's register operand form), the SASS holds HGMMA
    and UTMALDG."""
    need_nvcc()
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    ptx = ""
    for f, r, folder in nvcc_each(ATTENTION, "hop.tile", [
            "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-c", "-o", "k.o",
            "--keep"], HOPPER):
        assert r.returncode == 0 and "warning" not in r.stderr.lower(), r.stderr
        ptx += kept_ptx(folder, f, "compute_90a")
        report = ptxas_lines(r.stderr)
        assert report and not any(spills for _, spills in report.values()), r.stderr
        # (the launch gives each thread the kernel's count: setmaxnreg's counts add up to it)
        assert all(regs == 168 for (name, _), (regs, _) in report.items() if "_tma" in name), \
            report
        # no wgmma serialized or fenced by ptxas (C7510-C7519: accumulators touched while a
        # product runs, too few registers for the pipeline)
        assert not re.search(r"\(C751\d\)", r.stderr), r.stderr
        sass = kept_sass(folder, f)
        assert "HGMMA" in sass and "UTMALDG" in sass
        # Q K^T with both operands from shared memory (descriptors), P V with P from registers
        assert re.search(r"HGMMA\.64x(128|176)x16\.F32(\.BF16)? R\d+, gdesc\[", sass), f
        assert re.search(r"HGMMA\.64x128x16\.F32(\.BF16)? R\d+, R\d+, gdesc\[", sass), f
        _softmax_runs_beside_p_v(sass)
    for dt in ("f16", "bf16"):  # (also with the knobs: the same products)
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.{dt}\.{dt}\s*"
                         r"\{[^}]*\},\s*\{%r\d+, %r\d+, %r\d+, %r\d+\}", ptx), dt


@pytest.mark.gpu
@pytest.mark.parametrize("knob", ["", "2,0,0", "3,1,0", "3,0,1", "3,1,1", "3,1,0,1", "2,0,0,1",
                                  "3,1,1,1", "3,1,0,0,1", "2,1,0,0,1", "3,1,0,1,1",
                                  "2,1,0,1,1,176", "3,1,0,1,0,128,1"])
def test_warp_specialized_attention_on_gpu(monkeypatch, knob):
    """The Hopper attention alone (the other variants removed: a condition that fails is an
    error, not a fallback): head dims at and below both capacities, ragged L and S, causal with
    bf16, batch and heads merged, against the reference; also with 2 stages, in the overlapped
    order without the turns, in the serial order, with K and V on rings of their own, and on a
    persistent grid, whose blocks then
    walk several query tiles each (more tiles, and more causal pairs of tiles, than an H100 or
    H200 has SMs: the stage ring and Q's parity across tiles; an odd count of query tiles, whose
    middle one is a pair's alone) (TILEC_WGMMA_ATTENTION)."""
    need_gpu()
    if knob:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", knob)
    _tma_variants_only(monkeypatch)
    for dims in (dict(B=2, H=3, L=200, S=130, D=64), dict(B=1, H=2, L=130, S=300, D=128),
                 dict(B=1, H=1, L=64, S=64, D=40), dict(B=2, H=1, L=257, S=1, D=96),
                 dict(B=1, H=2, L=100, S=700, D=128)) + \
            ((dict(B=40, H=1, L=1000, S=200, D=128), dict(B=36, H=1, L=1800, S=300, D=64))
             if knob.split(",")[3:4] == ["1"] else ()):
        check_text(ATTENTION, dims, name="hop_only.tile", target="cuda", options=HOPPER)


L2_PROGRAM = r"""
#include <cstdio>
#include "tilec_cuda.h"
int main() {
    alignas(256) static unsigned char buf[512];
    const uint64_t lines[2] = {8192, 8192 * 4096}, inside[2] = {8176, 8176 * 4096};
    const uint64_t third[2] = {8192, 8192 * 4096 + 16};
    std::printf("%d %d %d %d %d\n",
                tilec::l2_promotion(buf, 2, lines) == CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                tilec::l2_promotion(buf, 2, inside) == CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                tilec::l2_promotion(buf + 16, 2, lines) == CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                tilec::l2_promotion(buf, 3, third) == CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                tilec::l2_promotion(buf, 2, third) == CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    return 0;
}
"""


def test_tensor_maps_fetch_256_bytes_only_where_rows_start_on_lines(tmp_path):
    """A tensor whose rows start inside 128-byte lines (a row of 4088 f16 values, an unaligned
    base) gets 128-byte L2 fetches in its tensor maps, others 256 (host code: runs here)."""
    need_nvcc()
    templates = Path(driver.__file__).parent / "templates"
    (tmp_path / "l2.cu").write_text(L2_PROGRAM)
    exe = tmp_path / "l2"
    r = subprocess.run(["nvcc", "-std=c++17", f"-I{templates / 'cuda'}", f"-I{templates / 'common'}",
                        str(tmp_path / "l2.cu"), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split() \
        == ["1"] * 5
