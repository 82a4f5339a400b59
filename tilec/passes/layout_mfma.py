"""The layout pass with the HIP target's tables: gemm accumulators take the MFMA layout
(ir/layout_mfma.py) instead of mma.sync's; everything else (propagation to the loops and
fragments, vector layouts, shared tiles) is the GPU layout pass's (passes/layout.py).

Every gemm of a kernel uses one MFMA tile T (32 x 32 x 8 where every wave tile is whole 32 x 32
tiles, else 16 x 16 x 16), so a 16-bit copy of an accumulator (attention's P) is laid out as the
next product's operand. Wave grids tile accumulators in 16 x 16 tiles (`Resources.mma`), the
squarest wave tiles of whole 32 x 32 tiles first.
"""

from __future__ import annotations

from ..ir import tile as T
from ..ir.layout_mfma import MfmaLayout, mfma_tile
from . import layout


class MfmaAssign(layout.Assign):
    def __init__(self, k: T.TileKernel, target):
        super().__init__(k, target)
        gemms = [s for s in T.walk_stmts(k.body) if isinstance(s, T.Gemm)]
        self.rows_in_warp = len(gemms) > 1 or any(len(self.allocs[f].shape) == 1
                                                  for f in self.frags)
        self.grids = {}
        for g in gemms:
            rows, cols = self.shape(g.c)
            self.grids[(rows, cols)] = self.grid(rows, cols)
        self.tile = mfma_tile((r // wm, c // wn) for (r, c), (wm, wn) in self.grids.items())

    def grid(self, rows: int, cols: int) -> tuple:
        return layout.best_grid(rows, cols, self.warps, self.rows_in_warp,
                                self.target.resources.mma[:2], pair=32)

    def simt_pad(self, cols: int, elem: int, g: T.Gemm, name: str) -> int:
        return 0  # (HIP's gemm_simt reads in the MFMA layout's pattern, not CUDA's)

    def acc_layout(self, rows: int, cols: int, rows_in_warp: bool, scalar: bool = False):
        assert rows_in_warp == self.rows_in_warp
        return MfmaLayout(rows, cols, *self.grids[(rows, cols)], tile=self.tile)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return layout.run(prog, target, options, MfmaAssign)
