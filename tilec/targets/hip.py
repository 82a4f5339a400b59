"""The HIP target (AMD GPUs, CDNA: gfx90a, gfx942): one workgroup per grid block of the Tile IR,
wavefronts of 64 lanes.

It is the CUDA target's sm_80 path with AMD's tables: the same lowering steps (its pipeline's
copies issued ahead load into registers and land in LDS at the next wait: AMD has no cp.async;
no Hopper steps, no overlapped gemm), the layout pass with MFMA accumulator layouts
(passes/layout_mfma.py, ir/layout_mfma.py), and `HipRenderer`, a subclass of the CUDA renderer
that calls tilec_hip.h's MFMA GEMMs and wave64 reductions and launches through the HIP runtime.
The launcher ABI is the CUDA one with a trailing `hipStream_t`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile

from ..diagnostics import TilecError
from ..ir import tile as T
from ..ir.layout import VecCols, VecRows
from ..ir.layout_mfma import MfmaLayout, MfmaRows
from ..passes import (
    barriers,
    hoist_invariants,
    host_scalars,
    layout_mfma,
    lower_reductions,
    pipeline,
    specialize,
    version_masks,
)
from .abi import launcher_context, render_libraries
from .base import Resources, Target, Toolchain
from .cpu import ALL_DTYPES
from .cstyle import cname
from .cuda import SIXTEEN, STORE, CudaRenderer, device_context, gpu_common_files, render_kernel

# LDS bytes per wave of a block-wide reduction's scratch (a value of up to 8 bytes)
REDUCE_SCRATCH = 8
# architectures tilec's HIP kernels are written for (CDNA: wave64 and MFMA with bf16_1k)
ARCHS = ("gfx90a", "gfx942")


class HipRenderer(CudaRenderer):
    """The CUDA renderer with AMD's device library: gemms on MFMA (the accumulator's MFMA tile is
    a template argument), row values of an accumulator reduced over the lanes that share them."""

    def __init__(self, kernel: T.TileKernel, target):
        super().__init__(kernel, target)
        # the staging registers of the copies issued ahead (one set per destination buffer),
        # landed in LDS at every wait
        self.staged = sorted({c.dst.buf for c in T.walk_stmts(kernel.body)
                              if isinstance(c, T.Copy) and c.async_})

    def copy_call(self, s: T.Copy, tparams: str, whole: bool, args: list, depth):
        if not s.async_:
            super().copy_call(s, tparams, whole, args, depth)
            return
        # issued ahead: the chunks are loaded into registers now and land at the next wait
        name = f"tilec_stage_{cname(s.dst.buf)}"
        ctype = STORE[self.allocs[s.dst.buf].dtype]
        self.copy_plans[name] = f"tilec::Staged<{tparams}, {ctype}> {name};  // copies in flight"
        self.emit(f"tilec::copy_issue<{str(whole).lower()}>({name}, {cname(s.dst.buf)}, "
                  f"{', '.join(args)});", depth)

    def s_Commit(self, s, depth):
        pass  # (a copy issued ahead is complete once its registers land: s_Wait)

    def s_Wait(self, s: T.Wait, depth):
        # every copy issued ahead lands (at least the groups the wait asks for; the stages they
        # write are free since their issue)
        for buf in self.staged:
            self.emit(f"tilec::copy_land(tilec_stage_{cname(buf)}, {cname(buf)});", depth)

    def s_GemvMma(self, s: T.GemvMma, depth):
        raise T.Unsupported("gemv_mma() has no HIP version (tilec_cuda.h's routine is mma.sync "
                            "code); write the GEMV with a parallel loop")

    def native16(self, e) -> bool:
        # 16-bit operations are computed in f32 and rounded once (the same bits; tilec_hip.h has
        # no 16-bit instruction wrappers)
        return False

    def s_Allreduce(self, s: T.Allreduce, depth):
        a = self.allocs[s.buf]
        op = {"sum": "tilec::OpSum", "max": "tilec::OpMax", "min": "tilec::OpMin"}[s.fn]
        if isinstance(a.layout, MfmaRows):
            assert a.layout.warps_n == 1, "row values of an accumulator split across waves"
            self.emit(f"tilec::mfma_row_allreduce<{op}, {a.layout.tile}>({cname(s.buf)});", depth)
        elif isinstance(a.layout, VecRows):  # scratch in the kernel's LDS array (hip_kernel)
            self.emit(f"{cname(s.buf)}[0] = tilec::block_allreduce<{op}, {self.k.threads}>"
                      f"({cname(s.buf)}[0], tilec_red);", depth)
        elif isinstance(a.layout, VecCols):
            self.emit(f"tilec::block_col_allreduce<{op}, {self.k.threads}, {a.layout.per_row}>"
                      f"({cname(s.buf)}, tilec_red);", depth)
        else:
            raise AssertionError(f"allreduce of {s.buf} with layout {a.layout}")

    def gemm_args(self, L) -> str:
        return f", {L.tile}"  # (the MFMA tile: 32 or 16)

    def check_gemm(self, s: T.Gemm, a: T.Alloc, L):
        assert isinstance(L, MfmaLayout), f"gemm into {s.c} laid out {L}"
        assert s.next_stage is None and not s.sync and not s.refill, "an overlapped gemm on HIP"
        assert a.scope == "shared" or a.layout.tile == L.tile, \
            f"gemm with {s.a} in registers needs one MFMA tile with its accumulators"


def launch_lines(k: T.TileKernel, smem: int, args: list) -> list:
    """The launcher's lines from the grid sizes (tilec_g0..2) on: one workgroup per tile, the
    launch and its status. (LDS up to the 64 KiB of a workgroup needs no attribute on AMD.)"""
    assert not k.persistent and k.cluster <= 1 and not k.warp_specialize, \
        f"{k.name}: a Hopper kernel on the HIP target"
    return ["const int64_t tilec_blocks = tilec_g0 * tilec_g1 * tilec_g2;",
            "const int64_t tilec_x = tilec_blocks < 2147483647 ? tilec_blocks : 2147483647;",
            "const int64_t tilec_y = (tilec_blocks + tilec_x - 1) / tilec_x;",
            "if (tilec_y > 65535) return TILEC_ERR_UNSUPPORTED;",
            f"hipLaunchKernelGGL({k.name}, dim3((unsigned)tilec_x, (unsigned)tilec_y), "
            f"dim3({k.threads}), {smem}, tilec_stream, {', '.join(args)});",
            "return hipGetLastError() == hipSuccess ? TILEC_OK : TILEC_ERR_LAUNCH;"]


def hip_kernel(k: T.TileKernel, symbols, target) -> dict:
    """The CUDA renderer's kernel context, rendered by HipRenderer, with HIP's LDS, launch and
    launch bounds (the threads alone: no occupancy floor that would cap the registers).

    LDS is one static array (so the assembly's group segment is exactly tilec's count, which a
    comment in the source states and the tests compare): the shared buffers, then, where a
    block-wide reduction needs it, its scratch (a double per wave, reused by every reduction)."""
    ctx = render_kernel(k, symbols, target, HipRenderer)
    lds = ctx["smem"]
    if any("tilec_red" in line for line in ctx["body"]):
        lds += reduce_scratch(k, target.resources.warp)
    if lds > target.resources.tile_memory:
        return too_big(ctx, k, lds, target.resources.tile_memory)
    decl = []
    if lds:
        decl = [f"// LDS: {lds} bytes",
                f"__shared__ __attribute__((aligned(128))) unsigned char tilec_smem[{lds}];"]
        if lds > ctx["smem"]:
            decl.append(f"unsigned char* const tilec_red = tilec_smem + {ctx['smem']};  "
                        "// block reductions' scratch")
    ctx.update(bounds=str(k.threads), launch=launch_lines(k, 0, ctx["args"]), smem_decl=decl,
               lds=lds)
    return ctx


def reduce_scratch(k: T.TileKernel, wave: int) -> int:
    """Bytes of LDS scratch the kernel's block-wide reductions take: 8 per wave for row values,
    8 per wave and column for column values (block_col_allreduce)."""
    waves = k.threads // wave
    need = REDUCE_SCRATCH * waves
    allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
    for st in T.walk_stmts(k.body):
        if isinstance(st, T.Allreduce) and isinstance(allocs[st.buf].layout, VecCols):
            L = allocs[st.buf].layout
            need = max(need, REDUCE_SCRATCH * waves * L.per_row * L.vec)
    return need


def too_big(ctx: dict, k: T.TileKernel, lds: int, limit: int) -> dict:
    """A kernel variant whose tiles need more LDS than a workgroup has (capacities chosen for
    CUDA's 227 KiB, e.g. attention of f32 values at a head dim of 128): not built; its launcher
    returns TILEC_ERR_UNSUPPORTED, so the dims that pick it are refused at run time."""
    why = f"its tiles need {lds} bytes of LDS; a workgroup has {limit}"
    ctx.update(body=[f"    // not built for HIP: {why} (the launcher returns TILEC_ERR_UNSUPPORTED)"],
               frags=[], plans=[], shared=[], smem_decl=[], block=["(void)tilec_grid;"], ids=[], lds=0,
               bounds=str(k.threads),
               launch=[f"(void){k.name};", "(void)tilec_g0;", "(void)tilec_g1;", "(void)tilec_g2;",
                       f"return TILEC_ERR_UNSUPPORTED;  // {why}"])
    return ctx


class HipToolchain(Toolchain):
    """hipcc, whose `--version` prints the HIP and clang versions among other lines (on a
    machine without a GPU, a tool's traceback last): the version is those two lines."""

    def version(self) -> str:
        return _hip_version(self.command())


@functools.cache
def _hip_version(cmd: str) -> str:
    try:
        out = subprocess.run(cmd.split() + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [x.strip() for x in (out.stdout + out.stderr).splitlines()
             if x.startswith("HIP version") or "clang version" in x]
    return "; ".join(lines) or "unknown"


@functools.cache
def _compiles_for(hipcc: str, arch: str) -> str | None:
    """None when `hipcc` compiles device code for `arch`, else its first error line (probed once
    per process on an empty kernel file)."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "probe.hip")
        with open(src, "w") as f:
            f.write("__attribute__((global)) void tilec_probe() {}\n")
        try:
            p = subprocess.run(hipcc.split() + [f"--offload-arch={arch}", "--cuda-device-only",
                                                "-c", src, "-o", os.path.join(d, "probe.o")],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "HIP_PLATFORM": "amd"})
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
    if p.returncode == 0:
        return None
    lines = [x for x in (p.stderr + p.stdout).splitlines() if "error" in x]
    return (lines or [f"exit status {p.returncode}"])[0].strip()


def check_archs(target, archs) -> None:
    """One clear line when the installed hipcc cannot compile one of `archs` (nothing when there
    is no hipcc at all: the build says that)."""
    if target.toolchain.missing():
        return
    hipcc = target.toolchain.command()
    for arch in archs:
        why = _compiles_for(hipcc, arch)
        if why is not None:
            raise TilecError(f"the installed {hipcc} ({target.toolchain.version()}) cannot compile "
                             f"for {arch}: {why}")
        if arch not in ARCHS:
            raise TilecError(f"{arch} is an RDNA GPU (wave32, no MFMA); tilec's HIP kernels are "
                             f"written for CDNA: {', '.join(ARCHS)}")


def render(target, src, m, env, banner, options) -> dict:
    archs = options.get("arch") or target.default_arch
    check_archs(target, archs)

    def kernel_context(g, prog):
        ctx = launcher_context(g, prog, ["hipStream_t tilec_stream"], ["tilec_stream"])
        ctx["kernels"] = [hip_kernel(k, g.symbols, target) for k in prog.kernels]
        ctx.update(device_context(target, "HIP", "hipStream_t"))
        return ctx
    files, libs = render_libraries(
        target, src, m, env, banner, options, kernel_context, ["hip/hip_runtime_api.h"],
        ["tilec_stream: the HIP stream the kernels run on (0: default)",
         "Tensor pointers are device memory."])
    files["tilec_hip.h"] = env.loader.get_source(env, "hip/tilec_hip.h")[0]
    files.update(gpu_common_files(env))
    files["Makefile"] = env.get_template("hip/Makefile.j2").render(
        banner=banner("#"), libs=libs, archs=", ".join(archs),
        offload=" ".join(f"--offload-arch={a}" for a in archs))
    return files


HIP = Target(
    name="hip",
    resources=Resources(
        # wave64; 64 KiB of LDS per workgroup; accumulators in 16 x 16 MFMA tiles (32 x 32 where
        # wave tiles allow); 128 x 128 x 32 GEMM tiles on 4 waves of 64 x 64 (2 x 2 MFMA 32x32x8
        # tiles: 64 accumulator registers a lane), 2 LDS stages filled through registers
        # (HipRenderer.copy_call)
        warp=64, max_threads=1024, tile_memory=64 * 1024, mma=(16, 16, 16),
        gemm_tile=(128, 128, 32), gemm_stages=2, gemm_threads=256, row_block=1, row_threads=256,
        ew_tile=(1, 4096), ew_threads=256,
        # attention: 128 queries x 32 keys per step on 4 waves of 32 query rows (32x32 MFMA
        # tiles), K and V tiles double-buffered: at a head dim of 128 the Q tile and 2 stages
        # of K and V take the whole 64 KiB
        attn_tile=(128, 32), attn_threads=256, attn_stages=2,
        dtypes=tuple(d for d in ALL_DTYPES if not d.startswith("fp8")), async_copy=True,
        mma_dtypes=SIXTEEN, matrix_capacities=(64, 128),
        row_capacities=(256, 1024, 4096, 8192), row_threads_by_capacity=((256, 128),),
        gemm_swizzle=8, scalar_gemm_tile=(64, 64, 32), row_tile=False,
        # column reductions: CUDA's blocks (not measured on an AMD GPU)
        col_reduce=(512, 256, 128, 264, 4),
        # M <= 16 (decode): 16-row tiles on 4 waves of 16 x 32 (16x16x16 MFMA), 2 stages of K
        # tiles of 32 (f32 operands fit too)
        gemm_variants=((16, (16, 128, 32), 256, 2),),
        # M = 1: the scalar GEMV streaming B's rows (4-bit weights dequantized in registers):
        # 64 lanes x 4 columns, 4 waves walking K, splits of at least 128 rows
        gemv=(256, 256, 512, 128, 2, 4)),
    toolchain=HipToolchain("HIPCC", "hipcc", "HIP compiler"),
    lowering=(
        # LDS stages of pipelined loops, their copies issued ahead through registers
        ("pipeline", pipeline.run),
        ("version_masks", version_masks.run),
        ("lower_reductions", lower_reductions.run),
        ("specialize", specialize.run),
        ("hoist_invariants", hoist_invariants.run),
        # MFMA accumulator layouts; the rest as on CUDA
        ("layout", layout_mfma.run),
        ("barriers", barriers.run),
        ("host_scalars", host_scalars.run),
    ),
    render_files=render,
    templates="hip",
    source_ext=".hip",
    device_library="tilec_hip.h",
    arch_choices=ARCHS + ("gfx1100",),
    default_arch=("gfx90a",),
    link_flags="-lamdhip64",
)
