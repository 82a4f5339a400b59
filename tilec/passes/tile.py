"""Turns each fusion group into a Tile IR kernel: grid, buffers, tile copies, GEMMs, reductions,
parallel loops. Elementwise producers are inlined as expressions at the point of use.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from dataclasses import dataclass, replace

from ..diagnostics import TilecError, error
from ..ir import tile as T
from ..ir.fused import Group, Plan
from ..ir.graph import Graph, Module
from ..ir.layout import columns_per_access, warp_grids
from ..ir.tile import (
    Alloc,
    Copy,
    Fill,
    For,
    Gemm,
    If,
    Reduce,
    Region,
    Store,
    TensorDecl,
    TileKernel,
    TileProgram,
    dim_to_expr,
    iadd,
    iconst,
    idiv,
    ilt,
    imod,
    imul,
    land,
)
from ..ir.types import (
    DTYPES,
    FP8,
    PACKED,
    SIXTEEN,
    Dim,
    at_least_plus_zero,
    is_float,
    itemsize_bits,
    numel,
)
from . import merge_rows, split_k
from .fuse import Fuser, fusion_plan, is_squeeze
from .lower_reductions import identity, reduction_store
from .rewrite import loads_in, map_expr, map_exprs, map_stmts
from .signs import nonpositive
from .tma_store import tma_conditions

NEG_INF = T.Const(-math.inf, "f32")
# the least product size (batch x M x N x K) for which a GEMM whose operand rows are off 16 bytes
# copies them to padded rows first: for the warp-specialized kernel (`_tma_pad`) and for the
# default one (`_pad`). On an H100 (docs/PERFORMANCE.md, 2026-12-07 05:51): f16 256 x 260 x 260
# 0.017 ms padded against 0.028 on the mma.sync kernel's narrow copies, 1024 x 1028 x 1028 0.030
# against 0.081; f32 (the scalar kernel) 512 x 515 x 516 0.069 against 0.058, 1024 x 1027 x 1028
# 0.130 against 0.161. TILEC_PAD_LEAST sets both, for measuring
PAD_LEAST_TMA = 2 ** 24
PAD_LEAST = 2 ** 30
# a reduction that keeps the innermost axis runs on blocks of columns where that axis (with the
# kept axes after the last reduced one) has at least this many values or a run-time extent
# (lower_col_reduce); fewer, and the row kernel's strided reads cover whole lines
COL_REDUCE_LEAST = 8
# the largest finite value of each float dtype computed in (an online sum's floor for its max)
FLOAT_MAX = {"f32": 3.4028234663852886e38, "f64": sys.float_info.max}
# attention's online softmax: a row's max is renewed only when its scores exceed it by more than
# a factor of 2^RESCALE_LOG2 in exp (lower_attention)
RESCALE_LOG2 = 8.0


def widened(dtype: str) -> str:
    """Dtype a value has in registers: 16-bit and 8-bit floats compute in f32."""
    return "f32" if dtype in ("f16", "bf16", "fp8e4m3", "fp8e5m2") else dtype


def decompose(x, dims) -> list:
    """Row-major multi-index of flat index `x` over `dims`."""
    if not dims:
        return []
    out, stride = [], iconst(1)
    strides = []
    for d in reversed(dims):
        strides.append(stride)
        stride = T.imul(stride, dim_to_expr(d))
    strides.reverse()
    for k, d in enumerate(dims):
        if d == Dim.const(1):  # the only index of a size-1 axis
            out.append(iconst(0))
            continue
        v = idiv(x, strides[k])
        out.append(v if k == 0 else imod(v, dim_to_expr(d)))
    return out


def bcast_index(shape, out_shape, idx) -> tuple:
    """Index into a tensor of `shape` broadcast to `out_shape` at `idx` (NumPy right-alignment)."""
    off = len(out_shape) - len(shape)
    res = []
    for k, d in enumerate(shape):
        res.append(iconst(0) if d == Dim.const(1) else idx[off + k])
    return tuple(res)


class Names:
    def __init__(self, taken):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}{n}", n + 1
        self.taken.add(name)
        return name


class GroupLowering:
    def __init__(self, g: Graph, plan: Plan, grp: Group, target, sched, names: Names,
                 gemm_config=None):
        # a GemmVariant (None: the target's and schedule's tile; PADDED: that tile, its operands
        # read through copies with padded rows)
        self.padded = gemm_config is PADDED
        self.gemm_config = None if self.padded else gemm_config
        self.g, self.plan, self.grp = g, plan, grp
        self.ops = g.op_map()
        self.bufs = dict(plan.buffers)
        self.members = set(grp.members)
        self.target, self.sched, self.names = target, sched, names
        self.special: dict = {}  # op id -> callable(idx) -> expr, for values held in tile buffers
        self.used: set = set()  # global buffers touched

    def on_chip(self, oid: int, at, expr, cached: bool = False):
        """Op `oid` is held in a tile buffer: `expr` is its value at the block's own positions
        `at` (a tuple, or a list of accepted tuples). A `cached` copy of a tensor in memory reads
        memory at other positions; for anything else another index is a fusion bug, reported
        as an internal error rather than compiled into wrong code."""
        shape = self.ops[oid].type.shape
        unit = [i for i, d in enumerate(shape) if d.op == "const" and d.args[0] == 1]

        def key(idx):  # an axis of extent 1 has one position, however it is written
            idx = list(idx)
            for i in unit:
                if i < len(idx):
                    idx[i] = T.iconst(0)
            return tuple(idx)
        accepted = [key(a) for a in (at if isinstance(at, list) else [at])]

        def get(idx):
            if cached and key(idx) not in accepted:
                return self.load(oid, idx)
            if key(idx) not in accepted:
                raise AssertionError(f"%{oid} is on chip but used at another position: "
                                     f"{idx} not in {accepted}")
            return expr
        self.special[oid] = get

    # ---- expressions
    def value(self, oid: int, idx: tuple):
        if oid in self.special:
            return self.special[oid](idx)
        op = self.ops[oid]
        if oid not in self.members and oid in self.bufs:
            return self.load(oid, idx)
        k, a = op.kind, op.args
        dt = op.type.dtype
        if k == "const":
            return T.Const(op.attr("value"), dt)
        if k == "dim":
            return dim_to_expr(op.attr("dim"))
        if k == "index":
            return idx[op.attr("axis")]
        if k == "transpose":
            return self.value(a[0], idx[:-2] + (idx[-1], idx[-2]))
        if k == "reduce":  # over size-1 axes only (fusion keeps real reductions as anchors)
            axes, keep = op.attr("axes"), op.attr("keepdims")
            it = iter(idx)
            src = tuple(iconst(0) if n in axes else next(it)
                        for n in range(self.ops[a[0]].type.rank)) if not keep else \
                tuple(iconst(0) if n in axes else x for n, x in enumerate(idx))
            return self.value(a[0], src)
        if k == "dequant":
            q, z, s = self.dequant_parts(oid, *idx)
            return T.Binary("mul", T.Binary("sub", q, z, "f32"), s, "f32")
        args = [self.value(x, bcast_index(self.ops[x].type.shape, op.type.shape, idx)) for x in a]
        if k == "cast":
            return self.cast(args[0], dt)
        if k == "copy":
            return args[0]
        if k == "unary":
            fn = op.attr("fn")
            if fn == "exp" and nonpositive(self.ops, a[0]):  # softmax's exp(x - max(x))
                fn = "exp_nonpos"
            return T.Unary(fn, args[0], dt)
        if k == "binary":
            if op.attr("fn") == "pow":
                return T.Binary("pow", args[0], None, dt, op.attr("exponent"))
            return T.Binary(op.attr("fn"), args[0], args[1], dt)
        if k == "compare":
            return T.Compare(op.attr("fn"), args[0], args[1])
        if k == "where":
            return T.Select(args[0], args[1], args[2], dt)
        raise AssertionError(f"op %{oid} ({k}) reached expression lowering unmaterialized")

    @staticmethod
    def cast(e, dtype):
        if getattr(e, "dtype", None) == dtype:
            return e
        return T.Cast(e, dtype)

    def load(self, oid: int, idx: tuple):
        b = self.bufs[oid]
        self.used.add(oid)
        if b.kind == "input" and not b.type.shape:  # scalar parameters are passed by value
            return T.Var(b.name, b.type.dtype)
        return T.Load(b.name, tuple(idx), b.type.dtype)

    def store_outputs(self, outs, idx, guard) -> list:
        body = []
        for o in outs:
            self.used.add(o)
            b = self.bufs[o]
            body.append(Store(b.name, tuple(idx), self.value_for_store(o, idx)))
        return [If(guard, tuple(body))] if guard is not None else body

    def value_for_store(self, o, idx):
        v = self.value(o, idx)
        return self.cast(v, self.bufs[o].type.dtype)

    # ---- operand tiles for GEMMs
    def in_memory(self, oid: int) -> bool:
        return oid in self.bufs and oid not in self.members

    def _stored(self, oid: int):
        """(buffer op, transposed) when operand `oid` is a tensor in memory, possibly transposed;
        (None, False) otherwise."""
        op = self.ops[oid]
        if self.in_memory(oid):
            return oid, False
        if op.kind == "transpose" and self.in_memory(op.args[0]):
            return op.args[0], True
        return None, False

    def _stored_as(self, oid: int):
        """_stored of operand `oid`, or of the operand it converts (a cast computed on chip)."""
        src, trans = self._stored(oid)
        if src is None and self.ops[oid].kind == "cast" and not self.in_memory(oid):
            return self._stored(self.ops[oid].args[0])
        return src, trans

    def dequant_parts(self, oid: int, kk, nn, group_row=None) -> tuple:
        """(q, zero, scale) of dequant op `oid` at (kk, nn), each as f32: its value is
        (q - zero) * scale. `group_row`: a row known to share kk's group, whose scale and zero
        are read instead (one load for several rows)."""
        op = self.ops[oid]
        a = op.args
        q = self.value(a[0], (kk, nn))
        # (C's division where the row provably is not negative: `canonical_divisions`)
        grp = T.Binary("floordiv", kk if group_row is None else group_row, iconst(op.attr("group")),
                       "i64")
        s = self.value(a[1], (grp, nn))
        z = self.value(a[2], (grp, nn)) if len(a) > 2 else T.Const(op.attr("zero"), "f32")
        return T.Cast(q, "f32"), self.cast(z, "f32"), self.cast(s, "f32")

    def mma_dtype(self, a_id: int, b_id: int):
        """The 16-bit dtype both GEMM operands hold exactly, if the target's matrix units multiply
        it: an input of that dtype, its conversion to f32, or a dequantization whose scale has
        it (then the dequantized weight is rounded to it, as weight-only kernels do). fp8
        operands are f16 and bf16 values too (converted in the tile copies), and the Hopper
        kernel's wgmma multiplies them as they are: two tensors of one fp8 dtype in memory, both
        K-major (A as stored, B a transposed view: `A @ W.T`), or either of them not, in the
        variants that copy those transposed (GemmVariant.transpose, wgmma_kernel)."""
        def natural(oid):
            op = self.ops[oid]
            if op.kind == "cast" and not self.in_memory(oid):
                oid, op = op.args[0], self.ops[op.args[0]]
            if op.kind == "dequant" and not self.in_memory(oid):
                return self.ops[op.args[1]].type.dtype
            return op.type.dtype
        a, b = natural(a_id), natural(b_id)
        if a == b and a in FP8 and self.gemm_config is not None and self.gemm_config.wgmma:
            (sa, ta), (sb, tb) = self._stored_as(a_id), self._stored_as(b_id)
            if sa is not None and sb is not None and ((not ta and tb) or self.gemm_config.transpose):
                return a
        for dt in self.target.resources.mma_dtypes:
            if all(x == dt or (x in FP8 and dt in SIXTEEN) for x in (a, b)):
                return dt
        return None

    def operand(self, oid: int, dst: str, rows, cols, nrows, ncols, batch_idx, batch_shape,
                as_dtype: str | None = None):
        """Fill tile `dst` ([nrows, ncols]) with operand `oid` at (rows, cols): a tile copy when
        the operand sits in memory (possibly transposed, or converted from `as_dtype`), else a
        parallel loop computing it (converted to `as_dtype` when given).
        Returns (statements, transposed)."""
        op = self.ops[oid]
        shape = op.type.shape
        full = bcast_index(shape, batch_shape + shape[-2:], tuple(batch_idx) + (rows, cols))
        src, trans = self._stored_as(oid) if as_dtype else self._stored(oid)
        if src is not None and self.bufs[src].type.dtype not in ("u4", "i4") and \
                as_dtype in (None, self.bufs[src].type.dtype):  # (else converted by the loop)
            self.used.add(src)
            offs = full[:-2] + ((full[-1], full[-2]) if trans else full[-2:])
            return [Copy(Region(self.bufs[src].name, offs), Region(dst))], trans
        i, j = self.names.fresh("i"), self.names.fresh("j")
        r, c = iadd(rows, T.Var(i)), iadd(cols, T.Var(j))
        at = bcast_index(shape, batch_shape + shape[-2:], tuple(batch_idx) + (r, c))
        guard = land(ilt(r, dim_to_expr(shape[-2])), ilt(c, dim_to_expr(shape[-1])))
        val = self.value(oid, at)
        dt = as_dtype or op.type.dtype
        if as_dtype:
            val = self.cast(val, as_dtype)
        zero = T.Const(0.0 if is_float(dt) else 0, dt)
        # an operand computed from transposed views (`dequant(q.T, s.T, ...)` of weights packed
        # along K), or converted from one, is filled transposed, dst[j, i], with i innermost:
        # neighbouring threads then read neighbouring elements of the tensors in memory, and the
        # gemm reads dst transposed
        trans = (src is not None and trans) or self._reads_transposed(oid)
        idx = (T.Var(j), T.Var(i)) if trans else (T.Var(i), T.Var(j))
        body = If(guard, (Store(dst, idx, val),), (Store(dst, idx, zero),))
        loop = For((j, i), (ncols, nrows), "parallel", (body,)) if trans else \
            For((i, j), (nrows, ncols), "parallel", (body,))
        return [loop], trans

    def _reads_transposed(self, oid: int) -> bool:
        """Does computed operand `oid` read its 2-D tensors in memory through transposed views
        only (so its rows run along their contiguous dimension)?"""
        views = [self._stored(x) for x in self.ops[oid].args
                 if len(self.ops[x].type.shape) >= 2]
        views = [t for src, t in views if src is not None]
        return bool(views) and all(views)

    # ---- group kinds
    def lower(self) -> list:
        """The group's kernels, in launch order (one, or a split-K GEMM's two)."""
        out = getattr(self, "lower_" + self.grp.kind)()
        return out if isinstance(out, list) else [out]

    def kernel(self, grid, bvars, threads, body, comment, swizzle=0, auto_threads=False,
               extra=(), writes_outputs=True) -> TileKernel:
        """A kernel reading or writing the buffers `used` so far, plus the tensors `extra` (a
        split-K workspace: inputs first, outputs last, as for every kernel)."""
        params = [p for p in extra if p.kind == "input"]
        written = set(self.grp.outputs) if writes_outputs else set()
        for oid in sorted(self.used, key=lambda o: (o in written, o)):
            b = self.bufs[oid]
            kind = "scalar" if b.kind == "input" and not b.type.shape else \
                (b.kind if oid in written else "input")
            if all(p.name != b.name for p in params):
                params.append(TensorDecl(b.name, b.type.dtype, b.type.shape, kind))
        params += [p for p in extra if p.kind != "input"]
        return TileKernel("", tuple(params), tuple(grid), tuple(bvars), threads, tuple(body),
                          comment, swizzle, auto_threads=auto_threads)

    def check_warps(self, rows: int, cols: int, threads: int, rows_in_warp: bool, knob=False):
        """On targets that lay accumulators out over warps (their `layout` step), `threads` must
        give a grid of warps that tiles the rows x cols accumulator in 16 x 8 mma tiles (whole
        rows per warp for attention): a located error, not a failure in the layout pass."""
        r = self.target.resources
        if not any(name == "layout" for name, _ in self.target.lowering) or \
                warp_grids(rows, cols, threads // r.warp, rows_in_warp, r.mma[:2]):
            return
        shape = (f"give each of its warps a multiple of 16 of the {rows} query rows"
                 if rows_in_warp else
                 f"tile the {rows}x{cols} accumulator in {r.mma[0]}x{r.mma[1]} mma tiles")
        where = "TILEC_GEMM_TILE" if knob else "schedule"
        raise error(f"{where}: {threads} threads ({threads // r.warp} warps of {r.warp}) cannot "
                    f"{shape}", None if knob else self.sched.loc_of("threads"),
                    "choose threads and tile sizes that divide evenly, e.g. 4 warps for 128x128")

    def lower_gemm(self) -> list:
        mm = self.ops[self.grp.members[0]]
        a_id, b_id = mm.args
        shape = mm.type.shape
        batch, M, N = shape[:-2], shape[-2], shape[-1]
        K = self.ops[a_id].type.shape[-1]
        mma_dt = self.mma_dtype(a_id, b_id)
        # f32 products that `precision tf32` puts on the matrix units take their tile shape
        tf32 = mma_dt is None and self.target.tf32(self.sched) and \
            self.ops[a_id].type.dtype == self.ops[b_id].type.dtype == mm.type.dtype == "f32"
        scalar = mma_dt is None and not tf32  # (on the scalar units)
        bm, bn, bk, stages, threads = self.target.gemm_config(
            self.sched, scalar=scalar, operand_bytes=4 if tf32 else 2)
        blocks = 1  # (per SM, the kernel's bound)
        sc = self.sched  # (a schedule that sets any of the knob's fields keeps its own)
        knob = split_k.gemm_tile(self.target) if mma_dt is not None and \
            self.gemm_config is None and not (sc.tile or sc.threads or sc.stages or sc.swizzle) \
            else None
        if knob:
            (bm, bn, bk), threads, stages, _ = knob
        if self.gemm_config is None:
            self.check_warps(bm, bn, threads, False, bool(knob))
        split, gemv = None, 0
        if self.gemm_config is not None:
            cfg = self.gemm_config
            (bm, bn, bk), threads, stages, split, gemv = (cfg.tile, cfg.threads, cfg.stages,
                                                          cfg.split, cfg.gemv_unroll)
            if cfg.wgmma and scalar:
                raise NotWgmma()
        bx, by, bz = (self.names.fresh(n) for n in ("bx", "by", "bz"))
        grid = [dim_to_expr(N.cdiv(bn)), dim_to_expr(M.cdiv(bm))]
        bvars = [bx, by]
        if batch:
            grid.append(dim_to_expr(numel(batch)))
            bvars.append(bz)
        nk = K.cdiv(bk)
        k = self.names.fresh("k")
        trip, kt, first = dim_to_expr(nk), T.Var(k), iconst(0)
        bidx = decompose(T.Var(bz), batch)
        if split is not None:  # z = batch index * count + split; the split walks its K tiles
            kmajor = kmajor_gemv(self.ops, b_id, self.target)
            sk = split_k.plan(N.cdiv(bn) * M.cdiv(bm) * numel(batch), nk, *split[:2],
                              multiple=gemv_chunk_rows(gemv, kmajor))
            kc = self.names.fresh("kc")  # K tiles per split
            count, chunk = T.Binary("cdiv", dim_to_expr(nk), T.Var(kc), "i64"), T.Var(kc)
            lets = [T.Let(kc, dim_to_expr(sk.chunk))]
            # (the canonical division rule keeps these NumPy-style: kc is not a dimension)
            bidx = decompose(T.Binary("floordiv", T.Var(bz), count, "i64"), batch)
            part = T.Binary("mod", T.Var(bz), count, "i64") if batch else T.Var(bz)
            grid = grid[:2] + [dim_to_expr(numel(batch) * sk.count)]
            bvars = [bx, by, bz]
            first = imul(part, chunk)
            trip = T.Binary("min", chunk, T.isub(dim_to_expr(nk), first), "i64")
            kt = iadd(first, kt)
        row0, col0 = imul(T.Var(by), iconst(bm)), imul(T.Var(bx), iconst(bn))
        if gemv:
            # (slices as long as a whole split's: the last, shorter split masks the rest, and the
            # slice length stays a non-negative index for the division rule)
            body, acc = self.gemv_body(mm, trip, chunk if split else trip, first, k, row0, col0,
                                       bn, threads, bidx, batch, mma_dt, gemv, bm)
            body = ([] if split is None else lets) + body
        else:
            a_dt = mma_dt or self.ops[a_id].type.dtype
            b_dt = mma_dt or self.ops[b_id].type.dtype
            As, Bs, acc = (self.names.fresh(n) for n in ("A_s", "B_s", "acc"))
            k0 = imul(kt, iconst(bk))
            load_a, ta = self.operand(a_id, As, row0, k0, iconst(bm), iconst(bk), bidx, batch, mma_dt)
            load_b, tb = self.operand(b_id, Bs, k0, col0, iconst(bk), iconst(bn), bidx, batch, mma_dt)
            # (f32 alone, as measured: f64's accumulators take twice the registers and spilled
            # 1 KB under the 3-block bound; operands computed on their way to shared memory, a
            # prologue such as gelu(X), keep one block's bound too: they spilled 4 bytes)
            if scalar and tb and not ta and self.gemm_config is None and \
                    self.target.resources.scalar_gemm_kmajor and \
                    not (sc.tile or sc.threads or sc.stages) and \
                    a_dt == b_dt == mm.type.dtype == "f32" and \
                    all(isinstance(st, Copy) for st in load_a + load_b):
                stages, blocks = self.target.resources.scalar_gemm_kmajor
            body = ([] if split is None else lets) + [
                Alloc(As, "shared", a_dt, (iconst(bk), iconst(bm)) if ta else (iconst(bm), iconst(bk))),
                Alloc(Bs, "shared", b_dt, (iconst(bn), iconst(bk)) if tb else (iconst(bk), iconst(bn))),
                Alloc(acc, "fragment", mm.type.dtype, (iconst(bm), iconst(bn))),
                Fill(acc, T.Const(0, mm.type.dtype)),
                For((k,), (trip,), "pipelined",
                    tuple(load_a + load_b + [Gemm(
                        As, Bs, acc, ta, tb,
                        promote=self.target.resources.fp8_promote if mma_dt in FP8 else 0)]),
                    stages)]
        i, j = self.names.fresh("i"), self.names.fresh("j")
        r, c = iadd(row0, T.Var(i)), iadd(col0, T.Var(j))
        guard = land(ilt(r, dim_to_expr(M)), ilt(c, dim_to_expr(N)))
        of_a = "one row of A" if bm == 1 else f"{bm} rows of A"  # (a GEMV's, in its comment)
        swizzle = 0 if gemv else self.sched.swizzle or \
            (knob[3] if knob else self.target.resources.gemm_swizzle)
        if self.target.resources.async_copy:
            body = list(fit_stages(tuple(body), self.target.resources.tile_memory //
                                   (split[2] if split else 1)))
        if split is None:
            self.on_chip(mm.id, tuple(bidx) + (r, c), T.Load(acc, (T.Var(i), T.Var(j)), mm.type.dtype))
            body.append(For((i, j), (iconst(bm), iconst(bn)), "parallel",
                            tuple(self.store_outputs(self.grp.outputs, tuple(bidx) + (r, c), guard))))
            if self.gemm_config is not None and self.gemm_config.wgmma:
                return self.wgmma_kernel(grid, bvars, threads, body, swizzle)
            k = self.kernel(grid, bvars, threads, body,
                            f"GEMV ({of_a}) with fused prologue/epilogue" if gemv else
                            "GEMM with fused prologue/epilogue", swizzle)
            if scalar and not gemv:
                k = replace(k, blocks_per_sm=split_k.simt_blocks(blocks))
            if self.padded:  # (16-byte copies of rows that were off 16 bytes)
                params = {p.name for p in k.params}
                k, pads, misaligned = pad_operands(
                    k, [s.src.buf for s in T.walk_stmts(k.body)
                        if isinstance(s, Copy) and s.src.buf in params], self.names, self.target,
                    self.g.assumes)
                return pads + [replace(k, when=misaligned)]
            return [k]
        # split-K: the partial products to the workspace, then their sum and the epilogue
        ws = TensorDecl(self.names.fresh("partials"), mm.type.dtype,
                        tuple(batch) + (sk.count, M, N), "workspace", sk.when)
        at = tuple(bidx) + (part, r, c)
        body.append(For((i, j), (iconst(bm), iconst(bn)), "parallel", (If(guard, (
            Store(ws.name, at, T.Load(acc, (T.Var(i), T.Var(j)), mm.type.dtype)),)),)))
        what, unit = (f"GEMV ({of_a})", "rows") if gemv else ("GEMM", "tiles")
        partial = replace(self.kernel(grid, bvars, threads, body,
                                      f"{what} split over K: partial products of {kc} K {unit} "
                                      "each", swizzle, extra=(ws,), writes_outputs=False),
                          blocks_per_sm=split[2])
        self.used = set()
        s, tot = self.names.fresh("s"), self.names.fresh("sum")
        bidx = decompose(T.Var(bz), batch)
        grid, bvars = grid[:2] + ([dim_to_expr(numel(batch))] if batch else []), bvars[:2 + bool(batch)]
        vi, vj = T.Var(i), T.Var(j)
        self.on_chip(mm.id, tuple(bidx) + (r, c), T.Load(tot, (vi, vj), mm.type.dtype))
        body = lets + [
                Alloc(tot, "fragment", mm.type.dtype, (iconst(bm), iconst(bn))),
                Fill(tot, T.Const(0, mm.type.dtype)),
                For((s,), (count,), "range", (For((i, j), (iconst(bm), iconst(bn)), "parallel", (
                    If(guard, (Store(tot, (vi, vj), T.Binary(
                        "add", T.Load(tot, (vi, vj), mm.type.dtype),
                        T.Load(ws.name, tuple(bidx) + (T.Var(s), r, c), mm.type.dtype),
                        mm.type.dtype)),)),)),)),
                For((i, j), (iconst(bm), iconst(bn)), "parallel",
                    tuple(self.store_outputs(self.grp.outputs, tuple(bidx) + (r, c), guard)))]
        total = self.kernel(grid, bvars, threads, body,
                            "GEMM split over K: the sum of the partial products, then the epilogue",
                            extra=(replace(ws, kind="input", when=None),))
        return [partial, replace(total, part=1, name="_sum")]

    def wgmma_kernel(self, grid, bvars, threads, body, swizzle) -> list:
        """The warp-specialized GEMM kernel (resources.wgmma), after the kernels that write the
        copies it reads, if any: both operands tile copies of 16-bit tensors in memory (either
        of them transposed), or of fp8 ones, or of f32 ones under `precision tf32` (those two
        K-major: A not transposed, B transposed; the variants of GemmVariant.transpose read an
        operand stored the other way through a transposed copy), whose row strides TMA can take
        (16-byte multiples: the variant's run-time condition, with every extent, and the product
        of the leading dims of a tensor of more than 3, below 2^31 for TMA's 32-bit
        coordinates; GemmVariant.pad reads rows off 16 bytes through padded copies); else
        NotWgmma. The variant in clusters of 2 (GemmVariant.cluster) adds its own: B's rows off
        128-byte lines."""
        loop = next(s for s in body if isinstance(s, For) and s.kind == "pipelined")
        *copies, gemm = loop.body
        if len(copies) != 2 or not all(isinstance(c, Copy) for c in copies) or \
                not isinstance(gemm, Gemm):
            raise NotWgmma()
        a_dt = next(s.dtype for s in body if isinstance(s, Alloc) and s.name == gemm.a)
        *_, pingpong, cluster = wgmma_config(self.target, a_dt in FP8)
        consumers = self.gemm_config.threads // 128 - 1  # (and a producer warpgroup)
        pairs = self.gemm_config.cluster
        if len(grid) > 2:  # (clusters pair M tiles of one matrix: batched GEMMs take none)
            if pairs:
                raise NotWgmma()
            cluster = 1
        cluster = pairs or cluster
        k = self.kernel(grid, bvars, threads, body,
                        "GEMM with fused prologue/epilogue: warp-specialized (TMA, wgmma), "
                        "persistent" + (", ping-pong" if pingpong else "") +
                        (f", clusters of {cluster}" if cluster > 1 else ""), swizzle)
        params = {p.name: p for p in k.params}
        srcs = [c.src.buf for c in copies]
        tf32 = a_dt == "f32" and tf32_on_wgmma(self.target, self.sched)
        if any(params[n].dtype not in SIXTEEN + FP8 + (("f32",) if tf32 else ()) for n in srcs):
            raise NotWgmma()
        # (fp8 and tf32: K-major operands only; an operand stored the other way is read through
        # a transposed copy, in the variants that take them: GemmVariant.transpose)
        src_of = {c.dst.buf: c.src.buf for c in copies}
        mn_major = {} if params[srcs[0]].dtype in SIXTEEN else \
            {src_of[buf]: role for buf, role, kmajor in ((gemm.a, "a", not gemm.transpose_a),
                                                         (gemm.b, "b", gemm.transpose_b))
             if not kmajor}
        if mn_major and (not self.gemm_config.transpose or len(set(srcs)) < len(srcs)):
            raise NotWgmma()  # (one tensor as both operands: its copies would differ)
        pads, need = [], None  # (need: where the variant's copies are needed)
        if mn_major:
            # (with transposed copies the variant runs at every call where they pay: the other
            # operand is then read as it is, where TMA can, rather than copied at every call)
            need = self.transposes_pay(params, mn_major)
            k, pads, _ = pad_operands(k, list(mn_major), self.names, self.target,
                                      self.g.assumes, frozenset(mn_major))
        elif self.gemm_config.pad:  # (operands whose rows are off 16 bytes, copied)
            k, pads, need = pad_operands(k, srcs, self.names, self.target, self.g.assumes)
        if pads:
            params = {p.name: p for p in k.params}
            srcs = [dict(k.padded).get(n, n) for n in srcs]
        when = tma_conditions(params, srcs, None)
        if when is False:
            raise NotWgmma()
        if need is not None:
            when = Dim.bin("and", need, when) if when is not None else need
        if pairs:
            # B's rows start off 128-byte lines: the copy engine splits each of a box's rows into
            # more L2 requests, and B's boxes are most of a stage; a cluster loads each B tile
            # once for two blocks (on an H100, f16 4096 x 4088 x 4096: 0.249 -> 0.198 ms, A @ W.T
            # 4096 x 4096 x 4088: 0.272 -> 0.191 ms; 4096^3 with clusters: 0.180 -> 0.185 ms)
            b = params[next(c.src.buf for c in copies if c.dst.buf == gemm.b)]
            off = Dim.bin("ne", b.shape[-1] % (128 // (DTYPES[b.dtype][1] // 8)), 0)
            if off == Dim.const(0):
                raise NotWgmma()
            if off != Dim.const(1):
                when = off if when is None else Dim.bin("and", when, off)
        # (an operand of more than 3 dims is addressed as 3, its leading dims merged into one
        # 32-bit coordinate, as attention's are)
        for cond in dict.fromkeys(Dim.bin("lt", numel(params[n].shape[:-2]), 2 ** 31)
                                  for n in srcs if len(params[n].shape) > 3):
            when = Dim.bin("and", when, cond) if when is not None else cond
        copied = {c for _, c in k.padded}  # (workspaces: aligned by the launcher)
        return pads + [replace(k, when=when, warp_specialize=consumers, pingpong=pingpong,
                               cluster=cluster, persistent=True,
                               aligned=tuple(sorted(set(srcs) - copied)),
                               register_stores=self.gemm_config.pad)]

    def transposes_pay(self, params: dict, which: dict) -> Dim:
        """When transposed copies of the tensors `which` maps to their role ("a" or "b") pay:
        the product does TRANSPOSE_WORK multiply-adds per value copied or more (B's K x N
        values are each multiplied by M rows of A, A's by N columns of B, times the batch dims
        the tensor does not have), and the product has PAD_LEAST_TMA values. NotWgmma where
        TILEC_TRANSPOSE_WORK=0 or TILEC_PAD_LEAST=0 says never."""
        work, least = split_k.transpose_work(TRANSPOSE_WORK), split_k.pad_least(PAD_LEAST_TMA)
        if not work or not least:
            raise NotWgmma()
        mm = self.ops[self.grp.members[0]]
        batch, (M, N) = numel(mm.type.shape[:-2]), mm.type.shape[-2:]
        K = self.ops[mm.args[0]].type.shape[-1]
        # (and a product of PAD_LEAST_TMA values, as for padded copies: gemm_variants' `work`)
        return functools.reduce(lambda x, y: Dim.bin("and", x, y), [
            Dim.bin("ge", batch * M * N, Dim.const(least).cdiv(K))] + [
            Dim.bin("ge", batch * (M if role == "b" else N),
                    numel(params[name].shape[:-2]) * work)
            for name, role in which.items()])

    def gemv_body(self, mm, trip, span, first, k: str, row0, col0, bn: int, threads: int, bidx,
                  batch, mma_dt, unroll: int = 1, mr: int = 1) -> tuple:
        """The main loop of a GEMV (one row of A): each warp of the block walks its own slice of
        `span` rows (those below `trip`) from row `first` for the same `bn` columns, accumulating
        a * b in registers and reading B straight from memory (a vector of columns per thread
        and row: a warp reads whole rows); the warps' sums then meet in shared memory. With
        `unroll` > 1 a step gives each slice that many consecutive rows at once, unguarded (the
        loads are all in flight together; on the CPU the sums are read and written once per
        step), and the rows left over follow, guarded. `mr` > 1: the block takes `mr` rows of A
        (those below M) through the target's GEMV routine (T.GemvMma), which reads and
        dequantizes each weight once for all of them; NoVariant where it cannot take the
        product. Returns (statements, the [mr, bn] fragment of the block's sums)."""
        a_id, b_id = mm.args
        dt = mm.type.dtype
        slices = threads // self.target.resources.warp
        per, acc, red, tot = (self.names.fresh(n) for n in ("rows", "acc", "red", "tot"))
        i, j, s = self.names.fresh("i"), self.names.fresh("j"), self.names.fresh("s")
        vi, vj = T.Var(i), T.Var(j)
        c = iadd(col0, vj)
        N = mm.type.shape[-1]

        def operand(oid, idx, v=None):
            if v is None:
                shape = self.ops[oid].type.shape
                v = self.value(oid, bcast_index(shape, tuple(batch) + shape[-2:], tuple(bidx) + idx))
            if mma_dt and isinstance(v, T.Cast) and getattr(v.x, "dtype", None) == mma_dt:
                v = v.x  # a 16-bit value widened: it already is what the matrix units multiply
            return self.cast(self.cast(v, mma_dt) if mma_dt else v, dt)

        def pairwise(terms: list):
            while len(terms) > 1:
                terms = [T.Binary("add", terms[n], terms[n + 1], dt) if n + 1 < len(terms)
                         else terms[n] for n in range(0, len(terms), 2)]
            return terms[0]

        # B = dequant(q, s, zero, group G) not rounded to a 16-bit dtype, with G a multiple of
        # the rows per step: a step's rows share their group (steps start at multiples of
        # `unroll`: split chunks are multiples of it), so its scale and zero factor out,
        # sum_u a_u (q_u - z) s = (sum_u a_u q_u - z sum_u a_u) s: one multiply-add per weight
        # instead of a subtract and two multiplies (sum_u a_u is the same for every column)
        b_op = self.ops[b_id]
        one_group = (unroll > 1 and b_op.kind == "dequant" and not self.in_memory(b_id) and
                     b_op.attr("group") % unroll == 0)  # a step's rows share their group
        grouped = one_group and not mma_dt and dt == "f32"
        fused = dt in ("f32", "f64")  # products accumulate by fused multiply-adds

        def mac(x, y, total):  # total + x * y, as the product's accumulation
            return T.Fma(x, y, total, dt) if fused else \
                T.Binary("add", total, T.Binary("mul", x, y, dt), dt)

        def add_rows(rows: list):  # acc += the products of these rows
            kr = [iadd(first, r) for r in rows]
            total = T.Load(acc, (vi, vj), dt)
            a = [operand(a_id, (row0, x)) for x in kr]
            if grouped and len(rows) > 1:
                q = [self.dequant_parts(b_id, x, c)[0] for x in kr]
                _, z, s = self.dequant_parts(b_id, kr[0], c)
                dots = T.Binary("mul", a[0], q[0], dt)
                for x, y in zip(a[1:], q[1:]):
                    dots = mac(x, y, dots)
                return Store(acc, (vi, vj), mac(T.Binary(
                    "sub", dots, T.Binary("mul", z, pairwise(a), dt), dt), s, total))
            if one_group and len(rows) > 1:  # each row's weight, with the step's scale
                b = []
                for x in kr:
                    q, z, s = self.dequant_parts(b_id, x, c, group_row=kr[0])
                    b.append(operand(b_id, None, T.Binary("mul", T.Binary("sub", q, z, "f32"), s,
                                                          "f32")))
            else:
                b = [operand(b_id, (x, c)) for x in kr]
            for x, y in zip(a, b):
                total = mac(x, y, total)
            return Store(acc, (vi, vj), total)
        col_ok = ilt(c, dim_to_expr(N))
        if unroll == 1:
            row = iadd(imul(vi, T.Var(per)), T.Var(k))  # the row of the split this slice is at
            loops = [For((k,), (T.Var(per),), "range", (For(
                (i, j), (iconst(slices), iconst(bn)), "parallel",
                (If(land(ilt(row, trip), col_ok), (add_rows([row]),)),)),))]
        else:  # steps of slices x `unroll` whole rows (slice i: `unroll` consecutive ones), then
            # the rows left over, one per slice and pass, guarded
            step = slices * unroll
            full = T.Binary("floordiv", trip, iconst(step), "i64")
            left = self.names.fresh("r")
            mine = iadd(imul(vi, iconst(unroll)), T.Var(left))  # a left-over row of slice i
            tail = iadd(imul(full, iconst(step)), mine)
            loops = [For((k,), (full,), "range", (For(
                (i, j), (iconst(slices), iconst(bn)), "parallel", (If(col_ok, (add_rows(
                    [iadd(iadd(imul(T.Var(k), iconst(step)), imul(vi, iconst(unroll))), iconst(u))
                     for u in range(unroll)]),)),)),)),
                For((left,), (iconst(unroll),), "range", (For(
                    (i, j), (iconst(slices), iconst(bn)), "parallel",
                    (If(land(ilt(tail, trip), col_ok), (add_rows([tail]),)),)),))]
        form = self.gemv_mma_form(a_id, b_id, mma_dt, row0, batch) if dt == "f32" else None
        if mr > 1:  # several rows of A: the routine's alone (a variant of the words it reads)
            if form is None:
                raise NoVariant()
            return self.gemv_rows_body(form, mm, trip, first, row0, col0, bn, slices, mr)
        body = [
            *([T.Let(per, T.Binary("cdiv", span, iconst(slices), "i64"))] if unroll == 1 else []),
            Alloc(acc, "fragment", dt, (iconst(slices), iconst(bn))),
        ]
        scalar = [Fill(acc, T.Const(0, dt)), *loops]
        if slices == 1 and form is None:  # one slice (the CPU): its sums are the block's
            return body + scalar, acc
        scalar.append(For((i, j), (iconst(slices), iconst(bn)), "parallel",
                          (Store(red, (vi, vj), T.Load(acc, (vi, vj), dt)),)))
        body.append(Alloc(red, "shared", dt, (iconst(slices), iconst(bn))))
        if form is None:
            body += scalar
        else:  # on the matrix units where the weights are whole words (else the scalar GEMV;
            # weights packed along K: the routine takes every shape itself)
            mma = T.GemvMma(*form[:3], red, *form[3:5], (row0, first, trip, col0, iconst(1)),
                            form[5])
            words = T.Compare("eq", T.Binary("mod", dim_to_expr(N), iconst(8), "i64"), iconst(0))
            body.append(mma if form[5] else If(words, (mma,), tuple(scalar)))
        return body + sum_slices(red, tot, slices, 1, bn, dt, (i, j, s)), tot


    def gemv_rows_body(self, form, mm, trip, first, row0, col0, bn: int, slices: int,
                       mr: int) -> tuple:
        """The GEMV of `mr` rows of A from `row0` (those below M) by the target's routine: the
        warps' partial sums [slices * mr, bn] in shared memory, then their sum per row of A.
        Returns (statements, the [mr, bn] fragment of the block's sums)."""
        dt = mm.type.dtype
        red, tot = self.names.fresh("red"), self.names.fresh("tot")
        loop_vars = self.names.fresh("i"), self.names.fresh("j"), self.names.fresh("s")
        given = T.imin(iconst(mr), T.isub(dim_to_expr(mm.type.shape[-2]), row0))
        return [
            Alloc(red, "shared", dt, (iconst(slices * mr), iconst(bn))),
            T.GemvMma(*form[:3], red, *form[3:5], (row0, first, trip, col0, given), form[5], mr),
            *sum_slices(red, tot, slices, mr, bn, dt, loop_vars),
        ], tot

    def gemv_mma_form(self, a_id: int, b_id: int, mma_dt, row0, batch):
        """(A, q, scales, zero, group) when the target runs this GEMV on its matrix units
        (T.GemvMma): A @ dequant(q, s, zero=Z, group=G) with A's row and the 4-bit q and s (of
        A's dtype, one the target's gemv_mma takes: on CUDA the 16-bit dtype the matrix units
        multiply, on the CPU f32) plain tensors in memory, Z a small integer and G a multiple
        of 16; else None."""
        if batch or not split_k.gemv_mma(self.target):
            return None
        b_op = self.ops[b_id]
        if not dequant4_for_gemv_mma(self.ops, b_id, self.target) or self.in_memory(b_id) or \
                len(b_op.args) != 2:
            return None
        zero, group = b_op.attr("zero"), b_op.attr("group")
        if group % 16 or float(zero) != int(zero) or not -64 <= zero <= 64:
            return None
        probe = T.Var(self.names.fresh("k"))
        a = self.value(a_id, (row0, probe))
        if mma_dt and isinstance(a, T.Cast) and getattr(a.x, "dtype", None) == mma_dt:
            a = a.x
        if not (isinstance(a, T.Load) and a.dtype in gemv_mma_dtypes(self.target) and
                a.idx == (row0, probe)) or (mma_dt and a.dtype != mma_dt):
            return None
        (q_id, qt), (s_id, st) = self._stored(b_op.args[0]), self._stored(b_op.args[1])
        kmajor = kmajor_gemv(self.ops, b_id, self.target)
        if q_id is None or s_id is None or qt != kmajor or st != kmajor:
            return None
        q, s = self.bufs[q_id], self.bufs[s_id]
        if s.type.dtype != a.dtype or len(q.type.shape) != 2 or len(s.type.shape) != 2:
            return None
        self.used.update((q_id, s_id))
        return a.buf, q.name, s.name, int(zero), group, kmajor

    def lower_elementwise(self) -> TileKernel:
        S = self.grp.domain
        br, bc = self.target.resources.ew_tile
        rows, cols = numel(S[:-1]), (S[-1] if S else Dim.const(1))
        bx, by = self.names.fresh("bx"), self.names.fresh("by")
        i, j = self.names.fresh("i"), self.names.fresh("j")
        r, c = iadd(imul(T.Var(by), iconst(br)), T.Var(i)), iadd(imul(T.Var(bx), iconst(bc)), T.Var(j))
        idx = tuple(decompose(r, S[:-1])) + ((c,) if S else ())
        guard = land(ilt(r, dim_to_expr(rows)), ilt(c, dim_to_expr(cols)))
        body = [For((i, j), (iconst(br), iconst(bc)), "parallel",
                    tuple(self.store_outputs(self.grp.outputs, idx, guard)))]
        return self.kernel([dim_to_expr(cols.cdiv(bc)), dim_to_expr(rows.cdiv(br))], [bx, by],
                           self.sched.threads or self.target.resources.ew_threads, body, "elementwise")

    def lower_reduce(self) -> TileKernel | list:
        S, axes = self.grp.domain, self.grp.axes
        if self.gemm_config is COL_SPLIT:
            return self.split_col_reduce()
        if self.columns_pay():
            return self.lower_col_reduce()
        kept = [d for a, d in enumerate(S) if a not in axes]
        red = [d for a, d in enumerate(S) if a in axes]
        rows, cols = numel(kept), numel(red)
        res = self.target.resources
        br = self.sched.tile_size("M", res.row_block) if res.row_tile else res.row_block
        bx = self.names.fresh("bx")
        i, j = self.names.fresh("i"), self.names.fresh("j")
        vi, vj = T.Var(i), T.Var(j)
        r = iadd(imul(T.Var(bx), iconst(br)), vi)
        kidx, ridx = decompose(r, kept), decompose(vj, red)
        full, ki, ri = [], iter(kidx), iter(ridx)
        for a in range(len(S)):
            full.append(next(ri) if a in axes else next(ki))
        full = tuple(full)
        keep_idx = tuple(iconst(0) if a in axes else x for a, x in enumerate(full))
        drop_idx = tuple(kidx)
        keep_shape = tuple(Dim.const(1) if a in axes else d for a, d in enumerate(S))
        row_ok = ilt(r, dim_to_expr(rows))
        BR, COLS = iconst(br), dim_to_expr(cols)
        body = []
        # read each row of the inputs once: cache them on chip (a fragment of the block)
        for rd in self.grp.reads:
            op = self.ops[rd]
            if op.type.shape == S and any(S[a] != Dim.const(1) for a in axes) and op.type.shape:
                cache = self.names.fresh(self.bufs[rd].name + "_row")
                dt = op.type.dtype  # the values as they are in memory (half the registers of f32)
                body.append(Alloc(cache, "fragment", dt, (BR, COLS)))
                body.append(For((i, j), (BR, COLS), "parallel",
                                (If(row_ok, (Store(cache, (vi, vj), self.load(rd, full)),)),)))
                self.on_chip(rd, full, T.Load(cache, (vi, vj), dt), cached=True)
        users = self.g.users()
        outs = set(self.grp.outputs)
        for m in self.grp.members:
            op = self.ops[m]
            if op.kind == "reduce" and not is_squeeze(op, self.ops):
                src = self.value(op.args[0], full)
                if not (isinstance(src, T.Load) and src.idx == (vi, vj)):
                    tmp = self.names.fresh("t")
                    body.append(Alloc(tmp, "fragment", widened(src.dtype), (BR, COLS)))
                    body.append(For((i, j), (BR, COLS), "parallel",
                                    (If(row_ok, (Store(tmp, (vi, vj), src),)),)))
                    src = T.Load(tmp, (vi, vj), widened(src.dtype))
                    # later uses of the same row-shaped value read it back instead of recomputing
                    if op.args[0] not in self.special:
                        self.on_chip(op.args[0], full, src)
                dst = self.names.fresh("row_" + op.attr("fn"))
                dt = widened(op.type.dtype)
                body.append(Alloc(dst, "fragment", dt, (BR,)))
                body.append(Reduce(op.attr("fn"), src.buf, dst, 1))
                # accumulate wide, then round to the declared dtype (e.g. an f16 sum)
                self.on_chip(m, [keep_idx, drop_idx], self.cast(T.Load(dst, (vi,), dt), op.type.dtype))
            elif op.type.shape != S and (m in outs or any(u in self.members and
                                                          self.ops[u].type.shape == S for u in users[m])):
                buf = self.names.fresh("v")
                dt = widened(op.type.dtype)
                at = keep_idx if op.type.shape == keep_shape else drop_idx
                body.append(Alloc(buf, "fragment", dt, (BR,)))
                body.append(For((i,), (BR,), "parallel",
                                (If(row_ok, (Store(buf, (vi,), self.cast(self.value(m, at), dt)),)),)))
                self.on_chip(m, [keep_idx, drop_idx], T.Load(buf, (vi,), dt))
        row_outs = [o for o in self.grp.outputs if self.ops[o].type.shape == S]
        red_outs = [o for o in self.grp.outputs if self.ops[o].type.shape != S]
        if row_outs:
            body.append(For((i, j), (BR, COLS), "parallel",
                            tuple(self.store_outputs(row_outs, full, row_ok))))
        for o in red_outs:
            at = keep_idx if self.ops[o].type.shape == keep_shape else drop_idx
            body.append(For((i,), (BR,), "parallel", tuple(self.store_outputs([o], at, row_ok))))
        return self.kernel([dim_to_expr(rows.cdiv(br))], [bx],
                           self.sched.threads or self.target.resources.row_threads,
                           body, f"row reduction over axes {tuple(axes)}",
                           auto_threads=not self.sched.threads)

    def online_max(self, m: int):
        """The max reduction a sum `m` of exp(x - max(x)) over the same axes subtracts (the
        max's x the same value as the sum's, floats as wide as they compute in): the sum can
        follow the max's running value, rescaled where it grows (an online sum); None
        otherwise."""
        e = self.ops[self.ops[m].args[0]]
        if not (e.kind == "unary" and e.attr("fn") == "exp" and e.args[0] in self.members):
            return None
        d = self.ops[e.args[0]]
        if not (d.kind == "binary" and d.attr("fn") == "sub" and d.args[1] in self.members):
            return None
        r = self.ops[d.args[1]]
        if r.kind == "reduce" and r.attr("fn") == "max" and r.args[0] == d.args[0] and \
                r.attr("axes") == self.ops[m].attr("axes") and r.attr("keepdims") and \
                e.type.dtype in ("f32", "f64") and r.type.dtype == e.type.dtype:
            return r.id
        return None

    def columns_pay(self) -> bool:
        """Whether this reduction runs on blocks of columns (lower_col_reduce): the target
        takes them, the innermost axis is kept and is not a known handful of values (there the
        row kernel's strided reads cover whole lines too)."""
        S, axes = self.grp.domain, self.grp.axes
        if not (S and len(S) - 1 not in axes and
                split_k.col_reduce(self.target.resources.col_reduce)):
            return False
        *_, (_, inner, _) = self.col_axes()
        return inner.op != "const" or inner.args[0] >= COL_REDUCE_LEAST

    def col_axes(self) -> tuple:
        """A column reduction's axes: (the reduced ones, the kept ones after the last reduced one
        (its columns), the kept ones before it (a block per position), whether those are more
        than one position), and the extents (R, Ci, Po) of the three."""
        S, axes = self.grp.domain, self.grp.axes
        inner = list(range(max(axes) + 1, len(S)))
        outer = [a for a in range(max(axes)) if a not in axes]
        extents = tuple(numel([S[a] for a in x]) for x in (axes, inner, outer))
        return axes, inner, outer, any(S[a] != Dim.const(1) for a in outer), extents

    def col_block(self) -> tuple:
        """A column reduction's block: (threads, rows per step, columns, threads across a row,
        the least rows per step): the target's (or TILEC_COL_REDUCE's) bytes of each row in
        columns of the widest value read or written, and on GPUs 16 bytes per thread and
        access, every thread as many vectors, a step's vectors at least a warp's."""
        block, rb, row_bytes, *_ = split_k.col_reduce(self.target.resources.col_reduce)
        widest = max(itemsize_bits(self.ops[o].type.dtype) for o in
                     list(self.grp.reads) + list(self.grp.outputs))
        per_row = max(row_bytes // 16, 1)
        least = -(-self.target.resources.warp // per_row)
        return block, max(rb, least), max(row_bytes * 8 // max(widest, 8), 1), per_row, least

    def split_col_reduce(self) -> list:
        """The split variant of a column reduction (COL_SPLIT): where the columns give fewer
        blocks than the target's goal and the rows are many, `count` blocks per column block
        each sweep a slice of the rows into partials (a workspace [count, outer, columns] per
        reduction, in its dtype in registers: f32 for floats), and a second kernel combines
        each column's partials in slice order (deterministic) and computes the outputs. Only
        for one level of reductions (none reads another's result) whose outputs are all reduced
        values: others need the combined values before the next sweep over the rows. NoVariant
        elsewhere."""
        S = self.grp.domain
        reduces = [m for m in self.grp.members if self.ops[m].kind == "reduce" and
                   not is_squeeze(self.ops[m], self.ops)]
        if not self.columns_pay() or not reduces or \
                any(self.ops[o].type.shape == S for o in self.grp.outputs):
            raise NoVariant()
        members = set(self.grp.members)
        if any(_reaches(self.ops, self.ops[m].args, lambda x: x in reduces, members)
               for m in reduces):
            raise NoVariant()
        *_, blocks, steps = split_k.col_reduce(self.target.resources.col_reduce)
        *_, (R, Ci, Po) = self.col_axes()
        _, rb, bc, _, _ = self.col_block()
        split = split_k.plan(Ci.cdiv(bc) * Po, R.cdiv(rb), blocks, steps, wave=True)
        if split.when == Dim.const(0):
            raise NoVariant()
        ws = {m: TensorDecl(self.names.fresh("partials"), widened(self.ops[m].type.dtype),
                            (split.count, Po, Ci), "workspace", split.when) for m in reduces}
        part = self.lower_col_reduce(split=(split, ws))
        self.used = set()
        total = self.lower_col_reduce(combine=(split.count, ws))
        return [replace(part, when=split.when), replace(total, part=1, name="_combine")]

    def lower_col_reduce(self, split=None, combine=None) -> TileKernel:
        """A reduction that keeps the innermost axis, on blocks of columns: a block owns BC
        consecutive values of the axes after the last reduced one (the target's bytes of each
        row: GPUs a 128-byte line) for one position of the kept axes before it, and sweeps the
        reduced rows RB at a time over a [RB, BC] tile (GPUs: split over the threads in 16-byte
        vectors, 8 across a row), so every row is read whole and the partials per column
        accumulate, which `allreduce` combines (the CPU: one thread, its loop over the columns
        a SIMD one). Reductions share a sweep unless one reads another's result (an online sum
        of exp(x - max(x)) shares its max's), and the full-shaped outputs take one more: the
        rows are read again (from cache where they still are) instead of held, since a
        column's rows need not fit."""
        S = self.grp.domain
        axes, inner_axes, outer_axes, blocks_y, (R, Ci, Po) = self.col_axes()
        last = max(axes)
        red = [S[a] for a in axes]
        if combine:  # (the rows swept: the partials of the row slices)
            R = combine[0]
        block, rb, bc, per_row, least = self.col_block()
        if combine:  # (a few rows of partials: a short tile, one vector per thread on GPUs)
            rb = min(rb, 4 * least)
        if R.op == "const" and not split:  # few rows: a shorter tile (a split's is its plan's)
            while rb // 2 >= max(R.args[0], least):
                rb //= 2
        threads = min(self.sched.threads or block, rb * per_row)
        if (rb * per_row) % threads:  # (a schedule's threads that do not divide the tile)
            threads = min(block, rb * per_row)
        bx, by, bz, r0 = (self.names.fresh(n) for n in ("bx", "by", "bz", "r0"))
        i, j = self.names.fresh("i"), self.names.fresh("j")
        vi, vj = T.Var(i), T.Var(j)
        step = T.Var(r0)
        if split:  # (this block's slice of the sweep's steps)
            step = iadd(imul(T.Var(bz), dim_to_expr(split[0].chunk)), step)
        r = iadd(imul(step, iconst(rb)), vi)
        c = iadd(imul(T.Var(bx), iconst(bc)), vj)
        ridx = [iconst(0)] * len(red) if combine else decompose(r, red)
        cidx = decompose(c, [S[a] for a in inner_axes])
        pidx = decompose(T.Var(by), [S[a] for a in outer_axes])
        full, ri, ci, pi = [], iter(ridx), iter(cidx), iter(pidx)
        for a in range(len(S)):
            full.append(next(ri) if a in axes else next(ci) if a > last else next(pi))
        full = tuple(full)
        keep_idx = tuple(iconst(0) if a in axes else x for a, x in enumerate(full))
        drop_idx = tuple(x for a, x in enumerate(full) if a not in axes)
        keep_shape = tuple(Dim.const(1) if a in axes else d for a, d in enumerate(S))
        row_ok, col_ok = ilt(r, dim_to_expr(R)), ilt(c, dim_to_expr(Ci))
        RB, BC = iconst(rb), iconst(bc)

        def tile(body, guard, rows=RB):  # one [RB, BC] step of the block's tile (guard None: all)
            return For((i, j), (rows, BC), "parallel",
                       tuple(body) if guard is None else (If(guard, tuple(body)),))

        across = 0  # (threads across a row of the column values' tile: set by the first sweep)

        def col_tile(body, guard):
            """A tile of statements on the column values (idempotent: each writes what it does
            not read, or rescales by a ratio that is 1 once applied), of the fewest rows that
            every thread holds a row of: a thread runs them once (GPUs: a row of threads
            across the tile; one thread: one row). Its row 0 stores the columns'."""
            return tile(body, guard, iconst(max(1, threads // across)) if across else RB)

        def sweep(*tiles):  # the reduced rows, RB at a time (a split: this block's slice)
            steps = split[0].chunk if split else R.cdiv(rb)
            return For((r0,), (dim_to_expr(steps),), "range",
                       tuple(t if isinstance(t, For) else tile(*t) for t in tiles))
        inside = land(row_ok, col_ok)
        pflat = T.Var(by) if blocks_y else iconst(0)
        body = []
        # reductions that read none of each other's results share one sweep (a sum and a max of
        # the same rows); one that reads a pending result starts the next, except a sum of
        # exp(x - max(x)) whose max is pending: an online sum, in the max's sweep
        pending: list = []  # (accumulator, fn, its reduction store)
        online: list = []  # (the sum's accumulator, its max's, the max's value before the step)

        def rescaled():
            """Each online sum rescaled to its max's running value (from the value it had when
            the sum was last rescaled, `prev`)."""
            stmts = []
            for s_acc, mx, prev in online:
                dt = dts[s_acc]
                grown = T.Binary("sub", T.Load(prev, (vj,), dt), safe_max(mx), dt)
                stmts += [Store(s_acc, (vj,), T.Binary("mul", T.Load(s_acc, (vj,), dt),
                                                       T.Unary("exp_nonpos", grown, dt), dt)),
                          Store(prev, (vj,), T.Load(mx, (vj,), dt))]
            return col_tile(stmts, None)

        def flush():
            nonlocal across
            if not pending:
                return
            if not across:  # (the layout pass splits this sweep in 16-byte vectors of what it reads)
                read = [x.dtype for _, _, st in pending for x in loads_in(st) if x.buf not in dts]
                across = max(1, bc // columns_per_access(read))
            sums = {s_acc for s_acc, _, _ in online}
            body.extend(Alloc(acc, "fragment", dts[acc], (BC,)) for acc, _, _ in pending)
            body.extend(Fill(acc, identity(fn, dts[acc])) for acc, fn, _ in pending)
            body.extend(Alloc(prev, "fragment", dts[mx], (BC,)) for _, mx, prev in online)
            body.extend(Fill(prev, identity("max", dts[mx])) for _, mx, prev in online)
            # a step: the reductions' terms; with online sums, the maxima first, the sums
            # rescaled to them, then the sums' terms
            terms = [st for acc, _, st in pending if acc not in sums]
            then = [rescaled(), ([st for acc, _, st in pending if acc in sums], inside)] \
                if online else []
            body.append(sweep((terms, inside), *then))
            # the threads' partials combined; an online sum's rescaled to the combined max first
            body.extend(T.Allreduce(fn, acc) for acc, fn, _ in pending if acc not in sums)
            if online:
                body.append(rescaled())
                body.extend(T.Allreduce("sum", s_acc) for s_acc, _, _ in online)
            pending.clear()
            online.clear()

        def safe_max(mx):  # (a max of -inf so far: every value -inf, each exp(-inf - lowest) 0)
            dt = dts[mx]
            return T.Binary("maximum", T.Load(mx, (vj,), dt), T.Const(-FLOAT_MAX[dt], dt), dt)

        def reads_pending(e) -> bool:
            names = {acc for acc, _, _ in pending}
            return any(isinstance(x, T.Load) and x.buf in names for x in T.walk_exprs(e))
        dts: dict = {}
        acc_of: dict = {}  # (each reduction's accumulator, in member order)
        users = self.g.users()
        outs = set(self.grp.outputs)
        for m in self.grp.members:
            op = self.ops[m]
            if op.kind == "reduce" and not is_squeeze(op, self.ops):
                fn, dt = op.attr("fn"), widened(op.type.dtype)
                acc = self.names.fresh("col_" + fn)
                if combine:  # (the partials of the row slices, combined as the values were)
                    w = combine[1][m]
                    src = T.Load(w.name, (r, pflat, c), w.dtype)
                else:
                    src = self.value(op.args[0], full)
                mx = acc_of.get(self.online_max(m)) if not (split or combine) else None

                def at_max(src, value, mx=mx):  # (src with its max's loads replaced)
                    return map_expr(src, lambda x: value if isinstance(x, T.Load) and
                                    x.buf == mx else None)
                if any(mx == a for a, _, _ in pending) and \
                        not reads_pending(at_max(src, T.Const(0.0, dt))):
                    online.append((acc, mx, self.names.fresh(mx + "_prev")))
                    src = at_max(src, safe_max(mx))
                elif reads_pending(src):
                    flush()
                dts[acc] = dt
                acc_of[m] = acc
                pending.append((acc, fn, reduction_store(fn, acc, dt, (vj,), src)))
                self.on_chip(m, [keep_idx, drop_idx], self.cast(T.Load(acc, (vj,), dt), op.type.dtype))
            elif split:
                continue  # (the values after the reductions: the combining kernel's)
            elif op.type.shape != S and (m in outs or any(u in self.members and
                                                          self.ops[u].type.shape == S for u in users[m])):
                # a value per column, computed by every thread that holds the column
                flush()
                buf, dt = self.names.fresh("v"), widened(op.type.dtype)
                at = keep_idx if op.type.shape == keep_shape else drop_idx
                body += [Alloc(buf, "fragment", dt, (BC,)),
                         col_tile([Store(buf, (vj,), self.cast(self.value(m, at), dt))], col_ok)]
                self.on_chip(m, [keep_idx, drop_idx], T.Load(buf, (vj,), dt))
        flush()
        first = land(ilt(vi, iconst(1)), col_ok)  # (the tile's first row stores the columns')
        grid, bvars = [dim_to_expr(Ci.cdiv(bc))], [bx]
        if blocks_y:
            grid, bvars = grid + [dim_to_expr(Po)], bvars + [by]
        what = f"column reduction over axes {tuple(axes)}"
        if split:  # the slice's partials, one per column
            sp, ws = split
            body.append(col_tile([Store(w.name, (T.Var(bz), pflat, c),
                                    T.Load(acc_of[m], (vj,), dts[acc_of[m]])) for m, w in ws.items()],
                             first))
            return self.kernel(grid + [dim_to_expr(sp.count)], bvars + [bz], threads, body,
                               f"{what}, rows split over blocks: each slice's partials",
                               extra=tuple(ws.values()), writes_outputs=False)
        row_outs = [o for o in self.grp.outputs if self.ops[o].type.shape == S]
        if row_outs:
            body.append(sweep((self.store_outputs(row_outs, full, None), inside)))
        for o in self.grp.outputs:  # the values per column: stored by the tile's first row
            if self.ops[o].type.shape != S:
                at = keep_idx if self.ops[o].type.shape == keep_shape else drop_idx
                body.append(col_tile(self.store_outputs([o], at, None), first))
        if combine:
            what += ", rows split over blocks: the slices' partials combined"
            return self.kernel(grid, bvars, threads, body, what,
                               extra=tuple(replace(w, kind="input", when=None)
                                           for w in combine[1].values()))
        return self.kernel(grid, bvars, threads, body, what)

    def lower_attention(self) -> TileKernel:
        role = dict(self.grp.roles)
        qk, pv = self.ops[role["qk"]], self.ops[role["pv"]]
        q_id, k_id = qk.args
        p_id, v_id = pv.args
        shape = pv.type.shape
        batch, L, Dv = shape[:-2], shape[-2], shape[-1]
        S, Dk = qk.type.shape[-1], self.ops[q_id].type.shape[-1]
        res = self.target.resources
        bm, bn = self.sched.tile_size("M", res.attn_tile[0]), self.sched.tile_size("N", res.attn_tile[1])
        stages = self.sched.stages or res.attn_stages
        hopper = self.gemm_config is not None and self.gemm_config.wgmma
        if hopper:  # (its own tile: a schedule's is the mma.sync kernel's)
            (bm, bn, _), stages = self.gemm_config.tile, self.gemm_config.stages
        elif self.sched.threads:
            self.check_warps(bm, bn, self.sched.threads, True)
        bx, bz = self.names.fresh("bx"), self.names.fresh("bz")
        bidx = decompose(T.Var(bz), batch)
        row0 = imul(T.Var(bx), iconst(bm))
        Qs, Ks, Vs = (self.names.fresh(n) for n in ("Q_s", "K_s", "V_s"))
        Sc, Pt, O = (self.names.fresh(n) for n in ("S", "P", "O"))
        mx, mc, l, al, rs, ms = (self.names.fresh(n) for n in ("m", "m_new", "l", "alpha", "rowsum",
                                                               "m_sub"))
        k = self.names.fresh("k")
        i, j = self.names.fresh("i"), self.names.fresh("j")
        vi, vj = T.Var(i), T.Var(j)
        BM, BN, DK, DV = iconst(bm), iconst(bn), dim_to_expr(Dk), dim_to_expr(Dv)
        k0 = imul(T.Var(k), BN)
        load_q, tq = self.operand(q_id, Qs, row0, iconst(0), BM, DK, bidx, batch)
        load_k, tk = self.operand(k_id, Ks, iconst(0), k0, DK, BN, bidx, batch)
        load_v, tv = self.operand(v_id, Vs, k0, iconst(0), BN, DV, bidx, batch)
        p_dt = self.ops[p_id].type.dtype
        f32 = "f32"

        def L1(n):
            return T.Load(n, (vi,), f32)

        def L2(n, dt=f32):
            return T.Load(n, (vi, vj), dt)
        qk_at = tuple(bidx) + (iadd(row0, vi), iadd(k0, vj))
        self.on_chip(qk.id, qk_at, L2(Sc))
        score = self.value(role["x"], qk_at)
        col_ok = ilt(iadd(k0, vj), dim_to_expr(S))
        is_ninf = T.Compare("eq", L1(mc), NEG_INF)
        # exp(s - m) of each score: with a 16-bit P, as 2^(s c - m c) with c = log2(e) and the
        # row's m c computed once, one fused multiply-add and one exp2 per score (the rounding of
        # m c costs about |m| 6e-8 of relative error, far below P's own 2^-11 for any score
        # below 2^13); an f32 P keeps the exact difference. A score that is the product times
        # a non-negative scalar a (masks aside) keeps the product alone and folds a into c:
        # the max of the products times a is the max of the scores (rounding is monotonic)
        base2 = p_dt != f32
        log2e = T.Const(1.4426950408889634, f32)
        scale = None
        if base2:
            score, scale = unscaled_score(score, L2(Sc), set(self.g.symbols))
        c = log2e if scale is None else T.Binary("mul", scale, log2e, f32)
        m_sub = T.Binary("mul", L1(mc), c, f32) if base2 else L1(mc)
        # (one rounding: tilec's own expression, not a program's `x * y - z`)
        exp_sub = (T.Unary("exp2", T.Fma(L2(Sc), c, T.Unary("neg", L1(ms), f32), f32), f32)
                   if base2 else T.Unary("exp_nonpos", T.Binary("sub", L2(Sc), L1(ms), f32), f32))
        alpha = (T.Unary("exp2", T.Binary("mul", T.Binary("sub", L1(mx), L1(mc), f32), c, f32), f32)
                 if base2 else T.Unary("exp_nonpos", T.Binary("sub", L1(mx), L1(mc), f32), f32))
        # the max a row subtracts stays while the row's new scores exceed it by at most a factor
        # of 2^8 in exp (their exps then reach at most 256: far from f16's and f32's overflow,
        # and each term keeps its relative precision), so that alpha is exactly 1 and the
        # rescaling of O and l changes nothing in most key tiles (renderers may skip it)
        grown = T.Binary("sub", L1(mc), L1(mx), f32)
        keep = T.Compare("le", T.Binary("mul", grown, c, f32) if base2 else grown,
                         T.Const(RESCALE_LOG2 if base2 else RESCALE_LOG2 * math.log(2), f32))
        loop = load_k + [
            Fill(Sc, T.Const(0.0, f32)),
            Gemm(Qs, Ks, Sc, tq, tk),
            For((i, j), (BM, BN), "parallel", (Store(Sc, (vi, vj), T.Select(col_ok, score, NEG_INF, f32)),)),
            Reduce("max", Sc, mc, 1),
            For((i,), (BM,), "parallel", (
                Store(mc, (vi,), T.Binary("maximum", L1(mx), L1(mc), f32)),
                # (-inf - -inf is NaN: not kept, so a row's first finite max is taken)
                Store(mc, (vi,), T.Select(keep, L1(mx), L1(mc), f32)),
                # (a max still -inf is the old one too)
                Store(al, (vi,), T.Select(T.Compare("eq", L1(mx), L1(mc)), T.Const(1.0, f32),
                                          alpha, f32)),
                Store(mx, (vi,), L1(mc)),
                # what each score subtracts before exp: the row's max (times log2(e) in base
                # 2), or 0 while the row has seen only -inf (its scores are then all -inf, and
                # exp(-inf - 0) = 0 without a select per score)
                Store(ms, (vi,), T.Select(is_ninf, T.Const(0.0, f32), m_sub, f32)))),
            For((i, j), (BM, BN), "parallel", (Store(Sc, (vi, vj), exp_sub),)),
            Reduce("sum", Sc, rs, 1),
            For((i,), (BM,), "parallel", (Store(l, (vi,), T.Binary(
                "add", T.Binary("mul", L1(l), L1(al), f32), L1(rs), f32)),)),
            For((i, j), (BM, DV), "parallel", (Store(O, (vi, vj), T.Binary(
                "mul", L2(O), L1(al), f32)),)),
        ]
        if p_dt != f32:
            loop.append(For((i, j), (BM, BN), "parallel", (Store(Pt, (vi, vj), T.Cast(L2(Sc), p_dt)),)))
        loop += load_v + [Gemm(Pt if p_dt != f32 else Sc, Vs, O, False, tv)]
        # the on-chip width of a head dim: Hopper's kernel fills its tiles in panels of 64
        # columns, so a fixed head dim of part of a panel takes a whole one (TMA reads zeros past
        # the tensor's columns: Q K^T's sums are the same, P V's extra columns are not stored),
        # as a run-time one gets capacities 64 and 128 (passes/specialize.py)
        WK, WV = (iconst(64 if d.args[0] <= 64 else 128)
                  if hopper and d.op == "const" and d.args[0] % 64 and d.args[0] <= 128
                  else dim_to_expr(d) for d in (Dk, Dv))
        body = [Alloc(Qs, "shared", self.ops[q_id].type.dtype, (WK, BM) if tq else (BM, WK)),
                Alloc(Ks, "shared", self.ops[k_id].type.dtype, (BN, WK) if tk else (WK, BN)),
                Alloc(Vs, "shared", self.ops[v_id].type.dtype, (WV, BN) if tv else (BN, WV)),
                Alloc(Sc, "fragment", f32, (BM, BN))]
        if p_dt != f32:
            body.append(Alloc(Pt, "fragment", p_dt, (BM, BN)))
        body += [Alloc(O, "fragment", f32, (BM, WV))]
        body += [Alloc(n, "fragment", f32, (BM,)) for n in (mx, mc, l, al, rs, ms)]
        n_tiles = dim_to_expr(S.cdiv(bn))
        bound = causal_bound(score, n_tiles, k, vi.name, vj.name, row0, bm, bn)
        body += load_q + [Fill(mx, NEG_INF), Fill(l, T.Const(0.0, f32)), Fill(O, T.Const(0.0, f32)),
                          For((k,), (bound,), "pipelined", tuple(loop), stages)]
        out_at = tuple(bidx) + (iadd(row0, vi), vj)
        self.on_chip(pv.id, out_at, T.Binary("div", L2(O), L1(l), f32))
        guard = ilt(iadd(row0, vi), dim_to_expr(L))
        body.append(For((i, j), (BM, DV), "parallel", tuple(self.store_outputs(
            self.grp.outputs, out_at, guard))))
        grid = [dim_to_expr(L.cdiv(bm))]
        bvars = [bx]
        if batch:
            grid.append(dim_to_expr(numel(batch)))
            bvars.append(bz)
        if hopper:
            kernel = self.wgmma_attention(grid, bvars, body, (load_q, load_k, load_v),
                                          (tq, tk, tv), p_dt, (WK, WV))
        else:
            kernel = self.kernel(grid, bvars, self.sched.threads or res.attn_threads, body,
                                 "attention with online softmax (the L x S scores never leave "
                                 "the block)", auto_threads=not self.sched.threads)
        # a causal bound on Hopper's kernel (one block per SM): blocks of later query rows run
        # more key tiles, so they start first (measured 1-2% faster there; the mma.sync kernel,
        # several blocks per SM, measured 13% slower so: docs/PERFORMANCE.md); a persistent
        # grid walks them in pairs of even work instead (CudaRenderer.tile_loop)
        return replace(kernel, longest_first=hopper and bound is not n_tiles)

    def wgmma_attention(self, grid, bvars, body, loads, transposed, p_dt, heads) -> TileKernel:
        """The warp-specialized attention kernel (resources.wgmma_attention): Q, K and V tile
        copies of one 16-bit dtype from tensors in memory (Q and V row-major, K read as K^T: the
        layouts wgmma takes from shared memory), P rounded to that dtype (the A operand of P V,
        from registers); at run time TMA's row strides and extents (the leading dims merge
        into one coordinate); else NotWgmma. One block per 128 query rows, or, where the
        target's configuration says so, a persistent grid of one block per SM walking the
        query tiles."""
        if transposed != (False, True, False) or any(
                len(ld) != 1 or not isinstance(ld[0], Copy) for ld in loads):
            raise NotWgmma()
        # head dims' on-chip widths (`heads`) in whole 64-column panels of TMA, at most 128 (the
        # accumulators' registers); a run-time one gets capacities 64 and 128
        # (passes/specialize.py)
        if any(isinstance(w, T.Const) and w.value not in (64, 128) for w in heads):
            raise NotWgmma()
        srcs = [ld[0].src.buf for ld in loads]
        persistent = self.target.resources.wgmma_attention[5]
        k = self.kernel(grid, bvars, self.gemm_config.threads, body,
                        "attention with online softmax (the L x S scores never leave the block): "
                        "warp-specialized (TMA, wgmma)" + (", persistent" if persistent else ""))
        params = {p.name: p for p in k.params}
        dts = {params[n].dtype for n in srcs}
        if len(dts) != 1 or not dts <= {"f16", "bf16"} or p_dt not in dts:
            raise NotWgmma()
        when = tma_conditions(params, srcs, None)
        if when is False:
            raise NotWgmma()
        # (the merged leading dims: one 32-bit coordinate)
        for cond in dict.fromkeys(Dim.bin("lt", numel(params[n].shape[:-2]), 2 ** 31)
                                  for n in srcs if len(params[n].shape) > 3):
            when = cond if when is None else Dim.bin("and", when, cond)
        return replace(k, when=when, warp_specialize=self.gemm_config.threads // 128 - 1,
                       aligned=tuple(sorted(set(srcs))), persistent=persistent)


def _offset(e, base, var: str):
    """c when e is `base + var + c` (or `base + var`), else None."""
    if isinstance(e, T.Binary) and e.fn == "add" and isinstance(e.b, T.Const) and \
       isinstance(e.b.value, int):
        inner = _offset(e.a, base, var)
        return None if inner is None else inner + e.b.value
    if isinstance(e, T.Binary) and e.fn == "sub" and isinstance(e.b, T.Const) and \
       isinstance(e.b.value, int):
        inner = _offset(e.a, base, var)
        return None if inner is None else inner - e.b.value
    return 0 if e == iadd(base, T.Var(var)) else None


def non_negative(e, dims: set) -> bool:
    """Is `e` a kernel-wide scalar (of constants and dimensions alone) that is at least +0.0 or
    NaN, never -0.0 (a division by it would flip the sign): constants > 0 or +0.0, dimensions,
    and what functions that keep or produce such values make of them? (sqrt and relu keep a
    -0.0, rsqrt makes -inf of it: their arguments must be such values too.)"""
    if not all(isinstance(x, (T.Const, T.Cast, T.Unary, T.Binary)) or
               (isinstance(x, T.Var) and x.name in dims) for x in T.walk_exprs(e)):
        return False
    if isinstance(e, T.Const):
        return at_least_plus_zero(e.value)
    if isinstance(e, T.Var):  # (a dimension)
        return True
    if isinstance(e, T.Cast):
        return non_negative(e.x, dims)
    if isinstance(e, T.Unary):
        return e.fn in ("exp", "exp_nonpos", "exp2", "abs") or \
            (e.fn in ("sqrt", "rsqrt", "relu") and non_negative(e.x, dims))
    if isinstance(e, T.Binary):
        return e.fn in ("mul", "div", "add", "maximum", "minimum") and \
            non_negative(e.a, dims) and non_negative(e.b, dims)
    return False


def unscaled_score(score, product, dims: set) -> tuple:
    """(score without its scale, the scale) when `score` is `product * a` (or `a * product`)
    with `a` a non-negative scalar, under selects of -inf (masks) whose conditions do not read
    the product; else (score, None)."""
    found = set()

    def strip(e):
        if isinstance(e, T.Binary) and e.fn == "mul":
            for x, a in ((e.a, e.b), (e.b, e.a)):
                if x == product and non_negative(a, dims):
                    found.add(a)
                    return x
            return None
        if isinstance(e, T.Select) and product not in T.walk_exprs(e.cond):
            ninf_a, ninf_b = (isinstance(x, T.Const) and x.value == -math.inf for x in (e.a, e.b))
            if ninf_a or ninf_b:
                inner = strip(e.b if ninf_a else e.a)
                if inner is not None:
                    return replace(e, a=e.a if ninf_a else inner, b=inner if ninf_a else e.b)
        return None
    raw = strip(score)
    if raw is None or len(found) != 1:
        return score, None
    return raw, found.pop()


def causal_bound(score, n_tiles, k: str, i: str, j: str, row0, bm: int, bn: int):
    """The key loop's trip count when the score masks key j > query i + c with -inf: tiles
    wholly above that diagonal change nothing in an online softmax (their scores are -inf, so
    their probabilities are 0 and the running max stays), so the loop stops at the last tile that
    holds an unmasked key of the block's last query. Other scores: `n_tiles`."""
    key0 = imul(T.Var(k), iconst(bn))
    best = None
    for e in T.walk_exprs(score):
        if not isinstance(e, T.Select) or not isinstance(e.cond, T.Compare):
            continue
        ninf_a = isinstance(e.a, T.Const) and e.a.value == -math.inf
        ninf_b = isinstance(e.b, T.Const) and e.b.value == -math.inf
        c, fn = e.cond, e.cond.fn
        # normalize to "masked when key > query + off"
        if ninf_a and fn in ("gt", "ge"):
            key, query, off = c.a, c.b, (0 if fn == "gt" else -1)
        elif ninf_a and fn in ("lt", "le"):
            key, query, off = c.b, c.a, (0 if fn == "lt" else -1)
        elif ninf_b and fn in ("le", "lt"):
            key, query, off = c.a, c.b, (0 if fn == "le" else -1)
        elif ninf_b and fn in ("ge", "gt"):
            key, query, off = c.b, c.a, (0 if fn == "ge" else -1)
        else:
            continue
        if _offset(key, key0, j) != 0:
            continue
        q = _offset(query, row0, i)
        if q is None:
            continue
        # the block's last query row0 + bm - 1 sees keys up to row0 + bm - 1 + q + off
        shift = bm - 1 + q + off
        last = T.Binary("add" if shift >= 0 else "sub", row0, iconst(abs(shift)), "i64")
        tiles = iadd(idiv(last, iconst(bn)), iconst(1))  # truncation only over-counts: still exact
        best = tiles if best is None else T.Binary("min", best, tiles, "i64")
    return n_tiles if best is None else T.Binary("min", n_tiles, best, "i64")


@dataclass(frozen=True)
class GemmVariant:
    """How one kernel variant of a GEMM group is tiled (`gemm_variants`)."""

    tile: tuple  # (M, N, K)
    threads: int
    stages: int
    split: tuple | None = None  # (blocks, least K tiles per split, blocks per SM): split over K
    gemv_unroll: int = 0  # > 0: a GEMV (one row of A) taking this many rows per step
    wgmma: bool = False  # the warp-specialized TMA + wgmma kernel (resources.wgmma)
    # ... in clusters of this many blocks sharing B tiles (0: the target's choice), where B's
    # rows start off 128-byte lines (wgmma_kernel)
    cluster: int = 0
    # ... reading the operands whose rows TMA may not address (not 16-byte multiples) through
    # copies with padded rows, written by kernels launched before it, its epilogue storing from
    # registers (wgmma_kernel)
    pad: bool = False
    # ... reading fp8 and tf32 operands stored MN-major through transposed copies (wgmma_kernel)
    transpose: bool = False

    @property
    def gemv_rows(self) -> bool:
        """A GEMV of several rows of A: the target's routine alone (GroupLowering.gemv_rows_body),
        whose lowering may refuse the product (NoVariant)."""
        return bool(self.gemv_unroll) and self.tile[0] > 1


# the variant of the target's (or schedule's) GEMM kernel on padded copies of the operands whose
# rows are off 16 bytes (its copies then 16 bytes at a time): pad_operands, GroupLowering.padded
PADDED = GemmVariant(None, 0, 0, pad=True)
# the variant of a column reduction whose rows are split over blocks (lower_col_reduce): where
# the columns give the device too few blocks, each block sweeps a slice of the rows into partial
# values, and a second kernel combines them (in slice order) and computes the outputs
COL_SPLIT = GemmVariant(None, 0, 0)


def multiple_of_assumed(d: Dim, n: int, assumes) -> bool:
    """Does an `assume` (of `assumes`, a graph's AssumeDecls) say that `d` is a multiple of
    `n`: `d % m == 0` with m a multiple of n, alone or among `&`-joined conditions?"""
    stack = [a.cond for a in assumes]
    while stack:
        c = stack.pop()
        if c.op == "and":
            stack += c.args
        elif c.op == "eq" and c.args[1] == Dim.const(0) and c.args[0].op == "mod" and \
                c.args[0].args[0] == d and c.args[0].args[1].op == "const" and \
                c.args[0].args[1].value % n == 0:
            return True
    return False


def pad_operands(k: TileKernel, srcs: list, names: Names, target, assumes=(),
                 transposed=frozenset()) -> tuple:
    """Kernel `k` with its copies of each tensor of `srcs` whose rows may not be 16-byte
    multiples (TMA's strides; `assumes` may say they are), and of each tensor of `transposed`,
    reading a copy of it instead: a workspace whose rows are padded to 128-byte multiples,
    for `transposed` one with the last two axes swapped (its tile copies read the swapped
    window into a buffer of the swapped shape, and the gemm reading that buffer takes it
    transposed: the same product, its operand now K-major). Returns that kernel; the kernels
    that write the copies, to launch before it; and the condition that the copies are needed
    (some such row off 16 bytes, or a transposed copy). NoVariant where none can be."""
    params = {p.name: p for p in k.params}
    copies, pads, off = {}, [], {}  # (off: the rows' conditions, each once, in order)
    for name in dict.fromkeys(srcs):
        p = params[name]
        size = DTYPES[p.dtype][1] // 8
        if not size:  # (4-bit tensors, two values a byte: not copied so)
            continue
        unit = 128 // size
        if name in transposed:
            cond = Dim.const(1)
            shape = p.shape[:-2] + (p.shape[-1], p.shape[-2].cdiv(unit) * unit)
        else:
            cond = Dim.bin("ne", p.shape[-1] % (16 // size), 0)
            if cond == Dim.const(0) or multiple_of_assumed(p.shape[-1], 16 // size, assumes):
                continue
            shape = p.shape[:-1] + (p.shape[-1].cdiv(unit) * unit,)
        # (its `when`, the whole variant's, is set by tile_graph)
        ws = TensorDecl(names.fresh(f"{name}_{'transposed' if name in transposed else 'padded'}"),
                        p.dtype, shape, "workspace")
        copies[name] = ws
        pads.append((transpose_kernel if name in transposed else pad_kernel)(p, ws, names, target))
        off[cond] = None
    if not copies:
        raise NoVariant()
    swapped = set()  # (the shared buffers that transposed copies fill)

    def read_copy(st):
        if isinstance(st, Copy) and st.src.buf in copies:
            offsets = st.src.offsets
            if st.src.buf in transposed:
                offsets = offsets[:-2] + (offsets[-1], offsets[-2])
                swapped.add(st.dst.buf)
            return [replace(st, src=replace(st.src, buf=copies[st.src.buf].name, offsets=offsets))]
        return None
    body = map_stmts(k.body, read_copy)

    def swap(st):
        if isinstance(st, Alloc) and st.name in swapped:
            return [replace(st, shape=st.shape[:-2] + (st.shape[-1], st.shape[-2]))]
        if isinstance(st, Gemm) and (st.a in swapped or st.b in swapped):
            return [replace(st, transpose_a=st.transpose_a != (st.a in swapped),
                            transpose_b=st.transpose_b != (st.b in swapped))]
        return None
    if swapped:
        body = map_stmts(body, swap)
    # (a tensor the epilogue reads too stays a parameter beside its copy)
    read = {s.src.buf for s in T.walk_stmts(body) if isinstance(s, Copy)} | \
        {x.buf for st in body for x in loads_in(st)}
    params = []
    for p in k.params:
        if p.name in copies:
            params.append(replace(copies[p.name], kind="input", when=None))
        if p.name not in copies or p.name in read:
            params.append(p)
    return replace(k, body=body, params=tuple(params),
                   padded=tuple((n, w.name) for n, w in copies.items()),
                   transposed=tuple(n for n in copies if n in transposed)), pads, \
        functools.reduce(lambda a, b: Dim.bin("or", a, b), off)


def pad_kernel(src: TensorDecl, ws: TensorDecl, names: Names, target) -> TileKernel:
    """The kernel that copies tensor `src` into `ws`, of the same shape but longer rows, the
    values past each of src's rows zero (a K tile past K then adds zeros). Its name is the part's
    suffix (tile_graph)."""
    br, bc = target.resources.ew_tile
    rows, cols, padded = numel(src.shape[:-1]), src.shape[-1], ws.shape[-1]
    bx, by, i, j = (names.fresh(n) for n in ("bx", "by", "i", "j"))
    r = iadd(imul(T.Var(by), iconst(br)), T.Var(i))
    c = iadd(imul(T.Var(bx), iconst(bc)), T.Var(j))
    lead = tuple(decompose(r, src.shape[:-1]))
    # (one store per value, a select of the value or zero: the renderer may store a vector of
    # them; the load's column is clamped inside the row, where the select takes the zero)
    zero = T.Const(0.0 if is_float(src.dtype) else 0, src.dtype)
    inside = ilt(c, dim_to_expr(cols))
    value = T.Load(src.name, lead + (T.Binary("min", c, T.isub(dim_to_expr(cols), iconst(1)),
                                              "i64"),), src.dtype)
    body = (For((i, j), (iconst(br), iconst(bc)), "parallel",
                (If(land(ilt(r, dim_to_expr(rows)), ilt(c, dim_to_expr(padded))),
                    (Store(ws.name, lead + (c,), T.Select(inside, value, zero, src.dtype)),)),)),)
    return TileKernel(f"_{src.name}", (replace(src, kind="input"), ws),
                      (dim_to_expr(padded.cdiv(bc)), dim_to_expr(rows.cdiv(br))), (bx, by),
                      target.resources.ew_threads, body,
                      f"{src.name} copied into {ws.name}, its rows padded with zeros to "
                      f"{padded} values (128-byte multiples: for TMA and 16-byte copies)")


# the transposing copy's square tile (values) and threads
TRANSPOSE_TILE, TRANSPOSE_THREADS = 64, 256
# a transposed copy of an operand (K x N values of B) costs about what multiplying it by 512 rows
# of A on Hopper's tensor cores does (copy bandwidth ~3 TB/s, 8 bytes moved per tf32 value, 2 per
# fp8 one, against ~400 and ~1600 TFLOP/s): the variant runs where the product does at least
# this many multiply-adds per value copied (its kernel then saves more than the copy costs)
TRANSPOSE_WORK = 512


def transpose_kernel(src: TensorDecl, ws: TensorDecl, names: Names, target) -> TileKernel:
    """The kernel that copies tensor `src` ([..., R, C]) transposed into `ws` ([..., C, R']):
    `ws[..., c, r] = src[..., r, c]`, with R' >= R (rows padded to 128-byte multiples) and zeros
    past R. Each block moves a square tile through shared memory: read along src's rows, written
    along ws's (both coalesced). The shared rows are 4 bytes longer than the tile's, so the
    transposed reads (a warp down one column) fall in 32 different banks. Its name is the part's
    suffix (tile_graph)."""
    t = TRANSPOSE_TILE
    rows, cols, padded = src.shape[-2], src.shape[-1], ws.shape[-1]
    batch = src.shape[:-2]
    size = DTYPES[src.dtype][1] // 8
    bx, by, bz, i, j, s = (names.fresh(n) for n in ("bx", "by", "bz", "i", "j", "S"))
    lead = tuple(decompose(T.Var(bz), batch)) if batch else ()
    r0, c0 = imul(T.Var(bx), iconst(t)), imul(T.Var(by), iconst(t))
    r, c = iadd(r0, T.Var(i)), iadd(c0, T.Var(j))  # (the first loop's: src's row and column)

    def last(x, n):  # x clamped to n - 1 (the select below takes zero where it was past)
        return T.Binary("min", x, T.isub(dim_to_expr(n), iconst(1)), "i64")
    zero = T.Const(0.0 if is_float(src.dtype) else 0, src.dtype)
    value = T.Load(src.name, lead + (last(r, rows), last(c, cols)), src.dtype)
    rt, ct = iadd(r0, T.Var(j)), iadd(c0, T.Var(i))  # (the second loop's: ws's column and row)
    body = (Alloc(s, "shared", src.dtype, (iconst(t), iconst(t + max(1, 4 // size)))),
            For((i, j), (iconst(t), iconst(t)), "parallel",
                (Store(s, (T.Var(i), T.Var(j)),
                       T.Select(ilt(r, dim_to_expr(rows)), value, zero, src.dtype)),)),
            For((i, j), (iconst(t), iconst(t)), "parallel",
                (If(land(ilt(ct, dim_to_expr(cols)), ilt(rt, dim_to_expr(padded))),
                    (Store(ws.name, lead + (ct, rt), T.Load(s, (T.Var(j), T.Var(i)), src.dtype)),
                     )),)))
    grid = (dim_to_expr(padded.cdiv(t)), dim_to_expr(cols.cdiv(t))) + \
        ((dim_to_expr(numel(batch)),) if batch else ())
    return TileKernel(f"_{src.name}", (replace(src, kind="input"), ws), grid,
                      (bx, by, bz)[:len(grid)], TRANSPOSE_THREADS, body,
                      f"{src.name} copied transposed into {ws.name} (its last two axes swapped, "
                      f"rows padded with zeros to {padded} values: K-major, for TMA and wgmma)")


def wgmma_config(target, fp8: bool) -> tuple:
    """The warp-specialized GEMM's (BM, BN, BK, stages, consumers, pingpong, cluster): the
    target's fp8 one for a product of fp8 operands, else `wgmma`."""
    return (target.resources.wgmma_fp8 if fp8 else ()) or target.resources.wgmma


def fp8_product(g: Graph, mm) -> bool:
    """Are both operands of matmul op `mm` of one fp8 dtype (possibly transposed or converted on
    chip): the products the fp8 wgmma may take (wgmma_kernel checks the rest), which sum in the
    tensor cores' precision (runner.reduced_precision)?"""
    a, b = (_source(g, x).type.dtype for x in mm.args)
    return a == b and a in FP8


def sum_slices(red: str, tot: str, slices: int, mr: int, bn: int, dt: str, loop_vars) -> list:
    """A GEMV's fragment `tot` [mr, bn] = the sum of its warps' partial sums in shared `red` (row
    w * mr + i: warp w's for row i of the block's rows of A), in warp order; `loop_vars` the
    names (i, j, s) of its loops."""
    i, j, s = loop_vars
    vi, vj = T.Var(i), T.Var(j)
    row = T.Var(s) if mr == 1 else iadd(imul(T.Var(s), iconst(mr)), vi)
    return [
        Alloc(tot, "fragment", dt, (iconst(mr), iconst(bn))),
        Fill(tot, T.Const(0, dt)),
        For((s,), (iconst(slices),), "range", (For((i, j), (iconst(mr), iconst(bn)), "parallel", (
            Store(tot, (vi, vj), T.Binary("add", T.Load(tot, (vi, vj), dt),
                                          T.Load(red, (row, vj), dt), dt)),)),)),
    ]


def rounded_weights(g: Graph, mm, target) -> bool:
    """Does matmul op `mm` multiply dequantized weights on the target's 16-bit matrix units: an
    operand `dequant(q, s, ...)` with `s` of a 16-bit dtype they take, the other operand of that
    dtype? Its weights then reach them rounded to `s`'s dtype, as weight-only kernels do
    (GroupLowering.mma_dtype), where the program's dequant is f32 (runner.reduced_precision)."""
    if not target.resources.mma_dtypes:
        return False

    def natural(oid):
        op = _source(g, oid)
        if op.kind == "dequant":
            return g.op_map()[op.args[1]].type.dtype, True
        return op.type.dtype, False
    (a, qa), (b, qb) = (natural(x) for x in mm.args)
    return a == b and a in target.resources.mma_dtypes and (qa or qb)


def tf32_on_wgmma(target, sched) -> bool:
    """Do f32 products under schedule `sched` run in tf32 on the target's warp-specialized
    kernels (`precision tf32`, a target whose wgmma takes tf32)?"""
    return target.tf32(sched) and target.resources.wgmma_tf32


def tf32_product(g: Graph, mm, target, sched) -> bool:
    """Does matmul op `mm` multiply f32 tensors into f32 in tf32 on the warp-specialized
    kernels?"""
    return tf32_on_wgmma(target, sched) and mm.type.dtype == "f32" and \
        all(_source(g, x).type.dtype == "f32" for x in mm.args)


def fuller_waves(M: Dim, N: Dim, batch, tile: tuple, other: tuple) -> Dim:
    """When does block tile `other` run an M x N GEMM (times the batch) in fewer tile-slots than
    `tile`? A persistent grid of one block per multiprocessor (T.SMS) walks the tiles in waves;
    the last wave's idle blocks still count, so the cost is the waves times a tile's area. The
    other tile must save a tenth (a smaller tile computes less per shared-memory byte: at equal
    slots it is the slower). On an H100 (docs/PERFORMANCE.md, 2026-12-06 10:27), f16 linear
    layers with GELU of 192 x 128 against 128 x 256 tiles: 6304 x 768 x 3072 (slots 0.75)
    0.072 against 0.128 ms, 6304 x 3072 x 768 (0.9) 0.083 against 0.119 ms; 4096 x 4096 x 1024
    (1.13) 0.096 against 0.073 ms, 4096 x 11008 x 4096 (1.02) 0.629 against 0.575 ms."""
    sms = Dim.sym(T.SMS)

    def slots(bm, bn):
        tiles = M.cdiv(bm) * N.cdiv(bn) * numel(batch)
        return tiles.cdiv(sms) * (bm * bn)
    return Dim.bin("le", slots(*other) * 10, slots(*tile) * 9)


class NoVariant(Exception):
    """The variant does not apply to the group: it is left out."""


class NotWgmma(NoVariant):
    """The group's GEMM does not suit the warp-specialized kernel (an operand computed on chip,
    an fp8 operand that is not K-major, ...): that variant is left out."""


def _source(g: Graph, oid: int, through=("cast", "transpose", "copy")):
    """The op whose values operand `oid` reads through ops of the kinds `through` (conversions
    and views computed on chip)."""
    ops = g.op_map()
    op = ops[oid]
    while op.kind in through and op.args:
        op = ops[op.args[0]]
    return op


def _transposed(g: Graph, oid: int) -> bool:
    """Is operand `oid` a transposed view (read across its rows)?"""
    return _source(g, oid, ("cast", "copy")).kind == "transpose"


def _weight_bits(g: Graph, oid: int) -> int:
    """Bits per value of GEMM operand `oid` (B) as it is read from memory: a dequantization's
    quantized values, a converted or transposed operand's source."""
    return itemsize_bits(_source(g, oid, ("cast", "copy", "transpose", "dequant")).type.dtype)


def _index_masked(g: Graph, grp: Group) -> bool:
    """Does a `where` of the group select by a condition computed from `index` (a mask on
    positions, e.g. causal)?"""
    ops = g.op_map()
    return any(ops[m].kind == "where" and _reaches(ops, [ops[m].args[0]],
                                                   lambda x: ops[x].kind == "index")
               for m in grp.members)


def _reaches(ops: dict, roots, hit, within=None) -> bool:
    """Does a walk up the arguments from the ops `roots` (through the ops in `within` only,
    where given) meet one for which `hit` holds? (A stack, not recursion: chains may be long.)"""
    todo, seen = list(roots), set()
    while todo:
        x = todo.pop()
        if x in seen or (within is not None and x not in within):
            continue
        seen.add(x)
        if hit(x):
            return True
        todo.extend(ops[x].args)
    return False


def gemm_variants(g: Graph, grp: Group, target, sched) -> list:
    """(name suffix, condition, config) for each kernel of a GEMM group: for one row of A a GEMV
    (B read row by row from memory, bound by its bytes), then the target's small-M tiles
    (decode sizes: the launcher picks them by M at run time), each first split over K where the
    target splits and the grid is small (passes/split_k.py), before the default tile, unless the
    schedule fixes the tile. Config: a GemmVariant (None: the default tile). An attention group
    gets the target's warp-specialized kernel first (`wgmma_attention`), other groups one kernel."""
    if grp.kind == "attention" and target.resources.wgmma_attention and \
            sched.warp_specialize is not False:
        # Hopper: the warp-specialized attention first, where Q, K and V suit TMA at run time
        bm, bn, stages, *_ = target.resources.wgmma_attention
        if bn > bm and _index_masked(g, grp):
            # (key tiles longer than the query tile only where no mask on the scores' indices,
            # e.g. a causal one, cuts the key loop at a diagonal through them)
            bn = bm
        return [("_tma", None, GemmVariant((bm, bn, 0), 128 * (bm // 64 + 1), stages, wgmma=True)),
                ("", None, None)]
    if grp.kind == "reduce" and split_k.col_reduce(target.resources.col_reduce):
        # (lower_col_reduce leaves it out where it does not apply)
        return [("_split", None, COL_SPLIT), ("", None, None)]
    if grp.kind != "gemm":
        return [("", None, None)]
    # Hopper: the warp-specialized kernel, where the operands suit TMA at run time (its own
    # tile: a schedule's tile, threads and stages are the mma.sync kernel's)
    mm = g.op_map()[grp.members[0]]
    batch, M, N = mm.type.shape[:-2], mm.type.shape[-2], mm.type.shape[-1]
    hopper = []
    # variants on padded copies of operands whose rows are off 16 bytes: where the product is
    # large enough for the copies' time to pay (batch x M x N >= least / K: the output's size,
    # which the launcher checks fits in 64 bits, where the product of the four might not)
    def work(least: int):
        least = split_k.pad_least(least)
        return Dim.bin("ge", numel(batch) * M * N,
                       Dim.const(least).cdiv(g.op_map()[mm.args[0]].type.shape[-1])) \
            if least else None
    work_tma, work_default = work(PAD_LEAST_TMA), work(PAD_LEAST)
    if target.resources.wgmma and sched.warp_specialize is not False:
        fp8 = fp8_product(g, mm)
        bm, bn, bk, stages, consumers, pingpong, _ = wgmma_config(target, fp8)
        # (f32 operands under `precision tf32`: the 16-bit K tile's bytes, half its values)
        per_k = 2 if tf32_product(g, mm, target, sched) else 1
        tma = GemmVariant((bm, bn, bk // per_k), 128 * (consumers + 1), stages, wgmma=True,
                          transpose=True)
        hopper = [("_tma", None, tma)]
        waves = target.resources.wgmma_waves
        if waves and not fp8 and not pingpong:
            # the other block tile first, where it wastes less of the last wave of tiles
            # (the condition holds the SM count: known at run time only, it never folds)
            wm, wn, wk, wstages, wconsumers, *_ = waves
            hopper.insert(0, ("_tma_waves", fuller_waves(M, N, batch, (bm, bn), (wm, wn)),
                              GemmVariant((wm, wn, wk // per_k), 128 * (wconsumers + 1), wstages,
                                          wgmma=True)))
        if target.resources.wgmma_pairs and not fp8 and not pingpong and not batch:
            # where B's rows start off 128-byte lines, clusters of 2 sharing its tiles first
            hopper.insert(0, ("_tma_pairs", None, replace(tma, cluster=2, transpose=False)))
        if work_tma is not None:
            # where an operand's rows are not 16-byte multiples (TMA cannot read them): its copy
            # with padded rows, then the kernel above on it
            hopper.append(("_tma_pad", work_tma, replace(tma, pad=True)))
    # the default kernel on padded copies (where no variant above took them: tile_graph)
    padded = [("_pad", work_default, PADDED)] if work_default is not None and \
        target.resources.padded_operands else []
    if sched.tile:
        return hopper + padded + [("", None, None)]
    K = g.op_map()[mm.args[0]].type.shape[-1]
    split = split_k.config(target) or None
    decode = [(max_m, GemmVariant(tile_, threads, stages, split)) for max_m, tile_, threads, stages
              in split_k.decode_variants(target, _weight_bits(g, mm.args[1]))]
    on_mma = dequant4_for_gemv_mma(g.op_map(), mm.args[1], target)
    kmajor = kmajor_gemv(g.op_map(), mm.args[1], target)
    gemv = split_k.gemv_config(target, on_mma, kmajor)
    if gemv and not _transposed(g, mm.args[1]):  # (a transposed B: its rows are not contiguous)
        bn, threads, blocks, rows, per_sm, unroll = gemv
        unroll = _gemv_rows_per_step(g, mm, unroll)
        # one block per row of A: B is read once per row (4-bit weights: from cache, when the
        # target says that beats its smallest tile up to some M)
        max_m = target.resources.gemv_mma_max_m if on_mma and split_k.gemv_mma(target) else 1
        gemvs = [(max_m, GemmVariant((1, bn, 1), threads, 1, (blocks, rows, per_sm), unroll))]
        if on_mma and split_k.gemv_mma(target):
            # a few rows of A (decode batches) in one block: the target's routine reads and
            # dequantizes each weight once for all of them (GroupLowering.gemv_rows_body)
            gemvs += [(mr, GemmVariant((mr, bn, 1), t, 1, (blocks, rows, per), unroll))
                      for mr, t, per in split_k.gemv_rows(target, kmajor) if mr > max_m]
        decode = gemvs + decode
    out, rows_taken = [], False
    for max_m, cfg in decode:
        if M.op == "const" and (M.args[0] > max_m or (cfg.gemv_rows and rows_taken)):
            continue  # (a constant M takes the fewest rows of A that hold it)
        rows_taken = rows_taken or cfg.gemv_rows
        small = Dim.bin("le", M, max_m)
        if cfg.gemv_rows and not kmajor:  # (the routine's fast path needs whole words of weights)
            small = Dim.bin("and", small, Dim.bin("eq", N % 8, 0))
        name = f"_gemv{cfg.tile[0]}" if cfg.gemv_rows else "_gemv" if cfg.gemv_unroll else \
            f"_m{max_m}"
        if cfg.split:
            bm, bn, bk = cfg.tile
            when = split_k.plan(N.cdiv(bn) * M.cdiv(bm) * numel(batch), K.cdiv(bk),
                                *cfg.split[:2],
                                multiple=gemv_chunk_rows(cfg.gemv_unroll, kmajor)).when
            if when != Dim.const(0):
                out.append((f"{name}_split", Dim.bin("and", small, when), cfg))
        out.append((name, small, replace(cfg, split=None)))
        if M.op == "const" and not cfg.gemv_rows:
            break
    out += hopper + padded
    large = target.resources.gemm_large_tile
    if large:
        (bm, bn, bk), per_thread = large
        _, _, _, stages, threads = target.gemm_config(sched, scalar=False)
        blocks = N.cdiv(bn) * M.cdiv(bm) * numel(batch)
        out.append(("_large", Dim.bin("ge", blocks, Dim.sym(T.THREADS) * per_thread),
                    GemmVariant((bm, bn, bk), threads, stages)))
    out.append(("", None, None))
    # conditions that fold to true end the list; those that fold to false never run
    kept = []
    for suffix, when, cfg in out:
        if when == Dim.const(0):
            continue
        kept.append((suffix, None if when == Dim.const(1) else when, cfg))
        if (when is None or when == Dim.const(1)) and \
                not (cfg and (cfg.wgmma or cfg.pad or cfg.gemv_rows)):
            break  # (the TMA and padded variants' conditions come with their kernels: tile_graph;
            # a GEMV of several rows of A may refuse the product)
    return kept


def gemv_mma_dtypes(target) -> tuple:
    """The dtypes of A and the scales that the target's `gemv_mma` takes."""
    return target.resources.gemv_mma_dtypes or target.resources.mma_dtypes


def dequant4_for_gemv_mma(ops: dict, b_id: int, target) -> bool:
    """Is op `b_id` a dequantization of 4-bit weights with scales of a dtype the target's
    `gemv_mma` takes (the B of a GEMV it may take: GroupLowering.gemv_mma_form decides, with A's
    dtype and where the operands live)?"""
    b = ops[b_id]
    return b.kind == "dequant" and ops[b.args[0]].type.dtype in ("u4", "i4") and \
        ops[b.args[1]].type.dtype in gemv_mma_dtypes(target)


def kmajor_gemv(ops: dict, b_id: int, target) -> bool:
    """Is op `b_id` a dequantization of 4-bit weights packed along K (`dequant(q.T, s.T, ..)`
    of tensors in memory) that the target's `gemv_mma_kmajor` routine takes?"""
    if not (target.resources.gemv_mma_kmajor and dequant4_for_gemv_mma(ops, b_id, target)):
        return False
    return all(ops[x].kind == "transpose" for x in ops[b_id].args[:2])


def gemv_chunk_rows(unroll: int, kmajor: bool = False) -> int:
    """What a split GEMV's rows per split are a multiple of: its rows per step (a step's rows
    share their quantization group), and T.GemvMma's chunks (16 rows; 128 for weights packed
    along K); 1 for other GEMMs."""
    return math.lcm(unroll, 128 if kmajor else 16) if unroll else 1


def _gemv_rows_per_step(g: Graph, mm, rows: int) -> int:
    """A GEMV's rows per step for its weights: the target's count is for 32-bit weights; 16-bit
    ones (a 16-bit B, or a dequantization to a 16-bit scale's dtype, which the step holds in
    pairs) take twice as many rows in the same registers, 64-bit ones half."""
    ops = g.op_map()
    b = ops[mm.args[1]]
    if b.kind == "cast" and is_float(b.type.dtype):  # a widened operand: the narrow one's size
        b = ops[b.args[0]]
    dt = ops[b.args[1]].type.dtype if b.kind == "dequant" else b.type.dtype
    bits = max(itemsize_bits(dt), 16)
    return max(1, rows * 32 // bits)


def canonical_divisions(k: TileKernel, dims) -> TileKernel:
    """i64 `//` and `%` as `ir.tile.int_division` says (index math where it cannot go wrong)."""
    index_vars = set(k.block_vars) | set(dims) | {
        v for s in T.walk_stmts(k.body) if isinstance(s, For) for v in s.vars}
    for s in T.walk_stmts(k.body):  # i64 locals of those (as the tile-level parser sees them)
        if isinstance(s, T.Let) and getattr(s.value, "dtype", None) == "i64" and \
                T.nonneg(s.value, index_vars):
            index_vars.add(s.name)

    def fix(e):
        if isinstance(e, T.Binary) and e.fn in ("floordiv", "mod") and e.dtype == "i64":
            new = T.int_division(e.fn, e.a, e.b, index_vars, set(dims))
            return new if new.fn != e.fn else None
        return None
    return replace(k, grid=tuple(map_expr(e, fix) for e in k.grid),
                   body=tuple(map_exprs(s, fix) for s in k.body))


def tile_graph(g: Graph, plan: Plan, target, sched) -> TileProgram:
    taken = {p.name for p in g.params + g.outputs} | set(g.symbols)
    taken |= {b.name for _, b in plan.buffers}
    kernels = []
    for n, grp in enumerate(plan.groups):
        padded = False  # (a variant on padded copies came first: the default kernel takes none)
        for suffix, when, cfg in gemm_variants(g, grp, target, sched):
            if cfg is PADDED and padded:
                continue
            names = Names(taken)
            try:
                parts = GroupLowering(g, plan, grp, target, sched, names, cfg).lower()
            except NoVariant:
                continue
            for k in parts:  # the variant's own run-time needs (TMA's strides)
                if k.when is not None:
                    when = k.when if when is None else Dim.bin("and", when, k.when)
            # a variant's own workspace is the launcher's too: the next variant names another
            taken |= {p.name for k in parts for p in k.params if p.kind == "workspace"}
            # (padded operand copies: bytes only where the variant runs)
            copies = {c for k in parts for _, c in k.padded}
            # (a variant of transposed copies runs where they pay, not where rows are off)
            padded = padded or (bool(copies) and not any(k.transposed for k in parts))
            for p, k in enumerate(parts):
                # (a part's name is its suffix: split-K's second part `_sum`)
                name = f"{g.name}_k{grp.id}{suffix}{k.name}"
                params = tuple(replace(q, when=when) if q.name in copies and q.kind == "workspace"
                               else q for q in k.params)
                kernels.append(replace(canonical_divisions(k, g.symbols), name=name, slot=n,
                                       when=when, part=p, params=params))
    ws = [TensorDecl(b.name, b.type.dtype, b.type.shape, "workspace")
          for _, b in plan.buffers if b.kind == "workspace"]
    for k in kernels:  # a variant's own workspace (split-K partial products)
        ws += [p for p in k.params if p.kind == "workspace" and p.when is not None and p not in ws]
    ws = tuple(ws)
    return TileProgram(g.name, tuple(kernels), ws)


def shared_bytes(a: Alloc) -> int:
    """Bytes of one stage of a shared buffer (run-time extents count as 1)."""
    n = 1
    for d in a.shape:
        n *= d.value if isinstance(d, T.Const) else 1
    return n * max(DTYPES[a.dtype][1], 4 if a.dtype in PACKED else 8) // 8


def staged_buffers(body) -> dict:
    """{shared buffer: stages} for the buffers pipelined loops fill with copies."""
    return {s.dst.buf: loop.stages for loop in T.walk_stmts(body)
            if isinstance(loop, For) and loop.kind == "pipelined"
            for s in loop.body if isinstance(s, Copy)}


def fit_stages(body: tuple, budget: int) -> tuple:
    """`body` with the stages of its pipelined loops cut (to 2 at least) until its shared
    buffers fit in `budget` bytes: a deep pipeline of big tiles would not launch, or would keep
    fewer blocks on an SM than the kernel asks for."""
    staged = staged_buffers(body)
    shared = [a for a in T.walk_stmts(body) if isinstance(a, Alloc) and a.scope == "shared"]
    fixed = sum(shared_bytes(a) for a in shared if a.name not in staged)
    per_stage = sum(shared_bytes(a) for a in shared if a.name in staged)
    if not per_stage:
        return body
    most = max(2, (budget - fixed) // per_stage)

    def cut(st):
        if isinstance(st, For) and st.kind == "pipelined" and st.stages > most:
            return [replace(st, stages=most)]
        return None
    return map_stmts(body, cut)


def handwritten(g: Graph, target) -> TileProgram:
    """A tile-level kernel's own Tile IR, checked against what the target's blocks can hold."""
    k = g.tile
    r = target.resources
    if k.threads > r.max_threads or (r.warp > 1 and k.threads % r.warp):
        raise error(f"threads={k.threads}: a {target.name} block takes a multiple of {r.warp} "
                    f"threads, at most {r.max_threads}", g.loc)
    staged = staged_buffers(k.body)
    total = 0
    for a in T.walk_stmts(k.body):
        if isinstance(a, Alloc) and a.scope == "shared":
            total += shared_bytes(a) * (staged.get(a.name, 1) if r.async_copy else 1)
            if total > r.tile_memory:
                raise error(f"the shared buffers need {total} bytes by here on {target.name}; a "
                            f"block has {r.tile_memory}", g.tile_locs.get(a.name, g.loc),
                            "use smaller tiles or fewer stages")
    return TileProgram(g.name, (replace(k, name=f"{g.name}_k0", slot=0,
                                        comment=(g.doc or "").strip().split("\n")[0] or
                                        "hand-written tile-level kernel"),), ())


def with_precision(prog: TileProgram, sched, target) -> TileProgram:
    """`precision tf32` on a target whose matrix units take tf32: every gemm of two f32 operands
    in shared memory into an f32 accumulator is marked to run in tf32 (the layout pass pads the
    operands' rows for the fragment loads, the renderer multiplies on the matrix units); a gemm
    with A in registers (attention's P @ V), other targets, and `precision ieee` (the default)
    keep exact f32 FMAs."""
    if not target.tf32(sched):
        return prog

    def kernel(k):
        allocs = {s.name: s for s in T.walk_stmts(k.body) if isinstance(s, Alloc)}

        def mark(st):
            if isinstance(st, T.Gemm) and allocs[st.a].scope == allocs[st.b].scope == "shared" \
                    and allocs[st.a].dtype == allocs[st.b].dtype == allocs[st.c].dtype == "f32":
                return [replace(st, tf32=True)]
            return None
        return replace(k, body=map_stmts(k.body, mark))
    return replace(prog, kernels=tuple(kernel(k) for k in prog.kernels))


def run(m: Module, opts) -> Module:
    target = opts["target"]
    progs, plans = [], []
    for g, plan in zip(m.graphs, m.plans):
        sched = m.schedule_for(g.name, target.name)
        for p in g.params + g.outputs:
            if p.type.dtype not in target.resources.dtypes and p.type.dtype != "bool":
                raise error(f"{p.type.dtype} is not supported on target {target.name}", p.loc)
        if g.tile is not None:
            progs.append(with_precision(handwritten(g, target), sched, target))
            plans.append(plan)
            continue
        # (a batched GEMM's rows merged where the graph allows: its kernels see the view)
        view = merge_rows.view(g)
        try:
            prog = tile_graph(g, plan, target, sched) if view is None else \
                tile_graph(view, fusion_plan(view, sched.fuse), target, sched)
        except TilecError:
            raise
        except Exception:
            # A fusion bug: build every op as its own kernel instead (tests set
            # TILEC_STRICT_FUSION=1 so that the bug still fails them)
            if os.environ.get("TILEC_STRICT_FUSION"):
                raise
            plan = Fuser(g, False, isolate=True).run()
            prog = tile_graph(g, plan, target, sched)
        progs.append(with_precision(prog, sched, target))
        plans.append(plan)
    return replace(m, plans=tuple(plans), programs=tuple(progs))
