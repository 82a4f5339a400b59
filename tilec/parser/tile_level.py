"""Semantic analysis of tile-level kernels: the body of `with grid(...) as (...)` -> Tile IR.

The kernel's signature (parameters, dimensions, assumes) is analysed as for tensor-level kernels;
the body becomes a `TileKernel` that enters the pipeline after `tile`. Expressions get dtypes by
the same rules as the tensor level (NumPy promotion, weak literals); index arithmetic over loop
variables, block variables and dimensions is i64. Every mistake is a located error: unknown
names, scopes (a copy between two tensors, a GEMM into shared memory), shapes of GEMM operands
and copy windows, non-constant tile sizes, a buffer read before anything writes it, writes to
inputs, a reduction axis out of range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..diagnostics import error
from ..ir import tile as T
from ..ir.types import DTYPES, FP8, PACKED, PARAM_DTYPES, is_float, is_int, promote
from . import ast
from .lower import packed_conversion

UNARY = ("abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf",
         "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus", "mish",
         "exp_nonpos")  # (exp of an argument <= 44: what the lowering proves of softmax's)
INT_OK = ("abs", "relu")
SCOPES = ("shared", "fragment", "local")
CONSTANTS = {"inf": math.inf, "pi": math.pi, "nan": math.nan, "True": True, "False": False}
_BIN = {"+": "add", "-": "sub", "*": "mul", "/": "div", "&": "and", "|": "or"}
_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
# NumPy's float type for an integer argument of a float function
_INT_TO_FLOAT = {"i8": "f16", "u8": "f16", "i16": "f32", "u16": "f32", "i32": "f64", "u32": "f64",
                 "i64": "f64", "i4": "f16", "u4": "f16", "bool": "f16"}


def _count(n: int, noun: str) -> str:
    plural = {"axis": "axes", "index": "indices"}.get(noun, noun + "s")
    return f"{n} {noun if n == 1 else plural}"


@dataclass
class TE:
    """A typed expression while building: `weak` literals take their type from context."""

    e: object
    weak: bool = False

    @property
    def dtype(self) -> str:
        return getattr(self.e, "dtype", "i64")


def _index_like(e) -> bool:
    """i64 arithmetic on variables and constants only (no memory reads): index math."""
    return getattr(e, "dtype", "i64") == "i64" and \
        not any(isinstance(x, T.Load) for x in T.walk_exprs(e))


class TileBuilder:
    def __init__(self, k: ast.Kernel, grid: ast.Grid, params: list, outputs: list, symbols: list):
        self.k, self.grid = k, grid
        self.params, self.outputs = list(params), list(outputs)
        self.globals = {p.name: p for p in self.params + self.outputs}
        self.inputs = {p.name for p in params}
        self.symbols = set(symbols)
        self.bufs: dict = {}  # name -> T.Alloc
        self.scalars: dict = {}  # scalar names (loop/block vars, lets) -> dtype
        self.written: set = set()
        self.locs: dict = {}  # buffer name -> Loc of its declaration
        self.names: set = set(self.globals) | self.symbols
        self.loop_vars: set = set()  # block and loop variables in scope
        self.par = 0  # how many parallel loops enclose the statement being built
        self.depth = 0  # how many loops and branches enclose it

    # ---- kernel
    def build(self) -> T.TileKernel:
        g = self.grid
        if g.call.func != "grid":
            raise error(f"a tile-level kernel opens with 'with grid(...)', not '{g.call.func}'",
                        g.loc)
        kw = {k: (v, loc) for k, v, loc in g.call.kwargs}
        for k_, (_, loc) in kw.items():
            if k_ != "threads":
                raise error(f"grid() takes 'threads=', not '{k_}='", loc)
        if "threads" not in kw:
            raise error("grid() needs 'threads=' (the threads of each block)", g.loc)
        threads = self.int_literal(kw["threads"][0], "threads", minimum=1)
        if not g.call.args or len(g.call.args) > 3:
            raise error("grid() takes 1 to 3 extents (x first)", g.loc)
        grid = tuple(self.index(a, "a grid extent").e for a in g.call.args)
        if len(g.vars) != len(grid):
            raise error(f"grid has {len(grid)} extent(s) but {len(g.vars)} block variable(s)",
                        g.vars[0][1] if g.vars else g.loc)
        for name, loc in g.vars:
            self.declare_name(name, loc)
            self.scalars[name] = "i64"
            self.loop_vars.add(name)
        body, swizzle = list(g.body), 0
        if body and isinstance(body[0], ast.TCall) and body[0].call.func == "swizzle":
            c = body.pop(0).call
            if len(c.args) != 1 or c.kwargs:
                raise error("swizzle() takes one panel width", c.loc)
            swizzle = self.int_literal(c.args[0], "the swizzle panel", minimum=1)
        stmts = self.stmts(body)
        params = [T.TensorDecl(p.name, p.type.dtype, p.type.shape,
                               "scalar" if p.is_scalar else "input") for p in self.k_params()]
        params += [T.TensorDecl(p.name, p.type.dtype, p.type.shape, "output")
                   for p in self.k_outputs()]
        return T.TileKernel(self.k.name, tuple(params), grid, tuple(n for n, _ in g.vars),
                            threads, tuple(stmts), "", swizzle, loc=g.loc)

    def k_params(self):
        return self.params

    def k_outputs(self):
        return self.outputs

    def index_vars(self) -> set:
        """Names that cannot be negative: block and loop variables, dimensions, and i64 locals
        computed from those."""
        return self.loop_vars | self.symbols

    def declare_name(self, name: str, loc):
        if name in self.names or name in CONSTANTS or name in UNARY or name in PARAM_DTYPES:
            raise error(f"'{name}' is already defined", loc)
        self.names.add(name)

    def int_literal(self, e, what: str, minimum: int = 0) -> int:
        if not (isinstance(e, ast.Number) and not e.is_float) or e.value < minimum:
            raise error(f"{what} must be an integer literal >= {minimum}", e.loc)
        return e.value

    # ---- statements
    def stmts(self, body) -> list:
        out = []
        for st in body:
            out += self.stmt(st)
        return out

    def nested(self, body, parallel: bool = False) -> list:
        """The statements of a loop or branch body: scalar names defined there end with it."""
        names, scalars = set(self.names), dict(self.scalars)
        self.depth += 1
        self.par += parallel
        try:
            return self.stmts(body)
        finally:
            self.depth -= 1
            self.par -= parallel
            self.names, self.scalars = names, scalars

    def stmt(self, st) -> list:
        if isinstance(st, ast.TAssign):
            return self.assign(st)
        if isinstance(st, ast.TStore):
            return [self.store(st)]
        if isinstance(st, ast.TCall):
            return self.call_stmt(st.call)
        if isinstance(st, ast.TFor):
            return [self.for_(st)]
        if isinstance(st, ast.TIf):
            cond = self.expr(st.cond)
            if cond.dtype != "bool":
                raise error("an 'if' condition must be a comparison", st.cond.loc)
            return [T.If(cond.e, tuple(self.nested(st.body)), tuple(self.nested(st.orelse)))]
        if isinstance(st, ast.Grid):
            raise error("grid blocks do not nest", st.loc)
        raise error("this statement is not allowed in a grid block", st.loc)

    def assign(self, st: ast.TAssign) -> list:
        v = st.value
        if isinstance(v, ast.Call) and v.func in SCOPES:
            if self.depth:
                raise error("tile buffers are declared at the top level of the grid block, "
                            "outside loops and branches", st.loc)
            self.declare_name(st.name, st.loc)
            if len(v.args) != 2 or v.kwargs or not isinstance(v.args[0], ast.Name) or \
               not isinstance(v.args[1], ast.List):
                raise error(f"{v.func}() takes a dtype and a shape list: "
                            f"{v.func}(f16, [128, 32])", v.loc)
            dtype = v.args[0].id
            if dtype not in DTYPES:
                raise error(f"unknown dtype '{dtype}'", v.args[0].loc)
            if not v.args[1].items:
                raise error("a buffer needs at least one axis", v.args[1].loc)
            shape = tuple(self.extent(d) for d in v.args[1].items)
            a = T.Alloc(st.name, v.func, dtype, shape)
            self.bufs[st.name] = a
            self.locs[st.name] = st.loc
            return [a]
        self.declare_name(st.name, st.loc)
        val = self.expr(v)
        val = self.strong(val)
        self.scalars[st.name] = val.dtype
        if val.dtype == "i64" and T.nonneg(val.e, self.index_vars()):
            self.loop_vars.add(st.name)  # index math over it divides as C does (int_division)
        return [T.Let(st.name, val.e)]

    def extent(self, e) -> object:
        """A buffer extent: a positive integer literal or an expression of dimensions."""
        if isinstance(e, ast.Number):
            if e.is_float or e.value < 1:
                raise error("a buffer extent must be a positive integer", e.loc)
            return T.iconst(e.value)
        x = self.index(e, "a buffer extent")
        if isinstance(x.e, T.Const) and x.e.value < 1:
            raise error("a buffer extent must be a positive integer", e.loc)
        if any(isinstance(v, T.Var) and v.name not in self.symbols for v in T.walk_exprs(x.e)):
            raise error("a buffer extent must be a constant or an expression of dimensions "
                        "(tiles have static sizes)", e.loc)
        return x.e

    def target(self, name: str, loc, writes: bool = True):
        """The buffer or tensor `name` refers to (for a write: not an input)."""
        if name in self.bufs:
            return self.bufs[name]
        if name in self.globals:
            p = self.globals[name]
            if p.is_scalar:
                raise error(f"'{name}' is a scalar, not a tensor", loc)
            if writes and name in self.inputs:
                raise error(f"cannot write to input '{name}'", loc)
            return p
        raise self.unknown(name, loc)

    def unknown(self, name: str, loc):
        import difflib
        near = difflib.get_close_matches(name, sorted(self.names | set(self.bufs)), n=1)
        return error(f"unknown name '{name}'", loc, f"did you mean '{near[0]}'?" if near else None)

    def rank(self, t) -> int:
        return len(t.shape) if isinstance(t, T.Alloc) else len(t.type.shape)

    def dtype_of(self, t) -> str:
        return t.dtype if isinstance(t, T.Alloc) else t.type.dtype

    def store(self, st: ast.TStore) -> T.Store:
        t = self.target(st.name, st.loc)
        if not self.par:
            raise error("element stores run inside a parallel loop (the threads of the block "
                        "share its iterations): for i, j in parallel(...)", st.loc)
        if len(st.index) != self.rank(t):
            raise error(f"'{st.name}' has {_count(self.rank(t), 'axis')} but "
                        f"{_count(len(st.index), 'index')}", st.loc)
        idx = tuple(self.index(i, "an index").e for i in st.index)
        v = self.strong(self.expr(st.value), self.dtype_of(t))
        self.written.add(st.name)
        return T.Store(st.name, idx, v.e, loc=st.loc)

    def call_stmt(self, c: ast.Call) -> list:
        f = c.func
        if self.par and f in ("clear", "fill", "copy", "gemm", "reduce", "swizzle", "gemv_mma",
                                   "gemv_mma_kmajor", "allreduce"):
            raise error(f"{f}() works on whole tiles: it runs at block level, not inside a "
                        "parallel loop", c.loc)
        if f in ("clear", "fill"):
            n = 1 if f == "clear" else 2
            if len(c.args) != n or c.kwargs or not isinstance(c.args[0], ast.Name):
                raise error(f"{f}() takes {'a buffer' if n == 1 else 'a buffer and a value'}",
                            c.loc)
            b = self.buffer(c.args[0])
            value = T.Const(0.0 if is_float(b.dtype) else 0, b.dtype) if f == "clear" else \
                self.strong(self.expr(c.args[1]), b.dtype).e
            self.written.add(b.name)
            return [T.Fill(b.name, value)]
        if f == "copy":
            return self.copy(c)
        if f == "gemm":
            return [self.gemm(c)]
        if f == "reduce":
            return [self.reduce(c)]
        if f == "allreduce":
            return [self.allreduce(c)]
        if f in ("gemv_mma", "gemv_mma_kmajor"):
            return [self.gemv_mma(c, f == "gemv_mma_kmajor")]
        if f == "swizzle":
            raise error("swizzle() must be the first statement of the grid block", c.loc)
        raise error(f"'{f}' is not a tile operation (clear, fill, copy, gemm, reduce, allreduce)",
                    c.loc)

    def buffer(self, e, read: bool = False) -> T.Alloc:
        if not isinstance(e, ast.Name):
            raise error("expected a buffer name", e.loc)
        if e.id not in self.bufs:
            if e.id in self.globals:
                raise error(f"'{e.id}' is a tensor in memory, not a tile buffer", e.loc)
            raise self.unknown(e.id, e.loc)
        if read and e.id not in self.written:
            raise error(f"'{e.id}' is read before anything writes it", e.loc)
        return self.bufs[e.id]

    def region(self, e, write: bool):
        """(name, offsets or None, kind) of a copy operand: `X[i0, j0]` is a window of tensor
        X; a bare name is a whole tile buffer."""
        if isinstance(e, ast.Subscript):
            t = self.target(e.name, e.loc, writes=write)
            if isinstance(t, T.Alloc):
                raise error(f"a window is taken of a tensor in memory; '{e.name}' is a "
                            f"{t.scope} buffer", e.loc)
            if len(e.index) != self.rank(t):
                raise error(f"'{e.name}' has {_count(self.rank(t), 'axis')} but the window gives "
                            f"{_count(len(e.index), 'offset')}", e.loc)
            return e.name, tuple(self.index(i, "a window offset").e for i in e.index), "global"
        if isinstance(e, ast.Name) and e.id in self.globals:
            raise error(f"copy a window of '{e.id}': {e.id}[i0, j0, ...]", e.loc)
        b = self.buffer(e, read=not write)
        return b.name, None, b.scope

    def copy(self, c: ast.Call) -> list:
        if len(c.args) != 2 or c.kwargs:
            raise error("copy() takes a source and a destination", c.loc)
        src, s_off, s_kind = self.region(c.args[0], write=False)
        dst, d_off, d_kind = self.region(c.args[1], write=True)
        if s_kind == "global" and d_kind == "global":
            raise error("copy() moves data between memory and a tile buffer, not between two "
                        "tensors", c.loc)
        buf = self.bufs[dst] if d_kind != "global" else self.bufs[src]
        if len(buf.shape) < 2 and (s_kind == "global" or d_kind == "global"):
            raise error(f"copy() windows are 2-D tiles; '{buf.name}' has "
                        f"{_count(len(buf.shape), 'axis')}",
                        c.loc)
        self.written.add(dst)
        if s_kind == "global" and d_kind == "shared":
            if len(buf.shape) != 2:
                raise error(f"a copied tile has 2 axes; '{buf.name}' has "
                            f"{_count(len(buf.shape), 'axis')}", c.loc)
            return [T.Copy(T.Region(src, s_off), T.Region(dst), loc=c.loc)]
        return [self.copy_loop(src, s_off, dst, d_off, buf, c.loc)]

    def copy_loop(self, src, s_off, dst, d_off, buf, loc=None) -> T.For:
        """A copy that is not global -> shared, as the parallel loop it means: element by
        element over the tile, reading zeros (writing nothing) outside the tensor."""
        i, j = self.fresh("i"), self.fresh("j")
        rows, cols = buf.shape[-2:]
        lead = tuple(T.iconst(0) for _ in buf.shape[:-2])
        vi, vj = T.Var(i), T.Var(j)
        if s_off is not None:  # memory -> buffer
            p = self.globals[src]
            at = s_off[:-2] + (T.iadd(s_off[-2], vi), T.iadd(s_off[-1], vj))
            guard = T.land(T.ilt(at[-2], T.dim_to_expr(p.type.shape[-2])),
                           T.ilt(at[-1], T.dim_to_expr(p.type.shape[-1])))
            val = T.Load(src, at, p.type.dtype)
            if p.type.dtype != buf.dtype:
                val = T.Cast(val, buf.dtype)
            zero = T.Const(0.0 if is_float(buf.dtype) else 0, buf.dtype)
            body = (T.If(guard, (T.Store(dst, lead + (vi, vj), val),),
                         (T.Store(dst, lead + (vi, vj), zero),)),)
        elif d_off is not None:  # buffer -> memory: the part inside the tensor
            p = self.globals[dst]
            at = d_off[:-2] + (T.iadd(d_off[-2], vi), T.iadd(d_off[-1], vj))
            guard = T.land(T.ilt(at[-2], T.dim_to_expr(p.type.shape[-2])),
                           T.ilt(at[-1], T.dim_to_expr(p.type.shape[-1])))
            val = T.Load(src, lead + (vi, vj), buf.dtype)
            if p.type.dtype != buf.dtype:
                val = T.Cast(val, p.type.dtype)
            body = (T.If(guard, (T.Store(dst, at, val),)),)
        else:  # buffer -> buffer
            s, d = self.bufs[src], self.bufs[dst]
            if s.shape[-2:] != d.shape[-2:]:
                raise error(f"copy() between tiles of different shapes ({src} and {dst})",
                            self.grid.loc)
            val = T.Load(src, lead + (vi, vj), s.dtype)
            if s.dtype != d.dtype:
                val = T.Cast(val, d.dtype)
            body = (T.Store(dst, lead + (vi, vj), val),)
        return T.For((i, j), (rows, cols), "parallel", body, loc=loc)

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.names or name in self.bufs or name in self.scalars:
            name, n = f"{base}{n}", n + 1
        self.names.add(name)
        return name

    def gemm(self, c: ast.Call) -> T.Gemm:
        if len(c.args) != 3:
            raise error("gemm() takes A, B and the accumulator C (C += A @ B)", c.loc)
        kw, tf32 = {}, None
        for k_, v, loc in c.kwargs:
            if k_ == "precision":  # what the lowered dumps print: precision=tf32
                if not (isinstance(v, ast.Name) and v.id in ("tf32", "ieee")):
                    raise error("'precision' is tf32 or ieee", v.loc)
                tf32 = (v.id == "tf32", v.loc)
                continue
            if k_ not in ("transpose_a", "transpose_b"):
                raise error(f"gemm() takes 'transpose_a=', 'transpose_b=' and 'precision=', "
                            f"not '{k_}='", loc)
            if not (isinstance(v, ast.Name) and v.id in ("True", "False")):
                raise error(f"'{k_}' is True or False", v.loc)
            kw[k_] = v.id == "True"
        a, b = self.buffer(c.args[0], read=True), self.buffer(c.args[1], read=True)
        acc = self.buffer(c.args[2], read=True)
        ta, tb = kw.get("transpose_a", False), kw.get("transpose_b", False)
        if tf32 and tf32[0] and not a.dtype == b.dtype == acc.dtype == "f32":
            raise error("precision=tf32 rounds f32 operands into an f32 accumulator; these are "
                        f"{a.dtype}, {b.dtype} and {acc.dtype}", tf32[1])
        if acc.scope == "shared" or b.scope != "shared":
            raise error("gemm() multiplies a shared (or fragment) A by a shared B into a "
                        "fragment accumulator", c.loc)
        if a.dtype != b.dtype and not {a.dtype, b.dtype} <= set(FP8):
            raise error(f"gemm() multiplies tiles of one dtype: '{a.name}' is {a.dtype}, "
                        f"'{b.name}' {b.dtype}", c.args[1].loc,
                        "convert one of them in a parallel loop (fp8e4m3 and fp8e5m2 mix)")
        if a.dtype == "bool":
            raise error("gemm() multiplies numbers, not bool tiles", c.args[0].loc)
        accs = ("f32", "f64") if is_float(a.dtype) else ("i32", "i64")
        if acc.dtype not in accs:
            raise error(f"gemm() accumulates {a.dtype} products in {' or '.join(accs)}, not "
                        f"{acc.dtype}", c.args[2].loc)
        for buf, e in ((a, c.args[0]), (b, c.args[1]), (acc, c.args[2])):
            if len(buf.shape) != 2:
                raise error(f"'{buf.name}' must be a 2-D tile", e.loc)
        m_, k1 = (a.shape[1], a.shape[0]) if ta else (a.shape[0], a.shape[1])
        k2, n_ = (b.shape[1], b.shape[0]) if tb else (b.shape[0], b.shape[1])
        if k1 != k2:
            raise error(f"gemm(): A's K extent ({T.fmt(k1)}) differs from B's ({T.fmt(k2)})",
                        c.args[1].loc)
        if acc.shape != (m_, n_):
            raise error(f"gemm(): the accumulator is [{', '.join(map(T.fmt, acc.shape))}] but A @ B "
                        f"is [{T.fmt(m_)}, {T.fmt(n_)}]", c.args[2].loc)
        self.written.add(acc.name)
        return T.Gemm(a.name, b.name, acc.name, ta, tb, tf32=bool(tf32 and tf32[0]))

    def gemv_mma(self, c: ast.Call, kmajor: bool = False) -> T.GemvMma:
        """gemv_mma(dst, A, q, s, zero=Z, group=G, row=.., first=.., rows=.., col0=..[, m=..,
        mr=MR]): what the CUDA tiling of a 4-bit GEMV writes (ir/tile.py GemvMma says what it
        computes; m of A's rows from `row`, at most the literal MR, 2 to 16; neither: one row);
        gemv_mma_kmajor(...) the same of weights packed along K (q [N, K], s [N, K / G])."""
        if len(c.args) != 4:
            raise error(f"{c.func}() takes the partial sums' buffer, A, the 4-bit weights and "
                        "their scales", c.loc)
        dst = self.buffer(c.args[0])
        names = []
        for e in c.args[1:]:
            if not (isinstance(e, ast.Name) and e.id in self.globals):
                raise error("expected a tensor in memory", e.loc)
            names.append(e.id)
        a, q, s = (self.globals[n] for n in names)
        kw = {}
        for k_, v, loc in c.kwargs:
            if k_ == "zero":  # an integer literal, possibly negative
                neg = isinstance(v, ast.Unary) and v.op == "-"
                kw[k_] = -self.int_literal(v.operand, k_) if neg else self.int_literal(v, k_)
            elif k_ == "group":
                kw[k_] = self.int_literal(v, k_, minimum=16)
            elif k_ in ("row", "first", "rows", "col0", "m"):
                kw[k_] = self.index(v, f"'{k_}'").e
            elif k_ == "mr":
                kw[k_] = self.int_literal(v, k_)
                if not 2 <= kw[k_] <= 16:
                    raise error(f"{c.func}() takes mr= from 2 to 16 rows of A (one row: neither "
                                f"m= nor mr=), not {kw[k_]}", loc)
            else:
                raise error(f"{c.func}() takes zero=, group=, row=, first=, rows=, col0=, m= and "
                            f"mr=, not '{k_}='", loc)
        missing = [k_ for k_ in ("zero", "group", "row", "first", "rows", "col0") if k_ not in kw]
        if missing:
            raise error(f"{c.func}() needs {', '.join(k_ + '=' for k_ in missing)}", c.loc)
        if kw["group"] % 16:
            raise error(f"{c.func}()'s group is a multiple of 16", c.loc)
        if ("m" in kw) != ("mr" in kw):
            raise error(f"{c.func}() takes m= (A's rows) with mr= (their bound), or neither",
                        c.loc)
        if dst.scope != "shared" or dst.dtype != "f32" or len(dst.shape) != 2:
            raise error(f"{c.func}() writes a 2-D shared f32 buffer; '{dst.name}' is not one",
                        c.args[0].loc)
        mr, rows0 = kw.get("mr", 1), dst.shape[0]
        if isinstance(rows0, T.Const) and rows0.value % mr:
            raise error(f"{c.func}()'s buffer holds mr={mr} rows for each warp: its {rows0.value} "
                        "rows are no multiple of that", c.args[0].loc)
        shapes = [self.rank(x) for x in (a, q, s)]
        if shapes != [2, 2, 2] or q.type.dtype not in ("u4", "i4") or \
                a.type.dtype not in ("f16", "bf16", "f32") or s.type.dtype != a.type.dtype:
            raise error(f"{c.func}() takes a 2-D f16, bf16 or f32 A, 2-D u4 or i4 weights and 2-D "
                        "scales of A's dtype", c.loc)
        self.written.add(dst.name)
        return T.GemvMma(*names, dst.name, kw["zero"], kw["group"],
                         (kw["row"], kw["first"], kw["rows"], kw["col0"], kw.get("m", T.iconst(1))),
                         kmajor, kw.get("mr", 1))

    def allreduce(self, c: ast.Call) -> T.Allreduce:
        """`allreduce(op, buf)`: the values a parallel loop's reduction stores accumulated into
        fragment `buf` (each thread holds a part) combined, so that every thread holds them."""
        if len(c.args) != 2 or c.kwargs:
            raise error("allreduce() takes an operation (sum, max, min) and a fragment", c.loc)
        op = c.args[0]
        if not (isinstance(op, ast.Name) and op.id in ("sum", "max", "min")):
            raise error("the reduction is sum, max or min", op.loc)
        b = self.buffer(c.args[1], read=True)
        if b.scope == "shared" or len(b.shape) != 1:
            raise error(f"allreduce() combines a 1-D fragment; '{b.name}' is a "
                        f"{len(b.shape)}-D {b.scope} buffer", c.args[1].loc)
        return T.Allreduce(op.id, b.name, loc=c.loc)

    def reduce(self, c: ast.Call) -> T.Reduce:
        if len(c.args) != 3:
            raise error("reduce() takes an operation (sum, max, min), a source and a destination",
                        c.loc)
        op = c.args[0]
        if not (isinstance(op, ast.Name) and op.id in ("sum", "max", "min")):
            raise error("the reduction is sum, max or min", op.loc)
        src, dst = self.buffer(c.args[1], read=True), self.buffer(c.args[2])
        axis, axis_loc = 1, c.loc
        for k_, v, loc in c.kwargs:
            if k_ != "axis":
                raise error(f"reduce() takes 'axis=', not '{k_}='", loc)
            axis, axis_loc = self.int_literal(v, "axis"), v.loc
        if len(src.shape) != 2:
            raise error(f"reduce() reduces a 2-D tile; '{src.name}' has "
                        f"{_count(len(src.shape), 'axis')}",
                        c.args[1].loc)
        if axis not in (0, 1):
            raise error(f"axis {axis} is out of range for the 2-D tile '{src.name}'", axis_loc)
        if axis != 1:
            raise error("reduce() runs along the rows (axis=1); axis=0 is not supported yet",
                        axis_loc, "reduce the transposed tile, or write the loop by hand")
        if dst.shape != src.shape[:1]:
            raise error(f"'{dst.name}' must have shape [{T.fmt(src.shape[0])}] (one value per row)",
                        c.args[2].loc)
        self.written.add(dst.name)
        return T.Reduce(op.id, src.name, dst.name, axis)

    def for_(self, st: ast.TFor) -> T.For:
        it = st.iter
        kind = it.func
        if kind not in ("range", "parallel", "pipelined"):
            raise error(f"a loop runs over range(), parallel() or pipelined(), not '{kind}'",
                        it.loc)
        stages = 1
        for k_, v, loc in it.kwargs:
            if kind != "pipelined" or k_ != "stages":
                raise error(f"{kind}() takes no '{k_}='", loc)
            stages = self.int_literal(v, "stages", minimum=1)
        if not it.args:
            raise error(f"{kind}() needs an extent", it.loc)
        if kind != "parallel" and len(it.args) != 1:
            raise error(f"{kind}() takes one extent", it.loc)
        if len(st.vars) != len(it.args):
            raise error(f"{len(it.args)} extent(s) but {len(st.vars)} loop variable(s)",
                        st.vars[0][1])
        if self.par:
            raise error("a parallel loop's body holds element stores, scalar names and if/else; "
                        "loops do not nest inside it (list every axis in one parallel())", st.loc)
        if kind == "pipelined" and self.depth:
            raise error("pipelined() loops run at the top level of the grid block", st.loc)
        extents = tuple(self.index(a, "a loop extent").e for a in it.args)
        for a, e in zip(it.args, extents):
            if isinstance(e, T.Const) and e.value < 0:
                raise error(f"a loop extent cannot be negative (got {e.value})", a.loc)
            if isinstance(e, T.Const) and e.value == 0 and kind == "parallel":
                raise error("a parallel loop's extents are its tile's shape: at least 1 (got 0)",
                            a.loc)
        names, scalars, loop_vars = set(self.names), dict(self.scalars), set(self.loop_vars)
        for name, loc in st.vars:
            self.declare_name(name, loc)
            self.scalars[name] = "i64"
            self.loop_vars.add(name)
        body = self.nested(st.body, parallel=kind == "parallel")
        # loop variables are scoped to their loop
        self.names, self.scalars, self.loop_vars = names, scalars, loop_vars
        return T.For(tuple(n for n, _ in st.vars), extents, kind, tuple(body), stages,
                     loc=st.loc)

    # ---- expressions
    def index(self, e, what: str) -> TE:
        x = self.strong(self.expr(e), "i64")
        if x.dtype != "i64" or not _index_like(x.e):
            raise error(f"{what} must be an integer expression of dimensions and loop indices",
                        e.loc)
        return x

    def strong(self, x: TE, dtype: str | None = None) -> TE:
        """A weak literal typed by context (`dtype`), or by its natural type."""
        if not x.weak:
            return x
        c = x.e
        if isinstance(c, T.Const):
            dt = dtype if dtype is not None else c.dtype
            if is_int(dt) and isinstance(c.value, float):
                if not c.value.is_integer():
                    dt = "f64" if dtype is not None and is_int(dtype) else dt
                else:
                    return TE(T.Const(int(c.value), dt))
            return TE(T.Const(c.value, dt))
        return TE(x.e)

    def unify(self, a: TE, b: TE, loc) -> tuple:
        """Both operands in one dtype (NumPy promotion; a weak literal takes the other's)."""
        if a.weak and not b.weak:
            dt = b.dtype
            if isinstance(a.e, T.Const) and isinstance(a.e.value, float) and is_int(dt):
                dt = "f64" if not isinstance(a.e.value, float) or not a.e.value.is_integer() else dt
            return self.cast(self.strong(a, dt), dt), self.cast(b, dt)
        if b.weak and not a.weak:
            dt = a.dtype
            if isinstance(b.e, T.Const) and isinstance(b.e.value, float) and is_int(dt) and \
               not b.e.value.is_integer():
                dt = "f64"
            return self.cast(a, dt), self.cast(self.strong(b, dt), dt)
        if a.weak and b.weak:
            dt = "f32" if is_float(a.dtype) or is_float(b.dtype) else "i64"
            return self.strong(a, dt), self.strong(b, dt)
        dt = promote(a.dtype, b.dtype)
        return self.cast(a, dt), self.cast(b, dt)

    @staticmethod
    def cast(x: TE, dtype: str) -> TE:
        if x.dtype == dtype:
            return TE(x.e)
        if isinstance(x.e, T.Const):
            return TE(T.Const(x.e.value, dtype))
        return TE(T.Cast(x.e, dtype))

    def expr(self, e) -> TE:
        m = getattr(self, "ex_" + type(e).__name__, None)
        if m is None:
            raise error("not allowed in an expression here", e.loc)
        return m(e)

    def ex_Number(self, e: ast.Number) -> TE:
        return TE(T.Const(e.value, "f32" if e.is_float else "i64"), weak=True)

    def ex_Name(self, e: ast.Name) -> TE:
        n = e.id
        if n in self.scalars:
            return TE(T.Var(n, self.scalars[n]))
        if n in self.symbols:
            return TE(T.Var(n, "i64"))
        if n in self.globals:
            p = self.globals[n]
            if p.is_scalar:
                return TE(T.Var(n, p.type.dtype))
            raise error(f"'{n}' is a tensor: index it, {n}[...]", e.loc)
        if n in self.bufs:
            raise error(f"'{n}' is a tile buffer: index it, {n}[...]", e.loc)
        if n in CONSTANTS:
            v = CONSTANTS[n]
            if isinstance(v, bool):
                return TE(T.Const(v, "bool"))
            return TE(T.Const(v, "f32"), weak=True)
        raise self.unknown(n, e.loc)

    def ex_Subscript(self, e: ast.Subscript) -> TE:
        if e.name in self.bufs:
            b = self.bufs[e.name]
            if e.name not in self.written:
                raise error(f"'{e.name}' is read before anything writes it", e.loc)
            rank, dtype = len(b.shape), b.dtype
            if b.scope != "shared" and not self.par:
                raise error(f"'{e.name}' is a {b.scope}, spread over the block's threads: read "
                            "its elements inside a parallel loop", e.loc)
        elif e.name in self.globals and not self.globals[e.name].is_scalar:
            p = self.globals[e.name]
            rank, dtype = len(p.type.shape), p.type.dtype
        else:
            raise self.unknown(e.name, e.loc) if e.name not in self.globals else \
                error(f"'{e.name}' is a scalar: it takes no index", e.loc)
        if len(e.index) != rank:
            raise error(f"'{e.name}' has {_count(rank, 'axis')} but {_count(len(e.index), 'index')}",
                        e.loc)
        return TE(T.Load(e.name, tuple(self.index(i, "an index").e for i in e.index), dtype))

    def ex_Unary(self, e: ast.Unary) -> TE:
        x = self.expr(e.operand)
        if isinstance(x.e, T.Const) and e.op == "-" and x.dtype != "bool":
            return TE(T.Const(-x.e.value, x.e.dtype), x.weak)
        x = self.strong(x)
        if e.op == "-":
            return TE(T.Unary("neg", x.e, x.dtype))
        if is_float(x.dtype):
            raise error("'~' needs a bool or integer operand", e.loc)
        return TE(T.Unary("not", x.e, x.dtype))

    def ex_BinOp(self, e: ast.BinOp) -> TE:
        if e.op == "@":
            raise error("'@' multiplies tensors; in a tile kernel use gemm()", e.loc)
        a, b = self.expr(e.left), self.expr(e.right)
        if e.op == "**":
            if not (isinstance(b.e, T.Const) and b.weak):
                raise error("'**' needs a constant exponent", e.right.loc)
            a = self.strong(a)
            dt = a.dtype if is_float(a.dtype) or (isinstance(b.e.value, int) and b.e.value >= 0) \
                else "f64"
            return TE(T.Binary("pow", self.cast(a, dt).e, None, dt, b.e.value))
        if e.op in ("//", "%"):
            a, b = self.unify(a, b, e.loc)
            if is_float(a.dtype):
                raise error(f"'{e.op}' needs integer operands", e.loc)
            if isinstance(b.e, T.Const) and b.e.value == 0:
                raise error("division by zero", e.right.loc)
            fn = "floordiv" if e.op == "//" else "mod"
            if a.dtype == "i64":
                return TE(T.int_division(fn, a.e, b.e, self.index_vars(), self.symbols))
            return TE(T.Binary(fn, a.e, b.e, a.dtype))
        if e.op == "/":
            a, b = self.unify(a, b, e.loc)
            if not is_float(a.dtype):
                a, b = self.cast(a, "f64"), self.cast(b, "f64")
            return TE(T.Binary("div", a.e, b.e, a.dtype))
        weak = a.weak and b.weak
        a, b = self.unify(a, b, e.loc)
        if e.op in ("&", "|") and is_float(a.dtype):
            raise error(f"'{e.op}' needs bool or integer operands", e.loc)
        return TE(T.Binary(_BIN[e.op], a.e, b.e, a.dtype), weak)

    def ex_Compare(self, e: ast.Compare) -> TE:
        a, b = self.unify(self.expr(e.left), self.expr(e.right), e.loc)
        return TE(T.Compare(_CMP[e.op], a.e, b.e))

    def ex_Call(self, e: ast.Call) -> TE:
        f = e.func
        if e.kwargs:
            raise error(f"{f}() takes no keyword arguments here", e.kwargs[0][2])

        def args(n):
            if len(e.args) != n:
                raise error(f"{f}() takes {n} argument(s)", e.loc)
            return [self.expr(a) for a in e.args]
        if f in PARAM_DTYPES:
            if f in PACKED:  # (as at the tensor level)
                raise packed_conversion(f, e.loc)
            (x,) = args(1)
            x = self.strong(x)
            return TE(T.Cast(x.e, f))
        if f in UNARY:
            (x,) = args(1)
            x = self.strong(x)
            dt = x.dtype
            if f not in INT_OK and not is_float(dt):
                dt = _INT_TO_FLOAT.get(dt, "f64")
                x = self.cast(x, dt)
            return TE(T.Unary(f, x.e, dt))
        if f in ("maximum", "minimum"):
            a, b = args(2)
            a, b = self.unify(a, b, e.loc)
            return TE(T.Binary(f, a.e, b.e, a.dtype))
        if f == "clamp":  # maximum then minimum, as at the tensor level
            x, lo, hi = args(3)
            x, lo = self.unify(x, lo, e.loc)
            t, hi = self.unify(TE(T.Binary("maximum", x.e, lo.e, x.dtype)), hi, e.loc)
            return TE(T.Binary("minimum", t.e, hi.e, t.dtype))
        if f == "leaky_relu":
            x, slope = args(2)
            x = self.strong(x)
            if not is_float(x.dtype):
                dt = _INT_TO_FLOAT.get(x.dtype, "f64")
                x = self.cast(x, dt)
            s = self.cast(self.strong(slope, x.dtype), x.dtype)
            zero = T.Const(0.0, x.dtype)
            return TE(T.Select(T.Compare("ge", x.e, zero), x.e,
                               T.Binary("mul", x.e, s.e, x.dtype), x.dtype))
        if f in ("min", "max", "cdiv"):
            a, b = args(2)
            a, b = self.strong(a, "i64"), self.strong(b, "i64")
            if a.dtype != "i64" or b.dtype != "i64":
                raise error(f"{f}() takes index expressions", e.loc)
            if f == "cdiv" and isinstance(b.e, T.Const) and b.e.value == 0:
                raise error("division by zero", e.args[1].loc)
            return TE(T.Binary(f, a.e, b.e, "i64"))
        if f == "where":
            c, a, b = args(3)
            if c.dtype != "bool":
                raise error("where() needs a bool condition", e.args[0].loc)
            a, b = self.unify(a, b, e.loc)
            return TE(T.Select(c.e, a.e, b.e, a.dtype))
        if f == "fma":  # a product's accumulation: a * b + c, rounded once where the target fuses
            a, b, c = args(3)
            a, b = self.unify(a, b, e.loc)
            a, c = self.unify(a, c, e.loc)
            if not is_float(a.dtype):
                raise error("fma() takes float operands", e.loc)
            return TE(T.Fma(a.e, self.cast(b, a.dtype).e, c.e, a.dtype))
        raise error(f"unknown function '{f}'", e.loc)


def build_tile_kernel(k: ast.Kernel, grid: ast.Grid, params, outputs, symbols) -> tuple:
    """(TileKernel, {buffer name: Loc}) of a tile-level kernel."""
    b = TileBuilder(k, grid, params, outputs, symbols)
    kernel = b.build()
    for p in outputs:
        if p.name not in b.written:
            raise error(f"output '{p.name}' is never written", p.loc)
    return kernel, b.locs
