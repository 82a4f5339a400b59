"""Decode-size GEMM variants: split-K (passes/split_k.py) and the GEMV for one row of A. The
split covers every K tile once, the launcher takes each variant only where it applies (one row:
GEMV; a small grid and a long K: split), their kernels compute the reference's result (Tile IR
interpreter here, the GPU with `-m gpu`), and a split's workspace costs nothing where it does not
run."""

from __future__ import annotations

import ctypes
import math

import pytest
from conftest import SAMPLES, build_text, check_text, compile_text
from test_cuda import ON_CI, cuda_kernel_sources, need_gpu, need_nvcc
from test_tile_level import agree

from tilec import driver, interp, interp_tile
from tilec.diagnostics import TilecError
from tilec.ir import tile as T
from tilec.ir.types import DTYPES, Dim
from tilec.passes import split_k


@pytest.mark.parametrize("blocks,min_tiles,multiple,wave", [
    (512, 4, 1, False), (16, 1, 1, False), (7, 3, 1, False), (16, 1, 4, False),
    (512, 128, 4, False), (264, 4, 1, True), (7, 3, 1, True), (8, 64, 1, True)])
def test_every_k_tile_is_in_exactly_one_split(blocks, min_tiles, multiple, wave):
    """Every split walks a non-empty run of K tiles and together they walk all; a split stays
    near its block goal (`wave`: within it: the blocks a device runs at once, where a few more
    would start a second wave)."""
    tiles, nk = Dim.sym("t"), Dim.sym("n")
    sk = split_k.plan(tiles, nk, blocks, min_tiles, multiple, wave=wave)
    for t in range(1, 40):
        for n in list(range(1, 70)) + [255, 256, 1001, 4096]:
            env = {"t": t, "n": n}
            chunk, count = sk.chunk.eval(env), sk.count.eval(env)
            assert chunk % multiple == 0  # (a GEMV's steps start at multiples of its step)
            # split s walks tiles [s * chunk, min((s + 1) * chunk, n)): all non-empty, all of K
            sizes = [min(chunk, n - s * chunk) for s in range(count)]
            assert all(x >= 1 for x in sizes) and sum(sizes) == n, (t, n, chunk, count)
            assert count <= max(1, -(-blocks // t)), "more splits than the block goal asks"
            if sk.when.eval(env):
                assert count >= 2 and chunk >= min_tiles, "the split variant must split"
                assert not wave or count * t <= blocks, "a second wave of blocks"


def variant_names(text: str, dims: dict) -> list:
    _, _, m = compile_text(text, "k.tile", "cuda")
    return [k.name for k in interp_tile.pick_variants(m.programs[0], dims)]


def test_launcher_takes_the_split_for_decode_sizes_only():
    text = (SAMPLES / "w4a16.tile").read_text()
    # M = 1: 64-column blocks, split below about 128 of them (one per SM)
    assert variant_names(text, dict(M=1, N=4096, K=8192)) == ["w4a16_k0_gemv_split",
                                                               "w4a16_k0_gemv_split_sum"]
    assert variant_names(text, dict(M=1, N=8192, K=8192)) == ["w4a16_k0_gemv"]
    assert variant_names(text, dict(M=1, N=4096, K=128)) == ["w4a16_k0_gemv"]
    # up to 8 and 16 rows of A: the GEMV routine's blocks of 8 and 16 rows, split alike
    assert variant_names(text, dict(M=16, N=4096, K=4096)) == ["w4a16_k0_gemv16_split",
                                                                "w4a16_k0_gemv16_split_sum"]
    assert variant_names(text, dict(M=3, N=4096, K=4096)) == ["w4a16_k0_gemv8_split",
                                                               "w4a16_k0_gemv8_split_sum"]
    # short K: one block per tile already walks all of it; big grids fill the device alone
    assert variant_names(text, dict(M=2, N=8192, K=512)) == ["w4a16_k0_gemv8"]
    assert variant_names(text, dict(M=9, N=65536, K=8192)) == ["w4a16_k0_gemv16"]
    # N % 8 != 0 (weight words straddle rows): the 16-row tensor-core tile
    assert variant_names(text, dict(M=2, N=8196, K=512)) == ["w4a16_k0_m16"]
    assert variant_names(text, dict(M=2, N=65532, K=8192)) == ["w4a16_k0_m16"]
    assert variant_names(text, dict(M=17, N=128, K=8192)) == ["w4a16_k0"]


def test_gemv_of_several_rows_takes_plain_rows_of_a_and_the_fewest_rows_that_hold_m():
    """The GEMV variants of 8 and 16 rows of A run the target's routine, which reads A's rows
    from memory: a prologue on A (computed values) leaves them out for the 16-row tile; a
    constant M takes the variant of the fewest rows that hold it (and the tile, for N % 8 !=
    0); weights packed along K take them at any N. The interpreter agrees on each variant."""
    text = (SAMPLES / "w4a16.tile").read_text()
    names = [k.name for k in compile_text(text.replace("A @ dequant", "relu(A) @ dequant"),
                                          "k.tile", "cuda")[2].programs[0].kernels]
    assert "w4a16_k0_gemv" in names and not any("gemv8" in n or "gemv16" in n for n in names)
    const = text.replace("A: f16[M, K]", "A: f16[4, K]").replace("C: f16[M, N]", "C: f16[4, N]")
    names = [k.name for k in compile_text(const, "k.tile", "cuda")[2].programs[0].kernels]
    assert "w4a16_k0_gemv8" in names and "w4a16_k0_m16" in names and \
        not any("gemv16" in n for n in names)
    agree(const, "cuda", dict(N=264, K=1280))
    kmajor = (SAMPLES / "w4a16_kmajor.tile").read_text()
    assert variant_names(kmajor, dict(M=3, N=4100, K=4096))[0] == "w4a16_kmajor_k0_gemv8_split"
    assert variant_names(kmajor, dict(M=12, N=30000, K=4096)) == ["w4a16_kmajor_k0_gemv16"]


ROUNDED_WEIGHTS = """
kernel wf(A: f16[M, K], Wq: i4[K, N], s: f16[K // 32, N]) -> C: f32[M, N]:
    C = A @ dequant(Wq, s, zero=0, group=32)

kernel wx(A: f32[M, K], Wq: i4[K, N], s: f32[K // 32, N]) -> C: f32[M, N]:
    C = A @ dequant(Wq, s, zero=0, group=32)

kernel wm(A: f32[M, K], Wq: i4[K, N], s: f16[K // 32, N]) -> C: f32[M, N]:
    C = A @ dequant(Wq, s, zero=0, group=32)
"""


def test_weights_rounded_to_16_bit_scales_are_checked_with_a_16_bit_tolerance():
    """A @ dequant(q, s) with 16-bit A and s multiplies on the GPU targets' matrix units weights
    rounded to s's dtype (as weight-only kernels do; the program's dequant is f32): an f32
    output is then off by more than f32's tolerance and within f16's (the Tile IR interpreter
    on the CUDA lowering, every kernel the launcher picks at two sizes), so `tilec run` and the
    tests check such kernels with f16's; f32 scales or A (the exact f32 path) and the CPU keep
    f32's."""
    from test_tile_level import in_shape_of, tiled

    from tilec.interp_tile import pick_slots, run_program
    from tilec.runner import reduced_precision
    m = driver.frontend(driver.Source("r.tile", ROUNDED_WEIGHTS))
    got = {t: {g.name for g in m.graphs if reduced_precision(m, g, driver.get_target(t))}
           for t in ("cpu", "cuda", "hip")}
    assert got == {"cpu": set(), "cuda": {"wf"}, "hip": {"wf"}}
    m0, mt = tiled(ROUNDED_WEIGHTS, "cuda")
    g, prog = m0.graphs[0], mt.programs[0]
    for d in (dict(M=1, N=136, K=320), dict(M=20, N=136, K=320)):
        inputs = interp.random_inputs(g, d, 0)
        ref = interp.run_graph(g, inputs, d)["C"]
        kernels = [k for parts in pick_slots(prog, d) for k in parts]
        out = in_shape_of(run_program(kernels, inputs, d, ["C"])["C"], ref)
        err = interp.rel_error(out, ref)
        assert interp.tolerance("f32", 320) < err <= interp.tolerance("f32", 320, reduced=True)


def test_gemv_needs_rows_of_b_in_memory_order():
    """B read across its rows (W.T of a [N, K] weight) has no contiguous rows to stream: no GEMV
    variant (the split tensor-core variant takes M = 1)."""
    names = [k.name for k in compile_text(LINEAR_T, "k.tile", "cuda")[2].programs[0].kernels]
    assert not any("gemv" in n for n in names) and "linear_t_k0_m16_split" in names


def test_split_of_a_constant_shape_is_decided_at_compile_time():
    text = """
kernel decode(A: f16[1, 4096], W: f16[4096, N]) -> C: f16[1, N]:
    C = A @ W
"""
    _, _, m = compile_text(text, "k.tile", "cuda")
    kernels = m.programs[0].kernels
    assert [k.name for k in kernels] == ["decode_k0_gemv_split", "decode_k0_gemv_split_sum",
                                         "decode_k0_gemv"]  # M = 1: nothing else can run
    assert all(k.when is not None for k in kernels[:2])  # N decides (tiles < 512)
    assert kernels[-1].when is None


LINEAR = """
kernel linear(A: f16[M, K], B: f16[K, N], bias: f16[N]) -> C: f16[M, N]:
    C = relu(A @ B + bias)
"""

LINEAR_T = """
kernel linear_t(X: bf16[M, K], W: bf16[N, K]) -> Y: bf16[M, N]:
    Y = X @ W.T
"""


SPLIT_CASES = [
    ((SAMPLES / "w4a16.tile").read_text(), dict(M=3, N=70, K=1280)),  # ragged N, 3 splits
    ((SAMPLES / "w4a16.tile").read_text(), dict(M=1, N=300, K=1280)),  # GEMV, ragged N
    (LINEAR, dict(M=1, N=260, K=1000)),  # GEMV of 16-bit weights, ragged K, epilogue after
    (LINEAR, dict(M=5, N=130, K=1100)),  # ragged K: the last split is short; bias + relu after
    ((SAMPLES / "batched_matmul.tile").read_text(), dict(B=2, M=7, N=40, K=1030)),  # batch in z
    (LINEAR_T, dict(M=2, N=70, K=1100)),  # weights stored [N, K]: the B tile is transposed
    # 8-bit weights: a decode tile of 64 columns (8 KiB of them per K tile), ragged N and K
    ("kernel q(A: i8[M, K], Bw: i8[K, N], s: f32[N]) -> C: f16[M, N]:\n"
     "    C = f32(A @ Bw) * s\n", dict(M=3, N=100, K=1100)),
    # f32 weights on the scalar units: the narrowest decode tile (32 columns on 4 warps)
    ("kernel q(A: f32[M, K], Bw: f32[K, N]) -> C: f32[M, N]:\n    C = A @ Bw\n",
     dict(M=3, N=100, K=1100)),
]


SPLIT_IDS = ["w4a16", "w4a16_gemv", "linear_gemv", "linear", "batched", "linear_t", "int8",
             "f32"]


@pytest.mark.parametrize("text,dims", SPLIT_CASES, ids=SPLIT_IDS)
def test_split_variant_matches_the_reference_in_the_tile_interpreter(text, dims):
    _, _, m = compile_text(text, "k.tile", "cuda")
    picked = interp_tile.pick_variants(m.programs[0], dims)
    assert picked[0].name.endswith("_split"), [k.name for k in picked]
    agree(text, "cuda", dims)  # every variant, the split one included


@pytest.mark.nvcc
def test_split_workspace_is_needed_only_where_the_split_runs():
    need_nvcc()
    _, out = build_text(LINEAR, "linear.tile", "cuda", {"arch": ("sm_80",)})
    try:
        lib = ctypes.CDLL(str(out / "liblinear.so"))
    except OSError as e:
        if ON_CI:  # CI installs the toolkit: a runtime that does not load is a failure there
            pytest.fail(f"the CUDA runtime does not load on this CI machine: {e}")
        pytest.skip(f"the CUDA runtime does not load here: {e}")
    size = lib.linear_workspace_size
    size.restype = ctypes.c_size_t
    size.argtypes = [ctypes.c_int64] * 3
    _, _, m = compile_text(LINEAR, "k.tile", "cuda", options={"arch": ("sm_80",)})
    spaces = m.programs[0].workspaces
    # the GEMV and m16 splits' partial sums, and copies of A and B with padded rows (`_pad`)
    assert len(spaces) == 4 and all(w.when is not None for w in spaces)
    for M, K, N in [(1, 8192, 8192), (16, 4096, 1000), (64, 8192, 8192), (2, 256, 8192),
                    (1, 128, 100), (1024, 4100, 1000), (1024, 4096, 1001), (100, 4100, 1000)]:
        dims = dict(M=M, K=K, N=N)
        want = sum(DTYPES[w.dtype][1] // 8 * math.prod(d.eval(dims) for d in w.shape)
                   for w in spaces if w.when.eval(dims))
        got = size(M, K, N)
        assert want <= got < want + 1024, (dims, got, want)
        assert (got > 0) == any(w.when.eval(dims) for w in spaces), dims


@pytest.mark.gpu
@pytest.mark.parametrize("text,dims", SPLIT_CASES + [
    ((SAMPLES / "w4a16.tile").read_text(), dict(M=1, N=4096, K=4096)),
    ((SAMPLES / "w4a16.tile").read_text(), dict(M=16, N=1000, K=8192)),
    (LINEAR.replace("f16", "bf16"), dict(M=1, N=4100, K=3000)),
    ((SAMPLES / "w4a16.tile").read_text(), dict(M=1, N=130, K=128)),  # GEMV without a split
    ((SAMPLES / "batched_matmul.tile").read_text(), dict(B=3, M=1, N=70, K=2000)),  # batched GEMV
], ids=SPLIT_IDS + ["w4a16_decode", "w4a16_m16", "linear_bf16", "gemv_unsplit", "batched_gemv"])
def test_split_variant_on_gpu(text, dims):
    need_gpu()
    check_text(text, dims, target="cuda", options={"arch": ("sm_90",)})


def gemv_split_step(text: str, target: str):
    """(the split GEMV kernel of `text`, the Store of its main step: the one reading most rows)."""
    _, _, m = compile_text(text, "w.tile", target)
    gemv = next(k for p in m.programs for k in p.kernels if k.name.endswith("_gemv_split"))
    steps = [s for s in T.walk_stmts(gemv.body) if isinstance(s, T.Store) and s.buf.startswith("acc")]
    return gemv, max(steps, key=lambda s: T.fmt(s.value).count("Wq["))


def test_gemv_of_grouped_weights_scales_each_step_once():
    """A GEMV of f32 dequantized weights (q - zero) * scale, whose quantization group is a
    multiple of its rows per step: a step's rows share their group, so the step multiplies by
    the scale once and subtracts the zero once, (sum a q - zero * sum a) * scale, instead of per
    weight; its split chunks are multiples of the step. Checked against the reference."""
    text = (SAMPLES / "w4a16.tile").read_text().replace("f16", "f32")
    gemv, step = gemv_split_step(text, "cpu")
    body = T.fmt(step.value)
    assert body.count("scales[") == 1 and body.count(" - 8.0 * (") == 1, body
    # split chunks: multiples of the step (4 rows here) and of 16 (the matrix-unit GEMV's chunks)
    assert "kc = cdiv(cdiv(K, " in T.print_kernel(gemv) and ", 16) * 16" in T.print_kernel(gemv)
    for dims in (dict(M=1, N=300, K=1280 + 128), dict(M=1, N=70, K=128), dict(M=1, N=33, K=2048)):
        agree(text, "cpu", dims)


def test_gemv_step_reads_its_groups_scale_once_and_accumulates_by_fused_multiply_adds():
    """A GEMV of weights dequantized to a 16-bit dtype (rounded per weight, so the scale cannot
    factor out): the rows of a step share their group, so every row's weight reads the scale
    at the step's first row (one scale load per step, not one per row), and each product joins
    the f32 sum by a fused multiply-add (Tile IR `fma`, rendered as tilec::fma_acc). Checked
    against the reference at K that is and is not a multiple of the step and of the group."""
    text = (SAMPLES / "w4a16.tile").read_text().replace("f16", "bf16")
    _, step = gemv_split_step(text, "cuda")
    loads = {T.fmt(e) for e in T.walk_exprs(step.value) if isinstance(e, T.Load) and e.buf == "scales"}
    rows = T.fmt(step.value).count("Wq[")
    assert len(loads) == 1 and rows > 1, T.fmt(step.value)
    fmas = sum(isinstance(e, T.Fma) for e in T.walk_exprs(step.value))
    assert isinstance(step.value, T.Fma) and fmas == rows
    # 16-bit weights: twice the rows per step of 32-bit ones (the same registers)
    _, step32 = gemv_split_step(text.replace("bf16", "f32"), "cuda")
    assert T.fmt(step32.value).count("Wq[") * 2 == rows
    for dims in (dict(M=1, N=300, K=1280 + 128), dict(M=1, N=70, K=128), dict(M=1, N=33, K=2048)):
        agree(text, "cuda", dims)


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_gemv_of_4bit_weights_runs_on_the_matrix_units_where_words_are_whole(dt):
    """A GEMV of 4-bit weights dequantized to A's 16-bit dtype: where N is a multiple of 8 (whole
    32-bit words of weights), the CUDA tiling computes the warps' partial sums with `gemv_mma`
    (tilec_cuda.h gemv_dequant4_mma), the scalar GEMV in the other branch; f32 weights keep the
    scalar GEMV. The Tile IR interpreter (which runs gemv_mma's definition) agrees with the
    reference with the block's columns whole and cut, split and not, signed and unsigned."""
    text = (SAMPLES / "w4a16.tile").read_text().replace("f16", dt)
    _, _, m = compile_text(text, "w.tile", "cuda")
    gemvs = [k for p in m.programs for k in p.kernels if "_gemv" in k.name and "sum" not in k.name]
    def cond(k, st):  # (after host_scalars, `N % 8` is a kernel-level Let the launcher computes)
        lets = {s.name: T.fmt(s.value) for s in k.body if isinstance(s, T.Let)}
        return " ".join(lets.get(w, w) for w in T.fmt(st.cond).split())
    assert gemvs and all(isinstance(st, T.If) and isinstance(st.body[0], T.GemvMma)
                         and cond(k, st) == "N % 8 == 0"
                         for k in gemvs for st in k.body if isinstance(st, T.If))
    assert all(any(isinstance(st, T.GemvMma) for st in T.walk_stmts(k.body)) for k in gemvs)
    src = "\n".join(cuda_kernel_sources(text, "w.tile").values())
    # (the target's gemv_mma block shape: 64 columns, 32 warps; blocks of 8 rows of A on 24
    # warps, of 16 on 16)
    for slices, rows in ((32, 1), (24, 8), (16, 16)):
        assert f"tilec::gemv_dequant4_mma<tilec::{dt.upper()}, false, 64, {slices}, 64, {rows}>" \
            in src
    for dims in (dict(M=1, N=264, K=1280), dict(M=1, N=512, K=384), dict(M=1, N=8, K=128),
                 dict(M=3, N=264, K=1280), dict(M=11, N=136, K=384), dict(M=16, N=8, K=128)):
        agree(text, "cuda", dims)
    agree(text.replace("u4[", "i4[").replace("zero=8", "zero=0"), "cuda", dict(M=1, N=136, K=256))
    _, _, m32 = compile_text(text.replace(dt, "f32"), "w.tile", "cuda")
    assert not any(isinstance(st, T.GemvMma) for p in m32.programs for k in p.kernels
                   for st in T.walk_stmts(k.body))


@pytest.mark.parametrize("unroll", [2, 4])
def test_gemv_with_rows_per_step_and_several_slices_matches_the_reference(monkeypatch, unroll):
    """The GEMV's unrolled steps (each of 8 warps takes `unroll` consecutive rows, the rows left
    over follow guarded) at K that is no multiple of a step, split and not: the Tile IR
    interpreter against the reference (the CUDA and CPU defaults take 4 rows per step; the knob
    picks other counts)."""
    monkeypatch.setenv("TILEC_GEMV", f"256,256,512,128,4,{unroll}")
    text = (SAMPLES / "w4a16.tile").read_text()
    for dims in (dict(M=1, N=300, K=1280 + 128), dict(M=1, N=70, K=128)):
        agree(text, "cuda", dims)
    agree(LINEAR, "cuda", dict(M=1, N=260, K=1003))


GUARD_PAGE_CALL = r"""
import ctypes, mmap, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
M, K, N = 1, 12, 64
page = mmap.PAGESIZE
buf = mmap.mmap(-1, 2 * page)
libc = ctypes.CDLL(None)
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
assert libc.mprotect(ctypes.c_void_p(base + page), page, 0) == 0  # PROT_NONE after page one
rng = np.random.default_rng(1)
q = rng.integers(0, 16, size=(K, N)).astype(np.uint8)
packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
start = page - packed.size  # the weights end where the unreadable page begins
wq = np.frombuffer(buf, np.uint8, packed.size, start)
wq[:] = packed.ravel()
A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
s = rng.uniform(-1, 1, (K // 4, N)).astype(np.float32)
C = np.zeros((M, N), np.float32)
P = ctypes.c_void_p
fn = lib.w
fn.argtypes = [P, P, P, P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
assert fn(A.ctypes.data, base + start, s.ctypes.data, C.ctypes.data, M, K, N) == 0
ref = A.astype(np.float64) @ ((q - 8.0) * np.repeat(s, 4, axis=0))
assert np.abs(C - ref).max() <= 1e-4 * np.abs(ref).max(), (C, ref)
print("ok")
"""


def test_cpu_gemv_reads_no_weight_row_past_the_end(tmp_path):
    """The CPU GEMV unpacks a loop's 4-bit weights before the loop, but not for the guarded rows
    left over after the 4-row steps (rows 12..15 of a 12-row weight do not exist): with the
    weights ending at an unreadable page, the call must not fault and must match numpy."""
    import subprocess
    import sys
    text = """
kernel w(A: f32[M, K], Wq: u4[K, N], s: f32[K // 4, N]) -> C: f32[M, N]:
    C = A @ dequant(Wq, s, zero=8, group=4)
"""
    _, out = build_text(text, "w.tile", "cpu")
    script = tmp_path / "call.py"
    script.write_text(GUARD_PAGE_CALL)
    r = subprocess.run([sys.executable, str(script), str(out / "libw.so")], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("name,value,message", [
    ("TILEC_GEMV", "1,2", "TILEC_GEMV='1,2': expected columns,threads,blocks,rows,blocks_per_sm"),
    ("TILEC_SPLIT_K", "512,x,2", "TILEC_SPLIT_K='512,x,2': expected blocks,min_tiles"),
    ("TILEC_DECODE_TILE", "16,16x64,256,4", "the tile is BMxBNxBK, not (16, 64)"),
    ("TILEC_GEMV_MMA", "on", "TILEC_GEMV_MMA='on': expected off (or unset)"),
    ("TILEC_GEMM_TILE", "128x128,128,3,8", "expected BMxBNxBK,threads,stages,swizzle"),
    ("TILEC_GEMM_TILE", "128x128x64,128,0,8", "stages at least 1"),
    ("TILEC_GEMM_TILE", "128x128x64,100,3,8",
     "TILEC_GEMM_TILE: threads 100 is not a multiple of the cuda warp size (32)"),
    ("TILEC_GEMM_TILE", "128x128x60,128,3,8", "TILEC_GEMM_TILE: tile K=60 is not a multiple"),
    ("TILEC_GEMM_TILE", "512x512x64,128,3,8", "TILEC_GEMM_TILE: schedule needs 384 KiB"),
    ("TILEC_GEMM_TILE", "128x128x64,96,3,8",
     "TILEC_GEMM_TILE: 96 threads (3 warps of 32) cannot tile the 128x128 accumulator"),
])
def test_a_malformed_benchmark_knob_is_a_user_error(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(TilecError) as e:
        compile_text((SAMPLES / "w4a16.tile").read_text(), "k.tile", "cuda")
    assert message in str(e.value)


def test_knobs_turn_the_variants_off(monkeypatch):
    monkeypatch.setenv("TILEC_GEMV", "off")
    monkeypatch.setenv("TILEC_SPLIT_K", "off")
    names = [k.name for k in compile_text((SAMPLES / "w4a16.tile").read_text(), "k.tile",
                                          "cuda")[2].programs[0].kernels]
    # (K % 128 == 0 is assumed: A's rows are 16-byte multiples, no variant on padded copies)
    assert names == ["w4a16_k0_m16", "w4a16_k0"]


def test_the_gemm_tile_knob_sets_the_default_tile_and_a_schedule_keeps_its_own(monkeypatch):
    """TILEC_GEMM_TILE replaces the tensor-core GEMM's default tile, threads, stages and
    rasterization panel (the decode variants keep theirs); a kernel with a schedule keeps it."""
    text = """
kernel plain(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:
    C = A @ B

kernel tuned(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:
    C = A @ B

schedule tuned:
    target cuda:
        tile M=64, N=64, K=32
"""
    monkeypatch.setenv("TILEC_GEMM_TILE", "128x256x32,256,4,16")
    progs = {p.name: p for p in compile_text(text, "k.tile", "cuda")[2].programs}

    def main(name):
        k = progs[name].kernels[-1]
        shared = {a.name: tuple(d.value for d in a.shape) for a in T.walk_stmts(k.body)
                  if isinstance(a, T.Alloc) and a.scope == "shared"}
        return k.threads, k.swizzle, sorted(shared.values())
    assert main("plain") == (256, 16, [(4, 32, 256), (4, 128, 32)])
    assert main("tuned")[1:] == (8, [(3, 32, 64), (3, 64, 32)])


def decode_weight_tiles(text: str, target: str = "cuda") -> dict:
    """{decode kernel: (values of one stage of its staged weight tile, threads)} of text's
    first kernel."""
    out = {}
    for k in compile_text(text, "k.tile", target)[2].programs[0].kernels:
        if "_m16" in k.name and not k.name.endswith("_sum"):
            b = [a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc) and a.name == "B_s"]
            out[k.name] = (b[0].shape[-1].value * b[0].shape[-2].value, k.threads)
    return out


def test_decode_tiles_hold_at_most_8_kib_of_weights_per_k_tile(monkeypatch):
    """CUDA's decode tile is narrowed until one K tile of the weights, as they are in memory, is
    at most 8 KiB, with a warp per 8 columns: 16-bit weights (transposed or not) get 32 columns
    on 4 warps, 8-bit ones 64 on 8, 4-bit ones keep 128 on 8, 32-bit ones stop at 32; the HIP
    tile already fits; TILEC_DECODE_TILE is taken as it is."""
    w4 = (SAMPLES / "w4a16.tile").read_text()
    assert set(decode_weight_tiles(LINEAR_T).values()) == {(128 * 32, 128)}
    assert set(decode_weight_tiles(w4).values()) == {(128 * 128, 256)}
    plain = "kernel p(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:\n    C = A @ B\n"
    assert set(decode_weight_tiles(plain).values()) == {(128 * 32, 128)}
    assert set(decode_weight_tiles(plain, "hip").values()) == {(32 * 128, 256)}
    int8 = SPLIT_CASES[SPLIT_IDS.index("int8")][0]
    assert set(decode_weight_tiles(int8).values()) == {(128 * 64, 256)}
    assert split_k.narrowed((16, (16, 128, 128), 256, 4), 32, 8192) == \
        (16, (16, 32, 128), 128, 4), "not below 32 columns"
    monkeypatch.setenv("TILEC_DECODE_TILE", "16,16x128x128,256,4")
    assert set(decode_weight_tiles(LINEAR_T).values()) == {(128 * 128, 256)}


W4A16_F32 = """
kernel w(A: f32[M, K], Wq: u4[K, N], scales: f32[K // 128, N]) -> C: f32[M, N]:
    assume K % 128 == 0
    C = A @ dequant(Wq, scales, zero=8, group=128)
"""


@pytest.mark.parametrize("arch", ["x86-64-v3", "native"])
def test_cpu_gemv_of_4bit_weights_with_f32_scales_runs_gemv_dequant4(arch):
    """On the CPU a GEMV of 4-bit weights with f32 activations and scales runs tilec_cpu.h's
    gemv_dequant4 (Tile IR `gemv_mma`, the scalar GEMV where N % 8 != 0), split and not, whole
    and cut column blocks, signed and unsigned, for up to 16 rows of A (one block per row; 17
    rows take the GEMM tile); the vector code of the build machine (AVX-512 tables with `native`
    where it has them, AVX2 with x86-64-v3) matches the reference."""
    _, _, m = compile_text(W4A16_F32, "w.tile", "cpu")
    gemvs = [k for p in m.programs for k in p.kernels if "_gemv" in k.name and "sum" not in k.name]
    assert gemvs and all(any(isinstance(st, T.GemvMma) for st in T.walk_stmts(k.body))
                         for k in gemvs)
    assert {str(k.when).split(" & ")[0].strip("()") for k in gemvs} == {"M <= 16"}
    opts = {"arch": (arch,)}
    for dims in (dict(M=1, N=264, K=1280), dict(M=1, N=8, K=128), dict(M=1, N=8200, K=256),
                 dict(M=1, N=301, K=640), dict(M=3, N=40, K=256), dict(M=16, N=264, K=1280),
                 dict(M=5, N=8200, K=512), dict(M=17, N=72, K=256)):
        check_text(W4A16_F32, dims, name="w.tile", options=opts)
    signed = W4A16_F32.replace("u4[", "i4[").replace("zero=8", "zero=1")
    check_text(signed, dict(M=1, N=136, K=1024), name="w.tile", options=opts)
    with_bf16 = W4A16_F32.replace("scales: f32", "scales: bf16")
    _, _, m16 = compile_text(with_bf16, "w.tile", "cpu")  # (16-bit scales: the scalar GEMV)
    assert not any(isinstance(st, T.GemvMma) for p in m16.programs for k in p.kernels
                   for st in T.walk_stmts(k.body))


CPU_GEMV_MMA = """
kernel g(A: f32[M, K], Wq: u4[K, N], s: f32[K // 128, N]) -> P: f32[M, N]:
    with grid(cdiv(N, 255), M, threads=1) as (bx, by):
        red = shared(f32, [1, 256])
        gemv_mma(red, A, Wq, s, zero=8, group=128, row=by, first=8, rows=K - 8, col0=bx * 255)
        for i, j in parallel(1, 255):
            if bx * 255 + j < N:
                P[by, bx * 255 + j] = red[0, j]
"""


@pytest.mark.parametrize("arch", ["x86-64-v3", "native"])
def test_hand_written_gemv_mma_on_the_cpu_at_odd_columns(arch):
    """A hand-written gemv_mma on the CPU: blocks that start at odd columns (value by value),
    an odd count of columns in a block, a first chunk cut; with 16-bit scales it is a located
    error (the CPU routine takes f32)."""
    for dims in (dict(M=1, K=384, N=261), dict(M=2, K=256, N=7), dict(M=1, K=1280, N=600)):
        check_text(CPU_GEMV_MMA, dims, name="g.tile", options={"arch": (arch,)})
    with pytest.raises(TilecError, match="gemv_mma\\(\\) on the CPU takes f32"):
        build_text(CPU_GEMV_MMA.replace(": f32[", ": bf16["), "g.tile", "cpu")


LINEAR = """
kernel linear(A: f32[M, K], B: f32[K, N], bias: f32[N]) -> C: f32[M, N]:
    C = relu(A @ B + bias)
"""


def test_cpu_large_grids_take_the_large_tile_while_every_thread_gets_its_blocks():
    """The CPU launcher runs the 256 x 256 tile when its grid gives each of the threads a call
    may use (`tilec_threads`, omp_get_max_threads()) at least 4 blocks, the 128-row tile below
    that: the condition is on the grid and the threads at run time, not on constant sizes."""
    (tile, per_thread) = driver.get_target("cpu").resources.gemm_large_tile
    _, _, m = compile_text(LINEAR, "k.tile", "cpu")
    prog = m.programs[0]
    large = [k for k in prog.kernels if k.name.endswith("_large")]
    assert len(large) == 1 and T.THREADS in large[0].when.symbols()
    for M, N, threads in ((1024, 1024, 1), (1024, 1024, 4), (1024, 1024, 5), (300, 1030, 1),
                          (256, 768, 1), (200, 200, 1)):
        blocks = -(-M // tile[0]) * -(-N // tile[1])
        picked = [k.name for k in interp_tile.pick_variants(prog, dict(M=M, N=N, K=64))]
        if threads == 1:  # (the interpreter's thread count)
            assert picked == (["linear_k0_large"] if blocks >= per_thread else ["linear_k0"]), \
                (M, N, picked)
        assert large[0].when.eval({T.THREADS: threads, "M": M, "N": N, "K": 64}) == \
            (blocks >= per_thread * threads)
    cpp = driver.render(driver.Source("k.tile", LINEAR), m, "cpu")["linear.cpp"]
    assert f"const int64_t {T.THREADS} = omp_get_max_threads();" in cpp
    # a schedule's `threads` is the team the condition counts
    text = LINEAR + "\nschedule linear:\n    target cpu:\n        threads 3\n"
    src, _, m = compile_text(text, "k.tile", "cpu")
    assert f"const int64_t {T.THREADS} = 3;" in driver.render(src, m, "cpu")["linear.cpp"]


@pytest.mark.parametrize("dims", [dict(M=1024, N=1024, K=40), dict(M=1000, N=1030, K=300)])
def test_cpu_large_tile_matches_the_reference(dims):
    """Whole and ragged 256 x 256 tiles, built and run (the large variant runs on machines of
    up to 4 threads for the first size, 5 for the second)."""
    check_text(LINEAR, dims)


def test_cpu_large_tile_matches_the_reference_in_the_tile_interpreter():
    """The Tile IR of the large variant at a size whose 2 x 2 grid of large tiles the
    interpreter (1 thread) picks, ragged in M, N and K."""
    dims = dict(M=300, N=270, K=70)
    _, m0, m = compile_text(LINEAR, "k.tile", "cpu")
    g, prog = m0.graphs[0], m.programs[0]
    picked = interp_tile.pick_variants(prog, dims)
    assert [k.name for k in picked] == ["linear_k0_large"]
    inputs = interp.random_inputs(g, dims, 1, False)
    got = interp_tile.run_program(picked, inputs, dims, ["C"])
    assert interp.rel_error(got["C"], interp.run_graph(g, inputs, dims)["C"]) <= \
        interp.tolerance("f32")
