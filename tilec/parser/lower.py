"""Semantic analysis: ast.Kernel -> Graph IR (names, dtypes, shapes, broadcasting, dims).

Every user mistake is reported here with the location of the offending expression.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from ..diagnostics import Loc, error
from ..ir.graph import AssumeDecl, Graph, Module, Op, ParamDecl, Schedule, attrs
from ..ir.types import (
    DTYPES,
    PACKED,
    PARAM_DTYPES,
    Dim,
    TensorType,
    broadcast_shapes,
    is_float,
    is_int,
    promote,
)
from . import ast

UNARY_FNS = ("abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf",
             "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus", "mish")
INT_OK_FNS = ("abs", "relu")  # keep integer dtypes; every other function computes in floats
REDUCTIONS = ("sum", "max", "min", "mean", "logsumexp", "softmax")
OTHER_FNS = ("maximum", "minimum", "where", "clamp", "leaky_relu", "index", "dequant", "transpose")
KNOWN_FUNCTIONS = UNARY_FNS + REDUCTIONS + OTHER_FNS + PARAM_DTYPES
CONSTANTS = {"inf": math.inf, "pi": math.pi}
INT_MIN = {"i4": -8, "u4": 0, "i8": -128, "u8": 0, "i16": -2**15, "i32": -2**31, "i64": -2**63}
INT_MAX = {"i4": 7, "u4": 15, "i8": 127, "u8": 255, "i16": 2**15 - 1, "i32": 2**31 - 1,
           "i64": 2**63 - 1}
_BIN = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod", "**": "pow",
        "&": "and", "|": "or"}
_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}



def packed_conversion(dtype: str, loc):
    """The error for a conversion to a 4-bit dtype (at either level of the language)."""
    return error(f"cannot convert to {dtype}; packed 4-bit values only come from inputs", loc)

@dataclass(frozen=True)
class Val:
    """A value during building. `weak`: a Python-scalar-like literal or dim, typed by context."""

    id: int
    type: TensorType
    weak: bool = False
    const: int | float | None = None  # Python value of literal constants
    dim: Dim | None = None  # the dimension expression of dim-valued scalars
    loc: Loc | None = None  # where a literal was written


class KernelBuilder:
    def __init__(self, k: ast.Kernel):
        self.k = k
        self.ops: list[Op] = []
        self.env: dict[str, Val] = {}
        self.stmt = -1
        self.symbols: list[str] = []
        self.bound: set[str] = set()

    # ---- op creation
    def emit(self, kind, args, type_, loc, **kw) -> Val:
        op = Op(len(self.ops), kind, tuple(a.id for a in args), type_, attrs(**kw), loc, self.stmt)
        self.ops.append(op)
        return Val(op.id, type_)

    def const(self, value, dtype: str, loc) -> Val:
        if is_int(dtype) and (
                (isinstance(value, float) and (math.isinf(value) or math.isnan(value))) or
                (not isinstance(value, float) and not INT_MIN[dtype] <= value <= INT_MAX[dtype])):
            raise error(f"{value} cannot be represented in {dtype}", loc)
        if dtype == "bool":
            value = bool(value)
        elif is_int(dtype):
            value = int(value)
        else:
            value = float(value)
        return self.emit("const", (), TensorType(dtype, ()), loc, value=value)

    def strong(self, v: Val, dtype: str | None, loc) -> Val:
        """Give a weak value a concrete dtype (the other operand's, or its natural one)."""
        if not v.weak:
            return v
        if dtype is None:
            dtype = "f32" if is_float(v.type.dtype) else "i64"
        if v.const is not None:
            return self.const(v.const, dtype, v.loc or loc)
        return self.cast(v, dtype, loc)

    def cast(self, v: Val, dtype: str, loc) -> Val:
        if v.type.dtype == dtype:
            return Val(v.id, v.type)
        if v.const is not None:
            return self.const(v.const, dtype, loc)
        return self.emit("cast", (v,), v.type.with_dtype(dtype), loc)

    # ---- kernel
    def build(self) -> Graph:
        k = self.k
        grids = [s for s in k.body if isinstance(s, ast.Grid)]
        self.tile_level = bool(grids)
        params, declared = [], set()
        for p in k.params:  # `R: dim` declares a dimension that no shape names as an axis
            if p.dtype == "dim" and p.dims is None:
                # (one an earlier shape used inside an expression, `X: f32[B * S, K]`, keeps its
                # place among the dimensions)
                if p.name in self.bound or p.name in declared:
                    raise error(f"dimension '{p.name}' is declared twice", p.loc)
                declared.add(p.name)
                if p.name not in self.symbols:
                    self.symbols.append(p.name)
                self.bound.add(p.name)
            else:
                params.append(self.declare(p, is_input=True))
        outs = [self.declare(p, is_input=False) for p in k.outputs]
        names = set()
        for p in list(k.params) + list(k.outputs):
            if p.name in names:
                raise error(f"'{p.name}' is declared twice", p.loc)
            names.add(p.name)
        for p in list(k.params) + list(k.outputs):
            if p.name in self.symbols and not (p.dtype == "dim" and p.dims is None):
                raise error(f"'{p.name}' is both a parameter and a dimension", p.loc)
        self.check_bound(k.outputs)
        if grids:
            return self.build_tile(grids, params, outs)
        for p in params + outs:
            if p.in_memory:
                raise error(f"'{p.name}' has an empty shape: rank-0 tensors in memory are for "
                            f"tile-level kernels (a scalar input is written '{p.name}: "
                            f"{p.type.dtype}')", p.loc)
        for p in params:
            if p.is_scalar:
                self.env[p.name] = self.emit("input", (), p.type, p.loc, name=p.name)
            else:
                self.env[p.name] = self.emit("input", (), p.type, p.loc, name=p.name)
        out_names = {p.name: p for p in outs}
        results: dict[str, int] = {}
        assumes = []
        for i, st in enumerate(k.body):
            self.stmt = i
            if isinstance(st, ast.Assume):
                assumes.append(AssumeDecl(self.dim_cond(st.cond), _src(st.cond), st.loc))
                continue
            if st.name in self.env and st.name in {p.name for p in params}:
                raise error(f"cannot assign to input '{st.name}'", st.loc)
            if st.name in self.symbols:
                raise error(f"cannot assign to dimension '{st.name}'", st.loc)
            if st.name in CONSTANTS or st.name in KNOWN_FUNCTIONS:
                raise error(f"cannot assign to '{st.name}': it names a built-in", st.loc)
            v = self.expr(st.value)
            if st.name in out_names:
                if st.name in results:
                    raise error(f"output '{st.name}' is assigned twice", st.loc)
                decl = out_names[st.name]
                if v.type.shape != decl.type.shape:
                    raise error(f"output '{st.name}' is declared {decl.type} but the value has shape "
                                f"{_shape(v.type.shape)}", st.value.loc)
                if v.type.dtype == "bool" and decl.type.dtype != "bool":
                    v = self.cast(v, "i8", st.value.loc)
                v = self.cast(self.strong(v, decl.type.dtype, st.value.loc), decl.type.dtype,
                              st.value.loc)
                if self.ops[v.id].kind == "input" or v.id in results.values():
                    # an output must own its value: `Y = X` copies
                    v = self.emit("copy", (v,), v.type, st.value.loc)
                results[st.name] = v.id
            self.env[st.name] = Val(v.id, v.type, v.weak, v.const, v.dim)
        for p in outs:
            if p.name not in results:
                raise error(f"output '{p.name}' is never assigned", _decl_loc(k, p.name))
        if not any(True for _ in k.body if isinstance(_, ast.Assign)):
            raise error("a kernel needs at least one assignment", k.loc)
        return Graph(k.name, k.doc, tuple(params), tuple(outs), tuple(self.symbols), tuple(assumes),
                     tuple(self.ops), tuple(results[p.name] for p in outs), k.loc)

    def build_tile(self, grids, params, outs) -> Graph:
        """A tile-level kernel: its signature here, its body by tile_level.TileBuilder."""
        from .tile_level import build_tile_kernel

        k = self.k
        if len(grids) > 1:
            raise error("a tile-level kernel has one grid block", grids[1].loc)
        assumes = []
        for st in k.body:
            if isinstance(st, ast.Assign):
                raise error("a kernel is written at the tensor level or inside a grid block, not "
                            "both", st.loc)
            if isinstance(st, ast.Assume):
                assumes.append(AssumeDecl(self.dim_cond(st.cond), _src(st.cond), st.loc))
        kernel, locs = build_tile_kernel(k, grids[0], params, outs, self.symbols)
        return Graph(k.name, k.doc, tuple(params), tuple(outs), tuple(self.symbols), tuple(assumes),
                     (), (), k.loc, kernel, locs)

    def declare(self, p: ast.Param, is_input: bool) -> ParamDecl:
        if p.dtype not in DTYPES:
            near = difflib.get_close_matches(p.dtype, PARAM_DTYPES, n=1)
            raise error(f"unknown dtype '{p.dtype}'", p.dtype_loc,
                        f"did you mean '{near[0]}'?" if near else
                        "dtypes are " + " ".join(PARAM_DTYPES))
        if p.dtype == "bool" and (p.dims is None or not self.tile_level):
            # (tile-level kernels take bool tensors: tilec's dumps pass bool workspaces)
            raise error("bool is not a parameter type; use u8 or i8", p.dtype_loc)
        if p.dims is None:
            if not is_input:
                raise error(f"output '{p.name}' needs a shape", p.loc)
            if p.dtype in PACKED:
                raise error(f"a scalar cannot be {p.dtype}", p.dtype_loc)
            return ParamDecl(p.name, TensorType(p.dtype, ()), p.loc)
        if not is_input and p.dtype in PACKED:
            raise error(f"output '{p.name}' cannot be {p.dtype}: packed 4-bit values only come from "
                        "inputs", p.dtype_loc, "an output of u8 or i8 holds the same values")
        if not p.dims:  # `x: f32[]`: a rank-0 tensor in memory
            return ParamDecl(p.name, TensorType(p.dtype, ()), p.loc, in_memory=True)
        dims = tuple(self.dim_expr(d, bind=is_input) for d in p.dims)
        return ParamDecl(p.name, TensorType(p.dtype, dims), p.loc)

    def check_bound(self, outputs):
        for p in outputs:
            for d in p.dims or ():
                for name, loc in _dim_names(d):
                    if name not in self.bound:
                        raise error(f"dimension '{name}' is not bound by any input's shape", loc)
        # inputs whose dims use unbound symbols inside expressions (e.g. f16[K // 128] with no K)
        for p in self.k.params:
            for d in p.dims or ():
                for name, loc in _dim_names(d):
                    if name not in self.bound:
                        raise error(f"dimension '{name}' is not bound by any input's shape", loc,
                                    f"give some input a plain '{name}' axis")

    def dim_expr(self, e, bind: bool) -> Dim:
        if isinstance(e, ast.Name):
            if e.id in CONSTANTS:
                raise error(f"'{e.id}' is not a dimension", e.loc)
            if e.id not in self.symbols:
                self.symbols.append(e.id)
            if bind:
                self.bound.add(e.id)
            return Dim.sym(e.id)
        if isinstance(e, ast.Number) and not e.is_float:
            if e.value < 1:
                raise error("a dimension must be at least 1", e.loc)
            return Dim.const(e.value)
        if isinstance(e, ast.BinOp) and e.op in ("+", "-", "*", "//", "%"):
            if e.op in ("//", "%") and isinstance(e.right, ast.Number) and e.right.value == 0:
                raise error("division by zero in a dimension", e.right.loc)
            a, b = self.dim_expr(e.left, False), self.dim_expr(e.right, False)
            return Dim.bin(_BIN[e.op], a, b)
        if isinstance(e, ast.Call) and e.func in ("cdiv", "min", "max"):
            if len(e.args) != 2 or e.kwargs:
                raise error(f"{e.func}() of dimensions takes two arguments", e.loc)
            a, b = (self.dim_expr(x, False) for x in e.args)
            if e.func == "cdiv":
                if b == Dim.const(0):
                    raise error("division by zero in a dimension", e.args[1].loc)
                return a.cdiv(b)
            return Dim.bin(e.func, a, b)
        raise error("a dimension must be a name, an integer, or + - * // % cdiv min max of those",
                    e.loc)

    def dim_cond(self, e) -> Dim:
        if isinstance(e, ast.Compare):
            return Dim.bin(_CMP[e.op], self.dim_value(e.left), self.dim_value(e.right))
        if isinstance(e, ast.BinOp) and e.op in ("&", "|"):
            return Dim.bin(_BIN[e.op], self.dim_cond(e.left), self.dim_cond(e.right))
        raise error("assume needs a comparison of dimensions, e.g. 'assume K % 64 == 0'", e.loc)

    def dim_value(self, e) -> Dim:
        if isinstance(e, ast.Name):
            if e.id not in self.symbols:
                raise error(f"'{e.id}' is not a dimension of this kernel", e.loc)
            return Dim.sym(e.id)
        if isinstance(e, ast.Number) and not e.is_float:
            return Dim.const(e.value)
        if isinstance(e, ast.BinOp) and e.op in ("+", "-", "*", "//", "%"):
            b = self.dim_value(e.right)
            if e.op in ("//", "%") and b == Dim.const(0):
                raise error("division by zero in a dimension", e.right.loc)
            return Dim.bin(_BIN[e.op], self.dim_value(e.left), b)
        raise error("assume needs a comparison of dimensions, e.g. 'assume K % 64 == 0'", e.loc)

    # ---- expressions
    def expr(self, e) -> Val:
        m = getattr(self, "ex_" + type(e).__name__, None)
        if m is None:
            raise error("a tuple is only allowed as an 'axis=' argument", e.loc)
        return m(e)

    def ex_Number(self, e: ast.Number) -> Val:
        dt = "f32" if e.is_float else "i64"
        return Val(self.const(e.value, dt, e.loc).id, TensorType(dt, ()), True, e.value, loc=e.loc)

    def ex_Name(self, e: ast.Name) -> Val:
        if e.id in self.env:
            return self.env[e.id]
        if e.id in self.symbols:
            d = Dim.sym(e.id)
            v = self.emit("dim", (), TensorType("i64", ()), e.loc, dim=d)
            return Val(v.id, v.type, True, None, d)
        if e.id in CONSTANTS:
            v = CONSTANTS[e.id]
            return Val(self.const(v, "f32", e.loc).id, TensorType("f32", ()), True, v)
        if any(p.name == e.id for p in self.k.outputs):
            raise error(f"output '{e.id}' is used before it is assigned", e.loc)
        if e.id in KNOWN_FUNCTIONS:
            raise error(f"'{e.id}' is a function; call it", e.loc)
        near = difflib.get_close_matches(e.id, list(self.env) + self.symbols, n=1)
        raise error(f"unknown name '{e.id}'", e.loc, f"did you mean '{near[0]}'?" if near else None)

    def ex_Attr(self, e: ast.Attr) -> Val:
        if e.attr != "T":
            raise error(f"unknown attribute '.{e.attr}'; only '.T' (transpose) exists", e.loc)
        return self.transpose(self.expr(e.value), e.loc)

    def transpose(self, v: Val, loc) -> Val:
        if v.type.rank < 2:
            raise error(f"transpose needs a tensor of rank >= 2, got {_shape(v.type.shape)}", loc)
        s = v.type.shape
        return self.emit("transpose", (v,), TensorType(v.type.dtype, s[:-2] + (s[-1], s[-2])), loc)

    def ex_Unary(self, e: ast.Unary) -> Val:
        v = self.expr(e.operand)
        if e.op == "-":
            if v.const is not None:
                return self.ex_Number(ast.Number(e.loc, -v.const, isinstance(v.const, float)))
            if v.dim is not None:
                return self.dim_val(Dim.const(0) - v.dim, e.loc)
            self.no_bool(v, "-", e.loc)
            return self.emit("unary", (v,), v.type, e.loc, fn="neg")
        if v.type.dtype != "bool" and not is_int(v.type.dtype):
            raise error("'~' needs a bool or integer operand", e.loc)
        return self.emit("unary", (self.strong(v, None, e.loc),), v.type, e.loc, fn="not")

    def dim_val(self, d: Dim, loc) -> Val:
        if d.is_const:
            return self.ex_Number(ast.Number(loc, d.value, False))
        v = self.emit("dim", (), TensorType("i64", ()), loc, dim=d)
        return Val(v.id, v.type, True, None, d)

    def no_bool(self, v: Val, what: str, loc):
        if v.type.dtype == "bool":
            raise error(f"'{what}' does not apply to bool values; convert with i32(...) or f32(...)",
                        loc)

    def broadcast(self, a: Val, b: Val, loc, what: str) -> tuple:
        shape = broadcast_shapes(a.type.shape, b.type.shape)
        if shape is None:
            raise error(f"shapes {_shape(a.type.shape)} and {_shape(b.type.shape)} do not broadcast "
                        f"for '{what}'", loc)
        return shape

    def unify(self, a: Val, b: Val, loc) -> tuple:
        """Operands to a common dtype (NumPy rules; weak literals take the other side's type)."""
        if a.weak and b.weak:
            dt = "f32" if is_float(a.type.dtype) or is_float(b.type.dtype) else "i64"
        elif a.weak or b.weak:
            s, w = (b, a) if a.weak else (a, b)
            dt = s.type.dtype
            if is_float(w.type.dtype) and not is_float(dt):
                dt = "f64" if dt != "bool" else "f32"
        else:
            dt = promote(a.type.dtype, b.type.dtype)
        return self.cast(self.strong(a, dt, loc), dt, loc), self.cast(self.strong(b, dt, loc), dt,
                                                                      loc), dt

    def ex_BinOp(self, e: ast.BinOp) -> Val:
        a, b = self.expr(e.left), self.expr(e.right)
        if e.op == "@":
            return self.matmul(a, b, e)
        # dimension arithmetic stays symbolic (e.g. `D * 2`)
        def int_like(v):
            return v.dim is not None or isinstance(v.const, int)
        if (a.dim is not None or b.dim is not None) and int_like(a) and int_like(b) and \
           e.op in ("+", "-", "*", "//", "%"):
            da = a.dim if a.dim is not None else Dim.const(a.const)
            db = b.dim if b.dim is not None else Dim.const(b.const)
            if e.op in ("//", "%") and db == Dim.const(0):
                raise error("division by zero", e.right.loc)
            return self.dim_val(Dim.bin(_BIN[e.op], da, db), e.loc)
        if a.const is not None and b.const is not None and e.op not in ("&", "|"):
            return self.fold(e, a, b)
        if e.op == "**":
            if b.const is None:
                raise error("'**' needs a constant exponent", e.right.loc)
            self.no_bool(a, "**", e.loc)
            a = self.strong(a, None, e.loc)
            dt = a.type.dtype
            if is_int(dt) and (isinstance(b.const, float) or b.const < 0):
                dt = promote(dt, "f16")
                a = self.cast(a, dt, e.loc)
            return self.emit("binary", (a,), a.type.with_dtype(dt), e.loc, fn="pow",
                             exponent=b.const)
        shape = self.broadcast(a, b, e.loc, e.op)
        fn = _BIN[e.op]
        if e.op in ("&", "|"):
            for v in (a, b):
                if v.type.dtype != "bool" and not is_int(v.type.dtype):
                    raise error(f"'{e.op}' needs bool or integer operands", e.loc)
        else:
            self.no_bool(a, e.op, e.loc)
            self.no_bool(b, e.op, e.loc)
        a, b, dt = self.unify(a, b, e.loc)
        if e.op in ("//", "%") and not is_int(dt):
            raise error(f"'{e.op}' needs integer operands, got {dt}", e.loc)
        if e.op == "/" and is_int(dt):
            dt = "f64"
            a, b = self.cast(a, dt, e.loc), self.cast(b, dt, e.loc)
        return self.emit("binary", (a, b), TensorType(dt, shape), e.loc, fn=fn)

    def fold(self, e, a: Val, b: Val) -> Val:
        x, y = a.const, b.const
        try:
            r = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "/": lambda: x / y,
                 "//": lambda: x // y, "%": lambda: x % y, "**": lambda: x ** y}[e.op]()
        except ZeroDivisionError:
            raise error("division by zero", e.right.loc) from None
        if isinstance(r, complex):
            raise error("complex result in a constant expression", e.loc)
        return self.ex_Number(ast.Number(e.loc, r, isinstance(r, float)))

    def ex_Compare(self, e: ast.Compare) -> Val:
        a, b = self.expr(e.left), self.expr(e.right)
        shape = self.broadcast(a, b, e.loc, e.op)
        a, b, _ = self.unify(a, b, e.loc)
        return self.emit("compare", (a, b), TensorType("bool", shape), e.loc, fn=_CMP[e.op])

    def matmul(self, a: Val, b: Val, e) -> Val:
        for v, side in ((a, e.left), (b, e.right)):
            if v.type.rank < 2:
                raise error(f"matmul needs operands of rank >= 2, got {_shape(v.type.shape)}",
                            side.loc)
            if v.type.dtype == "bool":
                raise error("matmul does not take bool operands", side.loc)
        ka, kb = a.type.shape[-1], b.type.shape[-2]
        if ka != kb:
            raise error(f"matmul needs the left operand's last axis ({ka}) to equal the right "
                        f"operand's second-to-last axis ({kb})", e.loc)
        batch = broadcast_shapes(a.type.shape[:-2], b.type.shape[:-2])
        if batch is None:
            raise error(f"matmul batch axes {_shape(a.type.shape[:-2])} and "
                        f"{_shape(b.type.shape[:-2])} do not broadcast", e.loc)
        dt = promote(a.type.dtype, b.type.dtype)
        # 4-bit integers multiply as i8, which holds every 4-bit value, into i32 as i8's products
        # do (the GPU targets keep 4-bit tiles packed, for dequant's weights, and multiply none)
        dt = {"u4": "i8", "i4": "i8"}.get(dt, dt)
        a, b = self.cast(a, dt, e.loc), self.cast(b, dt, e.loc)
        out = {"f16": "f32", "bf16": "f32", "fp8e4m3": "f32", "fp8e5m2": "f32", "i8": "i32",
               "u8": "i32", "i16": "i32"}.get(dt, dt)
        shape = batch + (a.type.shape[-2], b.type.shape[-1])
        return self.emit("matmul", (a, b), TensorType(out, shape), e.loc)

    # ---- calls
    def ex_Call(self, e: ast.Call) -> Val:
        f = e.func
        if f in PARAM_DTYPES:
            self.nargs(e, 1)
            if f in PACKED:
                raise packed_conversion(f, e.loc)
            v = self.expr(e.args[0])
            if v.const is not None:
                return Val(self.const(v.const, f, e.loc).id, TensorType(f, ()))
            return self.cast(self.strong(v, None, e.loc), f, e.loc)
        if f in UNARY_FNS:
            self.nargs(e, 1)
            v = self.float_operand(self.expr(e.args[0]), f, e)
            return self.emit("unary", (v,), v.type, e.loc, fn=f)
        if f in ("maximum", "minimum"):
            self.nargs(e, 2)
            a, b = self.expr(e.args[0]), self.expr(e.args[1])
            shape = self.broadcast(a, b, e.loc, f)
            a, b, dt = self.unify(a, b, e.loc)
            return self.emit("binary", (a, b), TensorType(dt, shape), e.loc, fn=f)
        if f == "clamp":
            self.nargs(e, 3)
            x, lo, hi = (self.expr(a) for a in e.args)
            shape = self.broadcast(x, lo, e.loc, f)
            x, lo, dt = self.unify(x, lo, e.loc)
            t = self.emit("binary", (x, lo), TensorType(dt, shape), e.loc, fn="maximum")
            shape = self.broadcast(t, hi, e.loc, f)
            t, hi, dt = self.unify(t, hi, e.loc)
            return self.emit("binary", (t, hi), TensorType(dt, shape), e.loc, fn="minimum")
        if f == "leaky_relu":
            self.nargs(e, 2)
            x = self.float_operand(self.expr(e.args[0]), f, e)
            s = self.expr(e.args[1])
            if s.type.shape:
                raise error("leaky_relu's slope must be a scalar", e.args[1].loc)
            s = self.cast(self.strong(s, x.type.dtype, e.loc), x.type.dtype, e.loc)
            zero = self.const(0, x.type.dtype, e.loc)
            pos = self.emit("compare", (x, zero), TensorType("bool", x.type.shape), e.loc, fn="ge")
            neg = self.emit("binary", (x, s), x.type, e.loc, fn="mul")
            return self.emit("where", (pos, x, neg), x.type, e.loc)
        if f == "where":
            self.nargs(e, 3)
            c, a, b = (self.expr(x) for x in e.args)
            if c.type.dtype != "bool":
                raise error(f"where's condition must be bool, got {c.type.dtype}", e.args[0].loc)
            shape = self.broadcast(a, b, e.loc, f)
            shape = broadcast_shapes(c.type.shape, shape)
            if shape is None:
                raise error("where's condition does not broadcast with its values", e.loc)
            a, b, dt = self.unify(a, b, e.loc)
            return self.emit("where", (c, a, b), TensorType(dt, shape), e.loc)
        if f == "transpose":
            self.nargs(e, 1)
            return self.transpose(self.expr(e.args[0]), e.loc)
        if f == "index":
            self.nargs(e, 2)
            x = self.expr(e.args[0])
            ax = self.axis_arg(e.args[1], x.type.rank, single=True)
            return self.emit("index", (), TensorType("i64", x.type.shape), e.loc, axis=ax[0])
        if f in REDUCTIONS:
            return self.reduction(e)
        if f == "dequant":
            return self.dequant(e)
        if f == "exp_nonpos":  # (seen in `dump-ir` output, where the lowering proved it exact)
            raise error(f"unknown function '{f}'", e.loc,
                        "exp_nonpos is a function of tile-level kernels; here write exp (tilec "
                        "takes the cheaper form itself where the argument is at most 0)")
        near = difflib.get_close_matches(f, KNOWN_FUNCTIONS, n=1)
        raise error(f"unknown function '{f}'", e.loc, f"did you mean '{near[0]}'?" if near else None)

    def nargs(self, e: ast.Call, n: int, kw=()):
        if len(e.args) != n:
            raise error(f"{e.func}() takes {n} argument{'s' if n != 1 else ''}, got {len(e.args)}",
                        e.loc)
        for name, _, loc in e.kwargs:
            if name not in kw:
                raise error(f"{e.func}() has no keyword argument '{name}'", loc)

    def float_operand(self, v: Val, f: str, e) -> Val:
        self.no_bool(v, f, e.loc)
        v = self.strong(v, None, e.loc)
        if f not in INT_OK_FNS and is_int(v.type.dtype):
            v = self.cast(v, promote(v.type.dtype, "f16"), e.loc)
        return v

    def axis_arg(self, a, rank: int, single=False) -> tuple:
        items = a.items if isinstance(a, ast.Tuple) and not single else (a,)
        out = []
        for it in items:
            v = it
            neg = False
            if isinstance(v, ast.Unary) and v.op == "-":
                neg, v = True, v.operand
            if not (isinstance(v, ast.Number) and not v.is_float):
                raise error("an axis must be an integer constant" +
                            ("" if single else " or a tuple of them"), it.loc)
            ax = -v.value if neg else v.value
            if not -rank <= ax < rank:
                raise error(f"axis {ax} is out of range for a tensor of rank {rank}", it.loc)
            ax %= rank
            if ax in out:
                raise error(f"axis {ax} is repeated", it.loc)
            out.append(ax)
        return tuple(sorted(out))

    def reduction(self, e: ast.Call) -> Val:
        f = e.func
        kws = ("axis",) if f == "softmax" else ("axis", "keepdims")
        self.nargs(e, 1, kws)
        x = self.expr(e.args[0])
        self.no_bool(x, f, e.loc)
        x = self.strong(x, None, e.loc)
        if not x.type.shape:
            raise error(f"{f}() needs a tensor, got a scalar", e.args[0].loc)
        kw = {n: (v, loc) for n, v, loc in e.kwargs}
        axes = tuple(range(x.type.rank))
        if "axis" in kw:
            axes = self.axis_arg(kw["axis"][0], x.type.rank)
        elif f == "softmax":
            raise error("softmax() needs axis=", e.loc)
        keep = False
        if "keepdims" in kw:
            v = kw["keepdims"][0]
            if not (isinstance(v, ast.Name) and v.id in ("True", "False")):
                raise error("keepdims must be True or False", v.loc)
            keep = v.id == "True"
        if f in ("mean", "logsumexp", "softmax") and is_int(x.type.dtype):
            x = self.cast(x, promote(x.type.dtype, "f16"), e.loc)
        if f == "softmax":
            return self.emit("softmax", (x,), x.type, e.loc, axes=axes)
        shape = tuple(Dim.const(1) if i in axes else d for i, d in enumerate(x.type.shape)
                      if keep or i not in axes)
        t = TensorType(x.type.dtype, shape)
        if f in ("mean", "logsumexp"):
            return self.emit(f, (x,), t, e.loc, axes=axes, keepdims=keep)
        return self.emit("reduce", (x,), t, e.loc, fn=f, axes=axes, keepdims=keep)

    def dequant(self, e: ast.Call) -> Val:
        self.nargs(e, 2, ("zero", "group"))
        q, s = self.expr(e.args[0]), self.expr(e.args[1])
        if q.type.dtype not in ("u4", "i4", "u8", "i8") or q.type.rank != 2:
            raise error(f"dequant needs a 2-D u4/i4/u8/i8 tensor, got {q.type}", e.args[0].loc)
        if s.type.rank != 2 or not is_float(s.type.dtype):
            raise error(f"dequant's scale must be a 2-D float tensor, got {s.type}", e.args[1].loc)
        kw = {n: (v, loc) for n, v, loc in e.kwargs}
        if "group" not in kw:
            raise error("dequant() needs group=", e.loc)
        g = kw["group"][0]
        if not (isinstance(g, ast.Number) and not g.is_float and g.value >= 1):
            raise error("group must be a positive integer constant", g.loc)
        K, N = q.type.shape
        if s.type.shape[1] != N:
            raise error(f"dequant's scale must have {N} columns like the weights, got "
                        f"{s.type.shape[1]}", e.args[1].loc)
        want = (K + (g.value - 1)) // g.value
        if s.type.shape[0] not in (K // g.value, want, Dim.const(1) if g.value == 1 else None) and \
           s.type.shape[0] != K.cdiv(g.value):
            raise error(f"dequant's scale must have {K // g.value} rows for group={g.value}, got "
                        f"{s.type.shape[0]}", e.args[1].loc)
        args = [q, s]
        zero = 0.0
        if "zero" in kw:
            z = self.expr(kw["zero"][0])
            if z.const is not None:
                zero = float(z.const)
            else:
                if z.type.shape != s.type.shape:
                    raise error(f"dequant's zero must be a constant or shaped like the scale "
                                f"{_shape(s.type.shape)}", kw["zero"][1])
                args.append(self.strong(z, None, e.loc))
        return self.emit("dequant", tuple(args), TensorType("f32", (K, N)), e.loc, group=g.value,
                         zero=zero)

    def ex_Tuple(self, e):
        raise error("a tuple is only allowed as an 'axis=' argument", e.loc)


def _dim_names(e) -> list:
    if isinstance(e, ast.Name):
        return [(e.id, e.loc)]
    if isinstance(e, ast.BinOp):
        return _dim_names(e.left) + _dim_names(e.right)
    return []


def _decl_loc(k: ast.Kernel, name: str) -> Loc:
    for p in k.outputs:
        if p.name == name:
            return p.loc
    return k.loc


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _src(e) -> str:
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Number):
        return str(e.value)
    if isinstance(e, (ast.BinOp, ast.Compare)):
        return f"{_src(e.left)} {e.op} {_src(e.right)}"
    return "?"


# ---- schedules ------------------------------------------------------------------
SCHEDULE_KEYS = ("tile", "threads", "stages", "swizzle", "precision", "fuse", "warp_specialize")


def build_schedule(t: ast.TargetSchedule) -> Schedule:
    from .. import targets

    if t.target not in targets.TARGETS:
        raise error(f"unknown target '{t.target}'", t.loc,
                    "targets are " + ", ".join(targets.names()))
    fields: dict = {}
    locs = []
    for it in t.items:
        if it.key not in SCHEDULE_KEYS:
            near = difflib.get_close_matches(it.key, SCHEDULE_KEYS, n=1)
            raise error(f"unknown schedule key '{it.key}'", it.loc,
                        f"did you mean '{near[0]}'?" if near else "keys are " + ", ".join(SCHEDULE_KEYS))
        if it.key in fields:
            raise error(f"schedule key '{it.key}' is given twice", it.loc)
        # errors about a value point at the value (tile sizes: at their `M=`)
        locs.append((it.key, it.loc if it.key == "tile" or not it.args else it.args[0][2]))
        if it.key == "tile":
            tile = []
            for name, val, loc in it.args:
                if name not in ("M", "N", "K"):
                    raise error("tile takes M=, N= and K= sizes, e.g. 'tile M=128, N=128, K=32'", loc)
                if not isinstance(val, int) or val < 1:
                    raise error(f"tile size {name} must be a positive integer", loc)
                if name in dict(tile):
                    raise error(f"tile size {name} is given twice", loc)
                tile.append((name, val))
                locs.append((f"tile.{name}", loc))
            fields["tile"] = tuple(tile)
            continue
        if len(it.args) != 1 or it.args[0][0] is not None:
            raise error(f"'{it.key}' takes one value", it.loc)
        val, loc = it.args[0][1], it.args[0][2]
        if it.key in ("threads", "stages", "swizzle"):
            if not isinstance(val, int) or val < 1:
                raise error(f"'{it.key}' needs a positive integer", loc)
            fields[it.key] = val
        elif it.key == "precision":
            if val not in ("ieee", "tf32"):
                raise error("precision is 'ieee' or 'tf32'", loc)
            fields[it.key] = val
        else:
            if val not in ("on", "off"):
                raise error(f"'{it.key}' is 'on' or 'off'", loc)
            fields[it.key] = val == "on"
    return Schedule(t.target, loc=t.loc, locs=tuple(locs), **fields)


def lower_module(m: ast.Module) -> Module:
    from ..targets.cstyle import C_LIBRARY, cname, reserved
    graphs, names, folded = [], {}, {}
    for k in m.kernels:
        if reserved(k.name) or k.name in C_LIBRARY:
            what = ("a function of the C library or of the CUDA/HIP math libraries"
                    if k.name in C_LIBRARY else "a keyword or reserved name")
            raise error(f"kernel name '{k.name}' is taken in C/C++ ({what}): the library exports "
                        "a C function with the kernel's name", k.loc, "rename the kernel")
        if k.name in names:
            raise error(f"kernel '{k.name}' is defined twice", k.loc)
        if k.name.lower() in folded:
            raise error(f"kernel '{k.name}' differs from '{folded[k.name.lower()]}' only in case: "
                        "their files would be one on case-insensitive file systems", k.loc)
        folded[k.name.lower()] = k.name
        c_names: dict = {}  # the names of the C functions' arguments
        for p in list(k.params) + list(k.outputs):
            for name, loc in [(p.name, p.loc)] + [x for d in (p.dims or ()) for x in _dim_names(d)]:
                c = cname(name)
                if c_names.setdefault(c, name) != name:
                    raise error(f"'{name}' and '{c_names[c]}' are both '{c}' in the generated C "
                                f"('{c_names[c] if c_names[c] != c else name}' is a reserved "
                                "name there)", loc)
        names[k.name] = k
        graphs.append(KernelBuilder(k).build())
    scheds = []
    seen = set()
    for s in m.schedules:
        if s.kernel not in names:
            raise error(f"schedule for unknown kernel '{s.kernel}'", s.loc)
        if s.kernel in seen:
            raise error(f"kernel '{s.kernel}' has two schedules", s.loc)
        seen.add(s.kernel)
        targets = []
        for t in s.targets:
            if t.target in {x.target for x in targets}:
                raise error(f"target '{t.target}' appears twice in this schedule", t.loc)
            targets.append(build_schedule(t))
        scheds.append((s.kernel, tuple(targets)))
    return Module(tuple(graphs), tuple(scheds))
