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

Bounds: the variant needs `tiles < blocks`, so M * N * batch < blocks * tile size, and the
workspace (count <= blocks) stays far below any overflow of the launcher's 64-bit arithmetic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..ir.types import Dim


@dataclass(frozen=True)
class Split:
    chunk: Dim  # K tiles per split
    count: Dim  # splits per output tile (each gets at least one K tile)
    when: Dim  # the split pays: the output has fewer tiles than the block goal, K is long


def plan(tiles: Dim, nk: Dim, blocks: int, min_tiles: int) -> Split:
    """The split of `nk` K tiles for a grid of `tiles` output tiles, aiming at `blocks` blocks
    with at least `min_tiles` K tiles per split."""
    # at least `min_tiles` per split: at most nk // min_tiles splits (and at least one)
    want = Dim.bin("min", Dim.const(blocks).cdiv(tiles),
                   Dim.bin("max", Dim.bin("floordiv", nk, min_tiles), 1))
    chunk = nk.cdiv(want)
    count = nk.cdiv(chunk)
    when = Dim.bin("and", Dim.bin("lt", tiles, Dim.const(blocks)),
                   Dim.bin("ge", nk, Dim.const(2 * min_tiles)))
    return Split(chunk, count, when)


def config(target) -> tuple:
    """The target's (blocks, least K tiles per split, blocks per SM), or `TILEC_SPLIT_K`'s
    ("blocks,min_tiles,blocks_per_sm"; "off" or "0" turns splitting off): a knob for
    benchmarking other choices on a device, documented in docs/CUDA.md."""
    env = os.environ.get("TILEC_SPLIT_K", "").strip()
    if not env:
        return target.resources.split_k
    if env in ("off", "0") or not target.resources.split_k:
        return ()
    try:
        blocks, min_tiles, per_sm = (int(x) for x in env.split(","))
    except ValueError:
        raise ValueError(f"TILEC_SPLIT_K={env!r}: expected blocks,min_tiles,blocks_per_sm") from None
    return blocks, min_tiles, per_sm


def decode_variants(target) -> tuple:
    """The target's decode-size GEMM variants, or `TILEC_DECODE_TILE`'s single one
    ("MAX_M,BMxBNxBK,threads,stages", e.g. "16,16x256x64,256,4"): a benchmarking knob like
    `TILEC_SPLIT_K`."""
    env = os.environ.get("TILEC_DECODE_TILE", "").strip()
    if not env:
        return target.resources.gemm_variants
    try:
        max_m, tile, threads, stages = env.split(",")
        return ((int(max_m), tuple(int(x) for x in tile.split("x")), int(threads), int(stages)),)
    except ValueError:
        raise ValueError(f"TILEC_DECODE_TILE={env!r}: expected MAX_M,BMxBNxBK,threads,stages") \
            from None


def gemv_config(target) -> tuple:
    """The target's GEMV (M = 1) variant: (columns per block, threads, block goal, least K rows per
    split, blocks per SM, rows per step); `TILEC_GEMV` overrides it ("off" turns it off), a
    benchmarking knob like `TILEC_SPLIT_K`."""
    env = os.environ.get("TILEC_GEMV", "").strip()
    if not env:
        return target.resources.gemv
    if env in ("off", "0") or not target.resources.gemv:
        return ()
    try:
        return tuple(int(x) for x in env.split(","))
    except ValueError:
        raise ValueError(f"TILEC_GEMV={env!r}: expected columns,threads,blocks,rows,per_sm,unroll") \
            from None
