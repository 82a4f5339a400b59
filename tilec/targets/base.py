"""A target is one registry entry: its resources, its Tile IR lowering steps, its renderer, its
templates and its toolchain. Nothing outside `tilec/targets` lists target names or asks which
target it is compiling for; passes read what they need from the `Target` they are given.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from ..diagnostics import TilecError, error
from ..ir.graph import Schedule


@dataclass(frozen=True)
class Resources:
    """What one block of the target may use, and the default tiles the tile pass starts from."""

    warp: int  # threads per warp/wavefront (1 on the CPU)
    max_threads: int
    tile_memory: int  # bytes of on-chip tile memory per block (shared memory; CPU: L2 budget)
    mma: tuple  # (m, n, k) granule a GEMM tile must be a multiple of
    gemm_tile: tuple  # default (M, N, K)
    gemm_stages: int
    gemm_threads: int
    row_block: int  # rows per block for reductions (the schedule's `tile M=` when row_tile)
    row_threads: int  # threads per block of a row kernel
    ew_tile: tuple  # (rows, cols) per block for elementwise kernels
    ew_threads: int
    attn_tile: tuple  # (M, N) for attention
    attn_threads: int
    attn_stages: int
    dtypes: tuple  # storage dtypes it supports
    async_copy: bool = False  # global -> shared copies can be issued ahead (cp.async)
    # GEMMs whose operand rows are off 16 bytes get a variant on padded copies of them (passes/
    # tile.py PADDED): their tile copies then 16 bytes at a time
    padded_operands: bool = False
    # (condition on M, (M, N, K), threads, stages): GEMM variants the launcher picks from by the
    # dims at run time, tried in order before the default tile (decode sizes, skinny problems)
    gemm_variants: tuple = ()
    # ... their BN halved (down to 32 columns, with a warp per 8 of them) until one K tile of
    # the weights, as they are in memory, is at most this many bytes; 0 = as given
    decode_weight_bytes: int = 0
    # ((M, N, K), blocks per thread): a GEMM whose grid of that (larger) tile still gives each
    # of the threads a call may use (the launcher's `tilec_threads`) that many blocks takes it,
    # chosen at run time before the default tile (more rows share each staged tile of B); ()
    # = none
    gemm_large_tile: tuple = ()
    # (BM, BN, BK, stages, consumer warpgroups, ping-pong, cluster): GEMMs of 16-bit operands in memory
    # run a warp-specialized kernel (TMA copies, wgmma, a persistent grid: Hopper sm_90a) when
    # their operands suit TMA at run time; ping-pong: each of the 2 consumer warpgroups computes
    # whole BM x BN tiles of its own, alternating (one's epilogue overlaps the other's
    # products), else they share each tile, 64 rows each; cluster 2: pairs of blocks on
    # neighbouring M tiles load half of the B tile each for both (TMA multicast); () = never
    wgmma: tuple = ()
    # where `wgmma` takes no cluster: a variant in clusters of 2 first, for 16-bit GEMMs whose
    # B rows start off 128-byte lines (run-time strides)
    wgmma_pairs: bool = False
    # f32 products under `precision tf32` with both operands K-major take the warp-specialized
    # kernels too, on wgmma's tf32 form
    wgmma_tf32: bool = False
    # the same for GEMMs of fp8 operands (K in values: the same 128-byte rows hold twice as
    # many); () = `wgmma`'s
    wgmma_fp8: tuple = ()
    # K values whose fp8 products the matrix units sum before the partial is added to the f32
    # accumulators (Gemm.promote); 0 = never
    fp8_promote: int = 0
    # promoted K tiles in pairs (two partials): the second tile's wgmmas run while the first's
    # partial is added to the accumulators
    fp8_pairs: bool = False
    # a persistent warp-specialized GEMM whose epilogue stores whole tiles of 16-bit values by
    # TMA keeps each tile's values in registers, packed, and writes them to the staging buffers
    # under the next tile's first wgmmas (a panel per K tile) instead of with the tensor cores
    # idle
    deferred_epilogue: bool = False
    # (BM, BN, BK, stages, consumers, pingpong, cluster): a second warp-specialized GEMM tile,
    # taken where it wastes less of the last wave of tiles (passes/tile.fuller_waves)
    wgmma_waves: tuple = ()
    # (BM, BN, stages, overlap, pingpong, persistent, split, P buffers): attention's
    # warp-specialized kernel on the same machinery (one consumer warpgroup per 64 query rows,
    # BN keys per stage of K and V tiles; overlap: each warpgroup's softmax runs beside its products,
    # FlashAttention-3's order; pingpong: the two consumer warpgroups take turns issuing
    # products; persistent: a grid of one block per SM walks the query tiles, causal ones in
    # pairs of even work, the producer loading a tile's Q while the consumers finish the one
    # before; split: with overlap and without turns, K and V on rings of their own, a stage's K
    # freed once its Q K^T is complete, before its P V; P buffers 2: the next P is converted
    # into the buffer the P V in flight does not read, where the registers allow); () = never
    wgmma_attention: tuple = ()
    # (blocks, least K tiles per split, blocks per SM): a decode variant also comes split over K
    # (passes/split_k.py) when its grid has fewer tiles than `blocks`; () = never
    split_k: tuple = ()
    # (columns per block, threads, block goal, least K rows per split, blocks per SM, rows per
    # step of 32-bit weights, twice as many for 16-bit ones): GEMMs with one row of A (M = 1,
    # decode) also get a GEMV variant streaming B's rows from memory (passes/tile.py
    # gemv_body), split over K like split_k; () = none
    gemv: tuple = ()
    # GEMVs of 4-bit weights dequantized to the 16-bit dtype of the matrix units (CUDA), or with
    # f32 activations and scales (the CPU), run the target's GEMV routine (Tile IR `gemv_mma`;
    # the target renders it), with the scalar GEMV as the fallback: their
    # (columns per block, threads, block goal, least K rows per split, blocks per SM); () = never
    gemv_mma: tuple = ()
    # the dtypes of A and the scales that `gemv_mma` takes; () = mma_dtypes
    gemv_mma_dtypes: tuple = ()
    # the largest M whose GEMM of 4-bit weights runs that GEMV, one block per row of A (each row
    # reads the weights again); other GEMVs take M = 1
    gemv_mma_max_m: int = 1
    # GEMVs of more rows of A that the routine takes in one block (each weight read and
    # dequantized once for all of them), a variant each: ((rows, threads, blocks per SM), ...),
    # e.g. rows 8 for M <= 8 and 16 for M <= 16 (beyond gemv_mma_max_m; the columns per block,
    # block goal and rows per split are gemv_mma's); () = none
    gemv_mma_rows: tuple = ()
    # the same for weights packed along K (gemv_mma_kmajor's routine)
    gemv_mma_rows_kmajor: tuple = ()
    # the same for weights packed along K (q: [N, K] and scales [N, K / G] read as
    # `dequant(q.T, s.T, ...)`, the GPTQ-style layout): the target's routine for them, with the
    # same fields as gemv_mma; () = the scalar GEMV
    gemv_mma_kmajor: tuple = ()
    # 16-bit float dtypes the matrix units multiply (others take the scalar path)
    mma_dtypes: tuple = ()
    # f32 products on the matrix units in tf32 (operands rounded to 10 mantissa bits) where a
    # kernel's schedule says `precision tf32`; without it `precision tf32` changes nothing
    tf32: bool = False
    # compile-time sizes a run-time extent of an on-chip buffer may get (specialize pass): one
    # kernel variant each; for GEMM operands (attention's head dim) and for rows of row kernels
    matrix_capacities: tuple = ()
    row_capacities: tuple = ()
    # ((largest row capacity, threads), ...): threads per block of each row-capacity variant of a
    # row kernel whose schedule leaves `threads` open (longer rows: more threads, so that each
    # holds a few vectors; measured in docs/PERFORMANCE.md); past the last: row_threads
    row_threads_by_capacity: tuple = ()
    # ((largest capacity, threads), ...): the least threads of a variant for a run-time extent of
    # GEMM operands (attention's head dim) that is not exactly its capacity; an exact one keeps
    # the kernel's threads
    matrix_threads_by_capacity: tuple = ()
    # how the tiles a mask relating two tile positions (a causal key > query) does not touch
    # skip it (version_masks): "statement", a mask-free version of the masking statement chosen
    # per tile; "split", the loop split where the masks start (one version of the body per
    # loop); masks of one position (a key bound) always take the per-statement versions
    diagonal_masks: str = "statement"
    gemm_swizzle: int = 0  # default block rasterization panel of GEMM kernels (0: none)
    row_tile: bool = True  # a schedule's `tile M=` sets the rows per block of row kernels
    # reductions that keep the innermost axis (over rows: a column sum, a softmax over axis 0 or
    # a middle axis) run on blocks of columns that sweep the reduced rows, each row read whole
    # (GPUs: coalesced; the CPU: a SIMD loop over the columns): (threads, rows per step, bytes of
    # a row per block, the blocks a split of the rows over blocks aims at, the least steps per
    # slice); (): as row kernels of the transposed view (strided reads)
    col_reduce: tuple = ()
    # default (M, N, K) tile of a GEMM the matrix units cannot take (scalar FMAs; None: gemm_tile)
    scalar_gemm_tile: tuple | None = None
    # (stages, blocks per SM) of that GEMM of f32 operands copied as they are where both are
    # K-major (X @ W.T: both read 16 bytes along K), in place of gemm_stages and one block
    # (None: those)
    scalar_gemm_kmajor: tuple | None = None


class Toolchain:
    """The compiler a target's Makefile runs: how to find it and which version it is (the
    version is part of the compile-cache key)."""

    def __init__(self, env: str, default: str, what: str):
        self.env, self.default, self.what = env, default, what

    def command(self) -> str:
        return os.environ.get(self.env, self.default)

    def missing(self) -> list:
        out = []
        if shutil.which("make") is None:
            out.append("make")
        if shutil.which(self.command().split()[0]) is None:
            out.append(f"{self.command()} (set {self.env} to another {self.what})")
        return out

    def version(self) -> str:
        return _version(self.command())


@functools.cache
def _version(cmd: str) -> str:
    try:
        out = subprocess.run(cmd.split() + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    return lines[-1] if lines else "unknown"


@dataclass(frozen=True)
class Target:
    name: str
    resources: Resources
    toolchain: Toolchain
    # Tile IR lowering after `tile`: ((pass name, fn(program, target, options) -> program), ...)
    lowering: tuple = ()
    # render_files(target, source, module, jinja env, banner, options) -> {filename: text};
    # None: the target cannot build yet
    render_files: object = None
    templates: str = ""  # folder under tilec/templates
    source_ext: str = ".cpp"
    device_library: str = ""  # header tilec writes beside the sources
    arch_choices: tuple = ()  # values of --arch
    default_arch: tuple = ()
    runtime: str = ""  # module in tilec.runtimes that `tilec run` uses
    link_flags: str = ""  # what a program linking the library (static or shared) also needs
    options: dict = field(default_factory=dict)
    # specialize(target, build options) -> the target those options build for (CUDA: Hopper's
    # resources when every --arch is sm_90a); None: always this one
    specialize: object = None

    def for_options(self, options: dict | None) -> Target:
        return self.specialize(self, options or {}) if self.specialize else self

    @property
    def buildable(self) -> bool:
        return self.render_files is not None

    def tf32(self, s: Schedule) -> bool:
        """Whether schedule `s` lets this target multiply f32 in tf32 (`precision tf32` on a
        target whose matrix units take it)."""
        return s.precision == "tf32" and self.resources.tf32

    def gemm_config(self, s: Schedule, scalar: bool = False, operand_bytes: int = 2) -> tuple:
        """(BM, BN, BK, stages, threads) of a GEMM: the schedule's, else the target's tile (its
        scalar one for products off the matrix units); matrix-unit operands of `operand_bytes`
        (tf32: 4) keep the 16-bit tile's bytes per row, i.e. a K tile 2 / operand_bytes as deep."""
        r = self.resources
        bm, bn, bk = (r.scalar_gemm_tile or r.gemm_tile) if scalar else r.gemm_tile
        if not scalar:
            bk = max(bk * 2 // operand_bytes, 8)
        return (s.tile_size("M", bm), s.tile_size("N", bn), s.tile_size("K", bk),
                s.stages or r.gemm_stages, s.threads or r.gemm_threads)

    def validate(self, s: Schedule, operand_bytes: int = 2):
        """Reject schedules this target cannot run, naming the limit."""
        r = self.resources
        threads = s.threads or r.gemm_threads
        if threads > r.max_threads:
            raise error(f"threads {threads} exceeds the {self.name} limit of {r.max_threads}",
                        s.loc_of("threads"))
        if threads % r.warp:
            raise error(f"threads {threads} is not a multiple of the {self.name} warp size "
                        f"({r.warp})", s.loc_of("threads"))
        bm, bn, bk, stages, _ = self.gemm_config(s)
        for axis, size, gran in zip("MNK", (bm, bn, bk), r.mma):
            if size % gran:
                raise error(f"tile {axis}={size} is not a multiple of the {self.name} matrix-unit "
                            f"shape ({axis}={gran})", s.loc_of(f"tile.{axis}"))
        need = (bm * bk + bk * bn) * operand_bytes * stages
        if need > r.tile_memory:
            raise error(f"schedule needs {_kib(need)} of tile memory per block on {self.name}; "
                        f"the limit is {_kib(r.tile_memory)}", s.loc_of("tile"),
                        "use smaller tiles or fewer stages")

    def parse_arch(self, text: str | None) -> tuple:
        """`--arch a,b`: validated against the target's choices (default when None)."""
        if text is None:
            return self.default_arch
        archs = tuple(a.strip() for a in text.split(",") if a.strip())
        if not self.arch_choices:
            raise error(f"target {self.name} takes no --arch")
        for a in archs:
            if a not in self.arch_choices:
                raise error(f"unknown --arch '{a}' for target {self.name}; choose from "
                            f"{', '.join(self.arch_choices)}")
        if not archs:
            raise error("--arch needs at least one architecture")
        return archs

    def check_toolchain(self):
        missing = self.toolchain.missing()
        if missing:
            raise TilecError(f"cannot build for target {self.name}: {' and '.join(missing)} "
                             "not found")


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"
