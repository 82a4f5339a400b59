"""Split-K for GEMMs whose output has too few tiles to fill the device.

A decode-size GEMM (M <= 16) with N = 8192 has 128 output tiles: one block per SM, each walking
the whole K loop alone, so the weights stream through one pipeline per SM and the device waits on
latency, not bandwidth. Split-K gives each output tile `count` blocks, each walking `chunk`
consecutive K tiles and writing its f32 partial product to a workspace `[batch..., count, M, N]`;
a second kernel sums the partials in a fixed order (deterministic) and runs the epilogue on the
sum, so every fusion the epilogue holds still happens once, on the final value.

The split is chosen from the dimensions alone (the workspace size is a function of them):
`count` is about `blocks / tiles` (the target's block goal over the output tiles), with at least
`min_tiles` K tiles per split, and every split gets at least one K tile (`count = cdiv(nk,
chunk)`). The variant runs only where it splits (`count >= 2`); the plain variant follows it.
A column reduction's split of its rows (tile.py) plans the same way with `wave`: its goal is the
blocks the device runs at once, and `count` stays within it (`blocks // tiles`).

Bounds: the variant needs `tiles < blocks`, so M * N * batch < blocks * tile size, and the
workspace (count <= blocks) stays far below any overflow of the launcher's 64-bit arithmetic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..diagnostics import TilecError, error
from ..ir.graph import Schedule
from ..ir.types import Dim


@dataclass(frozen=True)
class Split:
    chunk: Dim  # K tiles per split
    count: Dim  # splits per output tile (each gets at least one K tile)
    when: Dim  # the split pays: the output has fewer tiles than the block goal, K is long


def plan(tiles: Dim, nk: Dim, blocks: int, min_tiles: int, multiple: int = 1,
         wave: bool = False) -> Split:
    """The split of `nk` K tiles for a grid of `tiles` output tiles, aiming at `blocks` blocks
    with at least `min_tiles` K tiles per split; each split's chunk a multiple of `multiple` (a
    GEMV's rows per step: its steps then start at multiples of it). `wave`: `blocks` is what the
    device runs at once, and the split stays within it (a few blocks more would make a second
    wave as long as the first): splits only where each tile gets two."""
    # at least `min_tiles` per split: at most nk // min_tiles splits (and at least one)
    per_tile = Dim.bin("max", Dim.bin("floordiv", Dim.const(blocks), tiles), 1) if wave else \
        Dim.const(blocks).cdiv(tiles)
    want = Dim.bin("min", per_tile, Dim.bin("max", Dim.bin("floordiv", nk, min_tiles), 1))
    chunk = nk.cdiv(want)
    if multiple > 1:
        chunk = chunk.cdiv(multiple) * multiple
    count = nk.cdiv(chunk)
    room = Dim.bin("le", tiles * 2, Dim.const(blocks)) if wave else \
        Dim.bin("lt", tiles, Dim.const(blocks))  # (wave: two splits per tile within the goal)
    when = Dim.bin("and", room, Dim.bin("ge", nk, Dim.const(2 * min_tiles)))
    if multiple > 1:  # (a chunk rounded up may leave a single split: then no split variant)
        when = Dim.bin("and", when, Dim.bin("ge", count, Dim.const(2)))
    return Split(chunk, count, when)


def _knob(name: str, expect: str, fields, parse=int):
    """A benchmarking knob from the environment (documented in docs/CUDA.md): None when unset, ()
    for "off" or "0", else `fields` comma-separated values (a count, or a tuple of the counts
    allowed; `parse` reads each); a malformed value is a user error naming the variable."""
    env = os.environ.get(name, "").strip()
    if not env:
        return None
    if env in ("off", "0"):
        return ()
    parts = env.split(",")
    try:
        if len(parts) not in (fields if isinstance(fields, tuple) else (fields,)):
            raise ValueError
        return tuple(parse(x) for x in parts)
    except ValueError:
        raise error(f"{name}={env!r}: expected {expect}") from None


def config(target) -> tuple:
    """The target's split (blocks, least K tiles per split, blocks per SM), or `TILEC_SPLIT_K`'s
    (a target that never splits stays so)."""
    knob = _knob("TILEC_SPLIT_K", "blocks,min_tiles,blocks_per_sm", 3)
    return target.resources.split_k if knob is None or not target.resources.split_k else knob


def decode_variants(target, weight_bits: int = 16) -> tuple:
    """The target's decode-size GEMM variants, or `TILEC_DECODE_TILE`'s single one
    ("MAX_M,BMxBNxBK,threads,stages", e.g. "16,16x256x64,256,4", taken as it is). The
    target's tiles are `narrowed` to its `decode_weight_bytes` per K tile of the weights, whose
    values take `weight_bits` each in memory."""
    def field(x: str):
        return tuple(int(v) for v in x.split("x")) if "x" in x else int(x)
    knob = _knob("TILEC_DECODE_TILE", "MAX_M,BMxBNxBK,threads,stages", 4, field)
    if knob is None:
        return tuple(narrowed(v, weight_bits, target.resources.decode_weight_bytes)
                     for v in target.resources.gemm_variants)
    if knob and not (isinstance(knob[1], tuple) and len(knob[1]) == 3):
        raise error(f"TILEC_DECODE_TILE: the tile is BMxBNxBK, not {knob[1]!r}")
    return (knob,) if knob else ()


NARROWEST = 32  # columns of a narrowed decode tile at least (4 warps of 8)


def narrowed(variant: tuple, weight_bits: int, limit: int) -> tuple:
    """Decode variant `variant` with BN halved until a K tile of its weights is at most `limit`
    bytes (0: as it is) or BN is NARROWEST, and its threads cut to one warp per 8 columns: a
    decode GEMM streams the weights once, and more, smaller blocks keep more of them in flight
    on every SM."""
    max_m, (bm, bn, bk), threads, stages = variant
    while limit and bn * bk * weight_bits > 8 * limit and bn // 2 >= NARROWEST:
        bn //= 2
    return max_m, (bm, bn, bk), min(threads, bn // 8 * 32), stages


def gemm_tile(target):
    """`TILEC_GEMM_TILE` ("BMxBNxBK,threads,stages,swizzle", e.g. "128x256x64,256,3,8"): the
    default block tile, threads, pipeline depth and rasterization panel of tensor-core GEMMs in
    place of the target's, for measuring other choices on a device; None when unset. Schedules
    that set any of them keep their own."""
    def field(x: str):
        return tuple(int(v) for v in x.split("x")) if "x" in x else int(x)
    knob = _knob("TILEC_GEMM_TILE", "BMxBNxBK,threads,stages,swizzle", 4, field)
    if not knob or not target.resources.mma:
        return None
    if not (isinstance(knob[0], tuple) and len(knob[0]) == 3) or \
            any(isinstance(x, tuple) for x in knob[1:]) or knob[2] < 1 or knob[3] < 0:
        raise error(f"TILEC_GEMM_TILE: expected BMxBNxBK,threads,stages,swizzle (stages at least "
                    f"1, swizzle at least 0), not {knob!r}")
    (bm, bn, bk), threads, stages, swizzle = knob
    try:  # the limits a schedule of these values would meet
        target.validate(Schedule(target.name, tile=(("M", bm), ("N", bn), ("K", bk)),
                                 threads=threads, stages=stages, swizzle=swizzle))
    except TilecError as e:
        raise error(f"TILEC_GEMM_TILE: {e.message}", None, e.note) from None
    return knob


def wgmma_tile(default: tuple) -> tuple:
    """`TILEC_WGMMA` ("BMxBN,stages[,pingpong][,cluster2]", e.g. "128x128,6,pingpong"): the
    warp-specialized
    GEMM's block tile and depth in place of the target's `wgmma`, for measuring other choices on
    a device. Cooperative (the default form): BM a multiple of 64 up to 192, one consumer
    warpgroup per 64 rows; ping-pong: BM 64 or 128, two consumer warpgroups each on tiles of its
    own. BN 64, 128 or 256 (ping-pong with BM 128, and cooperative with BM 192: at most 128, the
    accumulators' registers).
    cluster2 (not with ping-pong): blocks in clusters of 2 on neighbouring M tiles, each loading
    half of the B tile for both (TMA multicast). "off": no warp-specialized kernel."""
    env = os.environ.get("TILEC_WGMMA", "").strip()
    if not env:
        return default
    if env in ("off", "0"):
        return ()
    bad = error(f"TILEC_WGMMA={env!r}: expected BMxBN,stages[,pingpong|,cluster2] (BM a "
                "multiple of 64 up to 192, or 64/128 for ping-pong; BN 64, 128 or 256, at most "
                "128 with BM 192 or ping-pong's BM 128; at least 2 stages; all in 227 KiB of "
                "shared memory)")
    parts = env.split(",")
    try:
        bm, bn = (int(v) for v in parts[0].split("x"))
        stages = int(parts[1])
    except (ValueError, IndexError):
        raise bad from None
    flags = parts[2:]
    pingpong, cluster = "pingpong" in flags, 2 if "cluster2" in flags else 1
    if len(flags) != len(set(flags)) or not set(flags) <= {"pingpong", "cluster2"} or \
            (pingpong and cluster > 1) or bm % 64 or \
            not 64 <= bm <= (128 if pingpong else 192) or bn not in (64, 128, 256) or \
            (pingpong and bm * bn > 128 * 128 and bm > 64) or \
            (not pingpong and bm > 128 and bn > 128) or stages < 2 or \
            (bm + bn) * 64 * 2 * stages > 227 * 1024:
        raise bad
    return (bm, bn, 64, stages, 2 if pingpong else bm // 64, pingpong, cluster)


def fp8_promote(default: int) -> int:
    """`TILEC_FP8_PROMOTE` (K values, a multiple of 128, or "off"): how many values of K the fp8
    wgmma GEMM sums on the tensor cores before adding the partial to its f32 accumulators
    (Gemm.promote), in place of the target's `fp8_promote`; "off": never (the tensor cores'
    precision over all of K), for measuring on a device."""
    knob = _knob("TILEC_FP8_PROMOTE", "K values per promotion (a multiple of 128) or off", 1)
    if knob is None:
        return default
    if knob and (knob[0] <= 0 or knob[0] % 128):
        raise error(f"TILEC_FP8_PROMOTE={knob[0]}: expected a positive multiple of 128 or off")
    return knob[0] if knob else 0


def _switch(name: str, default: bool) -> bool:
    """A benchmarking knob that turns one of the target's choices on or off (1 or 0)."""
    knob = _knob(name, "1 or 0", 1)
    if knob is None:
        return default
    if knob and knob[0] not in (0, 1):
        raise error(f"{name}={knob[0]}: expected 1 or 0")
    return bool(knob and knob[0])


def shared_values(default: bool) -> bool:
    """`TILEC_SHARED_VALUES` (1 or 0): whether the CUDA and HIP renderers compute the values an
    element's statements repeat once, into locals (targets/cuda.py stmts), or render each
    repeat (the form before), for measuring on a device."""
    return _switch("TILEC_SHARED_VALUES", default)


def simt_shared(default: str) -> str:
    """`TILEC_SIMT_SHARED` (pad, swizzle or plain): how the layout pass keeps the shared operands
    of products on the scalar units conflict-free where their rows are M or N (passes/layout.py
    simt_pad): rows padded, 16-byte chunks XOR-swizzled by row, or neither (the form before),
    in place of the default, for measuring on a device."""
    env = os.environ.get("TILEC_SIMT_SHARED", "").strip()
    if not env:
        return default
    if env not in ("swizzle", "pad", "plain"):
        raise error(f"TILEC_SIMT_SHARED={env!r}: expected pad, swizzle or plain")
    return env


def simt_grid(default: bool) -> bool:
    """`TILEC_SIMT_GRID` (1 or 0): whether the accumulators of products on the scalar units take
    the grid of warps that reads the fewest operand values (passes/layout.py best_grid) or the
    matrix units' grid (the form before), for measuring on a device."""
    return _switch("TILEC_SIMT_GRID", default)


def simt_blocks(default: int) -> int:
    """`TILEC_SIMT_BLOCKS` (a count): the blocks per SM the kernels of products on the scalar
    units are compiled for (__launch_bounds__: their registers capped to fit), in place of the
    target's, for measuring on a device."""
    knob = _knob("TILEC_SIMT_BLOCKS", "blocks per SM (1 to 8)", 1)
    if knob is None:
        return default
    if not knob or not 1 <= knob[0] <= 8:
        raise error(f"TILEC_SIMT_BLOCKS={os.environ['TILEC_SIMT_BLOCKS'].strip()!r}: expected "
                    "blocks per SM (1 to 8)")
    return knob[0]


def wgmma_tf32(default: bool) -> bool:
    """`TILEC_WGMMA_TF32` (1 or 0): whether K-major f32 products under `precision tf32` take the
    warp-specialized kernels on tf32 wgmma (resources.wgmma_tf32) or stay on tf32 mma.sync, in
    place of the target's choice."""
    return _switch("TILEC_WGMMA_TF32", default)


def fp8_pairs(default: bool) -> bool:
    """`TILEC_FP8_PAIRS` (1 or 0): whether the promoted fp8 K loop takes its K tiles in pairs
    (resources.fp8_pairs), in place of the target's choice, for measuring on a device."""
    return _switch("TILEC_FP8_PAIRS", default)


def wgmma_pairs(default: bool) -> bool:
    """`TILEC_WGMMA_PAIRS` (1 or 0): whether 16-bit GEMMs whose B rows start off 128-byte lines
    take a variant in clusters of 2 (resources.wgmma_pairs), in place of the target's choice,
    for measuring on a device."""
    return _switch("TILEC_WGMMA_PAIRS", default)


def col_reduce(default: tuple) -> tuple | None:
    """The target's column reductions (tile.py lower_col_reduce: (threads, rows per step of the
    sweep, bytes of each row per block, the blocks a split of the rows aims at, the least steps
    per slice); () or None: none), or `TILEC_COL_REDUCE`'s ("threads,rows", e.g. 1024,256; 0:
    off, such reductions run as row kernels of the transposed view), for measuring."""
    knob = _knob("TILEC_COL_REDUCE", "threads,rows (or 0)", 2)
    if knob is None or not default:
        return default or None
    if knob and (not 1 <= knob[0] <= 1024 or knob[1] < 1 or knob[1] & (knob[1] - 1)):
        raise error(f"TILEC_COL_REDUCE={','.join(map(str, knob))}: expected threads (at most "
                    "1024) and rows per step (a power of 2)")
    # (a target of one thread per block, the CPU, keeps it)
    return (knob[0] if default[0] > 1 else 1, knob[1], *default[2:]) if knob else None


def _least(var: str, what: str, default: int) -> int:
    """Knob `var`: a count of at least 1 (`what`), or 0 (off: never); `default` where unset."""
    knob = _knob(var, f"{what}, or 0", 1)
    if knob is None:
        return default
    if knob and knob[0] < 1:
        raise error(f"{var}={knob[0]}: expected {what} of at least 1, or 0")
    return knob[0] if knob else 0


def pad_least(default: int) -> int:
    """`TILEC_PAD_LEAST` (a count, 0 or off: never): the least product size (batch x M x N x K)
    for which a GEMM whose operand rows are off 16 bytes copies them to padded rows for the
    warp-specialized kernel or the default one (passes/tile.py, the `_tma_pad` and `_pad`
    variants), in place of tilec's two, for measuring on a device."""
    return _least("TILEC_PAD_LEAST", "a product size (batch x M x N x K)", default)


def transpose_work(default: int) -> int:
    """`TILEC_TRANSPOSE_WORK` (a count, 0 or off: never): the least multiply-adds per value
    copied for which an fp8 or tf32 GEMM operand stored MN-major is copied transposed for the
    warp-specialized kernel (passes/tile.py, `_tma` and `_tma_pad`), in place of tilec's, for
    measuring on a device."""
    return _least("TILEC_TRANSPOSE_WORK", "a count of multiply-adds per value copied", default)


def wgmma_waves(default: tuple) -> tuple:
    """`TILEC_WGMMA_WAVES` (1, 0 or BMxBN): the block tile of the variant that 16-bit GEMMs take
    where it wastes less of the last wave (resources.wgmma_waves): the target's (1), none (0),
    or BM x BN (BM 128 or 192, one consumer warpgroup per 64 rows; BN 128, 192 or 256; at most
    192 x 192: the accumulators' registers), 4 stages, for measuring on a device."""
    env = os.environ.get("TILEC_WGMMA_WAVES", "").strip()
    if "x" not in env:
        return default if _switch("TILEC_WGMMA_WAVES", True) else ()
    try:
        bm, bn = (int(v) for v in env.split("x"))
    except ValueError:
        bm = bn = 0
    if bm not in (128, 192) or bn not in (128, 192, 256) or bm * bn > 192 * 192:
        raise error(f"TILEC_WGMMA_WAVES={env!r}: expected 1, 0 or BMxBN (BM 128 or 192, BN "
                    "128, 192 or 256, at most 192x192)")
    return (bm, bn, 64, 4, bm // 64, False, 1)


def merge_rows(default: bool) -> bool:
    """`TILEC_MERGE_ROWS` (1 or 0): whether a batched GEMM by one weight runs as one GEMM of all
    its rows (passes/merge_rows.py), in place of the default (on), for measuring."""
    return _switch("TILEC_MERGE_ROWS", default)


def dependent_launches(default: bool) -> bool:
    """`TILEC_DEPENDENT_LAUNCH` (1 or 0): whether a call's later kernels are dependent launches
    (targets/cuda.launch_order), in place of the default (on), for measuring on a device."""
    return _switch("TILEC_DEPENDENT_LAUNCH", default)


def deferred_epilogue(default: bool) -> bool:
    """`TILEC_DEFER_EPILOGUE` (1 or 0): whether a persistent warp-specialized GEMM stores each
    tile under the next tile's first wgmmas (resources.deferred_epilogue), in place of the
    target's choice, for measuring on a device."""
    return _switch("TILEC_DEFER_EPILOGUE", default)


def wgmma_attention(default: tuple) -> tuple:
    """`TILEC_WGMMA_ATTENTION` ("stages,overlap,pingpong[,persistent[,split[,keys[,p]]]]", each
    flag 1 or 0, e.g. "3,1,1"): the warp-specialized attention's K/V stages, whether each
    warpgroup overlaps its softmax with its products (FlashAttention-3's order), whether the two
    consumer warpgroups take turns issuing products (named barriers), whether a persistent grid
    walks the query tiles (the producer loads a tile's Q while the consumers finish the tile
    before it), whether K and V have rings of their own (a key tile's K is freed once its Q K^T
    is complete, its V once its P V is), the keys per tile (128 or 176: 176 leaves room for 2
    stages only) and the buffers of P (1 or 2: 2 converts P into the buffer that the P V in
    flight does not read, before that P V's wait, where the registers allow: cuda.py
    overlapped_loop), each the target's choice when left out, in place of the target's
    `wgmma_attention`, for measuring on a device; "off": none."""
    expect = ("stages,overlap,pingpong[,persistent[,split[,keys[,p]]]] (stages 2 or 3, the flags "
              "0 or 1, keys 128 or 176 with 2 stages at most, p buffers 1 or 2)")
    knob = _knob("TILEC_WGMMA_ATTENTION", expect, (3, 4, 5, 6, 7))
    if knob is None or not default:
        return default
    if knob == ():
        return ()
    flags, keys, p = knob[1:5], knob[5:6] or default[1:2], knob[6:7] or default[7:8]
    if knob[0] not in (2, 3) or any(f not in (0, 1) for f in flags) or \
            keys[0] not in (128, 176) or (keys[0] == 176 and knob[0] > 2) or p[0] not in (1, 2):
        raise error(f"TILEC_WGMMA_ATTENTION={','.join(map(str, knob))}: expected {expect}")
    return (default[0], keys[0], knob[0]) + tuple(bool(f) for f in flags) + \
        default[3 + len(flags):7] + (p[0],)


def gemv_mma(target) -> bool:
    """Whether GEMVs of 4-bit weights run the target's GEMV routine (T.GemvMma: CUDA's on the
    matrix units, the CPU's vector code): the target's `gemv_mma`, unless `TILEC_GEMV_MMA=off`
    (to measure the scalar GEMV against it)."""
    knob = _knob("TILEC_GEMV_MMA", "off (or unset)", 0)
    return bool(target.resources.gemv_mma) and knob != ()


def gemv_rows(target, kmajor: bool = False) -> tuple:
    """The target's GEMV variants of several rows of A on its GEMV routine: ((rows, threads,
    blocks per SM), ...) for weights in memory order or, `kmajor`, packed along K; or
    `TILEC_GEMV_ROWS` / `TILEC_GEMV_ROWS_KMAJOR`'s ("ROWSxTHREADSxBLOCKS_PER_SM,...", or off)."""
    name = "TILEC_GEMV_ROWS_KMAJOR" if kmajor else "TILEC_GEMV_ROWS"
    expect = "ROWSxTHREADSxBLOCKS_PER_SM,... (e.g. 8x1024x1,16x512x1) or off"
    knob = _knob(name, expect, (1, 2, 3, 4), lambda x: tuple(int(v) for v in x.split("x")))
    if knob is None:
        return target.resources.gemv_mma_rows_kmajor if kmajor else target.resources.gemv_mma_rows
    if any(len(v) != 3 or not 2 <= v[0] <= 16 or v[1] % 32 or not 32 <= v[1] <= 1024 or v[2] < 1
           for v in knob):
        raise error(f"{name}={os.environ[name]!r}: expected {expect}, rows 2 to 16, threads a "
                    "multiple of 32 up to 1024")
    return knob


def gemv_config(target, on_mma: bool = False, kmajor: bool = False) -> tuple:
    """The target's GEMV (M = 1) variant: (columns per block, threads, block goal, least K rows per
    split, blocks per SM, rows per step), or `TILEC_GEMV`'s (a target without one stays so).
    `on_mma`: the GEMV of 4-bit weights that runs on the matrix units, whose block shape the
    target's `gemv_mma` gives (the rows per step stay those of its scalar fallback)."""
    knob = _knob("TILEC_GEMV", "columns,threads,blocks,rows,blocks_per_sm,rows_per_step", 6)
    if knob is not None and target.resources.gemv:
        return knob
    if on_mma and gemv_mma(target):
        if kmajor:  # weights packed along K: their routine's block shape
            return target.resources.gemv_mma_kmajor + target.resources.gemv[5:]
        return target.resources.gemv_mma + target.resources.gemv[5:]
    return target.resources.gemv
