"""C++ (OpenMP) rendering of lowered Tile IR: Python decides every line; templates lay them out.

Blocks of the grid are distributed over OpenMP threads; each thread owns one copy of the block's
tile buffers (shared/fragment/local scopes all live in the thread's scratch). 16-bit floats are
stored as bits and computed in float, rounded wherever the program's dtype says f16/bf16.
"""

from __future__ import annotations

import math

from ..ir import tile as T
from ..ir.types import Dim, is_float, is_int

CTYPE = {"f16": "float", "bf16": "float", "f32": "float", "f64": "double", "i8": "int8_t",
         "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "bool": "bool",
         "i4": "int32_t", "u4": "int32_t"}
# element type of tensors at the C ABI
ABI_TYPE = {"f16": "tilec_f16", "bf16": "tilec_bf16", "f32": "float", "f64": "double",
            "i8": "int8_t", "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
            "i4": "uint8_t", "u4": "uint8_t", "bool": "bool"}
CXX_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char
char8_t char16_t char32_t class compl concept const consteval constexpr constinit const_cast
continue co_await co_return co_yield decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new
noexcept not not_eq nullptr operator or or_eq private protected public register reinterpret_cast
requires return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq main tilec std int8_t int16_t int32_t int64_t uint8_t uint16_t size_t
INFINITY NAN""".split())


def cname(n: str) -> str:
    """User names are kept readable; C++ keywords and reserved names get a trailing underscore."""
    return n + "_" if n in CXX_KEYWORDS or n.startswith("tilec_") else n


def cdim(d: Dim) -> str:
    return d.c(cname)


def pdim(d: Dim) -> str:
    """A dimension as a C operand: parenthesized unless it is a name or a number."""
    text = cdim(d)
    return text if d.op in ("sym", "const") else f"({text})"


def _float_lit(v: float, dtype: str) -> str:
    if math.isinf(v):
        s = "INFINITY" if dtype != "f64" else "HUGE_VAL"
        return s if v > 0 else "-" + s
    if math.isnan(v):
        return "NAN"
    r = repr(float(v))
    if "e" not in r and "." not in r and "inf" not in r:
        r += ".0"
    return r + ("" if dtype == "f64" else "f")


_UNARY = {
    "exp": "tilec::exp_f32({x})", "exp2": "std::exp2({x})", "log": "std::log({x})",
    "log2": "std::log2({x})", "sqrt": "std::sqrt({x})", "rsqrt": "({one} / std::sqrt({x}))",
    "sin": "std::sin({x})", "cos": "std::cos({x})", "tanh": "std::tanh({x})", "erf": "std::erf({x})",
    "sigmoid": "tilec::sigmoid({x})", "relu": "tilec::relu({x})", "gelu": "tilec::gelu({x})",
    "gelu_tanh": "tilec::gelu_tanh({x})", "silu": "tilec::silu({x})",
    "softplus": "tilec::softplus({x})", "mish": "tilec::mish({x})", "abs": "std::abs({x})",
    "neg": "(-{x})",
}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "imod": "%",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# C precedence of the infix operators we print (higher binds tighter)
_CPREC = {"mul": 13, "div": 13, "idiv": 13, "imod": 13, "add": 12, "sub": 12, "lt": 10, "le": 10,
          "gt": 10, "ge": 10, "eq": 9, "ne": 9}


def _infix(op: str, a: str, b: str) -> str:
    """`a op b` with operands already parenthesized as needed (see Emitter.operand)."""
    return f"{a} {_INFIX[op]} {b}"


class Emitter:
    """Renders one kernel's statements and expressions to C++ lines."""

    def __init__(self, kernel: T.TileKernel, allocs: dict):
        self.k = kernel
        self.globals = {p.name: p for p in kernel.params}
        self.allocs = allocs  # name -> Alloc
        self.lines: list[str] = []
        self.tmp = 0
        self.hoisted: dict = {}  # Load -> name of a local holding it
        self._readers = None

    # ---- expressions
    def expr(self, e) -> str:
        if isinstance(e, T.Var):
            return cname(e.name)
        if isinstance(e, T.Const):
            if e.dtype == "bool":
                return "true" if e.value else "false"
            if is_float(e.dtype):
                return _float_lit(float(e.value), e.dtype)
            v = int(e.value)
            if e.dtype == "i64":  # index arithmetic: int64_t operands keep it 64-bit
                return str(v) if -2**31 < v < 2**31 else f"INT64_C({v})"
            return f"({CTYPE[e.dtype]}){v}"
        if isinstance(e, T.Load):
            return self.load(e)
        if isinstance(e, T.Cast):
            return self.cast(self.expr(e.x), e.x.dtype if hasattr(e.x, "dtype") else "i64", e.dtype)
        if isinstance(e, T.Unary):
            x = self.expr(e.x)
            if e.fn in ("neg", "not"):  # prefix operators bind tighter than any infix one
                x = self.operand(e.x, 14, False)
            if e.fn == "not":
                return f"(!{x})" if e.dtype == "bool" else f"(~{x})"
            if e.fn == "exp" and e.dtype == "f64":
                s = f"std::exp({x})"
            else:
                s = _UNARY[e.fn].format(x=x, one="1.0" if e.dtype == "f64" else "1.0f")
            return self.rounded(s, e.dtype)
        if isinstance(e, T.Binary):
            return self.rounded(self.binary(e), e.dtype)
        if isinstance(e, T.Compare):
            return self.infix(e)
        if isinstance(e, T.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        raise TypeError(f"cannot render {e!r}")

    def binary(self, e: T.Binary) -> str:
        f = e.fn
        if f == "pow":
            x, n = self.expr(e.a), e.exponent
            if float(n).is_integer() and abs(n) <= 4:  # small powers: multiplications
                n = int(n)
                if n == 0:
                    return "1" if is_int(e.dtype) else _float_lit(1.0, e.dtype)
                prod = " * ".join(["tilec_x"] * abs(n))
                body = f"({prod})" if n > 0 else f"({_float_lit(1.0, e.dtype)} / ({prod}))"
                return f"([&]{{ const auto tilec_x = {x}; return {body}; }}())"
            return f"std::pow({x}, {_float_lit(float(n), e.dtype)})"
        if f in _INFIX:
            return self.infix(e)
        a, b = self.expr(e.a), self.expr(e.b)
        if f == "floordiv":
            return f"tilec::floordiv<{CTYPE[e.dtype]}>({a}, {b})"
        if f == "mod":
            return f"tilec::floormod<{CTYPE[e.dtype]}>({a}, {b})"
        if f in ("maximum", "minimum"):
            return f"tilec::{f}({a}, {b})"
        if f == "min":
            return f"std::min<int64_t>({a}, {b})"
        if f == "cdiv":
            return f"tilec_cdiv({a}, {b})"
        if f in ("and", "or"):
            if e.dtype == "bool":
                return f"({a} {'&&' if f == 'and' else '||'} {b})"
            return f"({a} {'&' if f == 'and' else '|'} {b})"
        raise TypeError(f"cannot render binary {f}")

    def infix(self, e) -> str:
        """Infix operators print without parentheses; `operand` adds them where C needs them."""
        p = _CPREC[e.fn]
        return f"{self.operand(e.a, p, False)} {_INFIX[e.fn]} {self.operand(e.b, p, True)}"

    def operand(self, e, parent: int, right: bool) -> str:
        text = self.expr(e)
        mine = _CPREC.get(getattr(e, "fn", None)) if isinstance(e, (T.Binary, T.Compare)) else None
        if mine is not None and e.dtype not in ("f16", "bf16") and \
           (mine < parent or (right and mine == parent)):
            return f"({text})"
        return text

    @staticmethod
    def rounded(s: str, dtype: str) -> str:
        if dtype == "f16":
            return f"tilec::round_f16({s})"
        if dtype == "bf16":
            return f"tilec::round_bf16({s})"
        return s

    def cast(self, x: str, src: str, dst: str) -> str:
        if src == dst or (CTYPE.get(src) == CTYPE[dst] == "float" and dst == "f32"):
            return x  # 16-bit floats are already held as (exactly representable) floats
        if dst == "bool":
            return f"({x} != 0)"
        if is_float(dst):
            return self.rounded(f"(({CTYPE[dst]})({x}))", dst)
        if is_float(src):
            return f"tilec::sat_cast<{CTYPE[dst]}>({x})"
        if src == "bool":
            return f"(({CTYPE[dst]})({x} ? 1 : 0))"
        return f"tilec::sat_int<{CTYPE[dst]}>({x})"

    def linear(self, shape_c: list, idx) -> str:
        """Row-major linear offset of `idx` in a buffer whose dims render as `shape_c`."""
        n = len(idx)
        acc = None
        for k, (d, i) in enumerate(zip(shape_c, idx)):
            if acc is None:
                acc = self.operand(i, 13 if n > 1 else 0, False)
            else:
                acc = f"{acc} * {d} + {self.operand(i, 12, True)}"
                if k < n - 1:
                    acc = f"({acc})"
        return acc or "0"

    def load(self, e: T.Load) -> str:
        if e in self.hoisted:
            return self.hoisted[e]
        if e.buf in self.allocs:
            a = self.allocs[e.buf]
            return f"{cname(e.buf)}[{self.linear([self.expr(s) for s in a.shape], e.idx)}]"
        p = self.globals[e.buf]
        dims = [pdim(d) for d in p.shape]
        if p.dtype in ("u4", "i4"):
            row = self.linear(dims[:-1], e.idx[:-1]) if len(dims) > 1 else "0"
            return (f"tilec::load_{p.dtype}({cname(p.name)}, {row}, {self.expr(e.idx[-1])}, "
                    f"{dims[-1]})")
        ref = f"{cname(p.name)}[{self.linear(dims, e.idx)}]"
        if p.dtype == "f16":
            return f"tilec::f16_to_f32({ref})"
        if p.dtype == "bf16":
            return f"tilec::bf16_to_f32({ref})"
        return ref

    def store_expr(self, buf: str, value) -> str:
        """A stored value; a final cast to the buffer's dtype is the store's own conversion."""
        if buf in self.globals and isinstance(value, T.Cast) and hasattr(value.x, "dtype") and \
           value.dtype == self.globals[buf].dtype:
            value = value.x
        vd = value.dtype if hasattr(value, "dtype") else "i64"
        return self.store_value(buf, self.expr(value), vd)

    def store_value(self, buf: str, value: str, vdtype: str) -> str:
        if buf in self.allocs:  # 16-bit tiles hold rounded values in float storage
            return self.cast(value, vdtype, self.allocs[buf].dtype)
        p = self.globals[buf]
        v = self.cast(value, vdtype, "f32" if p.dtype in ("f16", "bf16") else p.dtype)
        if p.dtype == "f16":
            return f"tilec::f32_to_f16({v})"
        if p.dtype == "bf16":
            return f"tilec::f32_to_bf16({v})"
        return v

    # ---- statements
    def emit(self, line: str, depth: int):
        self.lines.append("    " * depth + line)

    def stmts(self, ss, depth: int):
        ss = [x for x in ss if not isinstance(x, T.Alloc)]  # carved out before the block loop
        k = 0
        while k < len(ss):
            if k + 1 < len(ss) and self.fusable_reduce(ss[k], ss[k + 1]):
                self.store_and_reduce(ss[k], ss[k + 1], depth)
                k += 2
                continue
            getattr(self, "s_" + type(ss[k]).__name__)(ss[k], depth)
            k += 1

    def fusable_reduce(self, loop, red) -> bool:
        """`for i, j in parallel(..): t[i, j] = e` then `reduce(op, t, d)`: one pass can do both."""
        if not (isinstance(loop, T.For) and loop.kind == "parallel" and len(loop.vars) == 2 and
                isinstance(red, T.Reduce) and len(loop.body) == 1):
            return False
        st = loop.body[0]
        t = self.allocs.get(red.src)
        return (isinstance(st, T.Store) and st.buf == red.src and t is not None and
                len(t.shape) == 2 and st.idx == tuple(T.Var(v) for v in loop.vars) and
                loop.extents[1] == t.shape[1])

    def store_and_reduce(self, loop: T.For, red: T.Reduce, depth: int):
        """The producing loop accumulates the reduction as it goes; the row buffer is written only
        when something else reads it."""
        st = loop.body[0]
        (vi, vj), (ei, ej) = loop.vars, loop.extents
        keep = self.readers()[red.src] > 1
        ct = CTYPE[_stored(self.allocs[red.dst].dtype)]
        tt = CTYPE[_stored(self.allocs[red.src].dtype)]
        decls, clauses, update, result = _reduce_parts(red.fn, ct)
        self.emit(f"for (int64_t {cname(vi)} = 0; {cname(vi)} < {self.expr(ei)}; ++{cname(vi)}) {{"
                  f"  // and reduce({red.fn}) into {red.dst}", depth)
        scoped = []
        for load in _invariant_loads(loop.body, vj, set(self.allocs)):
            name = f"tilec_h{self.tmp}"
            self.tmp += 1
            self.emit(f"const {CTYPE[_stored(self.allocs[load.buf].dtype)]} {name} = "
                      f"{self.load(load)};", depth + 1)
            self.hoisted[load] = name
            scoped.append(load)
        for line in decls:
            self.emit(line, depth + 1)
        self.emit(f"#pragma omp simd {clauses}", depth + 1)
        self.emit(f"for (int64_t {cname(vj)} = 0; {cname(vj)} < {self.expr(ej)}; ++{cname(vj)}) {{",
                  depth + 1)
        self.emit(f"const {tt} tilec_v = {self.store_expr(st.buf, st.value)};", depth + 2)
        if keep:
            a = self.allocs[st.buf]
            self.emit(f"{cname(st.buf)}[{self.linear([self.expr(x) for x in a.shape], st.idx)}] = tilec_v;",
                      depth + 2)
        self.emit(update, depth + 2)
        self.emit("}", depth + 1)
        self.emit(f"{cname(red.dst)}[{cname(vi)}] = {result};", depth + 1)
        self.emit("}", depth)
        for load in scoped:
            del self.hoisted[load]

    def readers(self) -> dict:
        """How many statements of the kernel read each tile buffer (computed once)."""
        if self._readers is None:
            counts: dict = {}
            for st in T.walk_stmts(self.k.body):
                names = []
                if isinstance(st, T.Reduce):
                    names.append(st.src)
                elif isinstance(st, T.Gemm):
                    names += [st.a, st.b, st.c]
                elif isinstance(st, T.Copy):
                    names.append(st.src.buf)
                for e in [getattr(st, "value", None), getattr(st, "cond", None)]:
                    if e is not None and not isinstance(e, str):
                        names += [x.buf for x in T.walk_exprs(e) if isinstance(x, T.Load)]
                for n in set(names):
                    counts[n] = counts.get(n, 0) + 1
            self._readers = counts
        return self._readers

    def s_Fill(self, s: T.Fill, depth):
        a = self.allocs[s.buf]
        n = " * ".join(f"({self.expr(x)})" for x in a.shape)
        v = self.cast(self.expr(s.value), s.value.dtype, _stored(a.dtype))
        self.emit(f"std::fill_n({cname(s.buf)}, {n}, ({CTYPE[_stored(a.dtype)]}){v});", depth)

    def s_Copy(self, s: T.Copy, depth):
        dst = self.allocs[s.dst.buf]
        src = self.globals[s.src.buf]
        rows, cols = (self.expr(x) for x in dst.shape)
        dims = [pdim(d) for d in src.shape]
        offs = [self.operand(o, 12, True) for o in s.src.offsets]
        start = None  # row-major offset of the window's first element
        for d, o in zip(dims, offs):
            start = o if start is None else f"({start}) * {d} + {o}"
        conv = {"f16": "tilec::from_f16()", "bf16": "tilec::from_bf16()"}.get(
            src.dtype, f"tilec::cast_to<{CTYPE[_stored(dst.dtype)]}>()")
        self.emit(f"// copy {T.fmt(T.Load(s.src.buf, s.src.offsets, src.dtype))} -> {s.dst.buf}",
                  depth)
        def left(dim, off):  # how much of the tensor remains from `off` on
            return dim if off == "0" else f"{dim} - {off}"
        self.emit(f"tilec::copy_tile({cname(src.name)} + {start}, {dims[-1]}, "
                  f"{left(dims[-2], offs[-2])}, {left(dims[-1], offs[-1])}, {cname(s.dst.buf)}, "
                  f"{rows}, {cols}, {conv});", depth)

    def s_Gemm(self, s: T.Gemm, depth):
        a, b, c = self.allocs[s.a], self.allocs[s.b], self.allocs[s.c]
        m, n = (self.expr(x) for x in c.shape)
        k = self.expr(a.shape[0] if s.transpose_a else a.shape[1])
        lda, ldb, ldc = self.expr(a.shape[1]), self.expr(b.shape[1]), n
        ct = CTYPE[_stored(c.dtype)]
        if ct in ("float", "double") and CTYPE[_stored(a.dtype)] == ct == CTYPE[_stored(b.dtype)]:
            self.emit(f"tilec::gemm_tile<{str(s.transpose_a).lower()}, {str(s.transpose_b).lower()}, "
                      f"{ct}>({m}, {n}, {k}, {cname(s.a)}, {lda}, {cname(s.b)}, {ldb}, "
                      f"{cname(s.c)}, {ldc});", depth)
            return
        ia = (f"{cname(s.a)}[tilec_k * {lda} + tilec_i]" if s.transpose_a else
              f"{cname(s.a)}[tilec_i * {lda} + tilec_k]")
        ib = (f"{cname(s.b)}[tilec_j * {ldb} + tilec_k]" if s.transpose_b else
              f"{cname(s.b)}[tilec_k * {ldb} + tilec_j]")
        self.emit(f"for (int64_t tilec_i = 0; tilec_i < {m}; ++tilec_i)  // integer tile GEMM", depth)
        self.emit(f"for (int64_t tilec_k = 0; tilec_k < {k}; ++tilec_k)", depth + 1)
        self.emit(f"for (int64_t tilec_j = 0; tilec_j < {n}; ++tilec_j)", depth + 2)
        self.emit(f"{cname(s.c)}[tilec_i * {ldc} + tilec_j] += ({ct}){ia} * ({ct}){ib};", depth + 3)

    def s_Reduce(self, s: T.Reduce, depth):
        src, dst = self.allocs[s.src], self.allocs[s.dst]
        rows, cols = (self.expr(x) for x in src.shape)
        ct = CTYPE[_stored(dst.dtype)]
        decls, clauses, update, result = _reduce_parts(s.fn, ct)
        self.emit(f"for (int64_t tilec_r = 0; tilec_r < {rows}; ++tilec_r) {{"
                  f"  // reduce({s.fn}) along axis 1", depth)
        for line in decls:
            self.emit(line, depth + 1)
        self.emit(f"const auto* __restrict tilec_row = {cname(s.src)} + tilec_r * {cols};", depth + 1)
        self.emit(f"#pragma omp simd {clauses}", depth + 1)
        self.emit(f"for (int64_t tilec_c = 0; tilec_c < {cols}; ++tilec_c) {{ "
                  f"const {ct} tilec_v = tilec_row[tilec_c]; {update} }}", depth + 1)
        self.emit(f"{cname(s.dst)}[tilec_r] = {result};", depth + 1)
        self.emit("}", depth)

    def s_Store(self, s: T.Store, depth):
        if s.buf in self.allocs:
            a = self.allocs[s.buf]
            ref = f"{cname(s.buf)}[{self.linear([self.expr(x) for x in a.shape], s.idx)}]"
        else:
            p = self.globals[s.buf]
            ref = f"{cname(s.buf)}[{self.linear([pdim(d) for d in p.shape], s.idx)}]"
        self.emit(f"{ref} = {self.store_expr(s.buf, s.value)};", depth)

    def s_For(self, s: T.For, depth):
        simd = s.kind == "parallel" and _simd_ok(s.body)
        last = len(s.vars) - 1
        scoped = []
        for n, (v, ext) in enumerate(zip(s.vars, s.extents)):
            d = depth + n
            if n == last and last > 0 and s.kind == "parallel":
                # tile-buffer values that do not vary along the innermost loop are read once per
                # outer iteration: g++ does not vectorize the inner loop when it must reload them
                for load in _invariant_loads(s.body, s.vars[-1], set(self.allocs)):
                    name = f"tilec_h{self.tmp}"
                    self.tmp += 1
                    ct = CTYPE[_stored(self.allocs[load.buf].dtype)]
                    self.emit(f"const {ct} {name} = {self.load(load)};", d)
                    self.hoisted[load] = name
                    scoped.append(load)
            if simd and n == last:
                self.emit("#pragma omp simd", d)
            self.emit(f"for (int64_t {cname(v)} = 0; {cname(v)} < {self.expr(ext)}; ++{cname(v)}) {{",
                      d)
        self.stmts(s.body, depth + len(s.vars))
        for n in reversed(range(len(s.vars))):
            self.emit("}", depth + n)
        for load in scoped:  # the locals go out of scope with the loop
            del self.hoisted[load]

    def s_If(self, s: T.If, depth):
        self.emit(f"if ({self.expr(s.cond)}) {{", depth)
        self.stmts(s.body, depth + 1)
        if s.orelse:
            self.emit("} else {", depth)
            self.stmts(s.orelse, depth + 1)
        self.emit("}", depth)


def _reduce_parts(fn: str, ct: str) -> tuple:
    """How a loop reduces `tilec_v` into `tilec_acc`: (declarations, OpenMP reduction clauses,
    update statement, the result). A float max/min also tracks NaN, which must win as in NumPy
    (the vectorized max/min of OpenMP would drop it)."""
    flt = ct in ("float", "double")
    init = {"sum": "0",
            "max": f"-std::numeric_limits<{ct}>::infinity()" if flt else
                   f"std::numeric_limits<{ct}>::lowest()",
            "min": f"std::numeric_limits<{ct}>::infinity()" if flt else
                   f"std::numeric_limits<{ct}>::max()"}[fn]
    update = {"sum": "tilec_acc += tilec_v;",
              "max": "tilec_acc = tilec_v > tilec_acc ? tilec_v : tilec_acc;",
              "min": "tilec_acc = tilec_v < tilec_acc ? tilec_v : tilec_acc;"}[fn]
    decls = [f"{ct} tilec_acc = {init};"]
    clauses = f"reduction({ {'sum': '+', 'max': 'max', 'min': 'min'}[fn] }:tilec_acc)"
    result = "tilec_acc"
    if flt and fn != "sum":
        decls.append("int tilec_nan = 0;")
        clauses += " reduction(|:tilec_nan)"
        update += " tilec_nan |= tilec_v != tilec_v;"
        result = f"(tilec_nan ? std::numeric_limits<{ct}>::quiet_NaN() : tilec_acc)"
    return decls, clauses, update, result


def _stored(dtype: str) -> str:
    """Dtype of tile-buffer elements on the CPU: 16-bit floats are kept as f32."""
    return "f32" if dtype in ("f16", "bf16") else ("i32" if dtype in ("u4", "i4") else dtype)


def _invariant_loads(body, var: str, allocs: set) -> list:
    """Loads of tile buffers in `body` whose index does not use `var` and whose buffer `body`
    does not write (so reading them once before the loop is exact), in first-use order."""
    written, exprs = set(), []

    def visit(stmts):
        for st in stmts:
            if isinstance(st, T.Store):
                written.add(st.buf)
                exprs.extend(st.idx)
                exprs.append(st.value)
            elif isinstance(st, T.If):
                exprs.append(st.cond)
                visit(st.body)
                visit(st.orelse)
    visit(body)
    out = []
    for e in exprs:
        for x in T.walk_exprs(e):
            if isinstance(x, T.Load) and x.buf in allocs and x.buf not in written and x not in out \
               and not any(isinstance(y, T.Var) and y.name == var for i in x.idx
                           for y in T.walk_exprs(i)):
                out.append(x)
    return out


def _simd_ok(body) -> bool:
    return all(isinstance(s, (T.Store, T.If)) for s in body)


def collect_allocs(stmts, out: dict):
    out.update((a.name, a) for a in T.walk_stmts(stmts) if isinstance(a, T.Alloc))
    return out


# ---- whole-program rendering ---------------------------------------------------------------
STATUSES = (
    ("TILEC_OK", 0, "success"),
    ("TILEC_ERR_NULL_POINTER", 1, "a tensor pointer is NULL"),
    ("TILEC_ERR_BAD_DIM", 2, "a dimension is less than 1"),
    ("TILEC_ERR_ASSUME", 3, "an assume promise of the kernel does not hold"),
    ("TILEC_ERR_SHAPE", 4, "tensor shapes are inconsistent"),
    ("TILEC_ERR_ALIAS", 5, "an output overlaps another tensor"),
    ("TILEC_ERR_OUT_OF_MEMORY", 6, "out of memory for scratch or workspace buffers"),
)


def _bytes_expr(dtype: str, shape) -> str:
    shape = tuple(shape) or (Dim.const(1),)  # a rank-0 workspace holds one element
    n = " * ".join(f"(size_t)({cdim(d)})" for d in shape[:-1]) or "(size_t)1"
    last = f"(size_t)({cdim(shape[-1])})"
    if dtype in ("u4", "i4"):
        return f"{n} * (({last} + 1) / 2)"
    size = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "i32": 4,
            "i64": 8, "bool": 1}[dtype]
    return f"{n} * {last} * {size}"


def render_kernel(k: T.TileKernel, index: int, symbols, threads_expr: str) -> dict:
    allocs = collect_allocs(k.body, {})
    em = Emitter(k, allocs)
    em.stmts(k.body, 0)
    buffers, off = [], "0"
    for a in allocs.values():
        ct = CTYPE[_stored(a.dtype)]
        count = " * ".join(f"({em.expr(x)})" for x in a.shape)
        buffers.append(dict(name=a.name, cname=cname(a.name), ctype=ct, scope=a.scope, count=count,
                            offset=off))
        off = f"tilec_off_{a.name} + tilec::align64((size_t)({count}) * sizeof({ct}))"
    params = []
    for p in k.params:
        if p.kind == "scalar":
            params.append(f"{CTYPE[p.dtype]} {cname(p.name)}")
        else:
            const = "const " if p.kind == "input" else ""
            params.append(f"{const}{ABI_TYPE[p.dtype]}* __restrict {cname(p.name)}")
    params += [f"int64_t {cname(s)}" for s in symbols]
    grid = [em.expr(g) for g in k.grid] + ["1"] * (3 - len(k.grid))
    bvars = []
    for n, v in enumerate(k.block_vars):
        e = "tilec_b"
        if n > 0:
            e = f"tilec_b / ({' * '.join(f'tilec_grid[{m}]' for m in range(n))})"
        if n < len(k.block_vars) - 1:
            e = f"({e}) % tilec_grid[{n}]"
        bvars.append(dict(name=cname(v), expr=e))
    return dict(name=k.name, index=index, comment=k.comment, params=params, grid=grid,
                buffers=buffers, per_thread=off if buffers else "0", threads=threads_expr,
                block_vars=bvars, body=em.lines, tile_ir=T.print_kernel(k).splitlines())


def render_program(g, prog: T.TileProgram, sched, env, banner: str) -> dict:
    """Sources for one kernel: {filename: text}."""
    threads = str(sched.threads) if sched.threads else "omp_get_max_threads()"
    kernels = [render_kernel(k, n, g.symbols, threads) for n, k in enumerate(prog.kernels)]
    abi, arg_docs, checks, scalars = [], [], [], []
    tensors = [(p, "input") for p in g.params] + [(p, "output") for p in g.outputs]
    for p, role in tensors:
        if p.is_scalar:
            abi.append(f"{ABI_TYPE[p.type.dtype]} {cname(p.name)}")
            arg_docs.append(f"{p.name}: {p.type.dtype} scalar")
        else:
            const = "const " if role == "input" else ""
            abi.append(f"{const}{ABI_TYPE[p.type.dtype]}* {cname(p.name)}")
            arg_docs.append(f"{p.name}: {p.type} ({role})")
    abi += [f"int64_t {cname(s)}" for s in g.symbols]
    arg_docs += [f"{s}: dimension" for s in g.symbols]
    ptrs = [cname(p.name) for p, _ in tensors if not p.is_scalar]
    if ptrs:
        checks.append(dict(fail=" || ".join(f"!{x}" for x in ptrs), code="TILEC_ERR_NULL_POINTER",
                           why="NULL tensor"))
    if g.symbols:
        checks.append(dict(fail=" || ".join(f"{cname(s)} < 1" for s in g.symbols),
                           code="TILEC_ERR_BAD_DIM", why="dimensions are at least 1"))
    for a in g.assumes:
        checks.append(dict(fail=f"!({a.cond.c(cname)})", code="TILEC_ERR_ASSUME",
                           why=f"assume {a.text}"))
    seen = set()
    for p, _ in tensors:
        for d in p.type.shape:
            if d.op not in ("sym", "const") and d not in seen:
                seen.add(d)
                checks.append(dict(fail=f"({cdim(d)}) < 1", code="TILEC_ERR_BAD_DIM",
                                   why=f"{p.name} has dimension {d}"))
    for op in g.ops:
        if op.kind == "dequant":
            K = g.op_map()[op.args[0]].type.shape[0]
            R = g.op_map()[op.args[1]].type.shape[0]
            G = op.attr("group")
            checks.append(dict(fail=f"({cdim(R)}) * {G} < ({cdim(K)})", code="TILEC_ERR_SHAPE",
                               why=f"dequant group={G} needs {R} * {G} >= {K}"))
    for o in g.outputs:
        for p, _ in tensors:
            if p is o or p.is_scalar:
                continue
            a, b = cname(o.name), cname(p.name)
            checks.append(dict(
                fail=f"tilec::overlap({a}, {_bytes_expr(o.type.dtype, o.type.shape)}, {b}, "
                     f"{_bytes_expr(p.type.dtype, p.type.shape)})",
                code="TILEC_ERR_ALIAS", why=f"{o.name} overlaps {p.name}"))
    for p in g.params:
        if p.is_scalar:
            conv = {"f16": "tilec::f16_to_f32", "bf16": "tilec::bf16_to_f32"}.get(p.type.dtype, "")
            scalars.append(dict(ctype=CTYPE[p.type.dtype], local=f"tilec_s_{p.name}",
                                expr=f"{conv}({cname(p.name)})"))
    workspaces = [dict(cname=cname(w.name), ctype=ABI_TYPE[w.dtype], decl=f"{w.name}: {w.dtype}"
                       f"[{', '.join(str(d) for d in w.shape)}]",
                       bytes=_bytes_expr(w.dtype, w.shape)) for w in prog.workspaces]
    calls = []
    scalar_names = {p.name for p in g.params if p.is_scalar}
    for k in prog.kernels:
        args = [f"tilec_s_{p.name}" if p.name in scalar_names else cname(p.name) for p in k.params]
        args += [cname(s) for s in g.symbols]
        calls.append(f"{k.name}({', '.join(args)})")
    doc_lines = (g.doc or "").splitlines() or [""]
    ctx = dict(banner=banner, name=g.name, kernels=kernels, abi_params=abi, checks=checks,
               scalars=scalars, workspaces=workspaces, calls=calls, statuses=STATUSES,
               title=f"{g.name}: {doc_lines[0]}" if g.doc else g.name, doc_lines=doc_lines,
               arg_docs=arg_docs)
    return {f"{g.name}.cpp": env.get_template("cpu/kernel.cpp.j2").render(ctx),
            f"{g.name}.h": env.get_template("cpu/header.h.j2").render(ctx)}
