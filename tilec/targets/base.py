"""Target descriptions: resources, default tile sizes, and schedule validation."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import error
from ..ir.graph import Schedule


@dataclass(frozen=True)
class Target:
    name: str
    warp: int  # threads per warp/wavefront (1 on the CPU)
    max_threads: int
    tile_memory: int  # bytes of on-chip tile memory per block (shared memory; CPU: L2 budget)
    mma: tuple  # (m, n, k) granule a GEMM tile must be a multiple of
    gemm_tile: tuple  # default (M, N, K)
    gemm_stages: int
    gemm_threads: int
    row_block: int  # rows per block for reductions
    ew_tile: tuple  # (rows, cols) per block for elementwise kernels
    attn_tile: tuple  # (M, N) for attention
    dtypes: tuple  # storage dtypes it supports

    def gemm_config(self, s: Schedule) -> tuple:
        bm, bn, bk = self.gemm_tile
        return (s.tile_size("M", bm), s.tile_size("N", bn), s.tile_size("K", bk),
                s.stages or self.gemm_stages, s.threads or self.gemm_threads)

    def validate(self, s: Schedule, operand_bytes: int = 2):
        """Reject schedules this target cannot run, naming the limit."""
        threads = s.threads or self.gemm_threads
        if threads > self.max_threads:
            raise error(f"threads {threads} exceeds the {self.name} limit of {self.max_threads}",
                        s.loc_of("threads"))
        if threads % self.warp:
            raise error(f"threads {threads} is not a multiple of the {self.name} warp size "
                        f"({self.warp})", s.loc_of("threads"))
        bm, bn, bk, stages, _ = self.gemm_config(s)
        for axis, size, gran in zip("MNK", (bm, bn, bk), self.mma):
            if size % gran:
                raise error(f"tile {axis}={size} is not a multiple of the {self.name} matrix-unit "
                            f"shape ({axis}={gran})", s.loc_of(f"tile.{axis}"))
        need = self.tile_bytes(bm, bn, bk, stages, operand_bytes)
        if need > self.tile_memory:
            raise error(f"schedule needs {_kib(need)} of tile memory per block on {self.name}; "
                        f"the limit is {_kib(self.tile_memory)}", s.loc_of("tile"),
                        "use smaller tiles or fewer stages")

    def tile_bytes(self, bm, bn, bk, stages, operand_bytes) -> int:
        return (bm * bk + bk * bn) * operand_bytes * stages


def _kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"
