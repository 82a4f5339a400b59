"""Tile-level kernels: `dump-ir --stage tiled` parses back to the same Tile IR, the library built
from a dump gives the same results as the one built from the source, the Tile IR interpreter
agrees with the Graph IR interpreter on every tensor-level program's tiling, and the hand-written
kernels of samples/tile/ pass against the interpreter.

Round trips and interpreter checks run in-process for the samples, the random-program generator
and the regression programs, for the cpu and cuda targets' tilings (no compiler needed); builds
use g++ (and nvcc, marked)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import SAMPLES, build_text, check_text
from random_programs import random_program
from test_random_programs import REGRESSIONS

from tilec import driver, interp
from tilec.diagnostics import TilecError
from tilec.interp_tile import pick_slots, pick_variants, run_program
from tilec.ir.tile import print_kernel
from tilec.runner import call_library, choose_dims
from tilec.targets.abi import library_name

SAMPLE_FILES = sorted(SAMPLES.glob("*.tile"))
TILE_SAMPLES = sorted((SAMPLES / "tile").glob("*.tile"))
TARGETS = ["cpu", "cuda"]
RANDOM_SEEDS = range(40)


def tiled(text: str, target: str, name: str = "test.tile"):
    """(parsed module, module after the tile pass) of .tile source text."""
    m0 = driver.frontend(driver.Source(name, text))
    return m0, driver.stage_module(m0, "tiled", target, verify=True)


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.strip() and
                     not line.lstrip().startswith("#"))


def round_trip(text: str, target: str, name: str = "test.tile"):
    """Dump the tiled stage, parse it back, and check every kernel is the same Tile IR (and
    prints the same). Returns (source module, tiled module, module parsed from the dump)."""
    m0, m = tiled(text, target, name)
    dump = driver.print_stage(m, "tiled")
    back = driver.frontend(driver.Source("dump.tile", dump))
    kernels = [k for p in m.programs for k in p.kernels]
    assert [g.name for g in back.graphs] == [k.name for k in kernels]
    for g, k in zip(back.graphs, kernels):
        assert g.tile is not None, f"{g.name} did not parse as a tile-level kernel"
        assert print_kernel(g.tile) == without_comments(print_kernel(k))
        # a workspace the kernel writes reads back as one of its outputs
        params = tuple(replace(p, kind="output", when=None) if p.kind == "workspace" else p
                       for p in k.params)
        # (a warp-specialized, persistent kernel, or blocks started longest first, are the tile
        # pass's decisions: its dump reads back as the plain kernel, the decisions in comments)
        assert g.tile == replace(k, params=params, comment="", when=None, slot=0, part=0,
                                 capacities=(), blocks_per_sm=1, warp_specialize=0,
                                 persistent=False, pingpong=False, cluster=1, aligned=(),
                                 longest_first=False, padded=(), transposed=(),
                                 register_stores=False)
    # and the parsed kernel goes through the tile pass unchanged (but for its device name)
    again = driver.stage_module(back, "tiled", target, verify=True)
    for p, k in zip(again.programs, kernels):
        (k2,) = p.kernels
        assert without_comments(print_kernel(replace(k2, name=k.name))) == \
            without_comments(print_kernel(k))
    return m0, m, back


def in_shape_of(got, want):
    """`got` in `want`'s shape where they have as many elements: a kernel of merged rows
    (passes/merge_rows.py) writes the program's output in its own shape, [B * S, N] for
    [B, S, N], the same memory."""
    return got.reshape(want.shape) if got.size == want.size else got


def agree(text: str, target: str, dims: dict | None = None, seed: int = 0, full_ints=False,
          inner: int | None = None):
    """Run every kernel's Tile IR (each launch variant in turn) with the Tile IR interpreter and
    compare with the Graph IR interpreter (dims not given: choose_dims's, `inner` for the last
    two axes' symbols)."""
    m0, m = tiled(text, target)
    for g, prog in zip(m0.graphs, m.programs):
        d = choose_dims(g, {k: v for k, v in (dims or {}).items() if k in g.symbols}, inner)
        inputs = interp.random_inputs(g, d, seed, full_ints)
        ref = interp.run_graph(g, inputs, d)
        picked = pick_slots(prog, d)
        runs = [picked]
        for slot, variants in enumerate(prog.slots()):
            runs += [picked[:slot] + [v] + picked[slot + 1:] for v in variants if v not in picked]
        for chosen in runs:
            kernels = [k for parts in chosen for k in parts]
            got = run_program(kernels, inputs, d, [p.name for p in g.outputs])
            for p in g.outputs:
                err = interp.rel_error(in_shape_of(got[p.name], ref[p.name]), ref[p.name])
                assert err <= interp.tolerance(p.type.dtype), (
                    f"{g.name}.{p.name} ({', '.join(k.name for k in kernels)}) dims={d}: "
                    f"max rel error {err:.3e}")


# ---- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", SAMPLE_FILES + TILE_SAMPLES, ids=lambda p: p.stem)
def test_sample_dump_parses_back_to_the_same_tile_ir(path, target):
    round_trip(path.read_text(), target, path.name)


@pytest.mark.parametrize("target", TARGETS)
def test_random_program_dumps_parse_back(target):
    for seed in RANDOM_SEEDS:
        prog = random_program(seed, fp8=target == "cpu")
        try:
            round_trip(prog.text, target)
        except AssertionError as e:
            raise AssertionError(f"random program {seed}:\n{prog.text}\n{e}") from None


@pytest.mark.parametrize("target", TARGETS)
def test_regression_program_dumps_parse_back(target):
    for name, (text, *_rest) in REGRESSIONS.items():
        try:
            round_trip(text.replace("target cpu:", f"target {target}:"), target)
        except AssertionError as e:
            raise AssertionError(f"regression {name}: {e}") from None


# ---- the Tile IR interpreter -----------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_sample_tile_ir_agrees_with_graph_ir(path, target):
    # 67: two 64-wide tiles, the second ragged, and one ragged tile of 128 or 256 (as 100 gave,
    # at a third of the interpreter's work: a 100^3 GEMM's variants took 25 s)
    agree(path.read_text(), target, seed=hash(path.stem) & 0xFFFF, inner=67)


@pytest.mark.parametrize("target", TARGETS)
def test_random_program_tile_ir_agrees_with_graph_ir(target):
    for seed in RANDOM_SEEDS:
        prog = random_program(seed, fp8=target == "cpu")
        try:
            agree(prog.text, target, prog.dims, seed)
        except AssertionError as e:
            raise AssertionError(f"random program {seed} dims={prog.dims}:\n{prog.text}\n{e}") \
                from None


def test_interpreter_reports_unwritten_output_elements():
    text = """
kernel left_half(X: f32[N, N]) -> Y: f32[N, N]:
    with grid(cdiv(N, 16), threads=1) as (bx):
        for i, j in parallel(16, 8):
            if (bx * 16 + i < N) & (j < N):
                Y[bx * 16 + i, j] = X[bx * 16 + i, j]
"""
    (g,) = driver.frontend(driver.Source("left_half.tile", text)).graphs
    x = np.ones((8, 8))
    assert interp.run_graph(g, {"X": x}, {"N": 8})["Y"].tolist() == x.tolist()
    with pytest.raises(Exception, match=r"no block writes element \[0, 8\] of output 'Y'"):
        interp.run_graph(g, {"X": np.ones((9, 9))}, {"N": 9})


def test_interpreter_reports_reads_outside_a_tensor():
    text = """
kernel shift(X: f32[N]) -> Y: f32[N]:
    with grid(1, threads=1) as (bx):
        for i in parallel(N):
            Y[i] = X[i + 1]
"""
    (g,) = driver.frontend(driver.Source("shift.tile", text)).graphs
    with pytest.raises(Exception, match=r"reads X\[4\] outside its shape \[4\]"):
        interp.run_graph(g, {"X": np.ones(4)}, {"N": 4})


def test_a_fill_with_minus_zero_survives_the_dump():
    """`fill(F, -0.0)` once printed as `clear(F)` (0.0 == -0.0), which fills +0.0: the dump
    read back divided by the wrong zero."""
    text = """
kernel z(X: f32[N]) -> Y: f32[N]:
    with grid(1, threads=32) as (bx):
        F = fragment(f32, [1])
        fill(F, -0.0)
        for i in parallel(N):
            Y[i] = (abs(X[i]) + 1.0) / F[0]
"""
    for target in TARGETS:
        _, m, _ = round_trip(text, target)
        assert "fill(F, -0.0)" in driver.print_stage(m, "tiled")
    r = check_text(text, {"N": 5})
    assert r["z"].errors["Y"] == 0.0


def test_interpreter_stops_at_exp_nonpos_of_an_argument_above_44():
    """exp_nonpos is exp only up to 44: the reference stops at a larger argument (of the
    iterations that run: the masked-off ones do not count) and computes exp below."""
    text = """
kernel e(X: f32[N]) -> Y: f32[N]:
    with grid(1, threads=1) as (bx):
        for i in parallel(N):
            if i < 3:
                Y[i] = exp_nonpos(X[i])
            else:
                Y[i] = X[i]
"""
    (g,) = driver.frontend(driver.Source("e.tile", text)).graphs
    x = np.array([-1.0, 0.0, 44.0, 300.0])
    assert np.allclose(interp.run_graph(g, {"X": x}, {"N": 4})["Y"], [np.exp(-1), 1, np.exp(44), 300])
    x[1] = 45.0
    with pytest.raises(Exception, match=r"exp_nonpos of 45: above 44"):
        interp.run_graph(g, {"X": x}, {"N": 4})


def test_run_reports_a_store_outside_an_output_before_the_built_kernel_runs(tmp_path, monkeypatch):
    """A guard that lets a store past the output's edge: `tilec run` stops with an error at the
    store (from the reference, which runs first), and never calls the built kernel, which would
    write past the output's buffer."""
    from click.testing import CliRunner

    from tilec import runner
    from tilec.cli import main

    path = tmp_path / "edge.tile"
    path.write_text("""
kernel edge(X: f32[M, N]) -> Y: f32[M, N]:
    with grid(cdiv(N, 16), M, threads=16) as (bx, by):
        for j in parallel(16):
            if bx * 16 + j < N + 3:
                Y[by, bx * 16 + j] = X[by, bx * 16 + j] * 2.0
""")

    def ran(*a, **k):
        raise AssertionError("the built kernel was called")
    monkeypatch.setattr(runner, "_Call", ran)
    r = CliRunner().invoke(main, ["run", str(path), "--dims", "M=3,N=20", "-o",
                                  str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert "edge.tile:6:17: error: edge: reads X[0, 20] outside its shape [3, 20]" in r.output
    assert "Y[by, bx * 16 + j] = X[by, bx * 16 + j] * 2.0" in r.output


def test_interpreter_reports_elements_that_hold_no_value():
    """A buffer element nothing wrote, read directly or through a gemm that used it, is an error
    at the read (the built kernel would read whatever the memory held)."""
    text = """
kernel part(A: f32[M, 16], B: f32[16, 16]) -> C: f32[M, 16]:
    with grid(cdiv(M, 16), threads=32) as (bx):
        A_s = shared(f32, [16, 16])
        B_s = shared(f32, [16, 16])
        acc = fragment(f32, [16, 16])
        copy(B[0, 0], B_s)
        for i, j in parallel(ROWS, 16):
            A_s[i, j] = A[bx * 16 + i, j]
        clear(acc)
        gemm(A_s, B_s, acc)
        for i, j in parallel(16, 16):
            if bx * 16 + i < M:
                C[bx * 16 + i, j] = acc[i, j]
"""
    for rows, ok in ((16, True), (12, False)):
        (g,) = driver.frontend(driver.Source("part.tile", text.replace("ROWS", str(rows)))).graphs
        a, b = np.random.default_rng(0).random((32, 16)), np.random.default_rng(1).random((16, 16))
        if ok:
            got = interp.run_graph(g, {"A": a, "B": b}, {"M": 32})["C"]
            assert np.allclose(got, a @ b, rtol=1e-6)
            continue
        with pytest.raises(TilecError, match=r"reads acc\[12, 0\], which holds no value") as e:
            interp.run_graph(g, {"A": a, "B": b}, {"M": 32})
        assert e.value.loc.line == 14  # the store that reads acc
    # a copy out of a tile reads each element (at the copy)
    half = text.replace("ROWS", "16").replace(
        "        for i, j in parallel(16, 16):\n            if bx * 16 + i < M:\n"
        "                C[bx * 16 + i, j] = acc[i, j]\n", "        copy(A_s, C[bx * 16, 0])\n")
    half = half.replace("        for i, j in parallel(16, 16):\n            A_s[i, j]",
                        "        for i, j in parallel(16, 8):\n            A_s[i, j]")
    (g,) = driver.frontend(driver.Source("part.tile", half)).graphs
    with pytest.raises(TilecError, match=r"reads A_s\[0, 8\], which holds no value") as e:
        interp.run_graph(g, {"A": a, "B": b}, {"M": 32})
    assert (e.value.loc.line, e.value.loc.col) == (12, 9)


def test_interpreter_runs_no_iterations_of_a_negative_extent():
    """An extent that is negative at run time runs no iterations, as the targets' loops do."""
    text = """
kernel tail(X: f32[N]) -> Y: f32[N]:
    with grid(1, threads=64) as (bx):
        for j in parallel(N):
            Y[j] = X[j]
        for j in parallel(N - 5):
            Y[j + 5] = X[j] * 2.0
"""
    (g,) = driver.frontend(driver.Source("tail.tile", text)).graphs
    x = np.arange(1.0, 8.0)
    assert interp.run_graph(g, {"X": x[:3]}, {"N": 3})["Y"].tolist() == [1.0, 2.0, 3.0]
    assert interp.run_graph(g, {"X": x}, {"N": 7})["Y"].tolist() == [1, 2, 3, 4, 5, 2, 4]


def test_interpreter_reports_an_element_two_blocks_write_with_different_values():
    """Blocks run in any order: two blocks that write one element with different values make
    the result depend on it (an error, with both blocks); the same value is fine."""
    text = """
kernel fold(X: f32[N]) -> Y: f32[16]:
    with grid(cdiv(N, 16), threads=16) as (bx):
        for j in parallel(16):
            Y[j] = VALUE
"""
    x = np.arange(40.0)
    (g,) = driver.frontend(driver.Source("fold.tile", text.replace("VALUE", "X[j] * 2.0"))).graphs
    assert interp.run_graph(g, {"X": x}, {"N": 40})["Y"].tolist() == (x[:16] * 2).tolist()
    (g,) = driver.frontend(driver.Source("fold.tile", text.replace(
        "VALUE", "X[min(bx * 16 + j, N - 1)]"))).graphs
    with pytest.raises(TilecError, match=r"writes Y\[0\], which block bx=0 also wrote, with "
                                         r"another value: blocks run in any order \(in block "
                                         r"bx=1\)") as e:
        interp.run_graph(g, {"X": x}, {"N": 40})
    assert e.value.loc.line == 5


def test_interpreter_reports_a_copy_window_that_starts_before_its_tensor():
    """A window may run past a tensor's end (zeros there), not start before it: the targets
    would read before the tensor."""
    text = """
kernel shifted(X: f32[N, 16]) -> Y: f32[N, 16]:
    with grid(cdiv(N, 16), threads=16) as (bx):
        t = shared(f32, [16, 16])
        copy(X[bx * 16 + SHIFT, 0], t)
        for i, j in parallel(16, 16):
            if bx * 16 + i < N:
                Y[bx * 16 + i, j] = t[i, j]
"""
    x = np.arange(20.0 * 16).reshape(20, 16)
    (g,) = driver.frontend(driver.Source("s.tile", text.replace("SHIFT", "4"))).graphs
    want = np.vstack([x[4:], np.zeros((4, 16))])
    assert interp.run_graph(g, {"X": x}, {"N": 20})["Y"].tolist() == want.tolist()
    (g,) = driver.frontend(driver.Source("s.tile", text.replace("SHIFT", "-1"))).graphs
    with pytest.raises(TilecError, match=r"copy window of 'X' starts at \[-1, 0\], before the "
                                         r"tensor's first row") as e:
        interp.run_graph(g, {"X": x}, {"N": 20})
    assert (e.value.loc.line, e.value.loc.col) == (5, 9)


def test_reduce_converts_each_element_to_the_destination_dtype():
    """reduce() converts each element to dst's dtype and combines in it: an f32 tile summed into
    i32 is the sum of its rounded elements (not the rounded sum), into u8 it wraps; the built
    kernels agree with the reference."""
    text = """
kernel rowsums(X: f32[M, 16]) -> (S: i32[M], W: u8[M], F: f32[M]):
    with grid(cdiv(M, 4), threads=64) as (bx):
        t = shared(f32, [4, 16])
        si = fragment(i32, [4])
        su = fragment(u8, [4])
        sf = fragment(f32, [4])
        copy(X[bx * 4, 0], t)
        reduce(sum, t, si)
        reduce(sum, t, su)
        reduce(sum, t, sf)
        for i in parallel(4):
            if bx * 4 + i < M:
                S[bx * 4 + i] = si[i]
                W[bx * 4 + i] = su[i]
                F[bx * 4 + i] = sf[i]
"""
    (g,) = driver.frontend(driver.Source("r.tile", text)).graphs
    x = np.full((5, 16), 0.6) + np.arange(5)[:, None] * 10.0
    got = interp.run_graph(g, {"X": x}, {"M": 5})
    assert got["S"].tolist() == [16 * round(v) for v in x[:, 0]]
    assert got["W"].tolist() == [16 * round(v) % 256 for v in x[:, 0]]
    assert np.allclose(got["F"], x.sum(axis=1))
    assert check_text(text, dict(M=7))


def test_interpreter_prints_no_numpy_warnings(recwarn):
    """inf and NaN the program computes are its results: the reference does not warn about them
    (numpy's RuntimeWarnings reached `tilec run`'s output)."""
    text = """
kernel blow(A: f32[16, 16], B: f32[16, 16]) -> C: f32[16, 16]:
    with grid(1, threads=32) as (bx):
        A_s = shared(f32, [16, 16])
        B_s = shared(f32, [16, 16])
        acc = fragment(f32, [16, 16])
        copy(A[0, 0], A_s)
        copy(B[0, 0], B_s)
        clear(acc)
        gemm(A_s, B_s, acc)
        for i, j in parallel(16, 16):
            C[i, j] = acc[i, j] / (acc[i, j] - acc[i, j])
"""
    (g,) = driver.frontend(driver.Source("blow.tile", text)).graphs
    a = np.full((16, 16), np.inf)
    a[0, 0] = -np.inf
    out = interp.run_graph(g, {"A": a, "B": np.ones((16, 16))}, {})["C"]
    assert np.isnan(out).all()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_cdiv_rounds_up_for_any_signs_and_gives_0_for_a_zero_divisor():
    """cdiv(a, b) is -(-a // b) with floor division, 0 when b is 0 (as integer division by zero
    is): the built kernel agrees with the reference where a is negative and b is 0 at run time
    (the CPU's truncating (a + b - 1) / b differed, and divided by zero); a constant zero divisor
    is an error at it."""
    text = """
kernel cd(X: f32[N], Z: f32[M]) -> Y: i64[N]:
    with grid(cdiv(N, 64), threads=64) as (bx):
        for j in parallel(64):
            if bx * 64 + j < N:
                Y[bx * 64 + j] = cdiv(bx * 64 + j - 7, 4) * 1000 + cdiv(7 - j, M - 3) * 10
"""
    (g,) = driver.frontend(driver.Source("cd.tile", text)).graphs
    y = interp.run_graph(g, {"X": np.zeros(9), "Z": np.zeros(5)}, {"N": 9, "M": 5})["Y"]
    assert y.tolist() == [-(-(j - 7) // 4) * 1000 + -(-(7 - j) // 2) * 10 for j in range(9)]
    for dims in (dict(N=9, M=5), dict(N=9, M=3), dict(N=70, M=1)):
        assert check_text(text, dims)
    with pytest.raises(TilecError, match="division by zero") as e:
        driver.frontend(driver.Source("cd.tile", text.replace("M - 3", "0")))
    assert (e.value.loc.line, e.value.loc.col) == (6, 80)


def test_interpreter_where_reads_only_the_chosen_side():
    text = """
kernel guarded(X: f32[N]) -> Y: f32[N]:
    with grid(1, threads=1) as (bx):
        for i in parallel(N):
            Y[i] = where(i + 1 < N, X[i + 1], 0.0)
"""
    (g,) = driver.frontend(driver.Source("guarded.tile", text)).graphs
    x = np.arange(1.0, 5.0)
    assert interp.run_graph(g, {"X": x}, {"N": 4})["Y"].tolist() == [2.0, 3.0, 4.0, 0.0]


def test_fma_is_a_product_accumulation_rounded_once_and_takes_floats_only():
    """`fma(a, b, c)` at the tile level: a * b + c rounded once (the interpreter computes it in
    f64 and rounds to f32, so a case where rounding a * b first loses the answer shows it), and
    an integer fma is an error at its call."""
    text = """
kernel madd(X: f32[N], Y: f32[N], Z: f32[N]) -> W: f32[N]:
    with grid(1, threads=1) as (bx):
        for i in parallel(N):
            W[i] = fma(X[i], Y[i], Z[i])
"""
    (g,) = driver.frontend(driver.Source("madd.tile", text)).graphs
    x = np.float32(1 + 2.0 ** -12)
    # x * x = 1 + 2^-11 + 2^-24: rounded first it is 1 + 2^-11, and minus that leaves 0
    got = interp.run_graph(g, {"X": np.array([x]), "Y": np.array([x]),
                               "Z": np.array([-(1 + 2.0 ** -11)], np.float32)}, {"N": 1})["W"]
    assert got.tolist() == [2.0 ** -24]
    bad = text.replace("f32", "i32")
    with pytest.raises(TilecError, match="fma\\(\\) takes float operands"):
        driver.frontend(driver.Source("madd.tile", bad))


GEMV_MMA = """
kernel g(A: bf16[M, K], Wq: u4[K, N], s: bf16[K // 128, N]) -> P: f32[M, N]:
    with grid(cdiv(N, 256), M, threads=256) as (bx, by):
        red = shared(f32, [8, 256])
        gemv_mma(red, A, Wq, s, zero=8, group=128, row=by, first=8, rows=K - 8, col0=bx * 256)
        for i, j in parallel(1, 256):
            if bx * 256 + j < N:
                P[by, bx * 256 + j] = (red[0, j] + red[1, j] + red[2, j] + red[3, j] +
                                       red[4, j] + red[5, j] + red[6, j] + red[7, j])
"""


def test_gemv_mma_reads_back_and_checks_its_operands():
    """`gemv_mma(...)` (what the CUDA tiling of a 4-bit GEMV holds) parses at the tile level and
    the interpreter computes the GEMV with it (rows from 8: a first chunk cut, and a block's
    columns cut at N); misuse gets located errors."""
    (g,) = driver.frontend(driver.Source("g.tile", GEMV_MMA)).graphs
    rng = np.random.default_rng(3)
    M, K, N = 1, 128 * 3, 264
    a = rng.standard_normal((M, K)).astype(np.float32)
    q = rng.integers(0, 16, (K, N))
    sc = rng.standard_normal((K // 128, N)).astype(np.float32) * 0.1
    a, sc = interp.quantize(a, "bf16"), interp.quantize(sc, "bf16")
    got = interp.run_graph(g, {"A": a, "Wq": q, "s": sc}, {"M": M, "K": K, "N": N})["P"]
    w = interp.quantize((q - 8.0) * np.repeat(sc, 128, axis=0), "bf16")
    want = a[:, 8:].astype(np.float64) @ w[8:]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4) and not np.allclose(got, a @ w, atol=1e-4)
    bad = {"group=128": "group=24", "red = shared(f32": "red = fragment(f32",
           "zero=8, ": "", "col0=bx * 256)": "col0=bx * 256, k=1)"}
    for old, new in bad.items():
        with pytest.raises(TilecError, match="gemv_mma"):
            driver.frontend(driver.Source("g.tile", GEMV_MMA.replace(old, new)))


GEMV_MMA_ROWS = """
kernel gr(A: bf16[M, K], Wq: u4[K, N], s: bf16[K // 128, N]) -> P: f32[M, N]:
    with grid(cdiv(N, 64), cdiv(M, 8), threads=128) as (bx, by):
        red = shared(f32, [32, 64])
        gemv_mma(red, A, Wq, s, zero=8, group=128, row=by * 8, first=16, rows=K - 16,
                 col0=bx * 64, m=min(8, M - by * 8), mr=8)
        for i, j in parallel(8, 64):
            if (by * 8 + i < M) & (bx * 64 + j < N):
                P[by * 8 + i, bx * 64 + j] = red[i, j] + red[8 + i, j] + red[16 + i, j] + red[24 + i, j]
"""


def test_gemv_mma_of_several_rows_of_a():
    """`gemv_mma(..., m=.., mr=..)`: the partial sums of m rows of A at once, mr rows per warp in
    the buffer (a last block of rows cut by M: m = 3 of 8), rows from 16; misuse names it."""
    (g,) = driver.frontend(driver.Source("gr.tile", GEMV_MMA_ROWS)).graphs
    rng = np.random.default_rng(5)
    M, K, N = 11, 128 * 3, 100
    a = interp.quantize(rng.standard_normal((M, K)).astype(np.float32), "bf16")
    q = rng.integers(0, 16, (K, N))
    sc = interp.quantize(rng.standard_normal((K // 128, N)).astype(np.float32) * 0.1, "bf16")
    got = interp.run_graph(g, {"A": a, "Wq": q, "s": sc}, {"M": M, "K": K, "N": N})["P"]
    w = interp.quantize((q - 8.0) * np.repeat(sc, 128, axis=0), "bf16")
    want = a[:, 16:].astype(np.float64) @ w[16:]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4) and not np.allclose(got, a @ w, atol=1e-4)
    bad = [("mr=8)", "mr=17)", r"takes mr= from 2 to 16 rows of A .one row: neither m= nor mr=., "
            "not 17"),
           ("mr=8)", "mr=1)", "takes mr= from 2 to 16 rows of A .* not 1$"),
           (", mr=8)", ")", r"takes m= \(A's rows\) with mr="),
           ("[32, 64]", "[30, 64]", "its 30 rows are no multiple of that")]
    for old, new, msg in bad:
        with pytest.raises(TilecError, match=r"gemv_mma\(\)" + ".*" + msg):
            driver.frontend(driver.Source("gr.tile", GEMV_MMA_ROWS.replace(old, new)))


GEMV_MMA_KMAJOR = """
kernel gk(A: bf16[M, K], Wq: u4[N, K], s: bf16[N, K // 128]) -> P: f32[M, N]:
    with grid(cdiv(N, 32), M, threads=256) as (bx, by):
        red = shared(f32, [8, 32])
        gemv_mma_kmajor(red, A, Wq, s, zero=8, group=128, row=by, first=32, rows=K - 32, col0=bx * 32)
        for i, j in parallel(1, 32):
            if bx * 32 + j < N:
                P[by, bx * 32 + j] = (red[0, j] + red[1, j] + red[2, j] + red[3, j] +
                                      red[4, j] + red[5, j] + red[6, j] + red[7, j])
"""


def test_gemv_mma_kmajor_reads_its_weights_packed_along_k():
    """`gemv_mma_kmajor(...)`: the same sums of weights stored [N, K] with scales [N, K / G]
    (rows from 32, columns cut at N); its misuse names it; the CPU refuses it with a message."""
    (g,) = driver.frontend(driver.Source("gk.tile", GEMV_MMA_KMAJOR)).graphs
    rng = np.random.default_rng(4)
    M, K, N = 1, 128 * 3, 40
    a = interp.quantize(rng.standard_normal((M, K)).astype(np.float32), "bf16")
    q = rng.integers(0, 16, (N, K))
    sc = interp.quantize(rng.standard_normal((N, K // 128)).astype(np.float32) * 0.1, "bf16")
    got = interp.run_graph(g, {"A": a, "Wq": q, "s": sc}, {"M": M, "K": K, "N": N})["P"]
    w = interp.quantize((q.T - 8.0) * np.repeat(sc.T, 128, axis=0), "bf16")
    want = a[:, 32:].astype(np.float64) @ w[32:]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4) and not np.allclose(got, a @ w, atol=1e-4)
    with pytest.raises(TilecError, match=r"gemv_mma_kmajor\(\)'s group is a multiple of 16"):
        driver.frontend(driver.Source("gk.tile", GEMV_MMA_KMAJOR.replace("group=128", "group=24")))
    from conftest import compile_text
    src, _, m = compile_text(GEMV_MMA_KMAJOR, "gk.tile", "cpu")
    with pytest.raises(TilecError, match="gemv_mma_kmajor\\(\\) runs on CUDA only") as err:
        driver.render(src, m, "cpu", {})
    assert err.value.format("gk.tile", GEMV_MMA_KMAJOR).startswith("gk.tile:3:")


@pytest.mark.nvcc
def test_hand_written_gemv_mma_builds_for_cuda():
    """A hand-written gemv_mma builds for CUDA: the device function also takes a column count
    that is no multiple of 8 (value by value; the tile pass guards its own uses)."""
    from test_cuda import need_nvcc
    need_nvcc()
    _, out = build_text(GEMV_MMA, "g.tile", "cuda", {"arch": ("sm_80",)})
    assert (out / "libg.so").exists()
    assert "if (N % 8 != 0) {" in (out / "tilec_cuda.h").read_text()


def test_gemv_mma_with_a_zero_its_16_bit_pairs_cannot_hold_is_a_located_error():
    """gemv_mma's CUDA form subtracts MAGIC + zero from 16-bit pairs; a zero for which that or a
    q - zero is not exact in the scales' dtype is an error at the kernel, not wrong sums."""
    from conftest import compile_text
    text = GEMV_MMA.replace("zero=8", "zero=300")
    src, _, m = compile_text(text, "g.tile", "cuda")
    with pytest.raises(TilecError, match=r"gemv_mma\(\): zero=300 is not exact in bf16") as err:
        driver.render(src, m, "cuda", {"arch": ("sm_80",)})
    assert err.value.format("g.tile", text).startswith("g.tile:3:")  # the kernel's grid block


# ---- builds --------------------------------------------------------------------------------
def chain(m_dump, prog, out, inputs: dict, dims: dict) -> dict:
    """Call the dump's kernels (the variants the launcher would pick) in launch order, each
    from its own library, passing workspaces from one to the next."""
    env = dict(inputs)
    graphs = {g.name: g for g in m_dump.graphs}
    for k in pick_variants(prog, dims):
        g = graphs[k.name]
        env.update(call_library(out / "libdump.so", g, env, dims))
    return env


def same_results_from_dump(text: str, name: str, dims: dict | None = None):
    """Build `text` and its CPU dump; the dump's kernels, chained, give bit-identical outputs."""
    m0, m = tiled(text, "cpu", name)
    dump = driver.print_stage(m, "tiled")
    _, out_src = build_text(text, name)
    m_dump, out_dump = build_text(dump, "dump.tile")
    for g, prog in zip(m0.graphs, m.programs):
        d = choose_dims(g, {k: v for k, v in (dims or {}).items() if k in g.symbols})
        inputs = interp.random_inputs(g, d, 7)
        want = call_library(out_src / f"lib{library_name(name)}.so", g, inputs, d)
        got = chain(m_dump, prog, out_dump, inputs, d)
        for p in g.outputs:
            assert np.array_equal(in_shape_of(got[p.name], want[p.name]), want[p.name],
                                  equal_nan=True), \
                f"{g.name}.{p.name}: the dump's library differs from the source's"


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_library_built_from_the_dump_gives_the_same_results(path):
    same_results_from_dump(path.read_text(), path.name)


def test_library_built_from_a_random_programs_dump_gives_the_same_results():
    for seed in range(8):
        prog = random_program(seed)
        try:
            same_results_from_dump(prog.text, "random.tile", prog.dims)
        except AssertionError as e:
            raise AssertionError(f"random program {seed}:\n{prog.text}\n{e}") from None


@pytest.mark.parametrize("sizes", ["odd", "tile_multiple", "ones"])
@pytest.mark.parametrize("path", TILE_SAMPLES, ids=lambda p: p.stem)
def test_tile_sample_matches_reference(path, sizes):
    dims = {"odd": None,
            "tile_multiple": dict(M=256, N=256, K=256, B=1, H=2, L=256, S=128),
            "ones": dict(M=1, N=1, K=128, B=1, H=1, L=1, S=1)}[sizes]
    assert check_text(path.read_text(), dims, name=path.name)


# ---- the language around tile-level kernels ----------------------------------------------------
def test_tile_level_expressions_match_the_tensor_level():
    """clamp and leaky_relu (which the tensor level rewrites into maximum/minimum/where) mean
    the same in a tile-level kernel."""
    text = """
kernel act(X: f32[N], Z: f16[N]) -> Y: f32[N]:
    with grid(cdiv(N, 64), threads=64) as (bx):
        for i in parallel(64):
            if bx * 64 + i < N:
                Y[bx * 64 + i] = leaky_relu(X[bx * 64 + i], 0.1) + clamp(Z[bx * 64 + i], -0.5, 0.5)

kernel act_ref(X: f32[N], Z: f16[N]) -> Y: f32[N]:
    Y = leaky_relu(X, 0.1) + clamp(Z, -0.5, 0.5)
"""
    m = driver.frontend(driver.Source("act.tile", text))
    g_tile, g_ref = m.graphs
    d = {"N": 200}
    inputs = interp.random_inputs(g_ref, d, 3)
    got = interp.run_graph(g_tile, inputs, d)["Y"]
    assert np.array_equal(got, interp.run_graph(g_ref, inputs, d)["Y"])
    assert check_text(text, d)


def test_a_file_mixes_both_levels():
    text = """
kernel softmax_rows(X: f32[R, C]) -> Y: f32[R, C]:
    Y = softmax(X, axis=1)

kernel twice(X: f32[N]) -> Y: f32[N]:
    with grid(cdiv(N, 64), threads=64) as (bx):
        for i in parallel(64):
            if bx * 64 + i < N:
                Y[bx * 64 + i] = X[bx * 64 + i] * 2.0
"""
    assert set(check_text(text, {"R": 5, "C": 33, "N": 130})) == {"softmax_rows", "twice"}


def test_dim_parameters_name_dimensions_no_shape_has():
    text = """
kernel scale(X: f32[N], R: dim) -> Y: f32[N]:
    Y = X / f32(R)
"""
    (r,) = check_text(text, {"N": 10, "R": 7}).values()
    assert r.dims == {"N": 10, "R": 7}


def test_gpu_limits_are_errors_at_the_loop():
    text = """
kernel three(X: f32[B, R, C]) -> Y: f32[B, R, C]:
    with grid(B, threads=128) as (bx):
        for a, i, j in parallel(1, R, C):
            Y[bx + a, i, j] = X[bx + a, i, j] * 2.0
"""
    m0 = driver.frontend(driver.Source("three.tile", text))
    driver.stage_module(m0, "lowered", "cpu")  # the CPU takes it
    with pytest.raises(TilecError, match="parallel loop over 3 axes") as e:
        driver.stage_module(m0, "lowered", "cuda")
    assert (e.value.loc.line, e.value.loc.col) == (4, 9)


FOUR_BIT_TILES = """
kernel nibbles(X: i4[M, N]) -> Y: i8[M, N]:
    with grid(cdiv(N, 64), M, threads=64) as (bx, by):
        t = shared(i4, [1, 64])
        f = fragment(i4, [1, 64])
        copy(X[by, bx * 64], t)
        for i, j in parallel(1, 64):
            f[i, j] = t[i, j] - 1
        for i, j in parallel(1, 64):
            if bx * 64 + j < N:
                Y[by, bx * 64 + j] = i8(f[i, j]) * 10 + i8(t[i, j])
"""


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_four_bit_tiles_keep_their_sign(target):
    """A shared tile of 4-bit values filled by copy() (GPU targets keep it packed) and a 4-bit
    fragment (one value per register, its sign kept: -8 - 1 wraps to 7), on inputs over the
    whole i4 range."""
    if target == "cuda":
        from test_cuda import need_gpu
        need_gpu()
    opts = {"arch": ("sm_90",)} if target == "cuda" else None
    for dims in (dict(M=3, N=130), dict(M=2, N=64)):
        res = check_text(FOUR_BIT_TILES, dims, target=target, options=opts, full_ints=True)
        assert all(e == 0 for r in res.values() for e in r.errors.values()), res


def test_element_stores_into_a_packed_shared_tile_are_a_gpu_error_at_the_store():
    """GPU targets keep a shared tile of 4-bit values packed two per byte, as copy() fills it:
    an element store into one is refused there (it wrote a byte per element), at the store; the
    CPU, which holds one value per byte, takes it."""
    text = FOUR_BIT_TILES.replace("        copy(X[by, bx * 64], t)\n", "").replace(
        "            f[i, j] = t[i, j] - 1\n",
        "            t[i, j] = X[by, min(bx * 64 + j, N - 1)]\n            f[i, j] = t[i, j] - 1\n")
    m0 = driver.frontend(driver.Source("nibbles.tile", text))
    driver.stage_module(m0, "lowered", "cpu")
    for target in ("cuda", "hip"):
        with pytest.raises(TilecError, match="shared tile t holds 4-bit values") as e:
            driver.stage_module(m0, "lowered", target)
        assert (e.value.loc.line, e.value.loc.col) == (7, 13)


def test_a_copy_of_four_bit_values_from_an_odd_column_is_a_gpu_error_at_the_copy():
    """GPU targets copy 4-bit values as bytes: a window that may start on an odd column is
    refused there, at the copy; the CPU unpacks it."""
    text = FOUR_BIT_TILES.replace("copy(X[by, bx * 64], t)", "copy(X[by, bx * 64 + by], t)")
    assert check_text(text, dict(M=3, N=130), full_ints=True)
    m0 = driver.frontend(driver.Source("nibbles.tile", text))
    for target in ("cuda", "hip"):
        with pytest.raises(TilecError, match="starts on a byte") as e:
            driver.stage_module(m0, "lowered", target)
        assert (e.value.loc.line, e.value.loc.col) == (6, 9)


CONVERTING_COPIES = """
kernel convert(X: f32[M, 32], Q: f16[M, 32], I: i32[M, 32]) -> (H: f16[M, 32], E: f32[M, 32],
                                                                B: i32[M, 32], U: i32[M, 32]):
    with grid(cdiv(M, 16), threads=64) as (bx):
        h = shared(f16, [16, 32])
        e = shared(fp8e5m2, [16, 32])
        b = shared(i8, [16, 32])
        u = shared(u8, [16, 32])
        copy(X[bx * 16, 0], h)
        copy(Q[bx * 16, 0], e)
        copy(X[bx * 16, 0], b)
        copy(I[bx * 16, 0], u)
        for i, j in parallel(16, 32):
            if bx * 16 + i < M:
                H[bx * 16 + i, j] = h[i, j]
                E[bx * 16 + i, j] = f32(e[i, j])
                B[bx * 16 + i, j] = i32(b[i, j])
                U[bx * 16 + i, j] = i32(u[i, j])
"""


def test_a_copy_into_a_tile_of_another_dtype_converts_each_element():
    """copy() into a tile of another dtype converts as any conversion does: f32 into f16 and
    f16 into fp8 round, f32 into i8 rounds and saturates, i32 into u8 saturates (the CPU
    copied values unconverted but for the source's own unpacking); GPU targets, whose copies
    move bytes, refuse it at the copy."""
    (g,) = driver.frontend(driver.Source("c.tile", CONVERTING_COPIES)).graphs
    x = np.array([[0.1, -2.5, 300.0, 1e-8] * 8] * 3)
    i = np.array([[-5, 7, 1000, 255] * 8] * 3)
    got = interp.run_graph(g, {"X": x, "Q": np.full((3, 32), 0.3), "I": i}, {"M": 3})
    assert got["B"][0, :4].tolist() == [0, -2, 127, 0] and got["U"][0, :4].tolist() == [0, 7, 255, 255]
    assert got["H"][0, 0] == float(np.float16(0.1)) and got["E"][0, 0] == 0.3125
    for dims in (dict(M=3), dict(M=40)):
        assert check_text(CONVERTING_COPIES, dims)
    m0 = driver.frontend(driver.Source("c.tile", CONVERTING_COPIES))
    for target in ("cuda", "hip"):
        with pytest.raises(TilecError, match=r"copy\(\) from X \(f32\) to h \(f16\) changes the "
                                             "dtype") as e:
            driver.stage_module(m0, "lowered", target)
        assert (e.value.loc.line, e.value.loc.col) == (9, 9)


def test_a_one_axis_shared_tile_is_a_gpu_limit_the_cpu_takes():
    """GPU targets lay out 2-D shared tiles: a 1-D one is a located error there (it was an
    internal error), and the CPU runs it."""
    text = """
kernel rowmax(X: f32[M, 32]) -> Y: f32[M]:
    with grid(cdiv(M, 64), threads=64) as (bx):
        t = shared(f32, [64])
        for i in parallel(64):
            if bx * 64 + i < M:
                t[i] = X[bx * 64 + i, 0] * 2.0
        for i in parallel(64):
            if bx * 64 + i < M:
                Y[bx * 64 + i] = t[i]
"""
    assert check_text(text, dict(M=70))
    m0 = driver.frontend(driver.Source("r.tile", text))
    for target in ("cuda", "hip"):
        with pytest.raises(TilecError, match="shared tile t has one axis"):
            driver.stage_module(m0, "lowered", target)


SUM_INTO_NIBBLES = """
kernel red5(A: f16[M, 32], B: f16[32, 64]) -> (Y: i8[M], Z: i8[M]):
    with grid(cdiv(M, 64), threads=128) as (bx):
        A_s = shared(f16, [64, 32])
        B_s = shared(f16, [32, 64])
        acc = fragment(f32, [64, 64])
        r = fragment(i4, [64])
        q = fragment(i8, [64])
        copy(A[bx * 64, 0], A_s)
        copy(B[0, 0], B_s)
        clear(acc)
        gemm(A_s, B_s, acc)
        reduce(sum, acc, r)
        reduce(sum, acc, q)
        for i in parallel(64):
            if bx * 64 + i < M:
                Y[bx * 64 + i] = i8(r[i])
                Z[bx * 64 + i] = q[i]
"""


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_sum_into_a_four_bit_fragment_wraps_in_four_bits(target):
    """A row sum into an i4 fragment wraps in 4 bits, as in the reference: the CPU's vectorized
    row sum and the GPU's sum across a row's threads ran in 32 and 8 bits."""
    if target == "cuda":
        from test_cuda import need_gpu
        need_gpu()
    opts = {"arch": ("sm_90",)} if target == "cuda" else None
    for dims in (dict(M=100), dict(M=64)):
        res = check_text(SUM_INTO_NIBBLES, dims, target=target, options=opts)
        assert all(e == 0 for r in res.values() for e in r.errors.values()), res
