"""The accumulator layouts of AMD's matrix instructions (MFMA, wave64), the HIP target's tables
for the layout pass (passes/layout_mfma.py); tilec_hip.h's gemm_ss / gemm_rs / gemm_simt read and
write accumulators in exactly this layout.

The instructions (CDNA ISA, "matrix fused multiply-add"; f16 and bf16_1k alike), for a T x T
output tile over the 64 lanes of a wavefront, with H = 64 / T lane groups:

* v_mfma_f32_32x32x8 (T = 32, H = 2): A operand, lane l holds A[l % 32][4 (l / 32) + j] for
  j < 4 (four 16-bit values); B operand, lane l holds B[4 (l / 32) + j][l % 32]; D, lane l
  register r (16 of them) holds D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32].
* v_mfma_f32_16x16x16 (T = 16, H = 4): A, lane l holds A[l % 16][4 (l / 16) + j]; B, lane l
  holds B[4 (l / 16) + j][l % 16]; D, lane l register r (4) holds D[4 (l / 16) + r][l % 16].

Both: D row = 4 H (r / 4) + 4 (l / T) + r % 4, D column = l % T, k-steps of 4 H.

tilec runs every product transposed, C^T = B^T A^T (B's fragment as the instruction's A operand,
A's as its B operand), so lane l holds row l % T of C and, in register group g (registers 4g ..
4g + 3, g < G = T / (4 H)), the 4 consecutive columns 4 H g + 4 (l / T) .. + 3: the renderer's
register groups of 4 columns (16-byte f32 / 8-byte 16-bit stores), and a 16-bit copy of an
accumulator is, group for group, the B operand of the next product's k-steps (attention's P).
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import MmaLayout, MmaRows, added, operand

WAVE = 64


def mfma_tile(warp_tiles) -> int:
    """The MFMA tile T every gemm of a kernel uses: 32 (32x32x8) when every wave tile (rows,
    cols) is whole 32 x 32 tiles, else 16 (16x16x16). One T per kernel, so that a 16-bit copy of
    one accumulator has the operand layout of the next product."""
    return 32 if all(r % 32 == 0 and c % 32 == 0 for r, c in warp_tiles) else 16


@dataclass(frozen=True)
class MfmaLayout(MmaLayout):
    """The accumulator of wave-tiled MFMA: warps_m x warps_n waves each own a (rows / warps_m) x
    (cols / warps_n) tile of T x T MFMA tiles (module docstring); group q = (mi * NI + ni) * G + g
    of a lane holds row l % T of tile (mi, ni), columns 4 H g + 4 (l / T) .. + 3."""

    tile: int = 32
    vec = 4

    @property
    def h(self) -> int:  # lane groups
        return WAVE // self.tile

    @property
    def g(self) -> int:  # register groups of 4 per tile and lane
        return self.tile // (4 * self.h)

    @property
    def mi(self) -> int:
        return self.wm // self.tile

    @property
    def ni(self) -> int:
        return self.wn // self.tile

    def groups(self) -> int:
        return self.mi * self.ni * self.g

    def slots(self) -> int:
        return self.groups() * 4

    # (terms that are 0 for every group of the layout are left out, as MmaLayout's)
    def row(self, q: str) -> str:
        warp_m = "tilec_warp" if self.warps_n == 1 else f"(tilec_warp / {self.warps_n})"
        return added(f"{warp_m} * {self.wm}",
                     f"{operand(q)} / {self.ni * self.g} * {self.tile}" if self.mi > 1 else None,
                     f"tilec_lane % {self.tile}")

    def col0(self, q: str) -> str:
        warp_n = None if self.warps_n == 1 else f"(tilec_warp % {self.warps_n}) * {self.wn}"
        tile = f"{operand(q)} / {self.g}" if self.g > 1 else operand(q)  # (the tile's index along the row)
        return added(warp_n, f"{tile} % {self.ni} * {self.tile}" if self.ni > 1 else None,
                     f"{operand(q)} % {self.g} * {4 * self.h}" if self.g > 1 else None,
                     f"tilec_lane / {self.tile} * 4")

    def rows_layout(self) -> MfmaRows:
        return MfmaRows(self.rows, self.warps_m, self.warps_n, self.tile)

    def row_slot(self, q: str) -> str:
        return f"{operand(q)} / {self.ni * self.g}" if self.mi > 1 else "0"

    def __str__(self):
        return (f"mfma {self.tile}x{self.tile}(waves {self.warps_m}x{self.warps_n}, wave tile "
                f"{self.wm}x{self.wn}, {self.slots()} registers)")


@dataclass(frozen=True)
class MfmaRows(MmaRows):
    """One value per row of an MfmaLayout tile, held by the H lanes l % T + T h of the wave(s)
    holding the row."""

    tile: int = 32

    @property
    def mi(self) -> int:
        return self.rows // self.warps_m // self.tile

    def groups(self) -> int:
        return self.mi

    def row(self, q: str) -> str:
        warp_m = "tilec_warp" if self.warps_n == 1 else f"(tilec_warp / {self.warps_n})"
        return added(f"{warp_m} * {self.rows // self.warps_m}",
                     f"{operand(q)} * {self.tile}" if self.mi > 1 else None, f"tilec_lane % {self.tile}")

    def leader(self) -> str:
        lead = f"tilec_lane < {self.tile}"
        return lead if self.warps_n == 1 else f"{lead} && tilec_warp % {self.warps_n} == 0"

    def __str__(self):
        return f"mfma rows ({self.groups()} per thread, shared by {WAVE // self.tile} lanes)"


def lane_elements(L: MfmaLayout, warp: int, lane: int) -> dict:
    """{register slot: (row, col)} of one lane of wave `warp` (the formulas above, evaluated: for
    tests and tools)."""
    out = {}
    env = {"tilec_warp": warp, "tilec_lane": lane}
    for q in range(L.groups()):
        r = eval(L.row(str(q)).replace("/", "//"), {}, env)  # (our own formulas)
        c = eval(L.col0(str(q)).replace("/", "//"), {}, env)
        for v in range(4):
            out[q * 4 + v] = (r, c + v)
    return out
