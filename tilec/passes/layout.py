"""GPU layouts: every fragment gets a thread layout, every shared buffer a bank-conflict-free
layout, and every parallel loop is split over the block's threads by the layout of the fragments
it touches (`by=`), so each thread runs exactly the iterations whose registers it holds.

* A `gemm` accumulator gets the mma.sync accumulator layout. When rows must stay inside one warp
  (a row reduction or a second GEMM reads the tile, as in attention) the warps split the rows
  only; otherwise the warp grid that makes warp tiles squarest.
* A fragment written or read at [i, j] in a loop with a laid-out fragment takes its layout; a
  1-D fragment read at [i] there takes the matching row layout (the threads that share a row each
  hold its value: per-thread partials, combined by `allreduce`), and one read at [j] in a loop
  over a vector tile the matching column layout (a column reduction's values: the threads on
  the tile's rows each hold partials of their columns); a loop that reads column values takes
  their tile.
* The remaining 2-D fragments (row kernels' cached rows) and loops that touch no fragment get a
  vector layout: 16-byte vectors of columns dealt round-robin to the threads; a run-time column
  extent (a streamed row) is walked in a loop.
* Shared buffers that feed the matrix units are XOR-swizzled in 16-byte chunks (or padded where
  a row is not a power-of-two number of chunks), so cp.async writes and ldmatrix reads are free
  of bank conflicts; operands of products on the scalar units (f32 under `precision ieee`, f64,
  integers) whose rows are M or N are padded so that the rows one load reads fall in different
  banks.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from ..ir.layout import (
    MmaLayout,
    MmaRows,
    SharedLayout,
    VecCols,
    VecLayout,
    VecRows,
    WgmmaLayout,
    columns_per_access,
    warp_grids,
)
from ..ir.types import DTYPES, PACKED
from . import split_k
from .rewrite import loads_in, map_stmts, multiple_of, stores_in


def _const(e) -> int | None:
    return e.value if isinstance(e, T.Const) else None


def best_grid(rows: int, cols: int, warps: int, rows_in_warp: bool, tile: tuple = (16, 8),
              pair: int = 16, scalar: bool = False) -> tuple:
    """The best warp grid (the tile pass has checked that one exists: warp_grids): warp tiles
    whose columns are a multiple of `pair` first (CUDA: pairs of n-tiles load with one
    ldmatrix.x4), then the shortest warp tiles. `scalar`: a gemm on the scalar units (CUDA's
    gemm_simt), whose lane reads, per k, 2 values of A per 16 rows of its warp's tile and 2
    of B per 8 columns: the grid that reads the fewest (64 x 128 on 4 warps: 1 x 4 warps of
    64 x 32, 8 + 8 values a k, not 2 x 2 of 32 x 64, 4 + 16)."""
    grids = warp_grids(rows, cols, warps, rows_in_warp, tile)
    if not grids:
        raise AssertionError(f"no warp grid of {warps} warps tiles a {rows}x{cols} accumulator")

    def key(g):
        wm, wn = g
        if scalar:
            return (rows // wm // 8 + cols // wn // 4, -wm)
        return ((cols // wn) % pair != 0, rows // wm + cols // wn, -wm)
    return min(grids, key=key)


def mma_layout(rows: int, cols: int, warps: int, rows_in_warp: bool,
               scalar: bool = False) -> MmaLayout:
    return MmaLayout(rows, cols, *best_grid(rows, cols, warps, rows_in_warp, scalar=scalar))


def _frag_accesses(loop: T.For, frags: set) -> list:
    """(buffer, index) of every fragment load and store in a loop body."""
    out = []
    for st in T.walk_stmts(loop.body):
        if isinstance(st, T.Store) and st.buf in frags:
            out.append((st.buf, st.idx))
    out += [(ld.buf, ld.idx) for st in loop.body for ld in loads_in(st) if ld.buf in frags]
    return out


class Assign:
    def __init__(self, k: T.TileKernel, target):
        self.k, self.target = k, target
        self.allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
        self.frags = {n for n, a in self.allocs.items() if a.scope in ("fragment", "local")}
        self.lay: dict = {}
        self.loops = [s for s in T.walk_stmts(k.body) if isinstance(s, T.For) and s.kind == "parallel"]
        self.by: dict = {}  # id(loop) -> layout
        self.warps = k.threads // target.resources.warp
        # a warp-specialized kernel's loops run on its consumer warpgroups only (ping-pong: on
        # one of them)
        self.threads = 128 if k.pingpong else k.threads - 128 if k.warp_specialize else k.threads
        self.params = {p.name: p for p in k.params if p.kind != "scalar"}
        self.vmax = columns_per_access(p.dtype for p in self.params.values())

    def acc_layout(self, rows: int, cols: int, rows_in_warp: bool, scalar: bool = False):
        """The register layout of a gemm's rows x cols accumulator (a target's matrix units:
        mma.sync here, its grid of warps chosen for the scalar units' loads where the gemm runs
        there; subclasses for others)."""
        return mma_layout(rows, cols, self.warps, rows_in_warp, scalar)

    def shape(self, buf: str) -> tuple:
        return tuple(_const(d) for d in self.allocs[buf].shape)

    def set(self, buf: str, layout) -> bool:
        old = self.lay.get(buf)
        if old is None:
            self.lay[buf] = layout
            return True
        if old != layout:
            raise AssertionError(f"fragment {buf} needs two layouts: {old} and {layout}")
        return False

    def vec_layout(self, rows: int, cols: int | None, vmax: int | None = None) -> VecLayout:
        threads, vmax = self.threads, vmax or self.vmax
        if cols is None:
            return VecLayout(rows, None, threads, vmax)
        vec = vmax
        while vec > 1 and (cols % vec or rows * cols // vec < threads):
            vec //= 2
        return VecLayout(rows, cols, threads, vec)

    def frag_vmax(self, f: str) -> int:
        """Columns per thread group of a fragment's vector layout: what the first loop that fills
        it reads from memory in one 16-byte access (the fragment's own registers do not count: a
        GEMV's f32 sums of 16-bit weights take 8 columns, a cached bf16 row 8)."""
        for lp in self.loops:
            full = tuple(T.Var(v) for v in lp.vars)
            if len(lp.vars) == 2 and any(st.buf == f and st.idx == full for st in stores_in(lp)):
                return self.loop_vmax(lp)
        return self.vmax

    def loop_vmax(self, loop: T.For) -> int:
        """Columns per 16-byte access of a loop over memory and shared buffers: set by the widest
        dtype of memory or shared tile it reads or writes (a wider tensor elsewhere in the kernel
        does not narrow it)."""
        decls = {**self.params, **{n: a for n, a in self.allocs.items() if a.scope == "shared"}}
        bufs = {x.buf for x in stores_in(loop) + loads_in(loop) if x.buf in decls}
        return columns_per_access(decls[b].dtype for b in bufs)

    def stored_tile(self, loop: T.For):
        """The static (rows, cols) of the shared tile a loop fills at [i, j], if it fills one."""
        full = tuple(T.Var(v) for v in loop.vars)
        for st in T.walk_stmts(loop.body):
            if isinstance(st, T.Store) and st.buf in self.allocs and st.idx[-2:] == full and \
               self.allocs[st.buf].scope == "shared":
                shape = self.shape(st.buf)[-2:]
                if None not in shape:
                    return shape
        return None

    def propagate(self):
        changed = True
        while changed:
            changed = False
            for loop in self.loops:
                acc = _frag_accesses(loop, self.frags)
                full = tuple(T.Var(v) for v in loop.vars)
                L = self.by.get(id(loop))
                if L is None:
                    L = next((self.lay[b] for b, idx in acc if idx == full and b in self.lay), None)
                if L is None:  # column values read at [j]: a tile of the loop's rows with their
                    #              columns (a thread's groups each run the body: one group a row
                    #              of the threads, the fewest that keeps them)
                    L = next((self.lay[b].tile(_const(loop.extents[0])) for b, idx in acc
                              if len(full) == 2 and idx == full[1:] and
                              isinstance(self.lay.get(b), VecCols)), None)
                if L is None:
                    continue
                changed |= self.by.get(id(loop)) is None
                self.by[id(loop)] = L
                for b, idx in acc:
                    if idx == full:
                        changed |= self.set(b, L)
                    elif len(loop.vars) == 2 and idx == full[:1] and hasattr(L, "rows_layout") \
                            and L.rows_layout() is not None:
                        changed |= self.set(b, L.rows_layout())
                    elif len(loop.vars) == 2 and idx == full[1:] and hasattr(L, "cols_layout") \
                            and L.cols_layout() is not None:
                        changed |= self.set(b, L.cols_layout())
                    else:
                        raise T.Unsupported(
                            f"fragment {b} is read at [{', '.join(map(T.fmt, idx))}] in a loop "
                            f"over ({', '.join(loop.vars)}) split by {L}: a thread holds only "
                            "the fragment elements of its own iterations (index a fragment by "
                            "the loop's variables, or use a shared buffer)", loop.loc)

    def refuse_byte_copies_gpus_cannot_do(self):
        """GPU copies move bytes, and keep 4-bit shared tiles packed two per byte: a copy that
        changes the dtype, a 4-bit copy that may start on an odd column, and an element store or
        fill() into a 4-bit shared tile are errors at the statement."""
        params = {p.name: p for p in self.k.params}
        for st in T.walk_stmts(self.k.body):
            if isinstance(st, T.Copy):
                src, dst = (self.allocs.get(x.buf) or params[x.buf] for x in (st.src, st.dst))
                if src.dtype != dst.dtype:
                    raise T.Unsupported(f"copy() from {st.src.buf} ({src.dtype}) to {st.dst.buf} "
                                        f"({dst.dtype}) changes the dtype; on GPU targets it "
                                        "moves bytes (convert in a parallel loop)", st.loc)
                if dst.dtype in PACKED and st.src.offsets is not None and \
                        not multiple_of(st.src.offsets[-1], 2):
                    raise T.Unsupported(f"a copy of 4-bit values into {st.dst.buf} starts on a byte "
                                        "on GPU targets: its column offset must be a multiple of "
                                        f"2 (written {T.fmt(st.src.offsets[-1])})", st.loc)
            elif isinstance(st, (T.Store, T.Fill)):
                a = self.allocs.get(st.buf)
                if a is not None and a.scope == "shared" and a.dtype in PACKED:
                    what = "element stores into it" if isinstance(st, T.Store) else "fill()"
                    raise T.Unsupported(f"shared tile {a.name} holds 4-bit values, which GPU "
                                        "targets keep packed two per byte as copy() fills them: "
                                        f"{what} cannot write one (use a u8 or i8 tile)",
                                        getattr(st, "loc", None))

    def run(self) -> T.TileKernel:
        self.refuse_byte_copies_gpus_cannot_do()
        for loop in self.loops:
            if len(loop.vars) > 2:
                raise T.Unsupported(f"a parallel loop over {len(loop.vars)} axes "
                                    f"({', '.join(loop.vars)}); GPU targets split one or two",
                                    loop.loc)
        gemms = [s for s in T.walk_stmts(self.k.body) if isinstance(s, T.Gemm)]
        rows_in_warp = len(gemms) > 1 or any(len(self.allocs[f].shape) == 1 for f in self.frags)
        for g in gemms:
            rows, cols = self.shape(g.c)
            if self.k.warp_specialize:  # wgmma: 64 rows per consumer warpgroup, or all rows
                self.set(g.c, WgmmaLayout(rows, cols, 4, 1, True) if self.k.pingpong else
                         WgmmaLayout(rows, cols, rows // 16, 1))
                continue
            scalar = on_scalar_units(g, self.allocs, self.target.resources) and \
                split_k.simt_grid(True)
            self.set(g.c, self.acc_layout(rows, cols, rows_in_warp, scalar))
        self.propagate()
        for f in sorted(self.frags):  # row kernels' cached rows, GEMV accumulators
            if f not in self.lay and len(self.allocs[f].shape) == 2:
                self.set(f, self.vec_layout(*self.shape(f), self.frag_vmax(f)))
                self.propagate()
        for loop in self.loops:  # loops over memory and shared buffers only
            if id(loop) not in self.by and len(loop.vars) == 2:
                rows, cols = (_const(e) for e in loop.extents)
                tile = self.stored_tile(loop)
                if tile is not None and (rows is None or cols is None):
                    rows, cols = tile  # a run-time extent within a static tile: split the tile
                if rows is None or (cols is None and rows != 1):
                    raise AssertionError(f"parallel loop over ({', '.join(loop.vars)}) has a "
                                         "run-time extent it cannot split")
                self.by[id(loop)] = self.vec_layout(rows, cols, self.loop_vmax(loop))
                # (the fragments it lays out decide the layouts of the loops left that read them:
                # a column reduction's loops all take its first loop's tile)
                self.propagate()
        for f in sorted(self.frags):
            if f not in self.lay:
                # a 1-D fragment no loop reads as row values: its elements dealt to the threads
                # as a loop over them deals its iterations (a fragment of one value: every
                # thread holds it)
                (n, *rest) = self.shape(f)
                one_d = not rest and n is not None and n > 1
                self.set(f, self.vec_layout(1, n) if one_d else VecRows(self.threads))
        self.propagate()
        for loop in self.loops:
            if id(loop) not in self.by:
                self.by[id(loop)] = self.vec_layout(1, _const(loop.extents[0]))
        for name, a in self.allocs.items():
            if a.scope == "shared":
                if len(self.shape(name)) < 2:
                    raise T.Unsupported(f"shared tile {name} has one axis; GPU targets lay out "
                                        "2-D shared tiles (make it [1, n], or a fragment)")
                self.lay[name] = self.shared_layout(a, gemms)
        for st in T.walk_stmts(self.k.body):
            if isinstance(st, T.Allreduce) and not self.combinable(self.lay.get(st.buf)):
                raise T.Unsupported(f"allreduce() combines a fragment's row values (read at [i] "
                                    f"in a loop over (i, j)) or column values (at [j]); "
                                    f"{st.buf} is laid out {self.lay.get(st.buf)}", st.loc)
        if self.k.pingpong and any(not isinstance(L, WgmmaLayout) for L in self.by.values()):
            # (tilec_tid counts both consumer warpgroups: a vector layout of one would be wrong)
            raise AssertionError(f"{self.k.name}: a ping-pong kernel's loops must be split by its "
                                 "accumulators' layout")

        def annotate(st):
            if isinstance(st, T.Alloc) and st.name in self.lay:
                return [replace(st, layout=self.lay[st.name])]
            return None
        body = self._set_by(self.k.body)
        return replace(self.k, body=map_stmts(body, annotate))

    def _set_by(self, stmts) -> tuple:
        out = []
        for st in stmts:
            if isinstance(st, T.For):
                by = self.by.get(id(st)) if st.kind == "parallel" else None
                st = replace(st, body=self._set_by(st.body), by=by)
            elif isinstance(st, T.If):
                st = replace(st, body=self._set_by(st.body), orelse=self._set_by(st.orelse))
            out.append(st)
        return tuple(out)

    @staticmethod
    def combinable(L) -> bool:
        """Whether `allreduce` takes a fragment laid out `L` (row values of one warp's rows, or
        of a vector tile, or its column values)."""
        return isinstance(L, (VecRows, VecCols)) or (isinstance(L, MmaRows) and L.warps_n == 1)

    def shared_layout(self, a: T.Alloc, gemms) -> SharedLayout:
        rows, cols = self.shape(a.name)[-2:]
        users = [g for g in gemms if a.name in (g.a, g.b)]  # (the gemms it is an operand of)
        if self.k.warp_specialize and users:
            return SharedLayout(rows, cols, DTYPES[a.dtype][1] // 8, True, tma=True)
        if a.dtype in ("u4", "i4"):  # staged packed weights: bytes, row-major
            return SharedLayout(rows, (cols + 1) // 2, 1, False, 0, packed=True)
        elem = max(DTYPES[a.dtype][1] // 8, 1)
        tf32 = [g for g in users if g.tf32]
        if tf32 and cols * elem % 16 == 0:
            return SharedLayout(rows, cols, elem, False, tf32_pad(cols, tf32[0], a.name))
        mma = a.dtype in self.target.resources.mma_dtypes and bool(users)
        chunks = cols * elem // 16 if cols * elem % 16 == 0 else 0
        if users and not mma and chunks:
            # (rows of M or N on the scalar units: padded rows of whole 16-byte chunks, which
            # gemm_simt reads 16 bytes along k at a time with no address arithmetic; an XOR
            # swizzle would take no more memory, but is unmeasured: in the PTX of the scalar
            # loads its XORs split some of their pairs)
            pad = self.simt_pad(cols, elem, users[0], a.name)
            form = split_k.simt_shared("pad")
            if pad and form == "swizzle" and (chunks in (1, 2, 4) or chunks % 8 == 0):
                return SharedLayout(rows, cols, elem, True)
            if pad and form != "plain":
                return SharedLayout(rows, cols, elem, False, pad)
        if mma and chunks and (chunks in (1, 2, 4) or chunks % 8 == 0):
            return SharedLayout(rows, cols, elem, True)
        pad = 16 // elem if mma and cols * elem % 16 == 0 else 0
        return SharedLayout(rows, cols, elem, False, pad)

    def simt_pad(self, cols: int, elem: int, g: T.Gemm, name: str) -> int:
        """The row padding of a shared operand of gemm `g` on the scalar units (simt_pad); 0
        for none (a target whose scalar gemm reads in another pattern)."""
        return simt_pad(cols, elem, g, name)


def _rows_are_k(g: T.Gemm, name: str) -> bool:
    """Are the rows of gemm `g`'s shared operand `name` its K axis (B, or A transposed)?"""
    return (name == g.a and g.transpose_a) or (name == g.b and not g.transpose_b)


def simt_pad(cols: int, elem: int, g: T.Gemm, name: str) -> int:
    """The row padding (in elements, whole 16-byte chunks: cp.async fills the rows) of a shared
    operand of CUDA's gemm_simt `g` (tilec_cuda.h) that puts each of its loads in distinct banks.
    At one k, lane (g, c) reads A's rows g (+ 8 and 16 apart, load by load) and, B transposed,
    B's rows 2c + v: unpadded rows of 32 words all fall in one bank (8 and 4 ways). The pad, in
    whole chunks, also puts those rows' 16-byte chunks in distinct banks, as gemm_simt's
    16-byte loads along k read them. Tiles whose rows are k (B, or A transposed) are read
    along a row, conflict-free as they are."""
    if _rows_are_k(g, name):
        return 0
    rows = range(8) if name == g.a else (0, 2, 4, 6)
    step = max(16 // elem, 1)
    for pad in range(0, 32 * step, step):
        stride = (cols + pad) * elem  # bytes
        banks = [(r * stride // 4 + w) % 32 for r in rows for w in range(max(elem // 4, 1))]
        if len(set(banks)) == len(banks):
            return pad
    return 0


def tf32_pad(cols: int, g: T.Gemm, name: str) -> int:
    """The row padding (in 4-byte elements, a multiple of 4: rows stay whole 16-byte chunks for
    cp.async) of an f32 operand of the tf32 gemm `g` that makes its fragment loads free of bank
    conflicts. Lane (g, c) of an m16n8k8 tf32 fragment reads row or column g (8 values) at k = c
    (4 values): where the tile's rows are k (B, or A transposed) the 32 lanes read 4 rows of 8
    consecutive words, in 32 banks when the row stride is 8 mod 16 words; where its rows are m or
    n (A, or B transposed), 8 rows of 4 words, in 32 banks when the stride is 4 mod 8."""
    want, mod = (8, 16) if _rows_are_k(g, name) else (4, 8)
    pad = 0
    while (cols + pad) % mod != want:
        pad += 4
    return pad


def on_tf32_units(g: T.Gemm, allocs: dict) -> bool:
    """Whether the gemm `g` runs as tf32 mma.sync (m16n8k8) from shared f32 tiles: marked tf32
    (`precision tf32`), both operands in shared memory, k-steps of 8, warp tiles of whole 16-row
    tiles."""
    a, b, c = allocs[g.a], allocs[g.b], allocs[g.c]
    bk = _const(g.k_extent(a.shape))
    return g.tf32 and a.dtype == b.dtype == c.dtype == "f32" and a.scope == b.scope == "shared" \
        and bk % 8 == 0 and c.layout.wm % 16 == 0


def on_scalar_units(g: T.Gemm, allocs: dict, resources) -> bool:
    """Whether the gemm `g` multiplies on the scalar units (CUDA's gemm_simt) by its dtypes
    alone, as judged before its accumulator has a layout: neither tf32 nor two 16-bit (or fp8)
    operands of one dtype. (A product of those dtypes that on_matrix_units later refuses, by
    its tile shape, also runs there, on the matrix units' warp grid.)"""
    a, b = allocs[g.a], allocs[g.b]
    return not g.tf32 and not (a.dtype == b.dtype and a.dtype in resources.mma_dtypes)


def on_matrix_units(g: T.Gemm, allocs: dict, resources) -> bool:
    """Whether the gemm `g` (after this pass) runs on mma.sync fragments: 16-bit operands of one
    dtype into an f32 accumulator, k-steps of 16, warp tiles of whole 16-row tiles, and operand
    rows of whole 16-byte chunks (what ldmatrix reads)."""
    a, b, c = allocs[g.a], allocs[g.b], allocs[g.c]
    bk = _const(g.k_extent(a.shape))
    return (b.dtype in resources.mma_dtypes and a.dtype == b.dtype and c.dtype == "f32" and
            bk % 16 == 0 and c.layout.wm % 16 == 0 and b.layout.cols * 2 % 16 == 0 and
            (a.scope != "shared" or a.layout.cols * 2 % 16 == 0))


def run(prog: T.TileProgram, target, options, assign=Assign) -> T.TileProgram:
    return replace(prog, kernels=tuple(assign(k, target).run() for k in prog.kernels))
