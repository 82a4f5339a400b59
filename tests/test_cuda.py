"""The CUDA target.

Without a GPU (CI): every sample and the random-program regressions compile with nvcc for sm_80
and sm_90, warning-free, and no sample's kernel spills registers (`-Xptxas -v`). Where
nvcc is missing these tests skip and say so; CI installs the toolkit and fails instead.

With a GPU (`pytest -m gpu`, on the device): every sample and those programs run at sizes that
are and are not tile multiples (1, 17, 100, 1000, ...) and match the reference interpreter.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, build_text, check_text, compile_text
from test_random_programs import REGRESSIONS

from tilec import driver, interp
from tilec.diagnostics import TilecError
from tilec.interp_tile import pick_slots, run_program
from tilec.ir import tile as T
from tilec.passes.rewrite import used_names

SAMPLE_FILES = sorted(SAMPLES.glob("*.tile"))
TILE_SAMPLES = sorted((SAMPLES / "tile").glob("*.tile"))
ON_CI = os.environ.get("CI", "").lower() == "true"
# the architecture the GPU tests build for: sm_90 (mma.sync), or sm_90a on an H100/H200 (the
# warp-specialized TMA + wgmma GEMMs where the operands allow; bench/device_run.sh runs both)
GPU_OPTIONS = {"arch": (os.environ.get("TILEC_GPU_ARCH", "sm_90"),)}
# the mma.sync code these tests inspect (the default build adds sm_90a's Hopper GEMMs)
SM90 = {"arch": ("sm_90",)}


def need_nvcc():
    if shutil.which(os.environ.get("NVCC", "nvcc")) is None:
        if ON_CI:
            pytest.fail("nvcc is not installed on this CI machine: the CUDA tests need it")
        pytest.skip("nvcc not found: the CUDA compile tests need the CUDA toolkit")


@functools.cache
def gpu_reason() -> str:
    """Why GPU tests cannot run here ('' when they can)."""
    from tilec import runtimes
    try:
        rt = runtimes.get("cuda")
        rt.close()
    except TilecError as e:
        return str(e)
    return ""


def need_gpu():
    need_nvcc()
    reason = gpu_reason()
    if reason:
        pytest.skip(f"no GPU: {reason}")


# ---- compile only (CI) --------------------------------------------------------------------------
def warning_lines(log: str) -> list:
    """The lines of a compiler's output that warn."""
    return [line for line in log.splitlines() if "warning" in line.lower()]


def ptxas_lines(log: str) -> dict:
    """{(kernel, arch): (registers, spill bytes: stored and loaded)} from the `-Xptxas -v` lines
    of `log` (one compile at a time: ptxas reports each entry function on the lines after its
    name)."""
    report, key = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(\w+)'", line)
        if m:
            key = (m.group(1), m.group(2))
            report[key] = [None, None]
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and key:
            report[key][1] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and key:
            report[key][0] = int(m.group(1))
    missing = [k for k, v in report.items() if None in v]
    assert not missing, f"ptxas reported no registers or spills for {missing}:\n{log[-3000:]}"
    return report


@pytest.mark.nvcc
@pytest.mark.parametrize("path", SAMPLE_FILES + TILE_SAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("arch", [("sm_80", "sm_90"), ("sm_80", "sm_90a")],
                         ids=["sm80+sm90", "sm80+sm90a"])
def test_sample_compiles_for_sm80_and_sm90(path, arch, tmp_path, monkeypatch):
    """Every sample builds with its Makefile for sm_80 + sm_90 and for sm_80 + sm_90a (the
    default: the Hopper GEMMs in the same library, sm_90 PTX), without a warning, and no kernel
    of any architecture spills registers (`-Xptxas -v`)."""
    from tilec.build import run_make
    need_nvcc()
    src, _, m = compile_text(path.read_text(), path.name, "cuda", options={"arch": arch})
    driver.write_files(tmp_path, driver.render(src, m, "cuda", {"arch": arch}))
    monkeypatch.setenv("NVCCFLAGS", "-O3 -Xptxas -v")
    log = run_make(tmp_path, driver.get_target("cuda"), jobs=1)  # (one ptxas report at a time)
    log = log.stdout + log.stderr
    assert (tmp_path / f"lib{path.stem}.so").exists() and (tmp_path / f"lib{path.stem}.a").exists()
    assert not warning_lines(log), log[-3000:]
    report = ptxas_lines(log)
    assert {a for _, a in report} == set(arch), sorted(report)
    spills = {k: v for k, v in report.items() if v[1]}
    assert not spills, f"kernels spill registers: {spills}"


DECLARED = """\
    const int64_t bx = tilec_b % 7;
    (void)bx;
    const int64_t bz = tilec_b / 7;
    (void)bz;
    for (int tilec_q = 0; tilec_q < 4; ++tilec_q) {
        const int i = tilec_q * 8 + (tilec_lane >> 2);
        (void)i;
        const int tilec_j0 = (tilec_lane & 3) * 2;
        const int tilec_n = tilec::imin(2, N - tilec_j0);
        const int64_t j = tilec_j0 + 1;
        (void)j;
        // i and bz, in a comment
        Y[bx * 32 + tilec_q] = 1.0f;
    }
    if (bz > 0) {
        const int64_t k = bz - 1;
        (void)k;
    }
    Z[0] = i;
"""


def test_renderer_drops_the_index_constants_nothing_reads():
    """A kernel body loses the constants it declared for statements that did not read them,
    with their `(void)` markers, and plain constants that only fed those; what is read (here or
    in a nested block) stays, unmarked; a call stays; a name read after its block has closed
    or in a comment is not a read."""
    from tilec.targets.cstyle import drop_unread
    out = drop_unread(DECLARED.splitlines())
    kept = [ln.strip() for ln in out if ln.lstrip().startswith("const")]
    assert kept == ["const int64_t bx = tilec_b % 7;", "const int64_t bz = tilec_b / 7;",
                    "const int tilec_j0 = (tilec_lane & 3) * 2;",
                    "const int tilec_n = tilec::imin(2, N - tilec_j0);"]
    assert not [ln for ln in out if "(void)" in ln]
    assert drop_unread(out) == out


@pytest.mark.parametrize("layout", [
    ("mma", 64, 64, 4, 1), ("mma", 128, 128, 2, 2), ("mma", 128, 256, 2, 4), ("mma", 16, 8, 1, 1),
    ("mma", 64, 128, 1, 4), ("wgmma", 128, 256, 8, 1), ("wgmma", 128, 176, 8, 1),
    ("pingpong", 128, 128, 4, 1)], ids=lambda x: "x".join(map(str, x)))
def test_mma_layout_formulas_give_each_element_to_its_lane(layout):
    """The renderer's index formulas of the mma.sync / wgmma accumulator layouts, evaluated for
    every warp, lane and register group: lane l holds rows l / 4 and l / 4 + 8 of each 16 x 8
    tile of its warp's tile, columns 2 (l % 4) and 2 (l % 4) + 1, and every element of the tile
    is held exactly once (once per warpgroup with ping-pong); row_slot names the group of the
    row layout (MmaRows) that holds the same row."""
    from tilec.ir.layout import MmaLayout, WgmmaLayout
    kind, rows, cols, wm_, wn_ = layout
    L = MmaLayout(rows, cols, wm_, wn_) if kind == "mma" else \
        WgmmaLayout(rows, cols, wm_, wn_, pingpong=kind == "pingpong")
    R = L.rows_layout()

    def ev(formula, warp, lane, q):
        return eval(formula.replace("/", "//"), {}, {"tilec_warp": warp, "tilec_lane": lane,
                                                     "tilec_q": q})
    held = {}
    for warp in range(wm_ * wn_ * (2 if kind == "pingpong" else 1)):
        w = warp % 4 if kind == "pingpong" else warp
        for lane in range(32):
            for q in range(L.groups()):
                tile_m, tile_n, half = q // (L.ni * 2), q // 2 % L.ni, q % 2
                row = (w // wn_) * L.wm + tile_m * 16 + half * 8 + lane // 4
                if kind == "pingpong":  # (warp w: rows 16 w .. of each 64-row half)
                    row = tile_m * 64 + w * 16 + half * 8 + lane // 4
                col = (w % wn_) * L.wn + tile_n * 8 + lane % 4 * 2
                assert (ev(L.row("tilec_q"), warp, lane, q), ev(L.col0("tilec_q"), warp, lane, q)) \
                    == (row, col), (warp, lane, q)
                for v in range(2):
                    held[(warp // 4 if kind == "pingpong" else 0, row, col + v)] = \
                        held.get((warp // 4 if kind == "pingpong" else 0, row, col + v), 0) + 1
                if R is not None:
                    assert ev(R.row(str(ev(L.row_slot("tilec_q"), warp, lane, q))), warp, lane, 0) \
                        == row
    copies = 2 if kind == "pingpong" else 1
    assert sorted(held) == [(c, r, j) for c in range(copies) for r in range(rows) for j in range(cols)]
    assert set(held.values()) == {1}


@pytest.mark.parametrize("shape", [(1, 256, 256, 1), (1, 1024, 256, 4), (4, 256, 256, 4),
                                   (8, 64, 128, 8), (3, 100, 128, 2), (1, 8192, 1024, 8)],
                         ids=lambda x: "x".join(map(str, x)))
def test_vector_layout_formulas_deal_each_vector_to_one_thread(shape):
    """VecLayout's formulas, evaluated for every thread and group: vector g of the row-major
    tile (row g // (cols / vec), columns from vec (g % (cols / vec))) goes to thread
    g % threads, in its group g // threads, and the groups past the tile are invalid."""
    from tilec.ir.layout import VecLayout
    rows, cols, threads, vec = shape
    L = VecLayout(rows, cols, threads, vec)
    seen = []
    for tid in range(threads):
        for q in range(L.groups()):
            env = {"tilec_tid": tid, "tilec_q": q}
            valid = L.valid("tilec_q")
            if valid is not None and not eval(valid, {}, env):
                continue
            g = tid + q * threads
            got = [eval(f.replace("/", "//"), {}, env) for f in (L.row("tilec_q"), L.col0("tilec_q"))]
            assert got == [g // (cols // vec), g % (cols // vec) * vec], (tid, q)
            seen.append(g)
    assert sorted(seen) == list(range(rows * cols // vec))


@pytest.mark.parametrize("shape", [(128, 64, 256, 8), (64, 32, 128, 4), (4, 64, 32, 8), (32, 8, 32, 1)],
                         ids=lambda x: "x".join(map(str, x)))
def test_column_layout_formulas_give_each_thread_its_columns_in_every_group(shape):
    """VecCols of a VecLayout tile: every group of a thread covers the same columns (the
    thread's slot v is column col0 + v in all of them), and the threads holding a column are
    the tile's rows, per_row apart: what block_col_allreduce's shuffles and warps combine."""
    from tilec.ir.layout import VecLayout
    rows, cols, threads, vec = shape
    L = VecLayout(rows, cols, threads, vec)
    C = L.cols_layout()
    assert C is not None and C.slots() == vec and C.per_row == cols // vec
    holders = {}
    for tid in range(threads):
        env = {"tilec_tid": tid}
        firsts = {eval(L.col0(str(q)).replace("/", "//"), {}, env) for q in range(L.groups())}
        assert len(firsts) == 1, tid
        holders.setdefault(firsts.pop(), set()).add(tid)
    assert sorted(holders) == list(range(0, cols, vec))
    for c, tids in holders.items():
        assert tids == set(range(c // vec, threads, C.per_row)), c
    # groups that move along the columns have no column layout
    assert VecLayout(1, 1024, 256, 2).cols_layout() is None


ONE_D = """
kernel twice(X: f32[R, C]) -> s: f32[C]:
    with grid(cdiv(C, 32), threads=128) as (bx):
        acc = fragment(f32, [32])
        for j in parallel(32):
            if bx * 32 + j < C:
                acc[j] = X[0, bx * 32 + j] * 2.0
        for j in parallel(32):
            if bx * 32 + j < C:
                s[bx * 32 + j] = acc[j]
"""


def test_a_one_d_fragment_of_a_one_d_loop_holds_every_element():
    """A 1-D fragment that no loop reads as row values, filled by a loop over its elements, is
    dealt to the threads as its loop is (it once took the row-value layout, and every thread
    computed element 0 only)."""
    from tilec.ir.layout import VecLayout
    _, _, m = compile_text(ONE_D, "oned.tile", "cuda", options=SM90)
    (k,) = m.programs[0].kernels
    (acc,) = [a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)]
    assert isinstance(acc.layout, VecLayout) and acc.layout.cols == 32
    loops = [s for s in T.walk_stmts(k.body) if isinstance(s, T.For)]
    assert loops and all(lp.by == acc.layout for lp in loops)


@pytest.mark.gpu
def test_a_one_d_fragment_of_a_one_d_loop_on_gpu():
    need_gpu()
    for dims in (dict(R=2, C=70), dict(R=1, C=1)):
        check_text(ONE_D, dims, name="oned.tile", target="cuda", options=GPU_OPTIONS)


def test_an_if_test_loses_only_parentheses_that_enclose_all_of_it():
    from tilec.targets.cstyle import unwrapped
    assert unwrapped("(a < 0 || b < 0)") == "a < 0 || b < 0"
    assert unwrapped("(a < 0) || (b < 0)") == "(a < 0) || (b < 0)"
    assert unwrapped("(!(x >= 0))") == "!(x >= 0)"
    assert unwrapped("f(x) && g(y)") == "f(x) && g(y)"
    assert unwrapped("ok") == "ok"


def test_generated_kernels_declare_only_what_they_read():
    """No sample's CUDA or HIP kernel keeps an index constant it does not read: every
    `(void)` marker of the renderer is gone from the kernels, and a kernel that reads no lane
    or warp number does not compute it."""
    for path in SAMPLE_FILES + TILE_SAMPLES:
        for target in ("cuda", "hip"):
            src, _, m = compile_text(path.read_text(), path.name, target)
            for name, text in driver.render(src, m, target).items():
                for kernel in text.split("__global__")[1:]:
                    kernel = kernel[:kernel.index("\n}\n")]
                    assert not re.search(r"\(void\)(?!tilec_workspace|tilec_grid)", kernel), \
                        (path.name, name, kernel[:200])
                    for n in ("tilec_lane", "tilec_warp"):
                        assert (f"const int {n} =" in kernel) == \
                            (len(re.findall(rf"\b{n}\b", re.sub(r"//.*", "", kernel))) > 1), \
                            (path.name, name, n)


def nvcc_each(text: str, name: str, flags: list, options=None):
    """Yield (file, nvcc's result, folder) for each .cu source of text's CUDA target (sm_90, or
    the build `options`), compiled with `flags` in a temporary folder that holds the sources."""
    import tempfile
    options = options or {"arch": ("sm_90",)}
    src, _, m = compile_text(text, name, "cuda", options=options)
    files = driver.render(src, m, "cuda", options)
    with tempfile.TemporaryDirectory() as tmp:
        driver.write_files(Path(tmp), files)
        for f in files:
            if f.endswith(".cu"):
                r = subprocess.run([os.environ.get("NVCC", "nvcc"), "-std=c++17", "--fmad=false",
                                    "-O3", *flags, f], cwd=tmp, capture_output=True, text=True)
                assert r.returncode == 0, r.stderr[-3000:]
                yield f, r, Path(tmp)


RMSNORM16 = """
kernel rms(X: f16[R, C], w: f16[C], eps: f32) -> Y: f16[R, C]:
    Y = X * rsqrt(mean(f32(X) * f32(X), axis=-1, keepdims=True) + eps) * w
"""


def cuda_kernel_sources(text: str, name: str = "k.tile") -> dict:
    """{kernel: its CUDA source, from after `__global__` to its closing brace} of text (sm_90)."""
    src = driver.render(*[compile_text(text, name, "cuda", options=SM90)[i] for i in (0, 2)], "cuda",
                        {"arch": ("sm_90",)})
    cu = "\n".join(v for k, v in src.items() if k.endswith(".cu"))
    return {re.search(r"\) (\w+)\(", k).group(1): k[:k.index("\n}\n")]
            for k in cu.split("__global__")[1:]}


def ptx_entries(ptx: str) -> dict:
    """{kernel: its PTX} of a PTX file."""
    return {body.split("(", 1)[0]: body for body in ptx.split(".entry ")[1:]}


def kept_file(folder, cu: str, arch: str, ext: str):
    """The file (`ext`: ptx, cubin) that `nvcc --keep` left in `folder` for source `cu` and
    virtual `arch` (compute_90a, ...): named by the architecture where the compile had several."""
    stem = cu.removesuffix(".cu")
    path = folder / f"{stem}.{arch}.{ext}"
    return path if path.exists() else folder / f"{stem}.{ext}"


def kept_ptx(folder, cu: str, arch: str) -> str:
    """The PTX that `nvcc --keep` left (kept_file)."""
    return kept_file(folder, cu, arch, "ptx").read_text()


def sass_tool() -> list | None:
    """The command that prints the SASS of a cubin: cuobjdump where the CUDA toolkit has it,
    else nvdisasm (the test extra nvidia-cuda-nvdisasm installs it beside the Python
    packages), else None."""
    if shutil.which("cuobjdump"):
        return ["cuobjdump", "--dump-sass"]
    if shutil.which("nvdisasm"):
        return ["nvdisasm"]
    try:
        import nvidia
    except ImportError:
        return None
    tools = sorted(t for root in nvidia.__path__ for t in Path(root).glob("cu*/bin/nvdisasm"))
    return [str(tools[0])] if tools else None


def kept_sass(folder, cu: str, arch: str = "compute_90a") -> str:
    """The SASS of the cubin that `nvcc --keep` left (kept_file)."""
    tool = sass_tool()
    if tool is None:
        if ON_CI:
            pytest.fail("neither cuobjdump nor nvdisasm is installed on this CI machine: "
                        "the SASS tests need one (pip install '.[test]' brings nvdisasm)")
        pytest.skip("no cuobjdump or nvdisasm to read the SASS")
    r = subprocess.run(tool + [str(kept_file(folder, cu, arch, "cubin"))], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sass_functions(sass: str) -> dict:
    """{mangled kernel name: its SASS} of kept_sass's output (cuobjdump's `Function : NAME` or
    nvdisasm's `.text.NAME:` headers)."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*(?:Function : |\.text\.)(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            out.setdefault(name, "")
        elif name:
            out[name] += line + "\n"
    return out


def ptx_of(text: str, name: str) -> dict:
    """{kernel: its PTX} of text's CUDA sources compiled for sm_90."""
    out = {}
    for _, _, folder in nvcc_each(text, name, ["-arch=sm_90", "-ptx", "-o", "k.ptx"]):
        out.update(ptx_entries((folder / "k.ptx").read_text()))
    return out


@pytest.mark.nvcc
def test_row_kernel_moves_whole_rows_in_16_byte_accesses():
    """A row kernel's threads whose vector groups all lie inside the row run a version without
    per-group tests: 16-byte loads and stores (the stores once compiled to 32-bit pieces), and
    the guarded version only for the ragged end of a row."""
    need_nvcc()
    kernel = cuda_kernel_sources(RMSNORM16, "rms.tile")["rms_k0_C8192"]
    whole, guarded = kernel.split("} else {", 1)
    assert "every vector group of this thread" in whole
    assert "load_vec_whole" in whole and "store_vec_whole" in whole
    assert "tilec_n >=" not in whole and "tilec::imin" not in whole.split("{", 2)[2]
    assert "load_vec<" in guarded and "tilec_n >=" in guarded
    ptx = next(v for k, v in ptx_of(RMSNORM16, "rms.tile").items() if "rms_k0_C8192E" in k)
    assert re.search(r"ld\.global\.nc\.v4\.u32", ptx)
    assert "createpolicy" not in ptx  # (L2 policies only under TILEC_LOAD_FORM)
    assert re.search(r"st(\.global)?\.v4\.b32", ptx)


def test_threads_that_exchange_values_take_the_same_version():
    """A kernel whose threads meet at shuffles or barriers (row reductions) chooses its whole or
    guarded version once for the whole block: a per-thread choice split warps between the two
    versions at a ragged row (C = 1000 of a 1024-column layout), whose shuffles then waited for
    lanes that never came (the GPU tests hung). A kernel without them (an elementwise chain)
    keeps the per-thread choice, so only the threads at the row's end take the guarded one."""
    text = (SAMPLES / "softmax.tile").read_text() + (SAMPLES / "layernorm.tile").read_text() + \
        (SAMPLES / "elementwise_chain.tile").read_text() + RMSNORM16
    seen = {"collective": 0, "per-thread": 0}
    for kernel in cuda_kernel_sources(text).values():
        if "every vector group of this thread" not in kernel:
            continue
        test = kernel.split("// every vector group of this thread")[0].rsplit("if (", 1)[1]
        if re.search(r"allreduce|__syncthreads|__shfl", kernel):
            assert "tilec_tid" not in test and "tilec_lane" not in test, test
            seen["collective"] += 1
        else:
            seen["per-thread"] += "tilec_tid" in test
    assert seen["collective"] >= 3 and seen["per-thread"] >= 1, seen


def test_attention_has_exact_head_dim_variants():
    """Attention at D = 64, 96 and 128 (nearly every model) runs a variant where D is a constant
    (strides and bounds are immediates), tried before the run-time D <= 64 / 96 / 128 ones. The
    exact ones, D <= 64 and D <= 96 run 4 warps of 32 query rows; D <= 128 needs the registers of
    8 warps (its run-time bounds and strides)."""
    threads = {"D64exact": 128, "D64": 128, "D96exact": 128, "D96": 128, "D128exact": 128,
               "D128": 256}
    for name in ("attention", "causal_attention"):
        _, _, m = compile_text((SAMPLES / f"{name}.tile").read_text(), f"{name}.tile", "cuda", options=SM90)
        ks = m.programs[0].kernels
        assert [k.name.split("_k0_")[1] for k in ks] == list(threads), [k.name for k in ks]
        assert [str(k.when) for k in ks] == [f"D {op} {c}" for c in (64, 96, 128)
                                             for op in ("==", "<=")]
        assert {k.name.split("_k0_")[1]: k.threads for k in ks} == threads, name
        for k in ks:
            uses_d = "D" in used_names(k) or any("D" in d.symbols() for p in k.params
                                                 for d in p.shape)
            assert uses_d == ("exact" not in k.name), k.name


@pytest.mark.parametrize("target,arch", [("cuda", "sm_90"), ("cuda", "sm_90a"), ("hip", "gfx90a")])
def test_a_warp_whose_rescaling_factors_are_1_skips_the_rescaling(target, arch):
    """Attention's O is rescaled by a row factor that stays exactly 1 while the row's max does
    (passes/tile.py): each loop `O[i, j] = O[i, j] * alpha[i]` runs under a warp vote over every
    alpha the thread holds, on the mma.sync, wgmma and MFMA layouts. Loops of other forms (a
    GEMM epilogue's scale by a scalar, the softmax's division by the row sum) run as they
    are."""
    for name in ("attention", "causal_attention", "gemm_bias_relu", "softmax"):
        text = (SAMPLES / f"{name}.tile").read_text()
        src, _, m = compile_text(text, f"{name}.tile", target, options={"arch": (arch,)})
        files = driver.render(src, m, target, {"arch": (arch,)})
        code = "\n".join(v for k, v in files.items() if k.endswith((".cu", ".hip")))
        lines = code.splitlines()
        rescales = [n for n, line in enumerate(lines)
                    if re.search(r"^\s+(O\d*)\[tilec_q \* \d \+ tilec_v\] = \1\[.*\] \* alpha\[", line)]
        votes = [n for n, line in enumerate(lines) if "tilec::warp_any(" in line]
        if "attention" not in name:
            assert not votes and not rescales, name
            continue
        assert rescales and len(votes) == len(rescales), (name, len(votes), len(rescales))
        for v, r in zip(votes, rescales):
            assert v < r < v + 14, (name, lines[v:r + 1])
            held = re.search(r"warp_any\((.*)\)\) \{", lines[v]).group(1).split(" || ")
            # (the thread's rows: 2 per m16 tile of mma and wgmma, 1 per MFMA tile)
            assert held == [f"alpha[{n}] != 1.0f" for n in range(len(held))], lines[v]


def key_loops(name: str, target: str) -> list:
    """The key loops (range loops holding a gemm) of the first kernel of sample `name`."""
    _, _, m = compile_text((SAMPLES / f"{name}.tile").read_text(), f"{name}.tile", target,
                           options=SM90 if target == "cuda" else None)
    k = m.programs[0].kernels[0]
    return [s for s in T.walk_stmts(k.body) if isinstance(s, T.For) and s.kind == "range" and
            any(isinstance(x, T.Gemm) for x in T.walk_stmts(s.body))]


def test_cuda_splits_the_key_loop_of_a_causal_mask():
    """On CUDA a causal mask splits the key loop where the diagonal tiles start: the first loop
    runs every statement without the mask, the second (a fresh variable, starting where the
    first ends) with it; per-tile versions of the masking statement spilled there in the 4-warp
    layout. The key bound alone keeps per-tile versions (non-causal attention, whose split loop
    spilled), and the CPU versions both per tile."""
    def versioned(loop):
        return any(isinstance(s, T.If) and "< 0" in T.fmt(s.cond) for s in loop.body)

    def selects(loop):
        return sum(isinstance(e, T.Select) for st in T.walk_stmts(loop.body)
                   if isinstance(st, T.Store) for e in T.walk_exprs(st.value))
    (plain,) = key_loops("attention", "cuda")
    assert versioned(plain)
    (cpu,) = key_loops("causal_attention", "cpu")
    assert versioned(cpu)
    free, masked = key_loops("causal_attention", "cuda")
    assert not versioned(free) and not versioned(masked)
    assert free.start is None and masked.start == free.extents[0]
    assert masked.vars != free.vars
    assert selects(free) < selects(masked)  # the causal and key-bound selects: second loop only


@pytest.mark.parametrize("program,message", [
    ("kernel g(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:\n    C = A @ B\n",
     "96 threads (3 warps of 32) cannot tile the 128x128 accumulator in 16x8 mma tiles"),
    ("kernel a(Q: f16[L, D], K: f16[S, D], V: f16[S, D]) -> O: f16[L, D]:\n"
     "    O = softmax(Q @ K.T, axis=-1) @ V\n",
     "96 threads (3 warps of 32) cannot give each of its warps a multiple of 16 of the 128 "
     "query rows"),
])
def test_threads_that_no_warp_grid_fits_are_a_located_error(program, message):
    """A schedule's threads whose warps cannot split the matrix-unit accumulator are an error at
    `threads` (they were an internal error in the layout pass); the CPU builds the same file."""
    name = program.split("(")[0].split()[1]
    text = program + f"\nschedule {name}:\n    target cuda:\n        threads 96\n"
    with pytest.raises(TilecError) as e:
        compile_text(text, "w.tile", "cuda", options=SM90)
    assert message in str(e.value)
    assert (e.value.loc.line, e.value.loc.col) == (len(program.splitlines()) + 4, 17)
    compile_text(text, "w.tile", "cpu")


BAND = """
kernel band(Q: f32[L, D], K: f32[S, D], V: f32[S, D]) -> O: f32[L, D]:
    T = Q @ K.T
    T = where(index(T, -1) > index(T, -2), -inf, T)
    T = where(index(T, -1) < index(T, -2) - 100, -inf, T)
    O = softmax(T, axis=-1) @ V
"""


@pytest.mark.parametrize("shift", [0, 5, -70, "band"])
def test_split_key_loops_compute_what_the_reference_does(shift):
    """The split key loops of causal (and shifted causal) masks, run by the Tile IR interpreter
    (CUDA's tiles and version_masks policy, its copies as plain loops), match the reference at
    sizes whose diagonal falls inside a key tile and beside it, and where queries see no key;
    a band (keys at most 100 behind the query too) splits into three loops, masked before and
    after the free one."""
    from test_fusion import CAUSAL_SHIFTED

    from tilec.passes import pipeline, version_masks
    from tilec.targets.cpu import CPU
    from tilec.targets.cuda import CUDA
    text = BAND if shift == "band" else CAUSAL_SHIFTED.replace("SHIFT", str(shift))
    m0 = driver.frontend(driver.Source("c.tile", text))
    (g,), (prog,) = m0.graphs, driver.stage_module(m0, "tiled", "cuda", options=SM90).programs
    prog = version_masks.run(pipeline.run(prog, CPU, {}), CUDA, {})
    pieces = [s for k in prog.kernels for s in T.walk_stmts(k.body)
              if isinstance(s, T.For) and s.kind == "range" and
              any(isinstance(x, T.Gemm) for x in T.walk_stmts(s.body))]
    assert len(pieces) == (3 if shift == "band" else 2)
    assert all(b.start == a.extents[0] for a, b in itertools.pairwise(pieces))
    for dims in (dict(L=200, S=200, D=64), dict(L=64, S=300, D=32), dict(L=130, S=70, D=16),
                 dict(L=1, S=1, D=1)):
        inputs = interp.random_inputs(g, dims, 1, False)
        ref = interp.run_graph(g, inputs, dims)
        got = run_program([k for parts in pick_slots(prog, dims) for k in parts], inputs, dims,
                          ["O"])
        assert interp.rel_error(got["O"], ref["O"]) <= interp.tolerance("f32"), dims


def test_bounded_loops_count_in_32_bits():
    """A sequential loop whose trip count the launcher computes (or a constant) counts in a
    32-bit register; the launcher refuses a trip count past 2^31 (TILEC_ERR_UNSUPPORTED) instead
    of letting the counter wrap. A loop bounded by a per-block value only (min with a launcher
    value: causal attention) counts in 32 bits too."""
    for name in ("attention", "causal_attention", "gemm_bias_relu"):
        text = (SAMPLES / f"{name}.tile").read_text()
        src = driver.render(*[compile_text(text, f"{name}.tile", "cuda", options=SM90)[i] for i in (0, 2)],
                            "cuda", {"arch": ("sm_90",)})
        cu = src[f"{name}.cu"]
        loops = re.findall(r"for \((int64_t|int) (tilec_\w+_i|\w+) = [^;]*; [^;]*; ", cu)
        assert any(t == "int" and v == "tilec_k_i" for t, v in loops), (name, loops)
        assert not any(t != "int" and re.fullmatch(r"tilec_k\d*_i", v) for t, v in loops)
        bounds = re.findall(r"tilec_k\d*_i < \(int\)(?:tilec::imax\((?:\(int64_t\))?0, )*"
                            r"(?:tilec::imin\()*(\w+)", cu)
        assert bounds, name
        for bound in bounds:
            assert f"if ({bound} > 2147483647) return TILEC_ERR_UNSUPPORTED;" in cu, (name, bound)


def test_decode_gemv_reads_whole_weight_words_without_tests(monkeypatch):
    """The W4A16 decode GEMVs on the scalar units (a K loop around the row work) get a whole
    version too: when the block's columns lie inside N, N is a multiple of 8 and the tensors are
    aligned (tested once per block), each row's eight 4-bit weights are one word load and their
    scales one 16-byte load, with no per-word alignment test and no value-by-value path in that
    version. (`gemv_mma` takes these GEMVs by default; the knob measures the scalar one.)"""
    monkeypatch.setenv("TILEC_GEMV_MMA", "off")
    text = (SAMPLES / "w4a16.tile").read_text()
    gemvs = [k for name, k in cuda_kernel_sources(text, "w.tile").items()
             if "_gemv" in name and "_sum" not in name]
    assert gemvs
    for kernel in gemvs:
        assert "every vector group of this thread" in kernel, kernel[:200]
        test, rest = kernel.split("// every vector group of this thread", 1)
        whole, guarded = rest.split("} else {\n", 1)
        assert "tilec::words_aligned(Wq, N)" in test.rsplit("if (", 1)[1]
        assert "word4_whole(" in whole and "dequant4x8" in whole
        assert "word4(" not in whole and "load_vec4" not in whole and "load_vec<8" not in whole
        assert "word4(" in guarded  # the ragged or unaligned blocks: tested per word


@pytest.mark.nvcc
def test_matrix_unit_gemv_asks_l2_for_whole_lines_of_weights():
    """The W4A16 M=1 GEMV on the matrix units reads 32 bytes of each weight row per warp; its
    weight loads carry an L2 prefetch size hint of 128 bytes (the neighbouring blocks read the
    rest of the line at about the same time: measured 14.4 -> 12.7 us for the weights alone on
    the H200), through the read-only path."""
    need_nvcc()
    text = (SAMPLES / "w4a16.tile").read_text()
    gemv = [v for k, v in ptx_of(text, "w.tile").items() if "_gemv" in k and "_sum" not in k]
    assert gemv
    for body in gemv:
        assert "ld.global.nc.L2::128B.b32" in body


def test_a_calls_later_kernels_are_dependent_launches(monkeypatch):
    """A call's kernels after its first (a later launch slot, or a variant's later part) are
    launched by tilec::launch_after (a programmatic dependent launch where the device and the
    kernel's code allow it) and wait for the one before at their first statement, before any
    memory access; every kernel followed by another lets it launch early. A call of one
    kernel, and the HIP target, do neither; the wait is compiled for sm_90 on only."""
    from tilec.targets.cuda import launch_order
    text = ("kernel two(A: f32[M, K], B: f32[K, N], C: f32[N, P]) -> D: f32[M, P]:\n"
            "    D = (A @ B) @ C\n"
            "kernel one(X: f32[R, C]) -> Y: f32[R, C]:\n"
            "    Y = softmax(X, axis=-1)\n")
    src, _, m = compile_text(text, "pdl.tile", "cuda", options=SM90)
    prog = next(p for p in m.programs if p.name == "two")
    order = launch_order(prog)
    slots = prog.slots()
    assert len(slots) == 2
    for si, variants in enumerate(slots):
        for v in variants:
            for pi, k in enumerate(v):  # (the GEMV variants split K: two parts)
                assert order[k.name] == (si > 0 or pi > 0, si == 0 or pi < len(v) - 1), k.name
    single = next(p for p in m.programs if p.name == "one")
    assert set(launch_order(single).values()) == {(False, False)}
    files = driver.render(src, m, "cuda", SM90)
    cu = files["two.cu"] + files["one.cu"]

    def section(start: str, name: str):
        at = cu.index(start)
        return cu[cu.index("{", at) + 1:cu.index("\n}\n", at)]
    for k in prog.kernels + single.kernels:
        after, before = order.get(k.name, (False, False))
        body = section(f" {k.name}(const", k.name).lstrip()
        launcher = section(f"static int tilec_launch_{k.name}(", k.name)
        assert body.startswith("tilec::wait_for_prior();") == after, (k.name, body[:100])
        assert body.count("wait_for_prior") == after
        assert ("tilec::allow_dependents();" in body) == before, k.name
        assert (f"tilec::launch_after({k.name}," in launcher) == after, k.name
        assert ("<<<" in launcher) == (not after), k.name
    with monkeypatch.context() as mp:  # (the benchmarking knob: plain launches)
        mp.setenv("TILEC_DEPENDENT_LAUNCH", "0")
        plain = "".join(v for n, v in driver.render(src, m, "cuda", SM90).items()
                        if n.endswith(".cu"))
        assert "launch_after(" not in plain and "wait_for_prior()" not in plain
        mp.setenv("TILEC_DEPENDENT_LAUNCH", "2")
        with pytest.raises(TilecError, match="TILEC_DEPENDENT_LAUNCH"):
            driver.render(src, m, "cuda", SM90)
    hip_src, _, hip_m = compile_text(text, "pdl.tile", "hip")
    hip = "".join(driver.render(hip_src, hip_m, "hip", None).values())
    assert "wait_for_prior" not in hip and "allow_dependents" not in hip
    need_nvcc()
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name, text_ in files.items():
            Path(tmp, name).write_text(text_)
        for arch, some in (("sm_80", False), ("sm_90", True)):
            r = subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-ptx", "two.cu", "-o",
                                f"{arch}.ptx"], cwd=tmp, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            ptx = Path(tmp, f"{arch}.ptx").read_text()
            assert ("griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx) \
                == some, arch


def test_divisions_of_dimensions_are_computed_by_the_launcher():
    """64-bit divisions of dimensions alone (a split's rows per chunk, its number of splits, the
    grid) are kernel-level Lets of the lowered Tile IR (host_scalars) that the launcher computes
    and passes in: the split-K sum kernel divides nothing, its launcher does."""
    text = (SAMPLES / "w4a16.tile").read_text()
    kernels = cuda_kernel_sources(text, "w.tile")
    total = next(src for name, src in kernels.items() if name.endswith("_gemv_split_sum"))
    # (the only divisions left: the block index into block coordinates)
    assert "cdiv" not in total and total.count(" / ") == total.count("tilec_b / "), total[:600]
    src = driver.render(*[compile_text(text, "w.tile", "cuda", options=SM90)[i] for i in (0, 2)], "cuda",
                        {"arch": ("sm_90",)})
    cu = next(v for k, v in src.items() if k.endswith(".cu"))
    launcher = cu[cu.index("static int tilec_launch_w4a16_k0_gemv_split_sum"):]
    assert "const int64_t kc = " in launcher.split("<<<")[0]


def test_gemm_overlaps_the_end_of_its_k_loop_where_the_copies_lie_inside():
    """A GEMM's K loop ends with the wait for its next tiles and a barrier; the gemm runs its last
    k-step across them (the first fragments of the next tiles loading meanwhile), in the version
    of the loop whose copies all read whole 16-byte chunks inside the tensors: tested once per
    block, then copies without tests. The blocks at the tensors' edges take the version with
    tested copies and the plain gemm."""
    text = (SAMPLES / "gemm_bias_relu.tile").read_text()
    lowered = T.print_kernel(next(k for p in compile_text(text, "g.tile", "cuda", options=SM90)[2].programs
                                  for k in p.kernels if k.name == "gemm_bias_relu_k0"))
    assert "gemm_load(A_s[0], B_s[0], acc)" in lowered
    # the copies of a later tile into the stage this iteration read go into the gemm too, after
    # the barrier: tile k + S, S - 1 iterations ahead of its use
    assert re.search(r"gemm\(A_s\[k % (\d)\], B_s\[k % \1\], acc, then=\[wait\(\d\); barrier\(\)\], "
                     r"next=\(k \+ 1\) % \1, refill=\[if k \+ \1 < .*: "
                     r"copy_async\(A\[.*\], A_s\[k % \1\]\); copy_async\(B\[.*\], B_s\[k % \1\]\); "
                     r"commit\(\)\]\)", lowered), lowered
    assert "# copies inside their tensors if" in lowered
    kernel = cuda_kernel_sources(text)["gemm_bias_relu_k0"]
    test, rest = kernel.split("// the copies of every iteration read whole chunks inside the tensors", 1)
    cond = test.rsplit("if (", 1)[1]
    assert all(x in cond for x in ("<= M", "<= N", "<= K", "tilec_plan_A_A_s.chunks",
                                   "tilec_plan_B_B_s.chunks")), cond
    assert "tilec_frags_acc.load(" in test
    inside, edge = rest.split("} else {", 1)
    assert "copy_g2s_inside<" in inside and "copy_g2s<" not in inside
    assert "gemm_ss_overlapped(" in inside and inside.count("__syncthreads") == 1  # in the gemm
    assert "copy_g2s<" in edge and "gemm_ss<" in edge and "gemm_ss_overlapped" not in edge
    # the stages k % 3 and (k + 1) % 3 (the overlapped gemm's next): a 32-bit counter, not 64-bit
    # remainders
    for version in (inside, edge):
        assert re.search(r"tilec_k_mod(\d) = tilec_k_mod\1 \+ 1 == \1 \? 0", version)
        code = re.sub(r"//.*", "", version)
        assert ("wrap_add<" in code) == (version is inside)
        assert not re.search(r"k( \+ \d\))? % \d", code)


def test_gemm_epilogue_runs_unguarded_where_the_blocks_tile_lies_inside():
    """A GEMM's epilogue (a loop over the accumulator) runs twice: the blocks whose whole tile
    lies inside the output (and whose vector accesses are aligned), tested once per block, store
    without per-row tests or per-group counts; the blocks at the edges keep them. Attention's
    output loop (its accumulator from P in registers) keeps one version."""
    text = (SAMPLES / "gemm_bias_relu.tile").read_text()
    kernel = cuda_kernel_sources(text)["gemm_bias_relu_k0"]
    epilogue = kernel[kernel.rindex("tilec::cp_async_commit();"):]
    test, rest = epilogue.split("// the block's whole tile lies inside the tensors", 1)
    cond = test.rsplit("if (", 1)[1]
    assert all(x in cond for x in ("M - by * 128 >= 128", "N - bx * 128 >= 128",
                                   "vec_aligned<2, tilec::Plain<uint16_t>>(C)",
                                   "vec_aligned<2, tilec::Plain<uint16_t>>(bias)")), cond
    whole, edge = rest.split("} else {", 1)
    assert "< M" not in whole and "tilec::imin(" not in whole and "store_vec_whole<2" in whole
    assert "by * 128 + i < M" in edge and "tilec::imin(2, N - bx * 128" in edge
    assert "store_vec<2" in edge and "store_vec_whole" not in edge
    attention = cuda_kernel_sources((SAMPLES / "attention.tile").read_text())
    assert not any("the block's whole tile" in k for k in attention.values())


def test_gemm_epilogue_keeps_one_guarded_version_when_a_bound_moves_with_its_rows():
    """The whole-tile test is one test per block, before the epilogue loop: a column bound that
    moves with the loop's own row variable (here j < N - i) cannot be part of it, so only the
    guarded loop is rendered, and it keeps that bound per row."""
    from dataclasses import replace

    from tilec.passes.rewrite import map_stmts
    src, _, m = compile_text((SAMPLES / "gemm_bias_relu.tile").read_text(), "g.tile", "cuda", options=SM90)
    edited = []

    def moving_bound(st):
        if not (isinstance(st, T.For) and st.kind == "parallel" and st.vars == ("i", "j")):
            return None
        cols = st.body[0].cond.b  # (by * 128 + i < M) & (bx * 128 + j < N)
        assert cols.b == T.Var("N"), cols
        cols = replace(cols, b=T.isub(T.Var("N"), T.Var("i")))
        edited.append(st)
        return [replace(st, body=(replace(st.body[0], cond=replace(st.body[0].cond, b=cols)),))]

    prog = m.programs[0]
    # (the default GEMM kernel's: its variant on padded copies has the same loop)
    kernels = tuple(replace(k, body=map_stmts(k.body, moving_bound))
                    if k.name == "gemm_bias_relu_k0" else k for k in prog.kernels)
    assert len(edited) == 1  # the epilogue loop of the one GEMM kernel
    m = replace(m, programs=(replace(prog, kernels=kernels),) + tuple(m.programs[1:]))
    files = driver.render(src, m, "cuda", {"arch": ("sm_90",)})
    kernel = "\n".join(v for k, v in files.items() if k.endswith(".cu"))
    kernel = kernel[kernel.index("void __launch_bounds__(128, 1) gemm_bias_relu_k0("):]
    kernel = kernel[:kernel.index("\n}\n")]
    epilogue = kernel[kernel.rindex("tilec::cp_async_commit();"):]
    assert "the block's whole tile" not in epilogue
    assert "by * 128 + i < M" in epilogue and "N - i" in epilogue
    assert "store_vec<2" in epilogue and "store_vec_whole" not in epilogue


def test_window_offsets_that_grow_with_k_bound_the_copies_of_every_iteration():
    """A pipelined loop's copies lie inside their tensors in every iteration when the last
    window does, which holds for offsets that never decrease as k grows; the pipeline pass
    records no condition otherwise."""
    from tilec.passes.pipeline import _monotone
    k, c = T.Var("k"), T.iconst
    assert _monotone(T.iadd(T.imul(k, c(64)), T.Var("by")), "k")
    assert _monotone(T.idiv(T.iadd(T.imul(k, c(64)), c(2)), c(128)), "k")
    assert _monotone(T.Var("by"), "k")
    assert not _monotone(T.isub(T.Var("K"), k), "k")
    assert not _monotone(T.imod(k, c(3)), "k")
    assert not _monotone(T.imul(k, T.Var("s")), "k")  # s may be negative


def test_whole_vector_loads_say_whether_they_read_once_or_global_memory():
    """An elementwise kernel's inputs shaped like its output are read once: their 16-byte loads
    are evict-first (LOAD_ONCE). A broadcast operand (read by every row) and row kernels' inputs
    are other global inputs (LOAD_GLOBAL, whose L2 policy TILEC_LOAD_FORM chooses)."""
    text = """
kernel ew(X: f16[R, C], w: f16[C]) -> Y: f16[R, C]:
    Y = silu(X * 0.5 + 1.0) * X * w
""" + RMSNORM16
    kernels = cuda_kernel_sources(text)
    ew = next(v for k, v in kernels.items() if k.startswith("ew_"))
    whole = r"load_vec_whole<\d+, [\w:<>]+, tilec::(\w+)>\(\w+, (\w+) \+"
    assert {(b, h) for h, b in re.findall(whole, ew)} == {("X", "LOAD_ONCE"), ("w", "LOAD_GLOBAL")}
    rms = "".join(v for k, v in kernels.items() if k.startswith("rms_"))
    assert {(b, h) for h, b in re.findall(whole, rms)} == {("X", "LOAD_GLOBAL"), ("w", "LOAD_GLOBAL")}
    assert not re.search(r"load_vec_whole<\d+, [\w:<>]+>\(", ew + rms)


def nvcc_warnings(text: str, name: str, arch: str) -> list:
    """nvcc's warnings for text's CUDA sources (compiled with -c for `arch`)."""
    return [line for _, r, _ in nvcc_each(text, name, [f"-arch={arch}", "-c", "-o", os.devnull])
            for line in warning_lines(r.stderr)]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_program_compiles(name):
    need_nvcc()
    text = REGRESSIONS[name][0].replace("target cpu:", "target cuda:")
    assert nvcc_warnings(text, f"{name}.tile", "sm_80") == []


SHARED = """
kernel twice(x: f16[R, C]) -> (o0: f16[R, C], o1: f16[R, C]):
    o0 = (sigmoid(x) + 0.25) ** 0.5
    o1 = o0 * o0

kernel once(x: f16[R, C]) -> o1: f16[R, C]:
    o1 = (sigmoid(x) + 0.25) ** 0.5 * 3.0

kernel guarded(x: bf16[R, C]) -> y: bf16[R, C]:
    y = where(x > 0.0, sqrt(f32(x)) * sqrt(f32(x)), exp(f32(x)) + exp(f32(x)))
"""


@pytest.mark.parametrize("share", ["1", "0"])
def test_repeated_values_are_computed_once(monkeypatch, share):
    """A value an element's statements repeat (o0, read by both outputs and twice by o1) is
    computed once per element, into a local: `twice` renders sigmoid and sqrt as often as
    `once`, whose expression has no repeat (nvcc does not merge the repeats itself: its f16
    conversions are asm). Values inside a select's branches stay there (C evaluates only the
    branch taken). TILEC_SHARED_VALUES=0 renders every repeat (the test's other half)."""
    monkeypatch.setenv("TILEC_SHARED_VALUES", share)
    srcs = cuda_kernel_sources(SHARED)
    for fn in ("tilec::sigmoid(", "tilec::sqrt("):
        n_twice, n_once = srcs["twice_k0"].count(fn), srcs["once_k0"].count(fn)
        assert n_once > 0 and (n_twice == n_once) == (share == "1"), (fn, n_twice, n_once)
    guarded = srcs["guarded_k0"]
    assert "tilec::sqrt(" in guarded and guarded.count("tilec::sqrt(") % 2 == 0
    assert not re.search(r"const auto tilec_c\d+ = [^;]*(sqrt|exp)\(", guarded)
    monkeypatch.setenv("TILEC_SHARED_VALUES", "2")
    with pytest.raises(TilecError, match="TILEC_SHARED_VALUES=2: expected 1 or 0"):
        cuda_kernel_sources(SHARED)


def test_no_lowered_kernel_keeps_a_fragment_nothing_reads():
    """A fragment written but never read (square_transpose_minus_its_max cached X's rows and then
    read X transposed from memory: nvcc warned "set but never used") is dropped with its stores:
    in every lowered CUDA kernel of the samples and the regressions, each fragment is read."""
    from tilec.passes.lower_reductions import drop_dead_fragments
    texts = [(p.name, p.read_text()) for p in SAMPLE_FILES]
    texts += [(f"{n}.tile", REGRESSIONS[n][0].replace("target cpu:", "target cuda:"))
              for n in sorted(REGRESSIONS)]
    for name, text in texts:
        _, _, m = compile_text(text, name, "cuda", options=SM90)
        for k in (k for p in m.programs for k in p.kernels):
            assert drop_dead_fragments(k.body) == k.body, f"{name}: {k.name}"
    _, _, m = compile_text(REGRESSIONS["square_transpose_minus_its_max"][0], "k.tile", "cuda", options=SM90)
    assert not any(isinstance(a, T.Alloc) and a.name == "X_row"
                   for p in m.programs for k in p.kernels for a in T.walk_stmts(k.body))


# random programs compiled for CUDA by nvcc without a warning (5012: a scalar no kernel read,
# and an fp8 output; 8010: two fp8 outputs)
@pytest.mark.nvcc
@pytest.mark.parametrize("seed", [5012, 5017, 6010, 6042, 7005, 7077, 8010])
def test_random_program_compiles_warning_free(seed):
    need_nvcc()
    from random_programs import random_program
    text = random_program(seed).text.replace("target cpu:", "target cuda:")
    assert nvcc_warnings(text, "rnd.tile", "sm_90") == []


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [5012, 8004, 8010, 8012, 8015])
def test_random_programs_with_fp8_outputs_on_gpu(seed):
    """Random programs that declare fp8 outputs (row kernels, elementwise chains, GEMMs: fp8
    tile buffers hold their bits) against the reference."""
    need_gpu()
    from random_programs import random_program
    text = random_program(seed).text.replace("target cpu:", "target cuda:")
    assert "fp8" in text
    check_text(text, None, name="rnd.tile", target="cuda", options=GPU_OPTIONS)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(24))
def test_random_gemm_fusions_on_gpu(seed):
    """Random KernelBench-style GEMM fusions (tests/random_gemm_fusions.py: prologues,
    transposes, batches, epilogue chains, row reductions) against the reference, at sizes whose
    rows suit TMA (the Hopper kernels under sm_90a), sizes that do not, and M = 1; every other
    f32 program under `precision tf32` (tf32 wgmma where its operands are K-major)."""
    import random

    from random_gemm_fusions import program
    need_gpu()
    text = program(random.Random(seed))
    if "f32[" in text.split("->")[0].split(",")[0] and seed % 2:
        text += "\nschedule g:\n    target cuda:\n        precision tf32\n"
    for dims in ({"M": 200, "K": 264, "N": 136, "B": 2}, {"M": 33, "K": 70, "N": 129, "B": 2},
                 {"M": 1, "K": 96, "N": 40, "B": 1}):
        check_text(text, dims, name=f"rgf{seed}.tile", target="cuda", options=GPU_OPTIONS)


def cuda_dump(path) -> str:
    """`tilec dump-ir --stage tiled --target cuda` of a sample."""
    m0 = driver.frontend(driver.Source(path.name, path.read_text()))
    return driver.print_stage(driver.stage_module(m0, "tiled", "cuda", options=SM90), "tiled")


@pytest.mark.nvcc
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_cuda_dump_builds(path):
    """Every kernel of the CUDA tiling's dump builds as a tile-level kernel."""
    need_nvcc()
    m, out = build_text(cuda_dump(path), "dump.tile", "cuda", {"arch": ("sm_80",)})
    assert (out / "libdump.so").exists()


# ---- on a GPU -------------------------------------------------------------------------------------
GPU_SIZES = {
    # tile multiples of the CUDA defaults (GEMM 128 x 128 x 64, attention 128 x 32 and causal
    # 128 x 64, rows 256..)
    "gemm_bias_relu": [dict(M=256, N=256, K=256), dict(M=17, N=1000, K=40), dict(M=1, N=1, K=1)],
    "gemm_gelu_softmax": [dict(M=128, N=256, K=64), dict(M=33, N=17, K=100)],
    "batched_matmul": [dict(B=2, M=128, N=128, K=64), dict(B=3, M=17, N=31, K=9),
                       dict(B=3, M=7, N=100, K=1500)],  # the last: split over K
    "w4a16": [dict(M=128, N=256, K=256), dict(M=1, N=1000, K=384), dict(M=16, N=64, K=128),
              dict(M=100, N=17, K=128), dict(M=1, N=1000, K=2048), dict(M=3, N=130, K=1280),
              # GEMVs whose blocks' columns are all whole (N a multiple of 256), split over K
              # and not
              dict(M=1, N=1024, K=2048), dict(M=1, N=768, K=4096), dict(M=1, N=33024, K=256)],
    # weights packed along K: GEMVs split over K and not, columns cut at N, K tails that cut a
    # 128-row chunk, and the tiled path (M > 1)
    "w4a16_kmajor": [dict(M=1, N=1024, K=2048), dict(M=1, N=8192, K=1024), dict(M=1, N=200, K=384),
                     dict(M=1, N=17, K=128), dict(M=1, N=4096, K=4224), dict(M=16, N=64, K=256),
                     dict(M=3, N=130, K=1280)],
    # head dims exactly 64, 96 and 128 (their exact variants), and between (the run-time ones)
    "attention": [dict(B=1, H=2, L=128, S=128, D=64), dict(B=2, H=1, L=17, S=1000, D=32),
                  dict(B=1, H=1, L=1, S=1, D=1), dict(B=1, H=3, L=200, S=70, D=128),
                  dict(B=1, H=1, L=130, S=200, D=100), dict(B=1, H=2, L=70, S=130, D=96),
                  dict(B=2, H=1, L=33, S=65, D=80)],
    "causal_attention": [dict(B=2, H=1, L=256, D=64), dict(B=1, H=2, L=1000, D=100),
                         dict(B=1, H=1, L=300, D=128), dict(B=1, H=1, L=200, D=96)],
    "elementwise_chain": [dict(R=16, C=4096), dict(R=17, C=1000), dict(R=1, C=1)],
    "softmax": [dict(R=64, C=1024), dict(R=17, C=1000), dict(R=3, C=20000), dict(R=1, C=1)],
    "rmsnorm": [dict(R=64, C=1024), dict(R=5, C=17), dict(R=2, C=17000)],
    "layernorm": [dict(R=32, C=4096), dict(R=17, C=1000), dict(R=2, C=16385)],
    "multi_output": [dict(R=32, C=256), dict(R=17, C=100)],
    # tf32 tiles of 128 x 128 x 32; split over K; the decode tile; a GEMV
    "linear_tf32": [dict(M=128, N=128, K=64), dict(M=100, N=72, K=300), dict(M=5, N=130, K=1000),
                    dict(M=1, N=17, K=9)],
}


@pytest.mark.gpu
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_sample_on_gpu(path):
    need_gpu()
    assert path.stem in GPU_SIZES
    for dims in GPU_SIZES[path.stem] + [None]:  # None: the runner's default (100-ish) sizes
        check_text(path.read_text(), dims, name=path.name, target="cuda",
                   options=GPU_OPTIONS)


TILE_GPU_SIZES = [dict(M=256, N=256, K=256, B=1, H=2, L=256, S=128),
                  dict(M=17, N=1000, K=384, B=2, H=1, L=17, S=1000), dict(M=1, N=1, K=128, B=1,
                                                                        H=1, L=1, S=1)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", TILE_SAMPLES, ids=lambda p: p.stem)
def test_tile_sample_on_gpu(path):
    need_gpu()
    for dims in TILE_GPU_SIZES + [None]:
        check_text(path.read_text(), dims, name=path.name, target="cuda",
                   options=GPU_OPTIONS)


@pytest.mark.gpu
def test_hand_written_gemv_mma_on_gpu():
    """A hand-written gemv_mma with column counts that are and are not multiples of 8 (the
    device function's value-by-value path), a block's columns cut at N, and a first chunk cut."""
    need_gpu()
    from test_tile_level import GEMV_MMA, GEMV_MMA_ROWS
    for dims in (dict(M=1, K=384, N=264), dict(M=2, K=256, N=261), dict(M=1, K=1280, N=7)):
        check_text(GEMV_MMA, dims, name="gemv_mma.tile", target="cuda",
                   options=GPU_OPTIONS)
    # 8 rows of A at once (a last block of 3 rows; N = 100 and 7: value by value)
    for dims in (dict(M=11, K=384, N=264), dict(M=11, K=384, N=100), dict(M=8, K=256, N=7)):
        check_text(GEMV_MMA_ROWS, dims, name="gemv_mma_rows.tile", target="cuda",
                   options=GPU_OPTIONS)


GEMV_KMAJOR = """
kernel gk_f16_i4(A: f16[M, K], Wq: i4[N, K], s: f16[N, K // 32]) -> C: f16[M, N]:
    assume K % 32 == 0
    C = A @ dequant(Wq.T, s.T, zero=0, group=32)

kernel gk_bf16_u4(A: bf16[M, K], Wq: u4[N, K], s: bf16[N, K // 64]) -> C: bf16[M, N]:
    assume K % 64 == 0
    C = A @ dequant(Wq.T, s.T, zero=3, group=64)
"""

GEMV_KMAJOR_ANY = """
kernel gk_any(A: bf16[M, K], Wq: u4[N, K], s: bf16[N, cdiv(K, 16)]) -> C: bf16[M, N]:
    C = A @ dequant(Wq.T, s.T, zero=8, group=16)
"""


@pytest.mark.gpu
def test_kmajor_gemv_on_gpu():
    """The GEMV of weights packed along K on f16 and bf16, signed and unsigned nibbles, zero
    points 0 and 3, groups of 32 and 64 rows (a lane's 32 rows lie in one group), warps' chunks
    cut by K, columns cut at N; and groups of 16 rows or K not a multiple of 32 (the
    value-by-value path)."""
    need_gpu()
    for dims in (dict(M=1, K=1216, N=512), dict(M=1, K=1216, N=520), dict(M=1, K=64, N=64),
                 dict(M=1, K=8192, N=48)):
        check_text(GEMV_KMAJOR, dims, name="gemv_kmajor.tile", target="cuda",
                   options=GPU_OPTIONS)
    for dims in (dict(M=1, K=200, N=40), dict(M=1, K=1024, N=72)):
        check_text(GEMV_KMAJOR_ANY, dims, name="gemv_kmajor_any.tile", target="cuda",
                   options=GPU_OPTIONS)


GEMV_GROUPS = """
kernel gv_f16_i4(A: f16[M, K], Wq: i4[K, N], s: f16[K // 32, N]) -> C: f16[M, N]:
    assume K % 32 == 0
    C = A @ dequant(Wq, s, zero=0, group=32)

kernel gv_bf16_u4(A: bf16[M, K], Wq: u4[K, N], s: bf16[K // 64, N]) -> C: bf16[M, N]:
    assume K % 64 == 0
    C = A @ dequant(Wq, s, zero=3, group=64)
"""


@pytest.mark.gpu
def test_decode_gemv_groups_on_gpu():
    """The matrix-unit GEMV on f16 and bf16, signed and unsigned nibbles, zero points other than 8,
    and groups of 32 and 64 rows that the warps' row ranges (3 chunks of 16 at K = 1216) cut in
    the middle, with whole and ragged column blocks."""
    need_gpu()
    for dims in (dict(M=1, K=1216, N=512), dict(M=1, K=1216, N=520), dict(M=1, K=64, N=64)):
        check_text(GEMV_GROUPS, dims, name="gemv_groups.tile", target="cuda",
                   options=GPU_OPTIONS)


@pytest.mark.gpu
def test_decode_gemv_of_several_rows_on_gpu():
    """The matrix-unit GEMVs of several rows of A (decode batches of 2 to 16 rows, one block
    taking up to 8 or 16 of them), in both weight layouts, at row counts that do and do not fill
    the block's rows, K cut in the middle of the warps' chunks, whole and ragged column blocks,
    split over K (K = 1216) and not; the routines' value-by-value paths too (K-major groups of
    16 rows)."""
    need_gpu()
    for M in (2, 8, 11, 16):
        for dims in (dict(M=M, K=1216, N=520), dict(M=M, K=64, N=64)):
            check_text(GEMV_GROUPS, dims, name="gemv_groups.tile", target="cuda",
                       options=GPU_OPTIONS)
            check_text(GEMV_KMAJOR, dims, name="gemv_kmajor.tile", target="cuda",
                       options=GPU_OPTIONS)
        check_text(GEMV_KMAJOR_ANY, dict(M=M, K=200, N=40), name="gemv_kmajor_any.tile",
                   target="cuda", options=GPU_OPTIONS)


@pytest.mark.gpu
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_cuda_dump_matches_reference_on_gpu(path):
    """Each kernel of the CUDA tiling's dump, built and run on its own, matches the Tile IR
    interpreter. (B = 3 where a kernel has it: batched_matmul's dump sizes the rows of its GEMV
    kernels by B, which the interpreter walks one by one: 160 s at the default 100.)"""
    need_gpu()
    check_text(cuda_dump(path), {"B": 3}, name="dump.tile", target="cuda", options=GPU_OPTIONS)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_program_on_gpu(name):
    need_gpu()
    text, dims, seed, _ = REGRESSIONS[name]
    check_text(text.replace("target cpu:", "target cuda:"), dims, seed, target="cuda",
               options=GPU_OPTIONS)


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0, 5, -70])
def test_causal_skipping_on_gpu(shift):
    need_gpu()
    from test_fusion import CAUSAL_SHIFTED
    text = CAUSAL_SHIFTED.replace("SHIFT", str(shift)).replace("f32", "f16")
    for dims in (dict(L=200, S=200, D=64), dict(L=64, S=300, D=32), dict(L=1, S=1, D=1)):
        check_text(text, dims, target="cuda", options=GPU_OPTIONS)


@pytest.mark.gpu
def test_a_loop_of_2_31_tiles_is_unsupported_on_gpu():
    """A key loop of 2^32 tiles (S = 2^37) would wrap its 32-bit counter: the launcher returns
    TILEC_ERR_UNSUPPORTED before launching (the pointers are never read)."""
    need_gpu()
    import ctypes
    _, out = build_text((SAMPLES / "attention.tile").read_text(), "attention.tile", "cuda",
                        GPU_OPTIONS)
    f = ctypes.CDLL(str(out / "libattention.so")).attention
    f.restype = ctypes.c_int
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    q, o, k, v = 1 << 12, 1 << 13, 1 << 40, 1 << 41  # disjoint ranges, never dereferenced
    # (B = H = L = 1: one block; D = 1: the D <= 64 variant, whose other limits all hold)
    st = f(P(q), P(k), P(v), P(o), I64(1), I64(1), I64(1), I64(1), I64(1 << 37), P(None))
    assert st == 9, st  # TILEC_ERR_UNSUPPORTED


@pytest.mark.gpu
def test_attention_variants_on_gpu():
    need_gpu()
    from test_fusion import ATTENTION_VARIANTS
    for dims in (dict(H=2, L=64, S=128, D=32, E=48, B=2), dict(H=2, L=70, S=33, D=5, E=7, B=1)):
        check_text(ATTENTION_VARIANTS, dims, target="cuda", options=GPU_OPTIONS)


@pytest.mark.nvcc
def test_attention_variants_compile():
    """f32 probabilities (the scalar product with A in registers), a mask tensor, Dv != Dk,
    bf16, shifted causal masks."""
    need_nvcc()
    from test_fusion import ATTENTION_VARIANTS, CAUSAL_SHIFTED
    build_text(ATTENTION_VARIANTS, "variants.tile", "cuda", {"arch": ("sm_80",)})
    build_text(CAUSAL_SHIFTED.replace("SHIFT", "-3"), "shifted.tile", "cuda", {"arch": ("sm_80",)})


@pytest.mark.nvcc
def test_cuda_schedule_tile_leaves_row_kernels_one_row_per_block():
    """A GEMM schedule's `tile M=` must not turn a row kernel of the same program into a
    multi-row block (the GPU row layout holds one row)."""
    need_nvcc()
    text = """
kernel k(A: f16[M, K], W: f16[K, N]) -> P: f32[M, N]:
    P = softmax(A @ W, axis=-1)

schedule k:
    target cuda:
        tile M=64, N=64, K=32
"""
    _, _, m = compile_text(text, "k.tile", "cuda", options=SM90)
    row = [k for k in m.programs[0].kernels if "row reduction" in k.comment]
    assert row and all(T.fmt(k.grid[0]) == "M" for k in row)
    build_text(text, "k.tile", "cuda", {"arch": ("sm_80",)})


# ---- 16-bit arithmetic and dequantization in 16-bit registers ------------------------------------
EXACT16 = """
kernel dq_u4_f16(Wq: u4[K, N], s: f16[K // 32, N]) -> Y: f16[K, N]:
    assume K % 32 == 0
    Y = f16(dequant(Wq, s, zero=8, group=32))

kernel dq_i4_bf16(Wq: i4[K, N], s: bf16[K // 32, N]) -> Y: bf16[K, N]:
    assume K % 32 == 0
    Y = bf16(dequant(Wq, s, group=32))

kernel dq_u4_bf16_z3(Wq: u4[K, N], s: bf16[K // 16, N]) -> Y: bf16[K, N]:
    assume K % 16 == 0
    Y = bf16(dequant(Wq, s, zero=3, group=16))

kernel dq_bf16_z130(Wq: u4[K, N], s: bf16[K // 16, N]) -> Y: bf16[K, N]:
    assume K % 16 == 0
    Y = bf16(dequant(Wq, s, zero=130, group=16))

kernel dq_bf16_z131(Wq: u4[K, N], s: bf16[K // 16, N]) -> Y: bf16[K, N]:
    assume K % 16 == 0
    Y = bf16(dequant(Wq, s, zero=131, group=16))

kernel half_ops(X: f16[R, C], W: f16[R, C]) -> Z: f16[R, C]:
    Z = (X * W - X) * 0.5 + maximum(X, -W) - abs(W)

kernel bhalf_ops(X: bf16[R, C], W: bf16[R, C]) -> Z: bf16[R, C]:
    Z = (X * W - X) * 0.5 + minimum(X, -W)
"""


def test_sixteen_bit_operations_render_as_sixteen_bit_instructions():
    """f16/bf16 add, subtract, multiply, maximum, negate and abs of 16-bit values run on the
    values' bits (one correctly rounded 16-bit instruction each: the same bits as the f32
    operation rounded once), and 4-bit dequantization of whole aligned groups runs two values
    per instruction; nothing converts a 16-bit result to f32 and back between two such ops."""
    _, _, m = compile_text(EXACT16, "exact.tile", "cuda", options=SM90)
    from tilec.targets.cuda import render_kernel
    src = {k.name: "\n".join(render_kernel(k, g.symbols, driver.get_target("cuda"))["body"])
           for g, p in zip(m.graphs, m.programs) for k in p.kernels}
    assert "__hmul_rn(" in src["half_ops_k0"] and "__hmax_nan(" in src["half_ops_k0"]
    assert "__hmin_nan(" in src["bhalf_ops_k0"]
    for name in ("half_ops_k0", "bhalf_ops_k0"):
        assert "round_f16" not in src[name] and "round_bf16" not in src[name]
    assert "dequant4x8<tilec::F16, false>" in src["dq_u4_f16_k0"]
    assert "0x64086408u" in src["dq_u4_f16_k0"]  # 1024 + zero 8
    assert "dequant4x8<tilec::BF16, true>" in src["dq_i4_bf16_k0"]
    assert "0x43084308u" in src["dq_i4_bf16_k0"]  # 128 + the sign flip's 8
    assert "0x43034303u" in src["dq_u4_bf16_z3_k0"]
    # 128 + 130 = 258 is a bf16 value; 128 + 131 = 259 is not (bf16 holds even integers past
    # 256), so that zero point takes the value-by-value path
    assert "0x43814381u" in src["dq_bf16_z130_k0"]
    assert "dequant4x8" not in src["dq_bf16_z131_k0"]


@pytest.mark.gpu
def test_sixteen_bit_results_are_bit_exact_on_gpu():
    """The 16-bit instructions and the paired dequantization give exactly the reference's bits,
    on whole aligned groups (N = 64) and on the value-by-value path (odd N: unaligned words)."""
    need_gpu()
    for dims in (dict(K=128, N=64, R=9, C=4096), dict(K=96, N=51, R=17, C=1001)):
        res = check_text(EXACT16, dims, target="cuda", options=GPU_OPTIONS)
        for name, r in res.items():
            assert all(e == 0 for e in r.errors.values()), (name, dims, r.errors)


def test_row_kernel_threads_follow_the_row_capacity_unless_scheduled():
    """Short rows get fewer threads per block (more rows per SM), as the
    target's table says; a schedule's `threads` fixes them for every variant (and applies to row
    kernels at all)."""
    text = """
kernel sm(X: f16[R, C]) -> Y: f16[R, C]:
    Y = softmax(X, axis=-1)

kernel sm_fixed(X: f16[R, C]) -> Y: f16[R, C]:
    Y = softmax(X, axis=-1)

schedule sm_fixed:
    target cuda:
        threads 64
"""
    _, _, m = compile_text(text, "rows.tile", "cuda", options=SM90)
    table = driver.get_target("cuda").resources.row_threads_by_capacity
    kernels = {k.name: k for p in m.programs for k in p.kernels}
    for name, k in kernels.items():
        cap = re.search(r"_C(\d+)$", name)
        if name.startswith("sm_fixed"):
            assert k.threads == 64, name
        elif cap:
            default = driver.get_target("cuda").resources.row_threads
            assert k.threads == next((t for top, t in table if int(cap.group(1)) <= top), default), name
    assert kernels["sm_k0_C256"].threads < kernels["sm_k0_C8192"].threads


RENDER_ALL = """
import sys
from pathlib import Path
from tilec import driver
for path in sorted(Path(sys.argv[1]).glob("*.tile")):
    src = driver.Source(path.name, path.read_text())
    for target in ("cpu", "cuda"):
        files = driver.render(src, driver.compile_module(driver.frontend(src), target), target)
        for name in sorted(files):
            print(f"==== {target} {path.name} {name}")
            print(files[name])
"""


def test_generated_sources_do_not_depend_on_python_hash_seeds():
    """The same .tile file gives byte-identical sources in every run: nothing iterates a set
    of IR nodes or names in hash order (the decode GEMV's deferred word loads once did)."""
    outs = []
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        r = subprocess.run([sys.executable, "-c", RENDER_ALL, str(SAMPLES)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2]


# ---- precision tf32 -----------------------------------------------------------------------------
TF32 = """
kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:
    C = A @ B

kernel mm_bt_relu(A: f32[M, K], B: f32[N, K], bias: f32[N]) -> C: f32[M, N]:
    C = relu(A @ B.T + bias)

kernel bmm(A: f32[Bt, M, K], B: f32[Bt, K, N]) -> C: f32[Bt, M, N]:
    C = A @ B

kernel att(Q: f32[Bt, M, D], Kt: f32[Bt, N, D], V: f32[Bt, N, D]) -> C: f32[Bt, M, D]:
    C = softmax(Q @ Kt.T, axis=-1) @ V
"""
TF32_SCHEDULES = "".join(f"\nschedule {k}:\n    target cuda:\n        precision tf32\n"
                         for k in ("mm", "mm_bt_relu", "bmm", "att"))


def tile_gemms(text: str, target: str = "cuda") -> list:
    """(kernel, gemm statement) of every lowered kernel of text."""
    _, _, m = compile_text(text, "tf32.tile", target, options=SM90 if target == "cuda" else None)
    return [(k.name, s) for p in m.programs for k in p.kernels for s in T.walk_stmts(k.body)
            if isinstance(s, T.Gemm)]


def test_precision_tf32_marks_the_f32_gemms_and_pads_their_operands():
    """Under `precision tf32` every tile GEMM of f32 operands is marked (and printed) tf32 and
    its shared operands get rows padded for conflict-free fragment loads; without the schedule
    (`ieee`, the default) none is, and on the CPU the key changes nothing."""
    gemms = tile_gemms(TF32 + TF32_SCHEDULES)
    # every gemm but attention's P @ V (P in registers: exact f32)
    assert gemms and all(s.tf32 == (s.a != "S") for _, s in gemms)
    assert {s.a for _, s in gemms if not s.tf32} == {"S"}
    assert not any(s.tf32 for _, s in tile_gemms(TF32))
    assert not any(s.tf32 for _, s in tile_gemms(
        TF32 + TF32_SCHEDULES.replace("target cuda", "target cpu"), "cpu"))
    dump = driver.print_stage(driver.stage_module(driver.frontend(driver.Source(
        "t.tile", TF32 + TF32_SCHEDULES)), "lowered", "cuda"), "lowered")
    assert "precision=tf32" in dump and "rows padded by 4" in dump and "rows padded by 8" in dump


@pytest.mark.parametrize("cols", [16, 32, 64, 128, 136])
@pytest.mark.parametrize("operand,transposed", [("a", False), ("a", True), ("b", False), ("b", True)])
def test_tf32_operand_padding_puts_each_fragment_load_in_32_banks(cols, operand, transposed):
    """The 32 lanes' words of one fragment load (lane (g, c): row or column g, k = c) fall in 32
    different banks of the padded tile, for every operand orientation."""
    from tilec.passes.layout import tf32_pad
    g = T.Gemm("A", "B", "C", transpose_a=transposed, transpose_b=transposed)
    name = "A" if operand == "a" else "B"
    pad = tf32_pad(cols, g, name)
    assert pad % 4 == 0 and pad < 16
    rows_are_k = (operand == "a") == transposed
    banks = set()
    for lane in range(32):
        gi, c = lane // 4, lane % 4
        r, col = (c, gi) if rows_are_k else (gi, c)
        banks.add((r * (cols + pad) + col) % 32)
    assert len(banks) == 32


@pytest.mark.parametrize("dtype, elem", [("f32", 4), ("f64", 8), ("i8", 1), ("i32", 4)])
@pytest.mark.parametrize("cols", [16, 32, 64, 128])
@pytest.mark.parametrize("operand,transposed", [("a", False), ("a", True), ("b", False), ("b", True)])
def test_scalar_gemm_operands_read_each_load_from_distinct_banks(dtype, elem, cols, operand,
                                                                 transposed):
    """gemm_simt's loads at one k (lane (g, c): A's row g, or a transposed B's row 2c + v) hit
    distinct banks in the layout the pass gives the tile, padded or XOR-swizzled (both forms
    checked), for every operand orientation, and so do its 16-byte loads along k; tiles whose
    rows are k keep their plain rows."""
    from tilec.passes.layout import simt_pad
    g = T.Gemm("A", "B", "C", transpose_a=transposed, transpose_b=transposed)
    name = "A" if operand == "a" else "B"
    pad = simt_pad(cols, elem, g, name)
    rows_are_k = (operand == "a") == transposed
    if rows_are_k:
        assert pad == 0
        return
    assert pad * elem % 16 == 0  # (0: the plain rows are conflict-free already)
    rows = range(8) if operand == "a" else (0, 2, 4, 6)
    per = 16 // elem if elem < 16 else 1  # (elements of a 16-byte chunk)

    def swizzled(r, c):  # tilec_cuda.h's SwizzledTile
        cpr = cols // per
        s = min(cpr, 8)
        return r * cols + ((c // per) ^ ((r // (8 // s)) % s)) * per + c % per

    for offset in (lambda r, c: r * (cols + pad) + c, swizzled):
        for k in range(cols):
            banks = [(offset(r, k) * elem // 4 + w) % 32 for r in rows
                     for w in range(max(elem // 4, 1))]
            assert len(set(banks)) == len(banks), (offset, k, banks)
        if elem in (4, 8):
            # 4- and 8-byte values are read 16 bytes along k at once (ld.shared.v4 / v2, from
            # k a multiple of `per`): each row's chunk is whole, aligned, in banks of its own
            for k in range(0, cols, per):
                chunks = [offset(r, k) * elem for r in rows]
                assert all(offset(r, k + i) == offset(r, k) + i for r in rows for i in range(per))
                assert all(c % 16 == 0 for c in chunks)
                assert len({c // 16 % 8 for c in chunks}) == len(rows), (offset, k, chunks)


def test_scalar_gemm_warp_grid_reads_the_fewest_operand_values(monkeypatch):
    """A 64 x 128 accumulator on the scalar units takes 1 x 4 warps (64 x 32 each: a lane reads
    8 values of A and 8 of B per k), not the matrix units' 2 x 2 (4 + 16); a 16-bit product on
    mma.sync keeps the matrix units' grid; TILEC_SIMT_GRID=0 gives the f32 one that grid too."""
    text = ("kernel g(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n\n"
            "kernel h(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N]:\n    C = A @ B\n")

    def acc_layouts():
        dump = driver.print_stage(driver.stage_module(driver.frontend(driver.Source(
            "s.tile", text)), "lowered", "cuda", options=SM90), "lowered")
        kernels = {k.split("(")[0]: k for k in dump.split("kernel ")}
        return kernels["g_k0"], kernels["h_k0"]
    g, h = acc_layouts()
    assert "acc = fragment(f32, [64, 128])  # layout: mma(warps 1x4, warp tile 64x32" in g
    assert "acc = fragment(f32, [128, 128])  # layout: mma(warps 2x2, warp tile 64x64" in h
    monkeypatch.setenv("TILEC_SIMT_GRID", "0")
    g, h2 = acc_layouts()
    assert "acc = fragment(f32, [64, 128])  # layout: mma(warps 2x2, warp tile 32x64" in g
    assert h2 == h
    monkeypatch.setenv("TILEC_SIMT_GRID", "2")
    with pytest.raises(TilecError, match="TILEC_SIMT_GRID=2: expected 1 or 0"):
        acc_layouts()


def test_scalar_gemm_of_k_major_operands_takes_two_stages_and_three_blocks(monkeypatch):
    """X @ W.T on the scalar units (both operands read 16 bytes along K) is pipelined 2 deep and
    bounded for 3 blocks per SM (registers capped at 168); A @ B keeps 3 stages and one
    block's bound, and so do one whose schedule sets any of tile, threads or stages and one
    whose operand is computed on its way to shared memory (gelu(A): it spilled so), and f64's
    (twice the accumulator registers: it spilled 1 KB);
    TILEC_SIMT_BLOCKS sets the bound of both."""
    text = ("kernel g(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n\n"
            "kernel h(A: f32[M, K], W: f32[N, K]) -> C: f32[M, N]:\n    C = A @ W.T\n\n"
            "kernel s(A: f32[M, K], W: f32[N, K]) -> C: f32[M, N]:\n    C = A @ W.T\n\n"
            "kernel p(A: f32[M, K], W: f32[N, K]) -> C: f32[M, N]:\n    C = gelu(A) @ W.T\n\n"
            "kernel d(A: f64[M, K], W: f64[N, K]) -> C: f64[M, N]:\n    C = A @ W.T\n\n"
            "schedule s:\n    target cuda:\n        threads 256\n")

    def k0s():
        _, _, m = compile_text(text, "s.tile", "cuda", options=SM90)
        return {k.name: k for p in m.programs for k in p.kernels if k.name.endswith("_k0")}
    ks = k0s()
    assert {n: k.blocks_per_sm for n, k in ks.items()} == {"g_k0": 1, "h_k0": 3, "s_k0": 1,
                                                            "p_k0": 1, "d_k0": 1}
    stages = {n: next(st.shape[0].value for st in T.walk_stmts(k.body) if isinstance(st, T.Alloc)
                      and st.scope == "shared" and len(st.shape) == 3) for n, k in ks.items()}
    assert stages == {"g_k0": 3, "h_k0": 2, "s_k0": 3, "p_k0": 3, "d_k0": 3}
    src, _, m = compile_text(text, "s.tile", "cuda", options=SM90)
    cu = driver.render(src, m, "cuda", SM90)
    assert "__launch_bounds__(128, 3) h_k0(" in cu["h.cu"]
    assert "__launch_bounds__(128, 1) g_k0(" in cu["g.cu"]
    monkeypatch.setenv("TILEC_SIMT_BLOCKS", "2")
    assert {k.blocks_per_sm for k in k0s().values()} == {2}
    monkeypatch.setenv("TILEC_SIMT_BLOCKS", "9")
    with pytest.raises(TilecError, match=r"TILEC_SIMT_BLOCKS='9': expected blocks per SM \(1 to 8\)"):
        k0s()


SCALAR_GEMMS = """
kernel lin(X: f32[M, K], W: f32[N, K], b: f32[N]) -> Y: f32[M, N]:
    Y = silu(X @ W.T + b)

kernel pro(X: f32[M, K], W: f32[N, K]) -> Y: f32[M, N]:
    Y = gelu(X) @ W.T

kernel mm(A: f32[M, K], B: f32[K, N], r: f32[M, 1]) -> C: f32[M, N]:
    C = (A @ B) * r

kernel d(X: f64[M, K], W: f64[N, K]) -> Y: f64[M, N]:
    Y = X @ W.T
"""


@pytest.mark.nvcc
def test_scalar_gemms_read_16_bytes_along_k_without_spills():
    """The scalar-unit GEMMs (f32 X @ W.T with an epilogue, with a prologue, A @ B, f64) built
    for sm_80 and sm_90a: warning-free, no kernel spills (X @ W.T's 3-block bound caps it at
    168 registers), and their PTX reads A (and W) rows 16 bytes along k: ld.shared.v4.f32,
    ld.shared.v2.f64."""
    need_nvcc()
    want = {"lin.cu": "ld.shared.v4.f32", "pro.cu": "ld.shared.v4.f32",
            "mm.cu": "ld.shared.v4.f32", "d.cu": "ld.shared.v2.f64"}
    seen = set()
    for f, folder in clean_builds(SCALAR_GEMMS, "simt.tile"):
        for arch in ("compute_80", "compute_90a"):
            assert want[f] in kept_ptx(folder, f, arch), (f, arch)
        seen.add(f)
    assert seen == set(want)


def clean_builds(text: str, name: str):
    """Yield (file, folder) for each .cu source of text built for sm_80 and sm_90a with its
    PTX kept, asserting that nvcc warned of nothing and no kernel spills."""
    for f, r, folder in nvcc_each(text, name, [
            "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
            "-Xptxas", "-v", "-c", "-o", "k.o", "--keep"], {"arch": ("sm_80", "sm_90a")}):
        assert not warning_lines(r.stderr), r.stderr[-3000:]
        report = ptxas_lines(r.stderr)
        assert report and not any(spills for _, spills in report.values()), report
        yield f, folder


# GEMMs whose operand rows are not 16-byte aligned (K or N not a multiple of 16 bytes' values):
# neither TMA nor the 16-byte copies can read them, so their tiles go 8 or 4 bytes at a time
# through cp.async (copy_g2s_narrow), or value by value where rows are only 2-byte aligned
ROWS_OFF_16 = """
kernel h(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:
    C = A @ B

kernel lin(A: bf16[M, K], W: bf16[N, K], b: bf16[N]) -> C: f32[M, N]:
    C = relu(A @ W.T + f32(b))

kernel at(A: f16[K, M], B: f16[K, N]) -> C: f16[M, N]:
    C = A.T @ B

kernel s(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:
    C = A @ B

kernel d(A: f64[M, K], W: f64[N, K]) -> C: f64[M, N]:
    C = A @ W.T
"""


@pytest.mark.nvcc
def test_rows_off_16_bytes_take_narrow_async_copies():
    """The GEMMs of ROWS_OFF_16 built for sm_80 and sm_90a: warning-free, no kernel spills, and
    their PTX holds the 8- and 4-byte cp.async copies of the rows that are not 16-byte aligned
    (f64 rows are always 8-byte aligned: 8-byte copies alone)."""
    need_nvcc()
    seen = set()
    for f, folder in clean_builds(ROWS_OFF_16, "rows.tile"):
        for arch in ("compute_80", "compute_90a"):
            sizes = set(re.findall(r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], (\d+),",
                                   kept_ptx(folder, f, arch)))
            assert sizes == ({"8"} if f == "d.cu" else {"4", "8"}), (f, arch, sizes)
        seen.add(f)
    assert seen == {"h.cu", "lin.cu", "at.cu", "s.cu", "d.cu"}


def test_narrow_copies_only_where_measured():
    """Narrow copies (copy_g2s's NARROW) in the kernels of one gemm bounded for one block per
    SM: an f32 A @ B and an f16 GEMM take them; the f32 X @ W.T bounded for 3 blocks (they
    slowed it), attention (two gemms) and the decode split kernels (2 blocks) do not."""
    text = ("kernel s(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n\n"
            "kernel h(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N]:\n    C = A @ B\n\n"
            "kernel bt(X: f32[M, K], W: f32[N, K]) -> Y: f32[M, N]:\n    Y = X @ W.T\n\n"
            + (SAMPLES / "attention.tile").read_text())
    srcs = cuda_kernel_sources(text)
    assert "__launch_bounds__(128, 3)" in srcs["bt_k0"]
    assert "__launch_bounds__(128, 2)" in srcs["h_k0_m16_split"]
    for kernel, want in (("s_k0", True), ("h_k0", True), ("bt_k0", False),
                         ("h_k0_m16_split", False), ("attention_k0_D64", False)):
        # the flags after the layout: ASYNC, WHOLE and, where an asynchronous copy's narrow
        # copies are left out, false (synchronous copies take none: no flag)
        flags = re.findall(r"copy_g2s<[^()]*>((?:, (?:true|false))+)>\(", srcs[kernel])
        flags = [f for f in flags if f.startswith(", true")]
        assert flags and all(f.count(",") == (2 if want else 3) for f in flags), (kernel, flags)
        assert want or all(f.endswith(", false") for f in flags)


# sizes at which every operand of ROWS_OFF_16 has rows off 16 bytes (K odd; the transposed A's
# rows M off 8 values): ragged tiles, M = 1
PADDED_DIMS = (dict(M=130, K=129, N=202), dict(M=70, K=301, N=68), dict(M=1, K=129, N=66),
               dict(M=262, K=77, N=300))


def variants_only(monkeypatch, chosen):
    """Build the GEMM variants whose suffix `chosen(suffix)` accepts alone, where a group has
    them, their conditions on the dims dropped (those their kernels add stay): a condition of
    theirs that fails is then an error, not a fall-through to another kernel."""
    from tilec.passes import tile as tile_pass
    keep = tile_pass.gemm_variants
    monkeypatch.setattr(tile_pass, "gemm_variants", lambda *a: [
        (s, None, c) for s, _, c in keep(*a) if chosen(s)] or keep(*a))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_rows_off_16_bytes_take_padded_copies(arch):
    """Where the product is large enough and an operand's rows are off 16 bytes, the GEMMs of
    ROWS_OFF_16 get a variant (`_pad`) that copies such operands into workspaces with padded
    rows, then runs the default kernel on them (on sm_90a the 16-bit ones take the
    warp-specialized kernel's instead, `_tma_pad`, and no `_pad`); its launches, run by the Tile
    IR interpreter, compute what the reference does (workspaces start as NaN there: the
    padding is zero)."""
    m0 = driver.frontend(driver.Source("rows.tile", ROWS_OFF_16))
    mod = driver.stage_module(m0, "tiled", "cuda", options={"arch": (arch,)})
    for g, prog in zip(mod.graphs, mod.programs):
        variants = [parts for v in prog.slots() for parts in v if parts[-1].padded]
        wgmma = arch == "sm_90a" and g.name in ("h", "lin", "at")
        (parts,) = variants
        assert parts[-1].name == f"{g.name}_k0_{'tma_pad' if wgmma else 'pad'}"
        assert bool(parts[-1].warp_specialize) == wgmma
        # (a product of at least 2^24 values for the warp-specialized kernel, 2^30 for the other)
        dims = {"M": 1100, "K": 1023, "N": 1104}
        assert parts[-1].when.eval(dims) and bool(parts[-1].when.eval({**dims, "M": 100})) == wgmma
        assert not parts[-1].when.eval({**dims, "M": 10})
        for dims in PADDED_DIMS[:2]:
            inputs = interp.random_inputs(g, dims, 1, False)
            ref = interp.run_graph(g, inputs, dims)
            got = run_program(list(parts), inputs, dims, ["C"])
            assert interp.rel_error(got["C"], ref["C"]) <= interp.tolerance(g.outputs[0].type.dtype)


def test_only_whole_byte_rows_get_padded_copies():
    """pad_operands copies the tensors of 8 bits or more whose rows may be off 16 bytes; 4-bit
    ones (two values a byte) and rows known to be multiples are read as they are, and a kernel
    with nothing to copy gets no such variant."""
    from tilec.ir.types import Dim
    from tilec.passes import tile as tile_pass
    K = Dim.sym("K")

    def kernel(*dtypes_rows):
        params = tuple(T.TensorDecl(f"X{n}", dt, (Dim.sym("M"), row), "input")
                       for n, (dt, row) in enumerate(dtypes_rows))
        body = tuple(T.Copy(T.Region(p.name, (T.iconst(0), T.iconst(0))), T.Region("S"))
                     for p in params)
        return T.TileKernel("k", params, (T.iconst(1),), ("bx",), 128, body)
    names = tile_pass.Names({"X0", "X1", "X2"})
    k, pads, off = tile_pass.pad_operands(
        kernel(("u4", K), ("i8", K), ("f16", Dim.const(4096))), ["X0", "X1", "X2"], names,
        driver.get_target("cuda"))
    assert k.padded == (("X1", "X1_padded"),) and len(pads) == 1 and str(off) == "K % 16 != 0"
    with pytest.raises(tile_pass.NoVariant):
        tile_pass.pad_operands(kernel(("u4", K), ("f32", Dim.const(100))), ["X0", "X1"], names,
                               driver.get_target("cuda"))


@pytest.mark.gpu
def test_padded_copies_on_gpu(monkeypatch):
    """ROWS_OFF_16 through its variants on padded copies alone (a failing condition is an
    error): the mma.sync kernel (sm_90), the scalar one (f32, f64), the warp-specialized one
    (16-bit on sm_90a)."""
    need_gpu()
    # (the variants on padded copies: `_tma_pad`, `_pad`)
    variants_only(monkeypatch, lambda s: s.endswith("_pad"))
    for dims in PADDED_DIMS:
        check_text(ROWS_OFF_16, dims, name="rows_pad.tile", target="cuda", options=GPU_OPTIONS)


@pytest.mark.gpu
def test_rows_off_16_bytes_on_gpu():
    """ROWS_OFF_16 against the reference where K and N make rows 8-, 4- and 2-byte aligned (f16:
    K = 132, 130, 129), over several K tiles, M and N cut by the tiles, and M = 1 (the decode
    kernels)."""
    need_gpu()
    for dims in (dict(M=70, K=132, N=68), dict(M=130, K=130, N=202), dict(M=65, K=129, N=133),
                 dict(M=200, K=302, N=36), dict(M=1, K=130, N=66)):
        check_text(ROWS_OFF_16, dims, name="rows.tile", target="cuda", options=GPU_OPTIONS)


@pytest.mark.parametrize("form, layout", [("", "row-major, rows padded by 4"),
                                          ("swizzle", "16-byte chunks XOR-swizzled by row"),
                                          ("plain", "row-major")])
def test_scalar_gemm_tiles_are_padded(monkeypatch, form, layout):
    """An f32 GEMM's A tile (rows of M) and a transposed B's (rows of N) have padded rows; a
    row-major B's (rows of K) stays plain; TILEC_SIMT_SHARED=swizzle swizzles them instead,
    plain keeps them plain."""
    if form:
        monkeypatch.setenv("TILEC_SIMT_SHARED", form)
    text = ("kernel g(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n\n"
            "kernel h(A: f32[M, K], W: f32[N, K]) -> C: f32[M, N]:\n    C = A @ W.T\n")
    dump = driver.print_stage(driver.stage_module(driver.frontend(driver.Source(
        "s.tile", text)), "lowered", "cuda", options=SM90), "lowered")
    g_k0 = dump[dump.index("kernel g_k0("):dump.index("kernel h_")]
    h_k0 = dump[dump.index("kernel h_k0("):]
    assert f"A_s = shared(f32, [3, 64, 32])  # layout: shared, {layout}\n" in g_k0
    assert "B_s = shared(f32, [3, 32, 128])  # layout: shared, row-major\n" in g_k0
    assert f"B_s = shared(f32, [2, 128, 32])  # layout: shared, {layout}\n" in h_k0
    monkeypatch.setenv("TILEC_SIMT_SHARED", "padded")
    with pytest.raises(TilecError, match="TILEC_SIMT_SHARED='padded': expected pad, swizzle or plain"):
        driver.stage_module(driver.frontend(driver.Source("s.tile", text)), "lowered", "cuda",
                            options=SM90)


@pytest.mark.nvcc
def test_tf32_gemms_run_tf32_mma_warning_free_without_spills():
    """The PTX of every tiled GEMM kernel of a `precision tf32` program multiplies with tf32
    mma.sync (operands rounded by cvt.rna.tf32); without the schedule no kernel does. The
    sources compile warning-free for sm_80 and sm_90, and no kernel spills."""
    need_nvcc()
    log, ptx = "", {}  # (one compile for both architectures, its PTX kept)
    for f, r, folder in nvcc_each(TF32 + TF32_SCHEDULES, "tf32.tile", [
            "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
            "-Xptxas", "-v", "-c", "-o", os.devnull, "--keep"]):
        log += r.stderr
        ptx.update(ptx_entries(kept_ptx(folder, f, "compute_90")))
    # (not the copies that pad operand rows: `_pad_A` ...)
    tiled = {k: v for k, v in ptx.items() if "gemv" not in k and "sum" not in k and
             "_pad_" not in k}
    assert tiled and all("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in v and
                         "cvt.rna.tf32.f32" in v for v in tiled.values()), sorted(tiled)
    assert not any("mma.sync" in v for v in ptx_of(TF32, "ieee.tile").values())
    assert not warning_lines(log), log[-3000:]
    report = ptxas_lines(log)
    assert {a for _, a in report} == {"sm_80", "sm_90"}
    spills = {k: v for k, v in report.items() if v[1]}
    assert not spills, spills


@pytest.mark.gpu
def test_tf32_gemms_on_gpu():
    """`precision tf32` GEMMs (plain, transposed B with a bias+ReLU epilogue, batched) and an
    attention's Q K^T at tile multiples and ragged sizes, decode sizes included: within tf32's
    tolerance of the exact reference, and visibly rounded (an f32 GEMM's error is ~1e-7), so the
    matrix units ran."""
    need_gpu()
    for dims in (dict(M=128, K=256, N=128, Bt=2, D=64), dict(M=100, K=300, N=72, Bt=3, D=100),
                 dict(M=17, K=40, N=9, Bt=1, D=128), dict(M=5, K=1000, N=130, Bt=2, D=32)):
        results = check_text(TF32 + TF32_SCHEDULES, dims, name="tf32.tile", target="cuda",
                             options=GPU_OPTIONS)
        for name, r in results.items():
            assert r.tolerances["C"] == interp.tolerance("f16")
            assert 1e-6 < r.errors["C"] < 3e-3, (name, dims, r.errors)
