"""The HIP target (AMD GPUs, gfx90a).

There is no AMD GPU here, so the proof is the compiler's: every sample (and the hand-written
tile-level ones) builds with hipcc for gfx90a (HIP_PLATFORM=amd), warning-free under -Wall, and
the device assembly (`--cuda-device-only -S`) says that the GEMM-family and attention kernels run
on MFMA (`v_mfma`), that no kernel uses scratch (private segment size 0), and that each kernel's
LDS (group segment) is what tilec computed (the `// LDS: N bytes` line of its source). The MFMA
accumulator layout is checked against a simulation of the instructions. Where hipcc is missing
these tests skip and say so; CI installs it and fails instead.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, compile_text

from tilec import driver
from tilec.diagnostics import TilecError
from tilec.ir.layout_mfma import WAVE, MfmaLayout, lane_elements

SAMPLE_FILES = sorted(SAMPLES.glob("*.tile")) + sorted((SAMPLES / "tile").glob("*.tile"))
ON_CI = os.environ.get("CI", "").lower() == "true"
HIPCC = os.environ.get("HIPCC", "hipcc")
GFX90A = {"arch": ("gfx90a",)}
# kernels that must run on MFMA: those whose source calls a matrix-unit GEMM (16-bit operands)
MFMA_CALL = re.compile(r"tilec::gemm_(ss|rs)<")


def need_hipcc():
    if shutil.which(HIPCC) is None:
        if ON_CI:
            pytest.fail("hipcc is not installed on this CI machine: the HIP tests need it")
        pytest.skip("hipcc not found: the HIP compile tests need it (apt-get install hipcc)")


# ---- the MFMA accumulator layout against a simulation of the instructions --------------------
def mfma_lanes(tile: int):
    """The instruction's operand and result mapping as the CDNA ISA states it (module docstring
    of ir/layout_mfma.py): for lane l and item/register r, the (row, k) of A, (k, col) of B and
    (row, col) of D."""
    h = WAVE // tile
    a = {(l, j): (l % tile, 4 * (l // tile) + j) for l in range(WAVE) for j in range(4)}
    b = {(l, j): (4 * (l // tile) + j, l % tile) for l in range(WAVE) for j in range(4)}
    regs = tile * tile // WAVE
    d = {(l, r): (4 * h * (r // 4) + 4 * (l // tile) + r % 4, l % tile)
         for l in range(WAVE) for r in range(regs)}
    return a, b, d, 4 * h


def simulate_mfma(tile: int, a_regs: dict, b_regs: dict, d_regs: dict) -> dict:
    """One MFMA: D += A B from the lanes' operand items (a_regs[(lane, j)]), as the hardware
    combines them; returns the lanes' new D registers."""
    amap, bmap, dmap, kstep = mfma_lanes(tile)
    A = [[0] * kstep for _ in range(tile)]
    B = [[0] * tile for _ in range(kstep)]
    for key, (i, k) in amap.items():
        A[i][k] = a_regs[key]
    for key, (k, j) in bmap.items():
        B[k][j] = b_regs[key]
    return {key: d_regs[key] + sum(A[i][k] * B[k][j] for k in range(kstep))
            for key, (i, j) in dmap.items()}


@pytest.mark.parametrize("tile", [32, 16])
@pytest.mark.parametrize("grid", [(1, 1), (2, 2), (4, 1)])
@pytest.mark.parametrize("paired", [True, False], ids=["pairs", "steps"])
def test_mfma_accumulator_layout_matches_the_instruction(tile, grid, paired):
    """gemm_ss's product as tilec_hip.h issues it (C^T = B^T A^T: lane l's A operand is B's
    column, its B operand A's row; k-step s at k = 4 (l / T) + j, or, for pairs of k-steps,
    at k = 8 (l / T) + 4 (s % 2) + j), simulated per instruction, leaves in each lane's
    accumulator registers exactly the C elements MfmaLayout says they hold; every element of C
    is held once."""
    wm_, wn_ = grid
    L = MfmaLayout(tile * 2 * wm_, tile * wn_, wm_, wn_, tile=tile)
    rng = random.Random(tile * 10 + wm_)
    K = 4 * (4 * WAVE // tile)  # four k-steps
    A = [[rng.randint(-3, 3) for _ in range(K)] for _ in range(L.rows)]
    B = [[rng.randint(-3, 3) for _ in range(L.cols)] for _ in range(K)]
    C = [[sum(A[i][k] * B[k][j] for k in range(K)) for j in range(L.cols)] for i in range(L.rows)]
    regs = tile * tile // WAVE
    seen = set()
    for w in range(wm_ * wn_):
        m0, n0 = w // L.warps_n * L.wm, w % L.warps_n * L.wn
        acc = {}
        for mi in range(L.mi):
            for ni in range(L.ni):
                d = {(lane, r): 0 for lane in range(WAVE) for r in range(regs)}
                kstep = 4 * WAVE // tile
                for k0 in range(0, K, kstep):
                    if paired:  # (the pair's first step k0 - k0 % 2 kstep)
                        kq = {lane: k0 - k0 % (2 * kstep) + lane // tile * 8 + (k0 // kstep % 2) * 4
                              for lane in range(WAVE)}
                    else:
                        kq = {lane: k0 + lane // tile * 4 for lane in range(WAVE)}
                    a_op = {(lane, j): B[kq[lane] + j][n0 + ni * tile + lane % tile]
                            for lane in range(WAVE) for j in range(4)}
                    b_op = {(lane, j): A[m0 + mi * tile + lane % tile][kq[lane] + j]
                            for lane in range(WAVE) for j in range(4)}
                    d = simulate_mfma(tile, a_op, b_op, d)
                for (lane, r), v in d.items():
                    acc[(lane, (mi * L.ni + ni) * regs + r)] = v
        for lane in range(WAVE):
            for slot, (i, j) in lane_elements(L, w, lane).items():
                assert acc[(lane, slot)] == C[i][j], (w, lane, slot, i, j)
                assert (i, j) not in seen
                seen.add((i, j))
    assert len(seen) == L.rows * L.cols


@pytest.mark.parametrize("tile", [32, 16])
def test_a_16bit_accumulator_is_the_next_products_operand(tile):
    """gemm_rs: the registers of P (an accumulator's layout) read as k-step ks's operand
    (registers ((mi * NIA + ks / G) * G + ks % G) * 4 + j) hold P[row l % T][k0 + 4 (l / T) + j],
    what the instruction's B operand (A^T) wants."""
    L = MfmaLayout(tile, 2 * tile, 1, 1, tile=tile)
    kstep = 4 * WAVE // tile
    for lane in range(WAVE):
        elements = lane_elements(L, 0, lane)
        for ks in range(L.cols // kstep):
            for j in range(4):
                slot = ((0 * L.ni + ks // L.g) * L.g + ks % L.g) * 4 + j
                assert elements[slot] == (lane % tile, ks * kstep + 4 * (lane // tile) + j)


# ---- LDS bank conflicts of the MFMA gemms' accesses, in a model of the LDS ----------------------
# The model (AMD's LDS on CDNA: 32 banks of 4 bytes): an access of W bytes per lane is served for
# 128 / W consecutive lanes at a time (8 for 16-byte accesses, 16 for 8-byte, 32 for 4 bytes or
# less); within such a group, the 4-byte words one bank holds are read one per cycle (lanes
# reading the same word share it). Conflict-free: one word per bank in every group.
def tile_offset(L, r: int, c: int) -> int:
    """tilec_hip.h's SwizzledTile / PaddedTile offset of (r, c) in elements."""
    if not L.swizzle:
        return r * (L.cols + L.pad) + c
    e = 16 // L.elem_bytes
    cpr = L.cols // e
    sw = min(cpr, 8)
    rep = 8 // sw
    return r * L.cols + ((c // e) ^ (((r // rep) ^ (r // (8 * rep) * 2)) % sw)) * e + c % e


def bank_conflicts(addresses: dict, width: int) -> int:
    """The worst number of distinct words one bank serves in one group of lanes (1: none)."""
    group, worst = 128 // width if width >= 4 else 32, 1
    for g0 in range(0, WAVE, group):
        banks: dict = {}
        for lane in range(g0, g0 + group):
            if lane in addresses:
                for w in range(addresses[lane] // 4, (addresses[lane] + width - 1) // 4 + 1):
                    banks.setdefault(w % 32, set()).add(w)
        worst = max([worst] + [len(ws) for ws in banks.values()])
    return worst


def gemm_lds_accesses(g, allocs, threads):
    """Each LDS access of tilec_hip.h's gemm_ss / gemm_rs for gemm `g`, and of the tile copies
    that fill its operands, per wave: (what, {lane: byte address}, bytes per lane)."""
    c = allocs[g.c].layout
    t, kstep = c.tile, 4 * WAVE // c.tile
    out = []
    operands = [(g.b, not g.transpose_b, c.ni, lambda w: w % c.warps_n * c.wn)]
    if allocs[g.a].scope == "shared":
        operands.append((g.a, g.transpose_a, c.mi, lambda w: w // c.warps_n * c.wm))
    for name, rows_are_k, tiles, base in operands:
        L = allocs[name].layout
        bk = L.rows if rows_are_k else L.cols
        paired = allocs[g.a].scope == "shared" and bk % (2 * kstep) == 0
        octs = (16 // L.elem_bytes) % 8 == 0 if L.swizzle else (L.cols + L.pad) % 8 == 0
        for w in range(threads // WAVE):
            for i in range(tiles):
                for k0 in range(0, bk, 2 * kstep if paired else kstep):
                    rc = {lane: base(w) + i * t + lane % t for lane in range(WAVE)}
                    k = {lane: k0 + lane // t * (8 if paired else 4) for lane in range(WAVE)}
                    n = 8 if paired else 4
                    if rows_are_k:  # value by value down the column
                        for j in range(n):
                            out.append((f"{name} down", {ln: 2 * tile_offset(L, k[ln] + j, rc[ln])
                                                         for ln in range(WAVE)}, 2))
                    elif paired and octs:
                        out.append((f"{name} b128", {ln: 2 * tile_offset(L, rc[ln], k[ln])
                                                     for ln in range(WAVE)}, 16))
                    else:
                        for h in range(n // 4):
                            out.append((f"{name} b64", {ln: 2 * tile_offset(L, rc[ln], k[ln] + 4 * h)
                                                        for ln in range(WAVE)}, 8))
    for name in (g.a, g.b):  # the copies' 16-byte chunk writes
        a = allocs[name]
        if a.scope != "shared":
            continue
        L = a.layout
        e = 16 // L.elem_bytes
        cpr = L.cols // e
        for w in range(threads // WAVE):
            for it in range(-(-L.rows * cpr // threads)):
                chunks = {ln: w * WAVE + ln + it * threads for ln in range(WAVE)}
                out.append((f"{name} copy", {ln: L.elem_bytes * tile_offset(L, ch // cpr, ch % cpr * e)
                                             for ln, ch in chunks.items() if ch < L.rows * cpr}, 16))
    return out


@pytest.mark.parametrize("path", [p for p in SAMPLE_FILES if p.stem in (
    "gemm_bias_relu", "attention", "causal_attention", "w4a16", "w4a16_kmajor", "gemm_relu",
    "flash_attention")], ids=lambda p: p.stem)
def test_mfma_gemm_lds_accesses_are_free_of_bank_conflicts(path):
    """In the LDS model above, every operand read of every MFMA gemm of the sample and every
    16-byte write of the copies that fill its tiles is free of bank conflicts."""
    from tilec.ir import tile as T
    from tilec.passes.layout import on_matrix_units
    _, _, m = compile_text(path.read_text(), path.name, "hip", options=GFX90A)
    res = driver.get_target("hip").resources
    checked = 0
    for prog in m.programs:
        for k in prog.kernels:
            allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
            for g in (s for s in T.walk_stmts(k.body) if isinstance(s, T.Gemm)):
                if not on_matrix_units(g, allocs, res):
                    continue
                for name in (g.a, g.b):  # (a layout is a permutation of the tile's elements)
                    L = allocs[name].layout
                    if allocs[name].scope == "shared" and L.swizzle:
                        offsets = {tile_offset(L, r, c) for r in range(L.rows) for c in range(L.cols)}
                        assert offsets == set(range(L.rows * L.cols)), (k.name, name)
                for what, addresses, width in gemm_lds_accesses(g, allocs, k.threads):
                    assert bank_conflicts(addresses, width) == 1, (k.name, what, width)
                    checked += 1
    assert checked


def test_the_bank_model_sees_a_conflict():
    """(The model can fail: 16 lanes reading 8 bytes at a stride of 64 bytes, rows 8 apart in one
    bank group, conflict 2 ways.)"""
    assert bank_conflicts({ln: 64 * ln for ln in range(WAVE)}, 8) == 8
    assert bank_conflicts({ln: 16 * ln for ln in range(WAVE)}, 16) == 1


# ---- hipcc: every sample for gfx90a, its assembly -----------------------------------------------
def kernel_sources(text: str) -> dict:
    """{kernel name: its source text} of a generated .hip file."""
    out = {}
    for m in re.finditer(r"__global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)\n}\n", text, re.S):
        out[m.group(1)] = m.group(2)
    return out


def asm_kernels(asm: str) -> dict:
    """{kernel name: {mfma, private, lds}} from AMDGPU device assembly (names demangled from
    the anonymous namespace tilec's kernels live in)."""
    out = {}

    def name(mangled):
        m = re.match(r"_ZN12_GLOBAL__N_1(\d+)(\w+)", mangled)
        return m.group(2)[:int(m.group(1))] if m else mangled
    for m in re.finditer(r"^(_Z\w+):(.*?)^\.Lfunc_end\d+:", asm, re.S | re.M):
        facts = out.setdefault(name(m.group(1)), {})
        facts["mfma"] = len(re.findall(r"^\s*v_mfma", m.group(2), re.M))
        # generic-address memory instructions: an LDS or global pointer whose address space the
        # compiler lost (slower than ds_* / global_*)
        facts["flat"] = len(re.findall(r"^\s*flat_(load|store|atomic)", m.group(2), re.M))
    for m in re.finditer(r"\.amdhsa_kernel (\S+)\n(.*?)\.end_amdhsa_kernel", asm, re.S):
        fields = dict(re.findall(r"\.amdhsa_(\w+) (\S+)", m.group(2)))
        out.setdefault(name(m.group(1)), {}).update(
            private=int(fields["private_segment_fixed_size"]),
            lds=int(fields["group_segment_fixed_size"]))
    return out


def hipcc(args: list, cwd: Path) -> str:
    r = subprocess.run([HIPCC] + args, cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "HIP_PLATFORM": "amd"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def emit(path: Path, out: Path, options=GFX90A) -> dict:
    src, _, m = compile_text(path.read_text(), path.name, "hip", options=options)
    files = driver.render(src, m, "hip", options)
    for name, text in files.items():
        (out / name).write_text(text)
    return files


@pytest.mark.hipcc
@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.parent.name + "/" + p.stem
                         if p.parent.name == "tile" else p.stem)
def test_sample_compiles_for_gfx90a_and_its_assembly_checks(path, tmp_path):
    """The sample's Makefile builds libNAME.a and libNAME.so with hipcc, warning-free; in the
    device assembly every kernel that calls a matrix-unit GEMM has v_mfma instructions, no
    kernel uses scratch or generic-address (flat) loads and stores, and every kernel's LDS is
    tilec's count."""
    need_hipcc()
    files = emit(path, tmp_path)
    r = subprocess.run(["make", "-C", str(tmp_path), "-j2", "--no-print-directory"],
                       capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    libs = os.listdir(tmp_path)
    assert any(f.startswith("lib") and f.endswith(".so") for f in libs), libs
    assert any(f.startswith("lib") and f.endswith(".a") for f in libs), libs
    sources = [n for n in files if n.endswith(".hip")]
    mfma_kernels = 0
    for name in sources:
        asm_path = tmp_path / (name[:-4] + ".s")
        hipcc(["-std=c++17", "-O3", "-ffp-contract=off", "--offload-arch=gfx90a",
               "--cuda-device-only", "-S", "-o", asm_path.name, name], tmp_path)
        asm = asm_kernels(asm_path.read_text())
        kernels = kernel_sources(files[name])
        assert kernels and set(kernels) <= set(asm), (sorted(kernels), sorted(asm))
        for k, body in kernels.items():
            facts = asm[k]
            lds = re.search(r"// LDS: (\d+) bytes", body)
            assert facts["private"] == 0, f"{k} uses {facts['private']} bytes of scratch"
            assert facts["flat"] == 0, f"{k} has {facts['flat']} flat (generic address) accesses"
            assert facts["lds"] == (int(lds.group(1)) if lds else 0), (k, facts)
            if MFMA_CALL.search(body):
                assert facts["mfma"] > 0, f"{k} calls an MFMA gemm but has no v_mfma"
                mfma_kernels += 1
    # the 16-bit GEMM family and attention run on MFMA (f32 GEMMs take the scalar path)
    if path.stem in ("gemm_bias_relu", "attention", "causal_attention", "w4a16", "w4a16_kmajor",
                     "flash_attention", "gemm_relu"):
        assert mfma_kernels >= 2 if path.parent.name != "tile" else mfma_kernels == 1


@pytest.mark.hipcc
@pytest.mark.parametrize("sample", ["batched_matmul", "gemm_gelu_softmax", "linear_tf32"])
def test_the_f32_gemm_samples_in_16_bits_run_on_mfma(sample, tmp_path):
    """The samples whose products are f32 (scalar FMAs, as on CUDA without tf32) with 16-bit
    tensors instead: the batched GEMM, the GEMM feeding a row softmax through a workspace and the
    transposed-weight linear layer put their tile products on v_mfma, without scratch."""
    need_hipcc()
    text = (SAMPLES / f"{sample}.tile").read_text().replace("f32[", "f16[")
    path = tmp_path / f"{sample}.tile"
    path.write_text(text)
    files = emit(path, tmp_path)
    (name,) = [n for n in files if n.endswith(".hip")]
    hipcc(["-std=c++17", "-O3", "-ffp-contract=off", "--offload-arch=gfx90a", "--cuda-device-only",
           "-S", "-o", "k.s", name], tmp_path)
    asm = asm_kernels((tmp_path / "k.s").read_text())
    tiled = [k for k, body in kernel_sources(files[name]).items() if MFMA_CALL.search(body)]
    assert len(tiled) == 2, tiled  # the default tile and the decode tile
    assert all(asm[k]["mfma"] > 0 and asm[k]["private"] == 0 for k in tiled), asm


def test_the_launcher_abi_is_cudas_with_a_trailing_hip_stream(tmp_path):
    files = emit(SAMPLES / "attention.tile", tmp_path)
    header = files["attention.h"]
    assert "#include <hip/hip_runtime_api.h>" in header
    assert re.search(r"int attention\(const tilec_f16\* Q, const tilec_f16\* K, const tilec_f16\* V, "
                     r"tilec_f16\* O, int64_t B, int64_t H, int64_t L, int64_t D, int64_t S, "
                     r"hipStream_t tilec_stream\);", header), header
    assert "hipStream_t tilec_stream" in header.split("attention_with_workspace(")[1].split(";")[0]
    make = files["Makefile"]
    assert "--offload-arch=gfx90a" in make and "libattention.so" in make and "HIPCC ?= hipcc" in make
    assert set(files) >= {"attention.hip", "attention.h", "tilec_hip.h", "Makefile"}


def test_gemm_and_attention_tiles_are_double_buffered_through_registers(tmp_path):
    """The pipelined K loops keep 2 LDS stages; their copies are issued ahead into registers
    (copy_issue, global loads in flight during the product) and land at the loop's wait."""
    for sample, kernel, buf in (("gemm_bias_relu", "gemm_bias_relu_k0", "A_s: f16[2, 128, 32]"),
                                ("attention", "attention_k0_D128exact", "K_s: f16[2, 32, 128]")):
        files = emit(SAMPLES / f"{sample}.tile", tmp_path)
        body = kernel_sources(files[f"{sample}.hip"])[kernel]
        assert "tilec::copy_issue<" in body and "tilec::copy_land(" in body, body
        decls = re.findall(r"uint16_t\* __restrict__ (\w+) = .*?// (f16\[[^\]]*\])", body)
        assert f"{buf.split(':')[0]}: {buf.split(': ')[1]}" in [f"{n}: {d}" for n, d in decls]
        loop = body[body.index("for (int tilec_k_i"):]
        # in the loop: the product, then the landing of the copies issued one iteration before,
        # the barrier, and the next copies issued
        assert loop.index("tilec::gemm_") < loop.index("copy_land") < loop.index("__syncthreads") \
            < loop.index("copy_issue")


def test_wave64_lanes_and_shuffles(tmp_path):
    """Kernels index lanes and waves of 64, reductions shuffle over the 64 lanes."""
    src = emit(SAMPLES / "attention.tile", tmp_path)["attention.hip"]
    assert "tilec_lane = tilec_tid & 63;" in src and "tilec_warp = tilec_tid >> 6;" in src
    files = emit(SAMPLES / "softmax.tile", tmp_path)
    src = files["softmax_rows.hip"]
    assert "block_allreduce<" in src and "tilec_red" in src
    lib = files["tilec_hip.h"]
    assert "__shfl_xor(v, m, WAVE)" in lib and "constexpr int WAVE = 64;" in lib


def test_an_arch_the_toolchain_or_tilec_cannot_build_is_one_line(tmp_path):
    """gfx1100 (RDNA3): either the installed hipcc cannot compile for it, or tilec says its
    kernels need CDNA; one error line, no traceback."""
    need_hipcc()
    r = subprocess.run([sys.executable, "-m", "tilec.cli", "build", str(SAMPLES / "softmax.tile"),
                        "--target", "hip", "--arch", "gfx1100", "-o", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "gfx1100" in lines[0] and "error:" in lines[0], r.stderr
    assert "cannot compile for gfx1100" in lines[0] or "RDNA" in lines[0]


def test_hip_refuses_hopper_only_schedules_by_taking_the_generic_path():
    """warp_specialize (Hopper) changes nothing on HIP: no warp-specialized kernel is made."""
    text = (SAMPLES / "gemm_bias_relu.tile").read_text()
    _, _, m = compile_text(text, "g.tile", "hip", options=GFX90A)
    assert all(not k.warp_specialize for p in m.programs for k in p.kernels)


def test_unknown_hip_arch_is_an_error():
    with pytest.raises(TilecError, match="unknown --arch 'sm_80' for target hip"):
        driver.get_target("hip").parse_arch("sm_80")


def test_a_handwritten_gemv_mma_is_a_located_error_on_hip():
    from test_tile_level import GEMV_MMA, GEMV_MMA_KMAJOR
    for text in (GEMV_MMA, GEMV_MMA_KMAJOR):
        src, _, m = compile_text(text, "g.tile", "hip", options=GFX90A)
        with pytest.raises(TilecError, match="gemv_mma") as e:
            driver.render(src, m, "hip", GFX90A)
        assert e.value.loc is not None and e.value.loc.line == 3


ATTENTION_F32 = """
kernel att32(Q: f32[B, H, L, D], K: f32[B, H, S, D], V: f32[B, H, S, D]) -> O: f32[B, H, L, D]:
    P = softmax((Q @ K.T) * rsqrt(f32(D)), axis=-1)
    O = P @ V
"""


def test_a_variant_whose_tiles_exceed_the_lds_is_refused_at_run_time(tmp_path):
    """f32 attention's head-dim 128 variants would need 128 KiB of LDS (CUDA's capacities): they
    are not built, their launchers return TILEC_ERR_UNSUPPORTED, and the file still compiles
    warning-free for gfx90a."""
    need_hipcc()
    src = tmp_path / "att32.tile"
    src.write_text(ATTENTION_F32)
    files = emit(src, tmp_path)
    text = files["att32.hip"]
    kernels = kernel_sources(text)
    assert "not built for HIP: its tiles need 131072 bytes of LDS" in kernels["att32_k0_D128"]
    launch = text.split("static int tilec_launch_att32_k0_D128(")[1].split("\n}\n")[0]
    assert "return TILEC_ERR_UNSUPPORTED;" in launch and "hipLaunchKernelGGL" not in launch
    assert "hipLaunchKernelGGL" in text.split("static int tilec_launch_att32_k0_D64(")[1].split("\n}\n")[0]
    out = hipcc(["-std=c++17", "-O3", "-Wall", "-ffp-contract=off", "--offload-arch=gfx90a",
                 "-c", "att32.hip", "-o", "att32.o"], tmp_path)
    assert "warning" not in out.replace("argument unused during compilation", ""), out


@pytest.mark.hipcc
def test_cmake_builds_a_program_against_a_hip_library(tmp_path):
    """tilec_add_library(... TARGET_KIND hip) builds the kernels with hipcc at build time and a
    C++ program compiled by the project's compiler links them with hip::host; without a GPU
    the call returns a status instead of crashing."""
    need_hipcc()
    if shutil.which("cmake") is None:
        if ON_CI:
            pytest.fail("cmake is not installed on this CI machine")
        pytest.skip("cmake not found")
    import tilec
    wrapper = tmp_path / "tilec"
    root = Path(tilec.__file__).resolve().parents[1]
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} -m tilec.cli \"$@\"\n")
    wrapper.chmod(0o755)
    app = tmp_path / "app"
    app.mkdir()
    (app / "CMakeLists.txt").write_text(f"""cmake_minimum_required(VERSION 3.20)
project(hip_app CXX)
find_package(Tilec REQUIRED)
tilec_add_library(kernels SOURCES {SAMPLES / "softmax.tile"} TARGET_KIND hip)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE kernels)
""")
    (app / "main.cpp").write_text("""#include "softmax.h"
#include <cstdio>
int main() {
    float* none = nullptr;  // (no device memory here: the call's checks answer)
    std::printf("%s\\n", tilec_status_string(softmax_rows(none, none, 2, 3, 0)));
    return 0;
}
""")
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(app), "-B", str(build), f"-DTILEC_EXECUTABLE={wrapper}",
                 f"-DCMAKE_PREFIX_PATH={root / 'tilec' / 'cmake'}"],
                ["cmake", "--build", str(build), "-j2"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(build / "app")], capture_output=True, text=True)
    assert r.returncode == 0 and "NULL" in r.stdout, r.stdout + r.stderr
