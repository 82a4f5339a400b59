"""Layouts: which thread of a GPU block holds element (i, j) of a tile buffer, in which register,
and where a shared-memory tile puts it. The layout pass decides them; the renderer prints the
index formulas these classes give (C++ expressions over the thread's ids); `dump-ir` shows them.

Register layouts split a fragment into per-thread *groups* of `vec` consecutive columns: group q
of the calling thread holds row `row(q)`, columns `col0(q) .. col0(q) + vec - 1`, in registers
q * vec .. q * vec + vec - 1. Names the formulas use: `tilec_tid` (thread in block), `tilec_lane`,
`tilec_warp`, and `tilec_q` for the group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .types import DTYPES


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def operand(q: str) -> str:
    """Group index `q` as an operand of `/` or `%`: a name as it is, else in parentheses."""
    return q if q.isidentifier() else f"({q})"


def added(*terms) -> str:
    """The terms that are not None, added ("0" for none)."""
    return " + ".join(t for t in terms if t is not None) or "0"


def warp_grids(rows: int, cols: int, warps: int, rows_in_warp: bool = False,
               tile: tuple = (16, 8)) -> list:
    """The (warps_m, warps_n) grids of `warps` warps that tile a rows x cols accumulator in
    `tile` (m, n) mma tiles, 16 x 8 by default (rows_in_warp: whole rows per warp, warps_n = 1)."""
    tm, tn = tile
    if rows_in_warp:
        return [(warps, 1)] if warps and rows % (tm * warps) == 0 else []
    return [(wm, warps // wm) for wm in range(1, warps + 1)
            if warps % wm == 0 and rows % (tm * wm) == 0 and cols % (tn * (warps // wm)) == 0]


@dataclass(frozen=True)
class MmaLayout:
    """The accumulator of warp-tiled mma.sync m16n8: warps_m x warps_n warps each own a
    (rows / warps_m) x (cols / warps_n) tile of 16 x 8 mma tiles; lane l holds rows l/4 and
    l/4 + 8 of each, columns 2 (l % 4) and 2 (l % 4) + 1."""

    rows: int
    cols: int
    warps_m: int
    warps_n: int
    vec = 2

    @property
    def wm(self) -> int:  # rows per warp
        return self.rows // self.warps_m

    @property
    def wn(self) -> int:
        return self.cols // self.warps_n

    @property
    def mi(self) -> int:
        return self.wm // 16

    @property
    def ni(self) -> int:
        return self.wn // 8

    def groups(self) -> int:
        return self.mi * self.ni * 2

    def slots(self) -> int:
        return self.groups() * 2

    # (terms that are 0 for every group of the layout are left out: a warp of one row of mma
    # tiles has no row-tile term, one of one column of them no column-tile term)
    def row(self, q: str) -> str:
        warp_m = "tilec_warp" if self.warps_n == 1 else f"(tilec_warp / {self.warps_n})"
        return added(f"{warp_m} * {self.wm}", f"{operand(q)} / {self.ni * 2} * 16" if self.mi > 1 else None,
                     f"{operand(q)} % 2 * 8", "(tilec_lane >> 2)")

    def col0(self, q: str) -> str:
        warp_n = None if self.warps_n == 1 else f"(tilec_warp % {self.warps_n}) * {self.wn}"
        return added(warp_n, f"{operand(q)} / 2 % {self.ni} * 8" if self.ni > 1 else None,
                     "(tilec_lane & 3) * 2")

    def valid(self, q: str):
        return None

    def rows_layout(self) -> MmaRows:
        return MmaRows(self.rows, self.warps_m, self.warps_n)

    def row_slot(self, q: str) -> str:
        return added(f"{operand(q)} / {self.ni * 2} * 2" if self.mi > 1 else None, f"{operand(q)} % 2")

    def __str__(self):
        return (f"mma(warps {self.warps_m}x{self.warps_n}, warp tile {self.wm}x{self.wn}, "
                f"{self.slots()} registers)")


@dataclass(frozen=True)
class WgmmaLayout(MmaLayout):
    """The accumulators of wgmma m64nN (Hopper), in the pattern of mma.sync m16n8 tiles along
    each warp's 16 rows. Shared (the default): consumer warpgroup g (warps 4g .. 4g + 3) holds
    rows 64g .. 64g + 63 of all `cols` columns, an MmaLayout of rows / 16 warps by 1. Ping-pong
    (`pingpong`): each consumer warpgroup holds a whole tile of its own, its warp w rows
    64h + 16w .. 64h + 16w + 15 of each 64-row half h (warps_m = 4: the row formula differs)."""

    pingpong: bool = False

    def row(self, q: str) -> str:
        if not self.pingpong:
            return super().row(q)
        return added(f"{operand(q)} / {self.ni * 2} * 64" if self.mi > 1 else None,
                     "(tilec_warp % 4) * 16", f"{operand(q)} % 2 * 8", "(tilec_lane >> 2)")

    def rows_layout(self):
        return None if self.pingpong else super().rows_layout()

    def __str__(self):
        if self.pingpong:
            return (f"wgmma(ping-pong: each of 2 warpgroups {self.rows}x{self.cols}, "
                    f"{self.slots()} registers)")
        return (f"wgmma(warpgroups {self.warps_m // 4} of 64x{self.cols}, "
                f"{self.slots()} registers)")


@dataclass(frozen=True)
class MmaRows:
    """One value per row of an MmaLayout tile, held by every lane that holds part of the row
    (the 4 lanes of a quad, in each of the warps_n warps)."""

    rows: int
    warps_m: int
    warps_n: int
    vec = 1

    @property
    def mi(self) -> int:
        return self.rows // self.warps_m // 16

    def groups(self) -> int:
        return self.mi * 2

    def slots(self) -> int:
        return self.groups()

    def row(self, q: str) -> str:
        warp_m = "tilec_warp" if self.warps_n == 1 else f"(tilec_warp / {self.warps_n})"
        return added(f"{warp_m} * {self.rows // self.warps_m}",
                     f"{operand(q)} / 2 * 16" if self.mi > 1 else None, f"{operand(q)} % 2 * 8",
                     "(tilec_lane >> 2)")

    def col0(self, q: str) -> str:
        return "0"

    def valid(self, q: str):
        return None

    def leader(self) -> str:
        """The one replica of each row that writes it to memory."""
        lead = "(tilec_lane & 3) == 0"
        return lead if self.warps_n == 1 else f"{lead} && tilec_warp % {self.warps_n} == 0"

    def __str__(self):
        return f"mma rows ({self.groups()} per thread, shared by a quad of lanes)"


def columns_per_access(dtypes) -> int:
    """Values of the widest of `dtypes` in one 16-byte access (4-bit values count as bytes; no
    dtype: 4, as for f32): a vector layout's columns per thread and access."""
    return 16 // max([DTYPES[d][1] // 8 or 1 for d in dtypes] or [4])


@dataclass(frozen=True)
class VecLayout:
    """Vectors of `vec` consecutive columns dealt round-robin to the block's threads: vector g of
    the row-major tile goes to thread g % threads. `cols` None: a run-time extent, walked in a
    loop (a row too long to hold: streamed)."""

    rows: int
    cols: int | None
    threads: int
    vec: int

    def groups(self):
        if self.cols is None:
            return None
        return _cdiv(self.rows * self.cols // self.vec, self.threads)

    def slots(self) -> int:
        return self.groups() * self.vec

    def _g(self, q: str) -> str:
        """The vector of group q (the thread's own, where each thread has one group)."""
        return "tilec_tid" if self.groups() == 1 else f"(tilec_tid + {operand(q)} * {self.threads})"

    def row(self, q: str) -> str:
        if self.rows == 1:
            return "0"
        return f"{self._g(q)} / {self.cols // self.vec}"

    def col0(self, q: str) -> str:
        scale = f" * {self.vec}" if self.vec > 1 else ""
        if self.rows == 1:
            return f"{self._g(q)}{scale}"
        return f"{self._g(q)} % {self.cols // self.vec}{scale}"

    def valid(self, q: str):
        total = self.rows * self.cols // self.vec
        if total % self.threads == 0:
            return None
        return f"{self._g(q)} < {total}"

    def rows_layout(self) -> VecRows | None:
        """The row values' layout; None for several rows (not supported yet)."""
        return VecRows(self.threads) if self.rows == 1 else None

    def row_slot(self, q: str) -> str:
        return "0"

    def cols_layout(self) -> VecCols | None:
        """The column values' layout (a 1-D fragment read at the column index): where every
        group of a thread has the same columns, the thread holds their `vec` values; None
        otherwise (a streamed row, groups that move along the columns)."""
        if self.cols is None:
            return None
        per_row = self.cols // self.vec
        if self.threads % per_row or (self.rows * per_row) % self.threads:
            return None
        return VecCols(self.cols, self.threads, self.vec, self.rows)

    def __str__(self):
        cols = "streamed" if self.cols is None else f"{self.slots()} registers"
        return f"vec(threads {self.threads}, {self.vec} columns per access, {cols})"


@dataclass(frozen=True)
class VecCols:
    """The columns of a VecLayout tile whose threads keep their columns in every group (a column
    reduction's tile: rows of the reduced axis, columns of the kept one): a thread holds the
    values of its vector's `vec` columns, and the threads on the tile's other rows (the
    thread's replicas, `threads / (cols / vec)` of them, `cols / vec` apart) hold the same
    columns' values (per-thread partials, combined by `allreduce`). The values are the same
    for a tile of any rows that keeps every thread's columns (`rows` only says which tile laid
    them out)."""

    cols: int
    threads: int
    vec: int
    rows: int = field(compare=False)

    @property
    def per_row(self) -> int:
        """Threads across a row of the tile (the replicas of a column are this many apart)."""
        return self.cols // self.vec

    def slots(self) -> int:
        return self.vec

    def tile(self, rows: int | None = None) -> VecLayout:
        """A tile of `rows` rows (default: the one that laid them out) that keeps these column
        values: each group of a thread has its columns; a `rows` that would not keep them
        gives the default."""
        if rows is None or rows < 1 or (rows * self.per_row) % self.threads:
            rows = self.rows
        return VecLayout(rows, self.cols, self.threads, self.vec)

    def __str__(self):
        return (f"column values ({self.vec} per thread, {self.threads // self.per_row} "
                f"replicas {self.per_row} threads apart)")


@dataclass(frozen=True)
class VecRows:
    """The one row of a VecLayout tile: every thread holds its value."""

    threads: int
    rows = 1
    vec = 1

    def groups(self) -> int:
        return 1

    def slots(self) -> int:
        return 1

    def row(self, q: str) -> str:
        return "0"

    def col0(self, q: str) -> str:
        return "0"

    def valid(self, q: str):
        return None

    def leader(self) -> str:
        return "tilec_tid == 0"

    def __str__(self):
        return f"row value (every thread of {self.threads})"


def shared_bytes(a) -> int:
    """Bytes a laid-out shared buffer (Alloc) takes, all its stages (a leading axis of 3-D
    buffers); where the renderer places it and the passes that budget shared memory agree."""
    stages = a.shape[0].value if len(a.shape) == 3 else 1
    return a.layout.size() * a.layout.elem_bytes * stages


def placed_bytes(allocs, align: int) -> int:
    """Bytes of shared buffers placed one after another, each at an `align`-byte boundary."""
    return sum((shared_bytes(a) + align - 1) // align * align for a in allocs)


@dataclass(frozen=True)
class SharedLayout:
    """A shared-memory tile of `rows` x `cols` elements (after a leading stage axis, if any).
    `swizzle`: 16-byte chunks of each row are XOR-permuted by the row index so that 8 rows read
    at the same column (ldmatrix, cp.async) hit 8 different bank groups; `pad`: elements added to
    each row instead, where the row is not a power-of-two number of chunks."""

    rows: int
    cols: int
    elem_bytes: int
    swizzle: bool
    pad: int = 0
    packed: bool = False  # 4-bit elements, two per byte: `cols` counts bytes
    # filled by TMA in its 128-byte swizzle (what wgmma descriptors read): rows of 128 bytes (64
    # 16-bit values, 128 fp8); a wider tile is stored as panels of that many columns, one after
    # the other
    tma: bool = False

    def cpp_type(self, ctype: str) -> str:
        if self.swizzle:
            return f"tilec::SwizzledTile<{self.rows}, {self.cols}, {ctype}>"
        return f"tilec::PaddedTile<{self.rows}, {self.cols}, {self.pad}, {ctype}>"

    def size(self) -> int:
        """Elements (bytes, if packed) one stage takes."""
        return self.rows * (self.cols + self.pad)

    def __str__(self):
        if self.tma:
            panel = 128 // self.elem_bytes  # (columns of one 128-byte row)
            return ("shared, TMA 128-byte swizzle" +
                    (f", panels of {panel} columns" if self.cols > panel else ""))
        if self.swizzle:
            return "shared, 16-byte chunks XOR-swizzled by row"
        return ("shared, row-major" + (f", rows padded by {self.pad}" if self.pad else "") +
                (", 4-bit values packed in bytes" if self.packed else ""))
