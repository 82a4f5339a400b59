"""Reductions that keep the innermost axis (a column sum, a softmax over axis 0 or over a middle
axis) on GPU targets: blocks of columns whose threads split the reduced rows (the tile pass's
lower_col_reduce), their column-value layout and the allreduce that combines the threads'
partials. Checked by the Tile IR interpreter against the reference here, compiled by nvcc and
hipcc, and run on a GPU where there is one."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_text, compile_text
from test_cuda import GPU_OPTIONS, SM90, need_gpu, need_nvcc, nvcc_each, ptxas_lines, warning_lines

from tilec import driver, interp
from tilec.interp_tile import pick_slots, run_program
from tilec.ir import tile as T
from tilec.ir.layout import VecCols
from tilec.passes.rewrite import loads_in, stores_in

PROGRAMS = """
kernel col_softmax(X: f16[R, C]) -> Y: f16[R, C]:
    Y = softmax(X, axis=0)

kernel mid_stats(X: f32[A, B, C]) -> (s: f32[A, C], m: f32[A, 1, C]):
    s = sum(X, axis=1)
    m = max(X * 2.0, axis=1, keepdims=True) + mean(X, axis=1, keepdims=True)

kernel norm0(X: bf16[R, C], g: bf16[R, 1]) -> Y: bf16[R, C]:
    mu = mean(f32(X), axis=0, keepdims=True)
    xc = f32(X) - mu
    Y = xc * rsqrt(mean(xc * xc, axis=0, keepdims=True) + 1e-5) * g

kernel outer_inner(X: f32[A, B, C, D]) -> s: f32[B, D]:
    s = sum(X, axis=(0, 2))

kernel int_cols(X: i8[R, C]) -> (s: i32[C], lo: i8[C]):
    s = sum(i32(X), axis=0)
    lo = min(X, axis=0)

kernel narrow(X: f32[R, 4]) -> s: f32[4]:
    s = sum(X, axis=0)
"""

# ragged sizes (R past one sweep step of 128 rows, C past 64-column blocks), one value, few rows
SIZES = [dict(R=300, C=130, A=3, B=37, D=70), dict(R=1, C=1, A=1, B=1, D=1),
         dict(R=1000, C=9, A=2, B=200, D=8), dict(R=5, C=700, A=1, B=3, D=33)]


def kernels(text: str, target: str, options=None) -> dict:
    m0 = driver.frontend(driver.Source("cols.tile", text))
    m = driver.stage_module(m0, "tiled", target, options=options)
    return {g.name: (g, prog) for g, prog in zip(m0.graphs, m.programs)}


def picked_agree(name: str, g, prog, dims: dict, tol: float) -> dict:
    """Run the kernels the launcher picks at `dims` in the Tile IR interpreter on random inputs
    and compare each output with the reference interpreter's (relative to its largest value);
    returns the reference's outputs."""
    inputs = interp.random_inputs(g, dims, 1, False)
    ref = interp.run_graph(g, inputs, dims)
    picked = [k for parts in pick_slots(prog, dims) for k in parts]
    got = run_program(picked, inputs, dims, [p.name for p in g.outputs])
    for p in g.outputs:
        r, o = (np.asarray(x[p.name], np.float64) for x in (ref, got))
        assert np.allclose(o, r, rtol=tol, atol=tol * max(np.abs(r).max(), 1e-30)), \
            (name, p.name, dims)
    return ref


@pytest.mark.parametrize("target,options", [("cuda", SM90), ("hip", None), ("cpu", None)])
def test_column_reductions_compute_what_the_reference_does(target, options):
    for name, (g, prog) in kernels(PROGRAMS, target, options).items():
        for dims in SIZES:
            picked_agree(name, g, prog, dims, 1e-2)


def test_column_reductions_run_on_blocks_of_columns():
    """Every program but the one whose kept axis has 4 values runs one column-reduction kernel;
    reductions that read none of each other's results share a sweep over the rows (mid_stats:
    one sweep for its three), one that reads another's result takes the next (the variance
    reads the mean) except a sum of exp(x - max(x)), which follows its max in the max's sweep
    (softmax), and the full-shaped output one more."""
    sweeps = {"col_softmax": 2, "mid_stats": 1, "norm0": 3, "outer_inner": 1, "int_cols": 1}
    for name, (_g, prog) in kernels(PROGRAMS, "cuda", SM90).items():
        (k,) = prog.slots()[0][-1]  # (the plain variant; one level of reductions also splits)
        if name == "narrow":
            assert "column reduction" not in k.comment
            continue
        assert k.comment.startswith("column reduction"), name
        loops = [s for s in T.walk_stmts(k.body) if isinstance(s, T.For) and s.kind == "range"]
        assert len(loops) == sweeps[name], name


def test_column_values_take_the_column_layout_of_their_tile():
    """After the layout pass every accumulator of a column reduction holds its thread's columns
    (VecCols of the loops' vector tile), every loop that reads one is split by a tile that keeps
    them, and a loop on column values alone (an online sum's rescale, a value per column, the
    stores of the columns' results) by a tile of one row per thread: each thread runs it once,
    not once per row of the sweep's tile it holds."""
    _, _, m = compile_text(PROGRAMS + ONLINE, "cols.tile", "cuda", options=SM90)
    online = set()  # (kernels with online sums: each rescales them in its sweep and after it)
    for k in (k for p in m.programs for k in p.kernels if k.comment.startswith("column")):
        allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
        cols = {n for n, a in allocs.items() if isinstance(a.layout, VecCols)}
        assert cols, k.name
        layouts = {allocs[n].layout for n in cols}
        assert len(layouts) == 1, k.name
        rescales = 0
        for loop in (s for s in T.walk_stmts(k.body) if isinstance(s, T.For) and s.kind == "parallel"):
            assert loop.by.cols_layout() in layouts, (k.name, loop.by)
            if not any(isinstance(x, T.Load) and x.buf not in cols for x in loads_in(loop)):
                assert loop.by.groups() == 1, (k.name, loop.by)
            # (a rescale: the sums' previous maxima updated, column values alone)
            if any("_prev" in st.buf for st in stores_in(loop)):
                assert loop.by.groups() == 1, (k.name, loop.by)
                rescales += 1
        assert rescales in (0, 2), (k.name, rescales)
        if rescales:
            online.add(k.name)
    assert online == {"col_softmax_k0", "masked_softmax_k0", "mid_lse_k0"}  # (softmax, logsumexp)


@pytest.mark.nvcc
def test_column_reductions_compile_warning_free_without_spills():
    need_nvcc()
    for arch in ("sm_80", "sm_90a"):
        for f, r, _ in nvcc_each(PROGRAMS + ONLINE + TALL, "cols.tile",
                                 [f"-arch={arch}", "-c", "-Xptxas", "-v"], {"arch": (arch,)}):
            log = r.stdout + r.stderr
            assert warning_lines(log) == [], (f, arch, log)
            for kernel, (regs, spills) in ptxas_lines(log).items():
                assert spills == 0, (f, arch, kernel, regs)


@pytest.mark.hipcc
def test_column_reductions_compile_for_gfx90a(tmp_path):
    """hipcc builds them warning-free; no kernel uses scratch, and each one's LDS is tilec's
    count (the allreduce's scratch for column values included)."""
    import os
    import re
    import subprocess

    from test_hip import GFX90A, asm_kernels, hipcc, kernel_sources, need_hipcc
    need_hipcc()
    src, _, m = compile_text(PROGRAMS, "cols.tile", "hip", options=GFX90A)
    files = driver.render(src, m, "hip", GFX90A)
    driver.write_files(tmp_path, files)
    r = subprocess.run(["make", "-C", str(tmp_path), "-j2", "--no-print-directory"],
                       capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
    assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    for name in (n for n in files if n.endswith(".hip")):
        asm_path = tmp_path / (name[:-4] + ".s")
        hipcc(["-std=c++17", "-O3", "-ffp-contract=off", "--offload-arch=gfx90a",
               "--cuda-device-only", "-S", "-o", asm_path.name, name], tmp_path)
        asm = asm_kernels(asm_path.read_text())
        for k, body in kernel_sources(files[name]).items():
            lds = re.search(r"// LDS: (\d+) bytes", body)
            assert asm[k]["private"] == 0, (k, asm[k])
            assert asm[k]["lds"] == (int(lds.group(1)) if lds else 0), (k, asm[k])


# a column sum written at the tile level: each thread accumulates its columns' rows, then
# allreduce combines the threads that share a column
COLSUM_TILE = """
kernel colsum(X: f32[R, C]) -> s: f32[C]:
    with grid(cdiv(C, 32), threads=128) as (bx):
        acc = fragment(f32, [32])
        clear(acc)
        for r0 in range(cdiv(R, 64)):
            for i, j in parallel(64, 32):
                if (r0 * 64 + i < R) & (bx * 32 + j < C):
                    acc[j] = acc[j] + X[r0 * 64 + i, bx * 32 + j]
        allreduce(sum, acc)
        for i, j in parallel(64, 32):
            if (i < 1) & (bx * 32 + j < C):
                s[bx * 32 + j] = acc[j] * 0.5
"""


def test_a_tile_level_column_sum_runs_on_the_cpu():
    """`allreduce` at the tile level: the interpreter (which `tilec run` checks against) and the
    CPU target agree with the tensor-level sum."""
    for dims in (dict(R=130, C=70), dict(R=1, C=1)):
        check_text(COLSUM_TILE, dims, name="colsum.tile", target="cpu")


@pytest.mark.nvcc
def test_a_tile_level_column_sum_takes_the_column_layout():
    need_nvcc()
    _, _, m = compile_text(COLSUM_TILE, "colsum.tile", "cuda", options=SM90)
    (k,) = m.programs[0].kernels
    (acc,) = [a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc) and a.name == "acc"]
    assert isinstance(acc.layout, VecCols) and acc.layout.slots() == acc.layout.vec
    for f, r, _ in nvcc_each(COLSUM_TILE, "colsum.tile", ["-arch=sm_90", "-c"]):
        assert warning_lines(r.stdout + r.stderr) == [], f


@pytest.mark.parametrize("text,message", [
    ("""
kernel bad(X: f32[R, C]) -> s: f32[C]:
    with grid(1, threads=128) as (bx):
        acc = fragment(f32, [32])
        clear(acc)
        for j in parallel(32):
            if j < C:
                acc[j] = acc[j] + X[0, j]
        allreduce(sum, acc)
        for j in parallel(32):
            if j < C:
                s[j] = acc[j]
""", "allreduce() combines a fragment's row values"),
    ("""
kernel bad(X: f32[R, C]) -> s: f32[C]:
    with grid(1, threads=128) as (bx):
        acc = fragment(f32, [32, 2])
        clear(acc)
        allreduce(sum, acc)
""", "allreduce() combines a 1-D fragment"),
])
def test_an_allreduce_gpus_cannot_do_is_a_located_error(text, message):
    # (errors of the layout pass: GPU targets)
    from tilec.diagnostics import TilecError
    with pytest.raises(TilecError) as e:
        compile_text(text, "bad.tile", "cuda", options=SM90)
    assert message in str(e.value) and e.value.loc is not None and e.value.loc.line > 1


def test_the_column_reduction_knob(monkeypatch):
    """TILEC_COL_REDUCE sets the block (threads, rows per step) or turns column reductions
    off; a malformed value is an error naming it. A step's vectors fill at least a warp, and
    the threads never outnumber them."""
    from tilec.diagnostics import TilecError

    def block(target="cuda", options=SM90):
        (k,) = kernels(PROGRAMS, target, options)["col_softmax"][1].kernels  # (no split)
        rows = {lp.extents[0].value for lp in T.walk_stmts(k.body) if isinstance(lp, T.For)
                and lp.kind == "parallel" and any(isinstance(s, T.If) for s in lp.body)}
        assert k.comment.startswith("column") and len(rows) == 1
        return k.threads, rows.pop()
    assert block() == (512, 256) and block("cpu", None) == (1, 4)
    monkeypatch.setenv("TILEC_COL_REDUCE", "128,32")
    assert block() == (128, 32)
    monkeypatch.setenv("TILEC_COL_REDUCE", "128,2")  # (16 vectors a step: 4 rows for a warp)
    assert block() == (32, 4) and block("cpu", None) == (1, 2)
    monkeypatch.setenv("TILEC_COL_REDUCE", "0")
    (k,) = kernels(PROGRAMS, "cuda", SM90)["col_softmax"][1].kernels
    assert not k.comment.startswith("column")
    for bad in ("100,3", "2000,4"):
        monkeypatch.setenv("TILEC_COL_REDUCE", bad)
        with pytest.raises(TilecError, match="TILEC_COL_REDUCE"):
            kernels(PROGRAMS, "cuda", SM90)


# online sums of exp(x - max(x)): leading rows of -inf in odd columns (a thread's running max
# -inf, then finite), a scale that makes the max grow often, a bf16 logsumexp over a middle axis
ONLINE = """
kernel masked_softmax(X: f32[R, C]) -> (Y: f32[R, C], l: f32[1, C]):
    Z = where((index(X, 0) < 40) & (index(X, 1) % 2 == 1), -inf, X * 4.0)
    Y = softmax(Z, axis=0)
    l = logsumexp(Z, axis=0, keepdims=True)

kernel mid_lse(X: bf16[A, B, C]) -> l: f32[A, C]:
    l = logsumexp(f32(X), axis=1)
"""
ONLINE_SIZES = [dict(R=300, C=130, A=3, B=300), dict(R=1000, C=9, A=2, B=41),
                dict(R=41, C=700, A=1, B=2000)]


@pytest.mark.parametrize("target,options", [("cuda", SM90), ("hip", None), ("cpu", None)])
def test_online_column_sums_follow_their_max(target, options):
    """A column sum of exp(x - max(x)) shares its max's sweep: rescaled where the max grows (a
    thread's partials, then the threads' combined), so the reductions read the rows once; the
    Tile IR interpreter agrees with the reference where leading rows are -inf."""
    for name, (g, prog) in kernels(ONLINE, target, options).items():
        k = prog.slots()[0][-1][0]
        loops = [s for s in T.walk_stmts(k.body) if isinstance(s, T.For) and s.kind == "range"]
        assert k.comment.startswith("column") and len(loops) == (2 if name == "masked_softmax" else 1)
        for dims in ONLINE_SIZES:
            ref = picked_agree(name, g, prog, dims, 1e-5)
            assert all(np.isfinite(v).all() for v in ref.values()), (name, dims)


# tall reductions: few columns, many rows (a split of the rows over blocks pays)
TALL = """
kernel stats(X: f32[R, C]) -> (mu: f32[C], mx: f32[1, C]):
    mu = mean(X, axis=0)
    mx = max(X, axis=0, keepdims=True) + mean(X * X, axis=0, keepdims=True)

kernel bn(X: f16[N, P, C]) -> s: f32[C]:
    s = sum(f32(X), axis=(0, 1))

kernel imin(X: i8[R, C]) -> (lo: i8[C], s: i32[C]):
    lo = min(X, axis=0)
    s = sum(i32(X), axis=0)
"""
TALL_SIZES = [dict(R=5000, C=70, N=50, P=100), dict(R=3000, C=300, N=7, P=400)]


@pytest.mark.parametrize("target,options", [("cuda", SM90), ("hip", None), ("cpu", None)])
def test_tall_column_reductions_split_their_rows(target, options):
    """Where the columns give fewer blocks than the target's goal and the rows are many, the
    rows are split over blocks: `_split` writes each slice's partials (a workspace per
    reduction, needed by that variant alone), `_split_combine` combines them in slice order and
    computes the outputs; the Tile IR interpreter picks it at these sizes and agrees with the
    reference. Programs with full-shaped outputs or a reduction of another's result keep one
    kernel (the combined values are needed before the next sweep)."""
    for name, (g, prog) in kernels(TALL, target, options).items():
        (split, plain) = prog.slots()[0]
        assert [k.name for k in split] == [f"{name}_k0_split", f"{name}_k0_split_combine"]
        assert [k.name for k in plain] == [f"{name}_k0"]
        assert {p.name for p in prog.workspaces} == \
            {p.name for p in split[0].params if p.kind == "workspace"} and \
            all(p.when is not None for p in prog.workspaces)
        for dims in TALL_SIZES:
            picked = [k for parts in pick_slots(prog, dims) for k in parts]
            assert picked == list(split), (name, dims)
            picked_agree(name, g, prog, dims, 1e-4)
        small = dict(R=100, C=70, N=2, P=10)
        assert [k.name for parts in pick_slots(prog, small) for k in parts] == [f"{name}_k0"]
    for name in ("col_softmax", "norm0"):
        assert len(kernels(PROGRAMS, target, options)[name][1].slots()[0]) == 1, name


# each program set built and run against the reference: (the text, sizes on the CPU, on GPUs)
# (ragged sizes; on GPUs a larger one too: several sweep steps, many blocks)
BUILT = {
    "cols": (PROGRAMS, SIZES[:3], SIZES + [dict(R=2048, C=2100, A=2, B=40, D=136)]),
    "online": (ONLINE, ONLINE_SIZES[:2], ONLINE_SIZES + [dict(R=4100, C=2100, A=2, B=3000)]),
    "tall": (TALL, TALL_SIZES[:1], TALL_SIZES + [dict(R=100, C=70, N=2, P=10)]),
}


@pytest.mark.parametrize("name", list(BUILT))
def test_column_programs_on_the_cpu(name):
    """The CPU's column reductions (blocks of 512 bytes of each row, a SIMD loop over the
    columns) built by g++ and run against the reference."""
    text, sizes, _ = BUILT[name]
    for dims in sizes:
        check_text(text, dims, name=f"{name}.tile", target="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BUILT))
def test_column_programs_on_gpu(name):
    need_gpu()
    text, _, sizes = BUILT[name]
    for dims in sizes:
        check_text(text, dims, name=f"{name}.tile", target="cuda", options=GPU_OPTIONS)


ALLREDUCE_HEAD = """
kernel bad(X: f32[R, C]) -> s: f32[C]:
    with grid(1, threads=128) as (bx):
        acc = fragment(f32, [32])
        clear(acc)
"""


@pytest.mark.parametrize("line,message", [
    ("        allreduce(mean, acc)", "the reduction is sum, max or min"),
    ("        allreduce(sum)", "allreduce() takes an operation (sum, max, min) and a fragment"),
    ("        allreduce(sum, acc, axis=0)", "allreduce() takes an operation"),
    ("        allreduce(sum, X)", "'X' is a tensor in memory, not a tile buffer"),
    ("        for i, j in parallel(2, 32):\n            allreduce(sum, acc)",
     "allreduce() works on whole tiles: it runs at block level"),
])
def test_a_malformed_allreduce_is_a_located_error(line, message):
    """allreduce() at the tile level: its operation, its operand, and where it may stand, each
    an error at the statement on every target."""
    from tilec.diagnostics import TilecError
    for target in ("cpu", "cuda"):
        with pytest.raises(TilecError) as e:
            compile_text(ALLREDUCE_HEAD + line + "\n", "bad.tile", target)
        assert message in str(e.value) and e.value.loc is not None and e.value.loc.line >= 6, \
            (target, str(e.value))
