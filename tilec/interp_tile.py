"""numpy reference interpreter for Tile IR: runs a tile-level kernel block by block.

It is the oracle for hand-written tile-level kernels (`tilec run` checks the built library
against it) and the check that tilec's own tiling is right (tests run a tensor-level program's
Graph IR and its Tile IR and compare). Values follow the Graph IR interpreter's rules: every
expression node is computed in float64 (int64 for integers) and rounded to its dtype.

Blocks run one after another. A parallel loop runs all its iterations at once as numpy arrays
over its iteration space, statement by statement, with `if` turned into masks (iterations of a
parallel loop are independent, so this is the loop's meaning). Buffers start as NaN (integers as
0), so a read of a never-written element shows. Reads and writes outside a tensor or buffer by
an iteration that runs are errors, as is an output element that no block writes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .diagnostics import error
from .interp import _binary, _compare, _unary, quantize, wrap
from .ir import tile as T
from .ir.types import is_float


class _Ctx:
    """What a statement sees: named values and, inside parallel loops, the iteration space and
    the mask of iterations that run."""

    def __init__(self, names: dict):
        self.names = names
        self.space: tuple = ()
        self.mask = None  # None: every iteration (or block level)

    def widen(self, extents: tuple):
        """Enter a parallel loop over `extents`: existing arrays get trailing axes."""
        k = len(extents)
        old = (dict(self.names), self.space, self.mask)
        self.names = {n: (np.reshape(v, np.shape(v) + (1,) * k) if np.ndim(v) else v)
                      for n, v in self.names.items()}
        if self.mask is not None:
            self.mask = np.reshape(self.mask, self.mask.shape + (1,) * k)
        base = len(self.space)
        self.space = self.space + tuple(extents)
        return old, base

    def restore(self, old):
        self.names, self.space, self.mask = old


def _and(m, c):
    return c if m is None else (m & c)


class KernelRun:
    def __init__(self, k: T.TileKernel, env: dict, dims: dict, written: dict):
        self.k, self.env, self.dims, self.written = k, env, dims, written
        self.decls = {p.name: p for p in k.params}
        self.bufs: dict = {}
        self.defined: dict = {}  # buffer -> which elements hold a value (written, from written ones)
        self.allocs: dict = {}
        self.at = k.loc  # where the statement being run was written (its errors point there)
        self.owner: dict = {}  # tensor -> the block that last wrote each element (-1: none)
        self.points: list = []  # the blocks run so far, by their index in `owner`
        # buffers whose threads' partial values an `allreduce` combines (the tile pass's column
        # reductions): their reduction stores accumulate over the loop's iterations
        self.combined = {s.buf for s in T.walk_stmts(k.body) if isinstance(s, T.Allreduce)}

    # ---- driver
    def run(self):
        # (values of the program's own making: inf and NaN are results, not numpy's warnings)
        with np.errstate(all="ignore"):
            self._run()

    def _run(self):
        names = {n: np.int64(v) for n, v in self.dims.items()}
        for p in self.k.params:
            if p.kind == "scalar":
                names[p.name] = np.asarray(self.env[p.name])[()]
        extents = [int(self.scalar(self.ev(g, _Ctx(names)), "a grid extent")) for g in self.k.grid]
        for point in itertools.product(*(range(e) for e in extents)):
            ctx = _Ctx(dict(names, **{v: np.int64(i) for v, i in zip(self.k.block_vars, point)}))
            self.bufs, self.defined = {}, {}
            self.block = point
            self.points.append(point)
            self.stmts(self.k.body, ctx)

    def fail(self, msg: str):
        where = ", ".join(f"{v}={i}" for v, i in zip(self.k.block_vars, self.block))
        raise error(f"{self.k.name}: {msg} (in block {where})", self.at)

    def check_exp_nonpos(self, x, mask):
        """exp_nonpos(x) is exp(x) only for x <= 44 (or NaN): stop at an argument above."""
        high = np.asarray(x, np.float64) > 44.0
        if mask is not None:
            high = high & np.broadcast_to(mask, high.shape)
        if np.any(high):
            v = np.asarray(x, np.float64)[high].max()
            self.fail(f"exp_nonpos of {v:g}: above 44, where it is not exp (use exp)")

    def scalar(self, v, what: str):
        if np.ndim(v):
            self.fail(f"{what} differs between the iterations of a parallel loop")
        return v

    def array(self, name: str):
        if name in self.bufs:
            return self.bufs[name]
        return self.env[name]

    # ---- statements
    def stmts(self, stmts, ctx: _Ctx):
        outer = self.at
        for s in stmts:
            self.at = getattr(s, "loc", None) or outer
            getattr(self, "st_" + type(s).__name__)(s, ctx)
        self.at = outer

    def st_Alloc(self, s: T.Alloc, ctx):
        shape = tuple(int(self.scalar(self.ev(d, ctx), "a buffer extent")) for d in s.shape)
        self.allocs[s.name] = s
        self.bufs[s.name] = np.full(shape, np.nan) if is_float(s.dtype) else \
            np.zeros(shape, dtype=bool if s.dtype == "bool" else np.int64)
        self.defined[s.name] = np.zeros(shape, bool)

    def st_Fill(self, s: T.Fill, ctx):
        dt = self.allocs[s.buf].dtype
        self.bufs[s.buf][...] = quantize(self.ev(s.value, ctx), dt)
        self.defined[s.buf][...] = True

    def st_Let(self, s: T.Let, ctx):
        ctx.names[s.name] = self.ev(s.value, ctx)

    def st_Copy(self, s: T.Copy, ctx):
        src, dst = s.src, s.dst
        if src.offsets is not None and dst.offsets is None:  # tensor window -> tile buffer
            tile = self.bufs[dst.buf]
            t = self.env[src.buf]
            win, sl = self.window(src, t, tile.shape, ctx)
            tile[...] = 0
            tile[sl] = quantize(t[win], self.allocs[dst.buf].dtype)
            self.defined[dst.buf][...] = True
        elif dst.offsets is not None and src.offsets is None:  # tile buffer -> tensor window
            tile = self.bufs[src.buf]
            t = self.env[dst.buf]
            win, sl = self.window(dst, t, tile.shape, ctx)
            val = quantize(tile[sl], self.decls[dst.buf].dtype)
            self.claim(dst.buf, win, val)
            t[win] = val
            if dst.buf in self.written:
                self.written[dst.buf][win] = True
        else:
            raise NotImplementedError("interpreter: a copy between two tile buffers")

    def window(self, r: T.Region, t: np.ndarray, shape: tuple, ctx):
        """(index into tensor t, index into the tile) of the part of the window at r.offsets
        with the tile's `shape` (its last two axes) that lies inside t."""
        off = [int(self.scalar(self.ev(o, ctx), "a copy offset")) for o in r.offsets]
        lead = len(off) - 2
        for ax in range(lead):
            if not 0 <= off[ax] < t.shape[ax]:
                self.fail(f"copy window of '{r.buf}' starts at {off} outside its shape "
                          f"{list(t.shape)}")
        if min(off[lead:], default=0) < 0:
            self.fail(f"copy window of '{r.buf}' starts at {off}, before the tensor's first "
                      f"{'row' if off[lead] < 0 else 'column'}: a window may run past a tensor's "
                      "end (zeros there), not start before it")
        rows, cols = shape[-2:]
        win, tile_sl = list(off[:lead]), [0] * (len(shape) - 2)
        for ax, n in ((lead, rows), (lead + 1, cols)):
            lo, hi = max(off[ax], 0), min(off[ax] + n, t.shape[ax])
            hi = max(hi, lo)
            win.append(slice(lo, hi))
            tile_sl.append(slice(lo - off[ax], hi - off[ax]))
        return tuple(win), tuple(tile_sl)

    def st_Gemm(self, s: T.Gemm, ctx):
        if s.a_stage is not None or s.b_stage is not None:
            raise NotImplementedError("interpreter: staged GEMM operands (after the pipeline pass)")
        a, b, c = self.bufs[s.a], self.bufs[s.b], self.bufs[s.c]
        a = a.T if s.transpose_a else a
        b = b.T if s.transpose_b else b
        dt = self.allocs[s.c].dtype
        if is_float(dt):
            c[...] = quantize(c + a.astype(np.float64) @ b.astype(np.float64), dt)
        else:  # integer products accumulate exactly in int64, then wrap
            c[...] = wrap(c.astype(np.int64) + a.astype(np.int64) @ b.astype(np.int64), dt)
        # an element of c is defined when its row of a and its column of b are
        da, db = self.defined[s.a], self.defined[s.b]
        da = da.T if s.transpose_a else da
        db = db.T if s.transpose_b else db
        self.defined[s.c] &= da.all(axis=1)[:, None] & db.all(axis=0)[None, :]

    def st_GemvMma(self, s: T.GemvMma, ctx):
        row, first, rows, col0, m = (int(self.scalar(self.ev(x, ctx), "a GEMV bound"))
                                     for x in s.idx)
        dst = self.bufs[s.dst]
        slices, bn = dst.shape[0] // s.mr, dst.shape[1]
        a, q, sc = self.env[s.a], self.env[s.q], self.env[s.s]
        dt = self.decls[s.s].dtype
        if s.kmajor:  # [N, K] weights and [N, K // group] scales
            q, sc = q.T, sc.T
        chunk = 128 if s.kmajor else 16
        cols = np.arange(col0, min(col0 + bn, q.shape[-1]))
        end, c0 = first + rows, first // chunk
        per = -(-(-(-end // chunk) - c0) // slices) * chunk if rows > 0 else 0
        m = min(m, s.mr)
        if m > 0 and not 0 <= row <= row + m <= a.shape[0]:
            self.fail(f"gemv_mma reads rows {row} .. {row + m - 1} of '{s.a}' outside its shape "
                      f"{list(a.shape)}")
        dst[...] = 0.0
        self.defined[s.dst][...] = True
        for w in range(slices):
            r = np.arange(max(first, c0 * chunk + w * per), min(c0 * chunk + (w + 1) * per, end))
            if r.size == 0 or cols.size == 0 or m <= 0:
                continue
            wts = quantize((q[r][:, cols].astype(np.float64) - s.zero) *
                           sc[r // s.group][:, cols].astype(np.float64), dt)
            dst[w * s.mr:w * s.mr + m, :cols.size] = quantize(
                a[row:row + m][:, r].astype(np.float64) @ wts, "f32")

    def st_Reduce(self, s: T.Reduce, ctx):
        f = {"sum": np.sum, "max": np.max, "min": np.min}[s.fn]
        dt = self.allocs[s.dst].dtype
        # each element converted to dst's dtype, then combined in it (as the targets do)
        self.bufs[s.dst][...] = wrap(f(quantize(self.bufs[s.src], dt), axis=s.axis), dt)
        self.defined[s.dst][...] = self.defined[s.src].all(axis=s.axis)

    def st_Allreduce(self, s: T.Allreduce, ctx):
        """Nothing to do: a block's iterations accumulated into one buffer (st_Store)."""

    def accumulate(self, s: T.Store, ctx) -> bool:
        """A reduction store `b[idx] = combine(b[idx], x)` into a buffer an allreduce combines:
        every iteration that runs combines its x in (iterations that share an element: a
        column reduction's rows), as the threads' partials and the allreduce do together."""
        v = s.value
        if not (s.buf in self.combined and isinstance(v, T.Binary) and
                v.fn in ("add", "maximum", "minimum") and isinstance(v.a, T.Load) and
                v.a.buf == s.buf and v.a.idx == s.idx):
            return False
        dtype, arr = self.allocs[s.buf].dtype, self.bufs[s.buf]
        act, idx = self.store_index(s, arr, ctx)
        x = np.broadcast_to(quantize(self.ev(v.b, ctx), dtype), ctx.space)[act]
        {"add": np.add, "maximum": np.maximum, "minimum": np.minimum}[v.fn].at(arr, tuple(idx), x)
        arr[...] = quantize(arr, dtype)
        return True

    def store_index(self, s: T.Store, arr, ctx) -> tuple:
        """(the mask of the iterations that run, their indices into `arr`, one array per axis),
        checked inside it."""
        shape = ctx.space
        act = np.ones(shape, bool) if ctx.mask is None else np.broadcast_to(ctx.mask, shape)
        idx = [np.broadcast_to(self.ev(i, ctx), shape)[act].astype(np.int64) for i in s.idx]
        self.check_bounds(s.buf, arr, idx, "writes")
        return act, idx

    def st_Store(self, s: T.Store, ctx):
        if self.accumulate(s, ctx):
            return
        dtype = self.allocs[s.buf].dtype if s.buf in self.bufs else self.decls[s.buf].dtype
        arr = self.array(s.buf)
        val = quantize(self.ev(s.value, ctx), dtype)
        act, idx = self.store_index(s, arr, ctx)
        val = np.broadcast_to(val, ctx.space)[act]
        if arr.ndim == 0:  # a rank-0 tensor: the last running iteration's value
            if val.size:
                arr[()] = val[-1]
                if s.buf in self.written:
                    self.written[s.buf][()] = True
            return
        if s.buf not in self.bufs:
            self.claim(s.buf, tuple(idx), val)
        arr[tuple(idx)] = val
        if s.buf in self.written:
            self.written[s.buf][tuple(idx)] = True
        if s.buf in self.defined:
            self.defined[s.buf][tuple(idx)] = True

    def claim(self, name: str, index: tuple, val):
        """This block writes `val` at `index` of tensor `name` (one index array per axis, or a
        copy's window: integers and slices): an element that another block of the kernel wrote
        with a different value is an error (blocks run in any order, so the result would depend
        on it)."""
        arr = self.env[name]
        if arr.ndim == 0:
            return
        if any(isinstance(ix, slice) for ix in index):  # a window: its elements, flattened
            axes = [np.arange(arr.shape[a])[ix] if isinstance(ix, slice) else np.array([ix])
                    for a, ix in enumerate(index)]
            index = tuple(g.ravel() for g in np.meshgrid(*axes, indexing="ij"))
            val = np.reshape(val, -1)
        own = self.owner.get(name)
        if own is None:
            own = self.owner[name] = np.full(arr.shape, -1, np.int64)
        me = len(self.points) - 1
        prev = own[index]
        old, new = arr[index], np.broadcast_to(val, np.shape(prev))
        clash = (prev >= 0) & (prev != me) & (old != new) & ((old == old) | (new == new))
        if np.any(clash):
            k = int(np.argmax(clash))
            was = ", ".join(f"{v}={i}" for v, i in zip(self.k.block_vars, self.points[prev[k]]))
            self.fail(f"writes {name}[{', '.join(str(int(ix[k])) for ix in index)}], which block "
                      f"{was} also wrote, with another value: blocks run in any order")
        own[index] = me

    def check_bounds(self, name: str, arr, idx: list, verb: str):
        bad = np.zeros(np.shape(idx[0]) if idx else (), bool)
        for i, n in zip(idx, arr.shape):
            bad = bad | (i < 0) | (i >= n)
        if np.any(bad):
            first = [int(np.asarray(i)[bad].flat[0]) if np.ndim(i) else int(i) for i in idx]
            self.fail(f"{verb} {name}[{', '.join(map(str, first))}] outside its shape "
                      f"{list(arr.shape)}")

    def check_defined(self, name: str, idx: list):
        undef = ~self.defined[name][tuple(idx)]
        if np.any(undef):
            first = [int(np.asarray(i)[undef].flat[0]) if np.ndim(i) else int(i) for i in idx]
            self.fail(f"reads {name}[{', '.join(map(str, first))}], which holds no value: nothing "
                      "wrote it, or a gemm or reduce computed it from elements nothing wrote")

    def st_For(self, s: T.For, ctx):
        if s.kind == "parallel":
            # (a negative extent runs no iterations, as the targets' loops do)
            ext = [max(int(self.scalar(self.ev(e, ctx), "a parallel extent")), 0)
                   for e in s.extents]
            old, base = ctx.widen(tuple(ext))
            n = len(ctx.space)
            for ax, v in enumerate(s.vars):
                shape = [1] * n
                shape[base + ax] = ext[ax]
                ctx.names[v] = np.arange(ext[ax], dtype=np.int64).reshape(shape)
            try:
                if all(ext):
                    self.stmts(s.body, ctx)
            finally:
                ctx.restore(old)
            return
        (v,), (e,) = s.vars, s.extents
        n = self.ev(e, ctx)
        first = 0 if s.start is None else int(self.scalar(self.ev(s.start, ctx), "a loop start"))
        saved = ctx.names.get(v)
        outer = ctx.mask
        for i in range(first, int(np.max(n)) if np.size(n) else 0):
            ctx.names[v] = np.int64(i)
            if np.ndim(n):  # a trip count that differs between parallel iterations
                ctx.mask = _and(outer, np.asarray(n) > i)
            self.stmts(s.body, ctx)
        ctx.mask = outer
        if saved is not None:
            ctx.names[v] = saved

    def st_If(self, s: T.If, ctx):
        c = self.ev(s.cond, ctx)
        if ctx.mask is None and not np.ndim(c):
            self.stmts(s.body if c else s.orelse, ctx)
            return
        outer = ctx.mask
        for body, m in ((s.body, c), (s.orelse, ~np.asarray(c))):
            if body:
                ctx.mask = _and(outer, m)
                self.stmts(body, ctx)
        ctx.mask = outer

    def st_Commit(self, s, ctx):  # copies here complete at once
        pass

    def st_Wait(self, s, ctx):
        pass

    def st_Barrier(self, s, ctx):
        pass

    # ---- expressions
    def ev(self, e, ctx: _Ctx, mask=None):
        """The value of `e` for the iterations that run (`mask`, or the context's): others get
        values computed from clamped indices, never used."""
        if isinstance(e, T.Const):  # a literal has its dtype's value (0.1 in f32 is not 0.1)
            return quantize(np.asarray(e.value), e.dtype)[()]
        if isinstance(e, T.Var):
            return ctx.names[e.name]
        if isinstance(e, T.Load):
            return self.load(e, ctx, mask)
        if isinstance(e, T.Cast):
            return quantize(self.ev(e.x, ctx, mask), e.dtype)
        if isinstance(e, T.Select):
            c = self.ev(e.cond, ctx, mask)
            m = ctx.mask if mask is None else mask
            a = self.ev(e.a, ctx, _and(m, c))  # as C's `?:`, each side runs only where chosen
            b = self.ev(e.b, ctx, _and(m, ~np.asarray(c)))
            return quantize(np.where(c, a, b), e.dtype)
        if isinstance(e, T.Unary):
            x = self.ev(e.x, ctx, mask)
            if e.fn == "exp_nonpos":
                self.check_exp_nonpos(x, ctx.mask if mask is None else mask)
            return wrap(_unary(e.fn, np.asarray(x, np.float64) if is_float(e.dtype) else x),
                        e.dtype)
        if isinstance(e, T.Compare):
            return _compare(e.fn, self.ev(e.a, ctx, mask), self.ev(e.b, ctx, mask))
        if isinstance(e, T.Binary):
            a = self.ev(e.a, ctx, mask)
            if e.fn == "pow":
                with np.errstate(all="ignore"):
                    return wrap(np.asarray(a) ** e.exponent, e.dtype)
            b = self.ev(e.b, ctx, mask)
            return wrap(self.binary(e.fn, a, b, e.dtype), e.dtype)
        if isinstance(e, T.Fma):  # in f64, rounded once to the dtype (as a fused multiply-add)
            a, b, c = (np.asarray(self.ev(x, ctx, mask), np.float64) for x in (e.a, e.b, e.c))
            return quantize(a * b + c, e.dtype)
        raise NotImplementedError(f"interpreter: expression {type(e).__name__}")

    @staticmethod
    def binary(fn, a, b, dtype):
        if fn in ("idiv", "imod", "cdiv"):
            a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
            b0 = np.where(b == 0, 1, b)
            r = {"idiv": lambda: a // b0, "imod": lambda: a % b0,
                 "cdiv": lambda: -(-a // b0)}[fn]()
            return np.where(b == 0, 0, r)
        if fn in ("min", "max"):
            return (np.minimum if fn == "min" else np.maximum)(a, b)
        return _binary(fn, a, b, dtype)

    def load(self, e: T.Load, ctx: _Ctx, mask):
        arr = self.array(e.buf)
        idx = [np.asarray(self.ev(i, ctx, mask), np.int64) for i in e.idx]
        m = ctx.mask if mask is None else mask
        shape = np.broadcast_shapes(*(np.shape(i) for i in idx), np.shape(m) if m is not None
                                    else ())
        idx = [np.broadcast_to(i, shape) for i in idx]
        act = np.ones(shape, bool) if m is None else np.broadcast_to(m, shape)
        self.check_bounds(e.buf, arr, [i[act] for i in idx], "reads")
        if e.buf in self.bufs:
            self.check_defined(e.buf, [i[act] for i in idx])
        safe = tuple(np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, arr.shape))
        if arr.size == 0:
            return np.zeros(shape)
        return arr[safe]


def run_kernel(k: T.TileKernel, env: dict, dims: dict, written: dict | None = None):
    """Run kernel `k` over its grid: reads and writes the arrays of `env` (name -> values)."""
    KernelRun(k, env, dims, written if written is not None else {}).run()


def run_program(kernels, inputs: dict, dims: dict, outputs) -> dict:
    """Run `kernels` in order on `inputs` (name -> values) and return the `outputs` (names).
    Tensors the kernels declare that are not inputs (outputs, workspaces) start as NaN, and every
    element of every output must be written. An input the kernels declare in another shape of
    the same size (a batched GEMM's rows merged: passes/merge_rows.py) is read as that view;
    outputs come back in the kernels' shapes."""
    decls = {p.name: p for k in kernels for p in k.params}
    env = {}
    for n, v in inputs.items():
        v = np.asarray(v)
        if n in decls and decls[n].shape:
            shape = tuple(x.eval(dims) for x in decls[n].shape)
            if v.shape != shape and v.size == math.prod(shape):
                v = v.reshape(shape)
        env[n] = v
    written = {}
    for name, d in decls.items():
        if name in env:
            continue
        shape = tuple(x.eval(dims) for x in d.shape)
        env[name] = np.full(shape, np.nan) if is_float(d.dtype) else \
            np.zeros(shape, dtype=bool if d.dtype == "bool" else np.int64)
        written[name] = np.zeros(shape, bool)
    loc = next((k.loc for k in kernels if k.loc is not None), None)
    for k in kernels:
        run_kernel(k, env, dims, written)
    for name in outputs:
        miss = ~written[name]
        if miss.any():
            at = ", ".join(str(int(i[0])) for i in np.nonzero(miss))
            raise error(f"no block writes element [{at}] of output '{name}' "
                        f"({int(miss.sum())} of {miss.size} elements are never written)", loc)
    return {name: env[name] for name in outputs}


def pick_variants(prog: T.TileProgram, dims: dict) -> list:
    """The kernels the launcher would run for `dims`, in launch order."""
    return [k for parts in pick_slots(prog, dims) for k in parts]


def pick_slots(prog: T.TileProgram, dims: dict) -> list:
    """Per launch slot, the variant the launcher would run for `dims`: the first whose `when`
    holds (the tuple of its kernels)."""
    return [next((parts for parts in variants if parts[0].when is None or
                  parts[0].when.eval({**T.MACHINE, **dims})), variants[-1])
            for variants in prog.slots()]
