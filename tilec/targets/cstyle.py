"""The C-style renderer shared by every target: expressions (precedence, literals, casts,
16-bit rounding), names, and the statements that print the same everywhere (stores, branches,
sequential loops, scalar locals). Targets subclass it with their tables and the statements that
differ (tile copies, tile GEMMs, parallel loops, barriers).

Python decides every line; templates only lay the lines out.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..ir import tile as T
from ..ir.types import Dim, is_float, is_int

CXX_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char
char8_t char16_t char32_t class compl concept const consteval constexpr constinit const_cast
continue co_await co_return co_yield decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new
noexcept not not_eq nullptr operator or or_eq private protected public register reinterpret_cast
requires return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq main tilec std int8_t int16_t int32_t int64_t uint8_t uint16_t size_t
INFINITY NAN threadIdx blockIdx blockDim gridDim warpSize half""".split())

# element type of tensors at the C ABI (16-bit floats as raw bits)
ABI_TYPE = {"f16": "tilec_f16", "bf16": "tilec_bf16", "f32": "float", "f64": "double",
            "i8": "int8_t", "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
            "i4": "uint8_t", "u4": "uint8_t", "bool": "bool", "fp8e4m3": "tilec_fp8e4m3",
            "fp8e5m2": "tilec_fp8e5m2"}
BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8,
         "bool": 1, "i4": 1, "u4": 1, "fp8e4m3": 1, "fp8e5m2": 1}
# floats narrower than f32, stored as their bits and computed in f32 (values held rounded)
NARROW_FLOATS = ("f16", "bf16", "fp8e4m3", "fp8e5m2")


# Macros and names that C and C++ headers (or the generated code) define or use unqualified.
_MACROS = set("""NULL EOF BUFSIZ FILENAME_MAX errno stdin stdout stderr assert offsetof setjmp
va_start va_arg va_end va_copy HUGE_VAL HUGE_VALF HUGE_VALL EXIT_SUCCESS EXIT_FAILURE RAND_MAX
CHAR_BIT MB_LEN_MAX CLOCKS_PER_SEC true false isnan isinf isfinite signbit fpclassify FP_NAN
FP_INFINITE FP_ZERO FP_NORMAL FP_SUBNORMAL unix linux restrict _Bool""".split())
# Prefixes of reserved or library names: _X and __, tilec's own (any case), OpenMP, CUDA, HIP,
# <math.h> constants (M_PI), and <stdint.h>/<limits.h>/<float.h> limits (INT64_MAX, FLT_EPSILON)
_RESERVED = re.compile(r"^(?:_[A-Za-z_]|[Tt][Ii][Ll][Ee][Cc]|omp_|cuda|hip[A-Z_]|M_[A-Z0-9_]|"
                       r"(?:U?INT\d*|U?INTPTR|U?INTMAX|SIZE|PTRDIFF|SIG_ATOMIC|WCHAR|WINT|FLT|"
                       r"DBL|LDBL|S?CHAR|UCHAR|U?SHRT|U?LONG|U?LLONG|UINT)_)")
# C library and GPU math library functions: a kernel's C function (a global symbol) cannot take
# these names (the file says where they come from)
C_LIBRARY = frozenset(
    line for line in (Path(__file__).parent / "c_library_names.txt").read_text().splitlines()
    if line and not line.startswith("#"))


def reserved(n: str) -> bool:
    """Would `n` clash with C/C++ keywords, macros, library or tilec names in generated code?"""
    return n in CXX_KEYWORDS or n in _MACROS or bool(_RESERVED.match(n))


def cname(n: str) -> str:
    """User names are kept readable; names `reserved` says would clash get a trailing
    underscore (the front end rejects a kernel whose names then coincide)."""
    return n + "_" if reserved(n) else n


def cdim(d: Dim) -> str:
    return d.c(cname)


def pdim(d: Dim) -> str:
    """A dimension as a C operand: parenthesized unless it is a name or a number."""
    text = cdim(d)
    return text if d.op in ("sym", "const") else f"({text})"


def float_lit(v: float, dtype: str) -> str:
    if math.isinf(v):
        s = "INFINITY" if dtype != "f64" else "HUGE_VAL"
        return s if v > 0 else "-" + s
    if math.isnan(v):
        return "NAN"
    r = repr(float(v))
    if "e" not in r and "." not in r and "inf" not in r:
        r += ".0"
    return r + ("" if dtype == "f64" else "f")


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "imod": "%",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# C precedence of the infix operators we print (higher binds tighter)
_CPREC = {"mul": 13, "div": 13, "idiv": 13, "imod": 13, "add": 12, "sub": 12, "lt": 10, "le": 10,
          "gt": 10, "ge": 10, "eq": 9, "ne": 9}


_INT_LIMITS = {"i8": (-2**7, 2**7 - 1), "u8": (0, 2**8 - 1), "i16": (-2**15, 2**15 - 1),
               "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1)}


class CStyleRenderer:
    """Renders one Tile IR kernel's statements and expressions to C-family lines."""

    # register type of a value of each dtype (16-bit floats compute in float)
    CTYPE = {"f16": "float", "bf16": "float", "f32": "float", "f64": "double", "i8": "int8_t",
             "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "bool": "bool",
             "i4": "int32_t", "u4": "int32_t", "fp8e4m3": "float", "fp8e5m2": "float"}
    # elementwise functions of float values; {x} is the argument, {one} the literal 1
    UNARY = {
        "exp": "tilec::exp_f32({x})", "exp_nonpos": "tilec::exp_nonpos_f32({x})",
        "exp2": "tilec::exp2_f32({x})", "log": "tilec::log_f32({x})",
        "log2": "tilec::log2_f32({x})", "sqrt": "std::sqrt({x})", "rsqrt": "({one} / std::sqrt({x}))",
        "sin": "tilec::sin_f32({x})", "cos": "tilec::cos_f32({x})", "tanh": "tilec::tanh_f32({x})",
        "erf": "tilec::erf_f32({x})", "sigmoid": "tilec::sigmoid({x})", "relu": "tilec::relu({x})",
        "gelu": "tilec::gelu({x})", "gelu_tanh": "tilec::gelu_tanh({x})",
        "silu": "tilec::silu({x})", "softplus": "tilec::softplus({x})", "mish": "tilec::mish({x})",
        "abs": "std::abs({x})", "neg": "(-{x})",
    }
    # (f64 takes libm's: accuracy matters more than vectorization there)
    UNARY_F64 = {"exp": "std::exp({x})", "exp_nonpos": "std::exp({x})", "exp2": "std::exp2({x})",
                 "log": "std::log({x})", "log2": "std::log2({x})", "sin": "std::sin({x})",
                 "cos": "std::cos({x})", "tanh": "std::tanh({x})", "erf": "std::erf({x})"}
    INDEX_TYPE = "int64_t"  # loop variables and tile indices
    # names the renderer itself introduces (user names starting with tilec_ are renamed)
    INTERNAL = frozenset(("tilec_j0", "tilec_v", "tilec_q", "tilec_g", "tilec_tid", "tilec_lane",
                          "tilec_warp"))

    def __init__(self, kernel: T.TileKernel):
        self.k = kernel
        self.globals = {p.name: p for p in kernel.params}
        self.allocs = {a.name: a for a in T.walk_stmts(kernel.body) if isinstance(a, T.Alloc)}
        self.lets: dict = {}  # Let name -> dtype
        self.lines: list[str] = []
        self.tmp = 0

    # ---- names and types
    def fresh(self, base: str = "tilec_t") -> str:
        self.tmp += 1
        return f"{base}{self.tmp}"

    @staticmethod
    def storage(dtype: str) -> str:
        """Dtype of a tile-buffer element: narrow floats are kept as f32, 4-bit ints as i32."""
        return "f32" if dtype in NARROW_FLOATS else ("i32" if dtype in ("u4", "i4") else dtype)

    def ctype(self, dtype: str) -> str:
        return self.CTYPE[dtype]

    # ---- expressions
    def expr(self, e) -> str:
        if isinstance(e, T.Var):
            return e.name if e.name in self.INTERNAL else cname(e.name)
        if isinstance(e, T.Const):
            return self.const(e)
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
            table = dict(self.UNARY, **self.UNARY_F64) if e.dtype == "f64" else self.UNARY
            s = table[e.fn].format(x=x, one="1.0" if e.dtype == "f64" else "1.0f")
            return self.rounded(s, e.dtype)
        if isinstance(e, T.Binary):
            return self.rounded(self.binary(e), e.dtype)
        if isinstance(e, T.Compare):
            return self.infix(e)
        if isinstance(e, T.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, T.Fma):
            return f"tilec::fma_acc({self.expr(e.a)}, {self.expr(e.b)}, {self.expr(e.c)})"
        raise TypeError(f"cannot render {e!r}")

    def const(self, e: T.Const) -> str:
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if is_float(e.dtype):
            return float_lit(float(e.value), e.dtype)
        v = int(e.value)
        if e.dtype in _INT_LIMITS:  # a literal converts to its type as a cast does: saturating
            lo, hi = _INT_LIMITS[e.dtype]
            v = min(max(v, lo), hi)
        if e.dtype == "i64":  # index arithmetic: int64_t operands keep it 64-bit
            return str(v) if -2**31 < v < 2**31 else f"INT64_C({v})"
        return f"({self.ctype(e.dtype)}){v}"

    def binary(self, e: T.Binary) -> str:
        f = e.fn
        if f == "pow":
            x, n = self.expr(e.a), e.exponent
            if is_int(e.dtype):  # (the exponent is an integer >= 0: the front end's rule)
                return f"tilec::ipow_wrap<{self.ctype(e.dtype)}>({x}, {int(n)})"
            if float(n).is_integer() and abs(n) <= 4:  # small powers: multiplications
                n = int(n)
                if n == 0:
                    return "1" if is_int(e.dtype) else float_lit(1.0, e.dtype)
                t = self.ctype(e.dtype)
                return f"tilec::ipow<{n}>(({t})({x}))"
            if e.dtype == "f64":
                return f"std::pow({x}, {float_lit(float(n), e.dtype)})"
            return f"tilec::pow_f32({x}, {float_lit(float(n), 'f64')})"  # (vectorizes)
        if f in _INFIX:
            return self.infix(e)
        a, b = self.expr(e.a), self.expr(e.b)
        if f == "floordiv":
            return f"tilec::floordiv<{self.ctype(e.dtype)}>({a}, {b})"
        if f == "mod":
            return f"tilec::floormod<{self.ctype(e.dtype)}>({a}, {b})"
        if f in ("maximum", "minimum"):
            return f"tilec::{f}({a}, {b})"
        if f in ("min", "max"):
            return f"tilec::i{f}({a}, {b})"
        if f == "cdiv":
            return f"tilec::cdiv({a}, {b})"
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
        if mine is not None and e.dtype not in NARROW_FLOATS and \
           (mine < parent or (right and mine == parent)):
            return f"({text})"
        return text

    NARROW_INTS = {"i8": "int8_t", "u8": "uint8_t", "i16": "int16_t"}

    @classmethod
    def rounded(cls, s: str, dtype: str) -> str:
        """The result of an operation in `dtype`: 16-bit floats round, and integers narrower than
        C's `int` (which C computes in) wrap around, as the language's integers do."""
        if dtype == "f16":
            return f"tilec::round_f16({s})"
        if dtype in NARROW_FLOATS:
            return f"tilec::round_{dtype}({s})"
        if dtype in cls.NARROW_INTS:
            return f"(({cls.NARROW_INTS[dtype]})({s}))"
        if dtype == "u4":  # (4-bit values are held in an int32_t)
            return f"((int32_t)({s}) & 15)"
        if dtype == "i4":
            return f"((((int32_t)({s}) ^ 8) & 15) - 8)"
        return s

    def cast(self, x: str, src: str, dst: str) -> str:
        if src == dst or (self.ctype(src) == self.ctype(dst) == "float" and dst == "f32"):
            return x  # 16-bit floats are already held as (exactly representable) floats
        if dst == "bool":
            return f"({x} != 0)"
        if dst in ("u4", "i4"):  # (held in an int32_t, saturated to 4 bits)
            return f"tilec::sat4<{str(dst == 'i4').lower()}>({self.cast(x, src, 'i32')})"
        if is_float(dst):
            return self.rounded(f"(({self.ctype(dst)})({x}))", dst)
        if is_float(src):
            return f"tilec::sat_cast<{self.ctype(dst)}>({x})"
        if src == "bool":
            return f"(({self.ctype(dst)})({x} ? 1 : 0))"
        return f"tilec::sat_int<{self.ctype(dst)}>({x})"

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

    def global_offset(self, p: T.TensorDecl, idx) -> str:
        return self.linear([pdim(d) for d in p.shape], idx)

    def load(self, e: T.Load) -> str:
        if e.buf in self.allocs:
            return self.load_alloc(e)
        return self.load_global(e)

    def load_global(self, e: T.Load) -> str:
        p = self.globals[e.buf]
        if p.dtype in ("u4", "i4"):
            dims = [pdim(d) for d in p.shape]
            row = self.linear(dims[:-1], e.idx[:-1]) if len(dims) > 1 else "0"
            return (f"tilec::load_{p.dtype}({cname(p.name)}, {row}, {self.expr(e.idx[-1])}, "
                    f"{dims[-1]})")
        return self.from_storage(f"{cname(p.name)}[{self.global_offset(p, e.idx)}]", p.dtype)

    @staticmethod
    def from_storage(ref: str, dtype: str) -> str:
        """A value read from memory in its storage form, as a register value."""
        if dtype == "f16":
            return f"tilec::f16_to_f32({ref})"
        if dtype in NARROW_FLOATS:
            return f"tilec::{dtype}_to_f32({ref})"
        return ref

    @staticmethod
    def to_storage(v: str, dtype: str) -> str:
        if dtype == "f16":
            return f"tilec::f32_to_f16({v})"
        if dtype in NARROW_FLOATS:
            return f"tilec::f32_to_{dtype}({v})"
        return v

    def load_alloc(self, e: T.Load) -> str:
        raise NotImplementedError

    def store_expr(self, buf: str, value) -> str:
        """A stored value; a final cast to the buffer's dtype is the store's own conversion."""
        if buf in self.globals and isinstance(value, T.Cast) and hasattr(value.x, "dtype") and \
           value.dtype == self.globals[buf].dtype:
            value = value.x
        vd = value.dtype if hasattr(value, "dtype") else "i64"
        return self.store_value(buf, self.expr(value), vd)

    def store_value(self, buf: str, value: str, vdtype: str) -> str:
        if buf in self.allocs:
            return self.alloc_value(buf, value, vdtype)
        p = self.globals[buf]
        v = self.cast(value, vdtype, "f32" if p.dtype in NARROW_FLOATS else p.dtype)
        return self.to_storage(v, p.dtype)

    def alloc_value(self, buf: str, value: str, vdtype: str) -> str:
        """A value converted for a tile buffer (16-bit tiles hold rounded values as floats)."""
        return self.cast(value, vdtype, self.allocs[buf].dtype)

    # ---- statements
    def emit(self, line: str, depth: int):
        self.lines.append("    " * depth + line)

    def stmts(self, ss, depth: int):
        for s in ss:
            getattr(self, "s_" + type(s).__name__)(s, depth)

    def s_Alloc(self, s: T.Alloc, depth):
        pass  # buffers are laid out by the kernel template

    def test(self, e) -> str:
        """Boolean `e` as the test of an `if`, whose own parentheses enclose it."""
        return unwrapped(self.expr(e))

    def s_If(self, s: T.If, depth):
        self.emit(f"if ({self.test(s.cond)}) {{", depth)
        self.stmts(s.body, depth + 1)
        if s.orelse:
            self.emit("} else {", depth)
            self.stmts(s.orelse, depth + 1)
        self.emit("}", depth)

    def s_Let(self, s: T.Let, depth):
        dt = getattr(s.value, "dtype", "i64")
        self.lets[s.name] = dt
        self.emit(f"const {self.ctype(dt)} {cname(s.name)} = {self.expr(s.value)};", depth)

    def s_For(self, s: T.For, depth):
        if s.kind == "parallel":
            self.parallel(s, depth)
            return
        self.loop_body = s.body  # (loop_head: whether the body reads the variable)
        for n, (v, ext) in enumerate(zip(s.vars, s.extents)):
            self.loop_head(v, ext, depth + n, s.start if n == 0 else None)
        self.stmts(s.body, depth + len(s.vars))
        for n in reversed(range(len(s.vars))):
            self.emit("}", depth + n)

    def loop_head(self, var: str, extent, depth, start=None):
        """`for (var = start; var < extent; ++var) {` of a sequential loop (its body follows)."""
        first = "0" if start is None else self.expr(start)
        self.emit(f"for ({self.INDEX_TYPE} {cname(var)} = {first}; {cname(var)} < "
                  f"{self.expr(extent)}; ++{cname(var)}) {{", depth)

    def parallel(self, s: T.For, depth):
        raise NotImplementedError

    def s_Allreduce(self, s: T.Allreduce, depth):
        raise NotImplementedError


def linear_block_vars(k: T.TileKernel) -> list:
    """(C name, expression) of each block variable of `k` from the linear block index `tilec_b`,
    x fastest; with `longest_first`, x counts down (the blocks with the most work first)."""
    out = []
    for n, v in enumerate(k.block_vars):
        e = "tilec_b"
        if n > 0:
            e = f"tilec_b / ({' * '.join(f'tilec_grid[{m}]' for m in range(n))})"
        if n < len(k.block_vars) - 1:
            e = f"({e}) % tilec_grid[{n}]"
        if n == 0 and k.longest_first:
            e = f"tilec_grid[0] - 1 - {e}"
        out.append((cname(v), e))
    return out


# `const TYPE NAME = INIT;` on a line of its own (TYPE a plain or qualified name)
_DECL = re.compile(r"( *)const [A-Za-z_][\w:]* ([A-Za-z_]\w*) = (.*);$")
_WORD = re.compile(r"[A-Za-z_]\w*")
# an initializer of names, numbers, operators and casts to int types, calling nothing
_PURE = re.compile(r"[\w\s+\-*/%&|^<>=!?:.()]*")
_CALL = re.compile(r"\w\s*\(")


def unwrapped(s: str) -> str:
    """C expression `s` without the parentheses that enclose all of it, if they do."""
    depth = 0
    for n, ch in enumerate(s):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return s[1:-1] if n == len(s) - 1 and s.startswith("(") else s
    return s


def names_in(lines) -> set:
    """Every name the C lines `lines` mention outside comments."""
    return {w for ln in lines for w in _WORD.findall(ln.split("//", 1)[0])}


def drop_unread(lines: list) -> list:
    """`lines` (a kernel's body) without the local constants nothing reads: those the renderer
    declared for statements that might read them (a loop's row and column indices, a tile's
    coordinates), each followed by a `(void)NAME;` line that would silence nvcc's
    unused-variable warning, and plain arithmetic constants that only fed those. The markers
    go too: what stays is read. Scopes come from the indentation (the renderer indents every
    block); comments do not count as reads."""
    lines = list(lines)
    words = [names_in([ln]) for ln in lines]
    while True:
        drop = set()
        for i, ln in enumerate(lines):
            m = _DECL.fullmatch(ln)
            if m is None or i in drop:
                continue
            indent, name, init = len(m.group(1)), m.group(2), m.group(3)
            marked = i + 1 < len(lines) and lines[i + 1].strip() == f"(void){name};"
            if not marked and not (_PURE.fullmatch(init) and not _CALL.search(init)):
                continue
            first = i + 2 if marked else i + 1
            read = False
            for j in range(first, len(lines)):
                if j in drop:
                    continue
                if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip(" ")) < indent:
                    break  # (the end of the declaration's block)
                if name in words[j]:
                    read = True
                    break
            if marked:  # (read or not, the marker has done its work)
                drop.add(i + 1)
            if not read:
                drop.add(i)
        if not drop:
            return lines
        lines = [ln for i, ln in enumerate(lines) if i not in drop]
        words = [w for i, w in enumerate(words) if i not in drop]


def bytes_expr(dtype: str, shape, cast: str = "(size_t)") -> str:
    """Bytes of a dense tensor (4-bit tensors: each row rounded up to whole bytes)."""
    shape = tuple(shape) or (Dim.const(1),)  # a rank-0 workspace holds one element
    n = " * ".join(f"{cast}({cdim(d)})" for d in shape[:-1]) or f"{cast}1"
    last = f"{cast}({cdim(shape[-1])})"
    if dtype in ("u4", "i4"):
        return f"{n} * (({last} + 1) / 2)"
    return f"{n} * {last} * {BYTES[dtype]}"
