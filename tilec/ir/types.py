"""Data types, NumPy-style promotion, and symbolic dimension expressions (`Dim`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# name -> (kind, bits); kind: f float, i signed, u unsigned, b bool
DTYPES = {
    "f16": ("f", 16), "bf16": ("f", 16), "f32": ("f", 32), "f64": ("f", 64),
    "fp8e4m3": ("f", 8), "fp8e5m2": ("f", 8),
    "i8": ("i", 8), "u8": ("u", 8), "i16": ("i", 16), "i32": ("i", 32), "i64": ("i", 64),
    "i4": ("i", 4), "u4": ("u", 4),
    "bool": ("b", 1),
}
PARAM_DTYPES = tuple(d for d in DTYPES if d != "bool")
PACKED = ("i4", "u4")
SIXTEEN = ("f16", "bf16")  # 16-bit floats
FP8 = ("fp8e4m3", "fp8e5m2")  # 8-bit floats (OCP FP8): every value is an f16 and a bf16 value


def is_float(dt: str) -> bool:
    return DTYPES[dt][0] == "f"


def is_int(dt: str) -> bool:
    return DTYPES[dt][0] in "iu"


# ---- constants and the sign of zero: 0.0 == -0.0 in Python, and they hash alike, but x / -0.0 is
# not x / 0.0
def value_key(v):
    """`v` as a key under which equal numbers match except zeros of opposite signs (an int 0 is
    +0.0's equal): what hash-consing and the Tile IR's constants compare."""
    return (v, math.copysign(1.0, v)) if isinstance(v, (int, float)) and v == 0 else v


def at_least_plus_zero(v) -> bool:
    """Is the number `v` > 0, or +0.0 (not -0.0, which flips the sign of what it divides)?"""
    return isinstance(v, (int, float)) and v >= 0 and math.copysign(1.0, v) > 0


def itemsize_bits(dt: str) -> int:
    return 8 if dt == "bool" else DTYPES[dt][1]


def promote(a: str, b: str) -> str:
    """NumPy's promotion for two array dtypes (bf16 and fp8 extend it the way ml_dtypes does)."""
    if a == b:
        return a
    ka, ba = DTYPES[a]
    kb, bb = DTYPES[b]
    if ka == "b":
        return b
    if kb == "b":
        return a
    if ka == "f" and kb == "f":
        if ba == bb:
            return "f32"  # f16 with bf16, or two fp8 kinds: neither holds the other
        return a if ba > bb else b
    if ka in "iu" and kb in "iu":
        if ka == kb:
            return a if ba >= bb else b
        (s, sb), (_, ub) = ((a, ba), (b, bb)) if ka == "i" else ((b, bb), (a, ba))
        if sb > ub:
            return s
        return {4: "i8", 8: "i16", 16: "i32", 32: "i64", 64: "f64"}[ub]
    # int with float: the float must hold the integer's range
    f, fb = (a, ba) if ka == "f" else (b, bb)
    ib = bb if ka == "f" else ba
    need = {4: 16, 8: 16, 16: 32, 32: 64, 64: 64}[ib]
    return f if fb >= need else {16: "f16", 32: "f32", 64: "f64"}[need]


# ---- symbolic integer expressions over dimension symbols ---------------------------

# Python precedence (the printer's syntax is .tile's): comparisons < | < & < + - < * // %
_PREC = {"lt": 3, "le": 3, "gt": 3, "ge": 3, "eq": 3, "ne": 3, "or": 4, "and": 5,
         "add": 7, "sub": 7, "mul": 8, "floordiv": 8, "mod": 8}
_PY = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%", "lt": "<", "le": "<=",
       "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&", "or": "|"}
_C = dict(_PY, floordiv="/", **{"and": "&&", "or": "||"})
_PY_FNS = {"cdiv": "cdiv", "min": "min", "max": "max"}
_C_FNS = {"cdiv": "tilec::cdiv", "min": "tilec::imin", "max": "tilec::imax"}
_CK_FNS = {"cdiv": "tilec::ck_cdiv", "min": "tilec::ck_min", "max": "tilec::ck_max"}


@dataclass(frozen=True, slots=True)
class Dim:
    """An integer (or, for comparisons, boolean) expression over dimension symbols."""

    op: str  # sym | const | add sub mul floordiv mod | lt le gt ge eq ne and or | min max | cdiv
    args: tuple

    # -- construction
    @staticmethod
    def sym(name: str) -> Dim:
        return Dim("sym", (name,))

    @staticmethod
    def const(v: int) -> Dim:
        return Dim("const", (int(v),))

    @staticmethod
    def of(x) -> Dim:
        return x if isinstance(x, Dim) else Dim.const(x)

    @staticmethod
    def bin(op: str, a, b) -> Dim:
        a, b = Dim.of(a), Dim.of(b)
        if a.op == "const" and b.op == "const":
            return Dim.const(_fold(op, a.args[0], b.args[0]))
        if (op == "add" and b == Dim.const(0)) or (op == "sub" and b == Dim.const(0)):
            return a
        if op == "add" and a == Dim.const(0):
            return b
        if op == "mul":
            if a == Dim.const(1):
                return b
            if b == Dim.const(1):
                return a
            if a == Dim.const(0) or b == Dim.const(0):
                return Dim.const(0)
        if op == "floordiv" and b == Dim.const(1):
            return a
        if op == "mod" and b.op == "const" and b.args[0] and a.op == "mul" and \
                any(x.op == "const" and x.args[0] % b.args[0] == 0 for x in a.args):
            return Dim.const(0)  # (a multiple of b: a padded row's length, modulo its unit)
        return Dim(op, (a, b))

    def __add__(self, o):
        return Dim.bin("add", self, o)

    def __radd__(self, o):
        return Dim.bin("add", o, self)

    def __sub__(self, o):
        return Dim.bin("sub", self, o)

    def __mul__(self, o):
        return Dim.bin("mul", self, o)

    def __rmul__(self, o):
        return Dim.bin("mul", o, self)

    def __floordiv__(self, o):
        return Dim.bin("floordiv", self, o)

    def __mod__(self, o):
        return Dim.bin("mod", self, o)

    def cdiv(self, o) -> Dim:
        o = Dim.of(o)
        if o == Dim.const(1):
            return self
        if self.op == "const" and o.op == "const":
            return Dim.const(-(-self.args[0] // o.args[0]))
        return Dim("cdiv", (self, o))

    # -- queries
    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self) -> int:
        assert self.op == "const"
        return self.args[0]

    def symbols(self) -> list[str]:
        if self.op == "sym":
            return [self.args[0]]
        if self.op == "const":
            return []
        out: list[str] = []
        for a in self.args:
            for s in a.symbols():
                if s not in out:
                    out.append(s)
        return out

    def eval(self, env: dict) -> int:
        if self.op == "sym":
            return env[self.args[0]]
        if self.op == "const":
            return self.args[0]
        vals = [a.eval(env) for a in self.args]
        if self.op == "cdiv":
            return -(-vals[0] // vals[1])
        return _fold(self.op, *vals)

    # -- printing
    def __str__(self) -> str:
        return self.render(_PY, _PY_FNS)

    def c(self, sym=lambda s: s) -> str:
        """C expression (dims are non-negative, so C's / and % agree with Python's)."""
        return self.render(_C, _C_FNS, sym)

    def c_checked(self, sym=lambda s: s) -> str:
        """C++ expression in the launchers' checked arithmetic (`tilec::ck`): its result says
        whether any step overflowed (`tilec::overflows(...)`)."""
        return self.render(_C, _CK_FNS, lambda s: f"tilec::ck({sym(s)})")

    def render(self, ops: dict, fns: dict, sym=lambda s: s, parent: int = 0) -> str:
        if self.op == "sym":
            return sym(self.args[0])
        if self.op == "const":
            return str(self.args[0])
        if self.op in ("cdiv", "min", "max"):
            return (f"{fns[self.op]}({self.args[0].render(ops, fns, sym)}, "
                    f"{self.args[1].render(ops, fns, sym)})")
        p = _PREC[self.op]
        a = self.args[0].render(ops, fns, sym, p)
        b = self.args[1].render(ops, fns, sym, p + 1)
        s = f"{a} {ops[self.op]} {b}"
        return f"({s})" if p < parent else s


def _fold(op: str, a: int, b: int) -> int:
    if op in ("floordiv", "mod") and b == 0:
        raise ZeroDivisionError("division by zero in a dimension expression")
    return {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
        "floordiv": lambda: a // b, "mod": lambda: a % b,
        "lt": lambda: int(a < b), "le": lambda: int(a <= b), "gt": lambda: int(a > b),
        "ge": lambda: int(a >= b), "eq": lambda: int(a == b), "ne": lambda: int(a != b),
        "and": lambda: int(bool(a) and bool(b)), "or": lambda: int(bool(a) or bool(b)),
        "min": lambda: min(a, b), "max": lambda: max(a, b),
    }[op]()


@dataclass(frozen=True, slots=True)
class TensorType:
    """A dtype and a shape of `Dim`s; shape () is a scalar."""

    dtype: str
    shape: tuple

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape)


def numel(shape) -> Dim:
    n = Dim.const(1)
    for d in shape:
        n = n * d
    return n


def broadcast_shapes(a: tuple, b: tuple) -> tuple | None:
    """NumPy broadcasting on symbolic shapes; None when they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else Dim.const(1)
        y = b[-i] if i <= len(b) else Dim.const(1)
        if x == y or y == Dim.const(1):
            out.append(x)
        elif x == Dim.const(1):
            out.append(y)
        else:
            return None
    return tuple(reversed(out))
