"""Random, well-typed tensor-level `.tile` programs for differential testing (CPU build vs the
numpy reference interpreter, see tests/test_random_programs.py).

The generator keeps its own model of the language's typing (NumPy promotion with weak Python
literals, broadcasting over symbolic dims, reductions with axis=/keepdims=) so that every
program it writes is well typed *by LANGUAGE.md*, independently of tilec's front end: a
front-end error on a generated program is a finding, not noise.

The generator can steer around a compiler bug by name (`filters`; the comment at each name
says which bug: all were found by this generator and are fixed now).

Numerics are kept well conditioned so that a failure means a compiler bug, not rounding noise:

* every value carries a conservative interval [lo, hi]; inputs are uniform in [-1, 1], scalars
  in [0.1, 1], i32 inputs in [-8, 8];
* log / sqrt / rsqrt / `**0.5` only see values >= 0.05 and division only by values whose
  interval stays >= 0.1 away from 0 (otherwise the operand is made positive first: `x*x + 1`,
  `abs(x) + 0.5`, `exp(x)`, ...);
* exp / exp2 / sin / cos only see small arguments (otherwise squashed with tanh / clamp / a
  small scale), and nothing stored in f16 can reach f16's overflow threshold;
* every value carries `tol`, the tolerance of the least precise rounding step in its tree
  (an f16 op, a cast to bf16, ...). An output may only be declared with a dtype whose
  tolerance is at least that large: an f32 output of an f16 computation would compare f16
  rounding noise against f32's tolerance.

The choices go through a `Chooser`: hypothesis' `st.randoms()` (which records and shrinks them)
or a plain seeded `random.Random` (for bulk bug hunting: `python tests/random_programs.py N`).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field, replace

# Dimension symbols and the values they are drawn from: some are multiples of the CPU tiles,
# most are not. B only sizes leading (batch) axes and stays small.
DIM_VALUES = {"R": (1, 3, 17, 64, 100, 257), "C": (1, 3, 17, 64, 100, 257), "B": (1, 2, 3)}
# sometimes: rows longer than the CPU's elementwise block (16384), or many short rows
LONG_ROWS = {"R": (1, 2, 3), "C": (16383, 16385, 40000), "B": (1, 2)}
MANY_ROWS = {"R": (4097, 20000), "C": (1, 3), "B": (1, 2)}
DIM_MAX = {d: max(v) for d, v in DIM_VALUES.items()}
MAX_ELEMENTS = 300_000  # per value (the interpreter computes erf element by element)

# Input shape patterns.
TENSOR_SHAPES = (("R", "C"), ("C",), ("R", 1), ("B", "R", "C"), ("R",), (1, "C"), ("B", 1, "C"),
                 ("B", "R", 1), ("C", "R"), ("R", 4), (3, "C"))
FLOATS = ("f32", "f16", "bf16", "f64")
# the interpreter's tolerances (tilec.interp.TOLERANCE), by output dtype
TOL = {"f64": 1e-9, "f32": 2e-5, "f16": 1e-2, "bf16": 3e-2, "fp8e4m3": 0.13, "fp8e5m2": 0.26}
# 8-bit float outputs: a computed value that the target (in f32) and the reference (in f64) round
# to neighbouring codes differs by one code, within the tolerance; a value converted to fp8 and
# computed on would amplify that, so fp8 outputs are never read by later statements
FP8 = ("fp8e4m3", "fp8e5m2")
F16_MAX = 3.0e4  # keep f16 values well below 65504
BIG = 1.0e5  # no value of any dtype may grow beyond this
UNARY_ANY = ("abs", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus", "mish",
             "erf")
UNARY_SMALL = ("exp", "exp2", "sin", "cos")
UNARY_POS = ("log", "sqrt", "rsqrt", "log2")
# names that need mangling in C++ (the generated sources must still compile)
ODD_NAMES = ("int", "float", "new", "auto", "char", "signed", "main", "std", "tilec_x", "i", "j",
             "r", "c", "acc", "bx", "row")


# ---- choices ------------------------------------------------------------------------------
class Chooser:
    """Where the generator's decisions come from."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq):
        seq = list(seq)
        return seq[self.integer(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        return self.integer(0, 999) < int(p * 1000)


class RandomChooser(Chooser):
    """From a seed, or from a `random.Random`-like object such as hypothesis' `st.randoms()`
    (whose draws hypothesis records and shrinks)."""

    def __init__(self, seed):
        self.rng = seed if hasattr(seed, "randint") else random.Random(seed)

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)


# ---- shapes and dtypes --------------------------------------------------------------------
def broadcast(a: tuple, b: tuple):
    """NumPy broadcasting over symbolic dims (distinct symbols never broadcast)."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def numel_max(shape, dim_max=None) -> int:
    dim_max = dim_max or DIM_MAX
    return math.prod(d if isinstance(d, int) else dim_max[d] for d in shape)


def shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def is_float(dt):
    return dt in FLOATS


def is_int(dt):
    return dt in ("i32", "i64", "i8", "i16", "u8")


_FBITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
_IBITS = {"i8": 8, "u8": 8, "i16": 16, "i32": 32, "i64": 64}


def promote(a: str, b: str) -> str:
    """NumPy promotion of two array dtypes (bf16 as ml_dtypes: f16 with bf16 gives f32)."""
    if a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    if is_float(a) and is_float(b):
        if _FBITS[a] == _FBITS[b]:
            return "f32"
        return a if _FBITS[a] > _FBITS[b] else b
    if is_int(a) and is_int(b):
        return a if _IBITS[a] >= _IBITS[b] else b  # signed only here
    f, i = (a, b) if is_float(a) else (b, a)
    need = {8: 16, 16: 32, 32: 64, 64: 64}[_IBITS[i]]
    return f if _FBITS[f] >= need else ("f32" if need == 32 else "f64")


# ---- expressions --------------------------------------------------------------------------
@dataclass(frozen=True)
class E:
    text: str
    shape: tuple
    dtype: str  # f16 bf16 f32 f64 i32 i64 bool
    lo: float
    hi: float
    tol: float = 0.0  # tolerance of the least precise rounding step inside
    weak: bool = False  # a Python-like literal: takes the other operand's dtype
    size: int = 1  # node count (keeps programs small)
    atom: bool = True  # needs no parentheses as an operand
    red: bool = False  # contains a reduction or softmax
    call: bool = False  # a call of an elementwise function (renders as a C++ call)

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def op(self) -> str:
        """Text for use as an operand."""
        return self.text if self.atom else f"({self.text})"


def node(text, shape, dtype, lo, hi, kids, atom=False, red=False) -> E:
    tol = max([k.tol for k in kids] + [TOL.get(dtype, 0.0)])
    return E(text, tuple(shape), dtype, float(lo), float(hi), tol, False,
             1 + sum(k.size for k in kids), atom, red or any(k.red for k in kids))


def lit(v) -> E:
    if isinstance(v, int):
        return E(str(v) if v >= 0 else f"({v})", (), "i64", v, v, weak=True)
    t = repr(float(v))
    return E(t if v >= 0 else f"({t})", (), "f32", v, v, weak=True)


def unify(a: E, b: E) -> str:
    """Result dtype of an arithmetic op on a and b (LANGUAGE.md: NumPy; weak literals)."""
    if a.weak and b.weak:
        return "f32" if "f32" in (a.dtype, b.dtype) else "i64"
    if a.weak or b.weak:
        s, w = (b, a) if a.weak else (a, b)
        if is_float(w.dtype) and not is_float(s.dtype):
            return "f64" if s.dtype != "bool" else "f32"
        return s.dtype
    return promote(a.dtype, b.dtype)


def float_of(dt: str) -> str:
    """dtype a float-only function computes in for an operand of dtype dt."""
    return dt if is_float(dt) else promote(dt, "f16")


def mul_iv(a, b):
    ps = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return min(ps), max(ps)


_IRANGE = {"i8": (-128, 127), "u8": (0, 255), "i16": (-2**15, 2**15 - 1)}


def literal_fits(a, b) -> bool:
    """A weak integer literal must be representable in the other operand's integer dtype
    (`u8` and `-3` is an error, as it should be)."""
    for x, y in ((a, b), (b, a)):
        if x.weak and y.dtype in _IRANGE and not (_IRANGE[y.dtype][0] <= x.lo <= x.hi <=
                                                  _IRANGE[y.dtype][1]):
            return False
    return True


def wrapped(dtype: str, lo, hi) -> tuple:
    """The interval of an integer result: i8/u8/i16 arithmetic wraps around (the language's
    integers), so a result past the dtype's range may be anything in it."""
    if dtype in _IRANGE and (lo < _IRANGE[dtype][0] or hi > _IRANGE[dtype][1]):
        return _IRANGE[dtype]
    return lo, hi


def fits(dtype: str, lo: float, hi: float) -> bool:
    m = max(abs(lo), abs(hi))
    if m > BIG:
        return False
    if dtype == "f16" and m > F16_MAX:
        return False
    return not (dtype == "i32" and m > 2 ** 20)


# unary function images of an interval (conservative)
def unary_iv(fn, lo, hi):
    if fn == "abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if fn in ("exp", "exp2", "tanh", "sigmoid", "erf", "log", "log2", "sqrt", "softplus", "relu"):
        f = {"exp": math.exp, "exp2": lambda x: 2.0 ** x, "tanh": math.tanh,
             "sigmoid": lambda x: 0.5 * (1 + math.tanh(x / 2)), "erf": math.erf, "log": math.log,
             "log2": math.log2, "sqrt": math.sqrt,
             "softplus": lambda x: math.log1p(math.exp(-abs(x))) + max(x, 0),
             "relu": lambda x: max(x, 0.0)}[fn]
        return f(lo), f(hi)
    if fn == "rsqrt":
        return 1 / math.sqrt(hi), 1 / math.sqrt(lo)
    if fn in ("sin", "cos"):
        return -1.0, 1.0
    if fn in ("gelu", "gelu_tanh", "silu", "mish"):  # x * (something in [0, 1]) (mish ~1.0 ok)
        return min(lo, -0.32), max(hi, 0.0) * 1.01
    raise KeyError(fn)


def prefix_safe(a: E) -> bool:
    """a renders as a C++ primary expression (an input, or a call of an elementwise function)."""
    return (a.size == 1 and a.atom) or a.call


def exp_bound(a: E) -> float:
    """How large |x| may be where exp/softmax/logsumexp turn x's absolute error into relative
    error: a 16-bit x carries |x| * 2^-8 (bf16) or |x| * 2^-11 (f16) per ulp it is off by."""
    return {"bf16": 2.0, "f16": 4.0}.get(a.dtype, 8.0)


class Reject(Exception):
    """The drawn combination is not usable; the caller picks something else."""


@dataclass
class Program:
    text: str
    dims: dict  # symbol -> value
    kernel: str
    inputs: list
    outputs: list  # (name, dtype, shape)
    value_dtypes: list  # per output: the dtype NumPy promotion gives its value
    notes: list = field(default_factory=list)


# ---- the generator ------------------------------------------------------------------------
class Generator:
    def __init__(self, ch: Chooser, filters=(), fp8: bool = True):
        self.ch = ch
        self.fp8 = fp8  # fp8 outputs (the targets that build them: the CPU and CUDA)
        self.fuse_off = False
        self.dim_values, self.dim_max = DIM_VALUES, DIM_MAX
        self.filters = set(filters or ())
        self.names_used: set = set()

    # -- small helpers
    def bcast(self, a: tuple, b: tuple):
        """Broadcast shape, or None when the shapes do not broadcast or the result could be too
        big to test quickly (e.g. [R] against [R, 1] with R = 20000)."""
        s = broadcast(a, b)
        return None if s is None or numel_max(s, self.dim_max) > MAX_ELEMENTS else s

    def fresh(self, base: str) -> str:
        n = 0
        while f"{base}{n}" in self.names_used:
            n += 1
        self.names_used.add(f"{base}{n}")
        return f"{base}{n}"

    def pick_leaf(self, pool, pred=lambda e: True, recent=True):
        cands = [e for e in pool if pred(e)]
        if not cands:
            raise Reject("no operand")
        if recent and self.ch.chance(0.5):
            return cands[-1]
        return self.ch.choice(cands)

    # -- value transformations that keep things well conditioned
    def positivize(self, a: E) -> E:
        """A value >= 0.05 derived from a."""
        if a.dtype == "bool":
            a = self.cast(a, "f32")
        k = self.ch.integer(0, 3)
        if k == 0 or a.mag > 100:
            c = self.ch.choice((1, 0.5))
            sq = self.binop("*", a, a)
            return self.binop("+", sq, lit(c) if not is_int(sq.dtype) or c == 1 else lit(1))
        if k == 1:
            return self.binop("+", self.unary("abs", a), lit(self.ch.choice((0.5, 1.0))))
        if k == 2:
            return self.unary("exp", self.squash(a, min(3.0, exp_bound(a))))
        return self.binop("+", self.unary("sigmoid", a), lit(0.25))

    def squash(self, a: E, bound: float) -> E:
        """A value in [-bound, bound] derived from a (a itself when it already is)."""
        if a.mag <= bound:
            return a
        k = self.ch.integer(0, 2)
        if k == 0:
            t = self.unary("tanh", a)
            return t if bound >= 1 else self.binop("*", t, lit(bound))
        if k == 1:
            return self.clamp(a, -bound, bound)
        s = 2.0 ** math.floor(math.log2(bound / a.mag))  # exact power of two
        return self.binop("*", a, lit(s))

    # -- builders: each returns an E or raises Reject
    def cast(self, a: E, dt: str) -> E:
        if dt == a.dtype and not a.weak:
            return a
        if not fits(dt, a.lo, a.hi):
            raise Reject("cast range")
        lo, hi = (a.lo, a.hi)
        return node(f"{dt}({a.text})", a.shape, dt, lo, hi, [a], atom=True)

    def unary(self, fn: str, a: E) -> E:
        if a.dtype == "bool":
            raise Reject("bool operand")
        keeps_int = fn in ("abs", "relu") and is_int(a.dtype)
        dt = a.dtype if keeps_int else float_of("f32" if a.weak else a.dtype)
        if fn in UNARY_POS and a.lo < 0.05:
            raise Reject("domain")
        if fn in ("erf", "gelu") and not a.shape and "scalar_erf" in self.filters:
            # bug (fixed): erf() of a rank-0 value returns a Python float, and
            # `.astype` fails: AttributeError in the reference interpreter
            raise Reject("filtered")
        if fn == "gelu_tanh" and a.lo < -4 and "gelu_tanh_cancellation" in self.filters:
            # bug (fixed): the CPU's gelu_tanh computed 0.5 * x * (1 + tanh(z)) in f32, which
            # cancels to 0 for x < -5 (the interpreter, in f64, gives ~1e-10)
            raise Reject("filtered")
        if fn in ("exp", "exp2") and (a.hi > 6 or a.lo < -30):
            raise Reject("range")
        if fn in ("sin", "cos") and a.mag > 8:
            raise Reject("range")
        lo, hi = unary_iv(fn, a.lo, a.hi)
        lo, hi = min(lo, hi), max(lo, hi)
        if not fits(dt, lo, hi):
            raise Reject("range")
        return replace(node(f"{fn}({a.text})", a.shape, dt, lo, hi, [a], atom=True), call=True)

    def neg(self, a: E) -> E:
        if a.dtype == "bool" or a.weak:
            raise Reject("neg")
        if "unary_prefix" in self.filters and not prefix_safe(a):
            # bug (fixed): C++ rendering of unary - / ~ does not parenthesize an infix operand:
            # -(x + y) is emitted as (-x + y), ~(x < y) as (!x < y); this includes values
            # that *render* as infix: names of earlier statements, x.T, logsumexp (log(s) + m)
            raise Reject("filtered")
        return node(f"-{a.op()}", a.shape, a.dtype, *wrapped(a.dtype, -a.hi, -a.lo), [a])

    def binop(self, op: str, a: E, b: E) -> E:
        if not literal_fits(a, b):
            raise Reject("literal out of the integer dtype's range")
        if "bool" in (a.dtype, b.dtype):
            raise Reject("bool arithmetic")
        shape = self.bcast(a.shape, b.shape)
        if shape is None:
            raise Reject("shapes")
        dt = unify(a, b)
        if op == "+":
            lo, hi = a.lo + b.lo, a.hi + b.hi
        elif op == "-":
            lo, hi = a.lo - b.hi, a.hi - b.lo
        elif op == "*":
            lo, hi = mul_iv(a, b)
        else:
            if b.lo < 0.1 and b.hi > -0.1:
                raise Reject("division by ~0")
            if is_int(dt):
                dt = "f64"
            inv = (1 / b.hi, 1 / b.lo)
            ps = [a.lo * inv[0], a.lo * inv[1], a.hi * inv[0], a.hi * inv[1]]
            lo, hi = min(ps), max(ps)
        if a.weak and b.weak:
            raise Reject("constant folding")
        lo, hi = wrapped(dt, lo, hi)
        if op == "-" and a.text == b.text and "fp_contract" in self.filters:
            # bug (fixed): the CPU build contracts a*b - a*b into an FMA (g++ -O3 -march=native defaults
            # to -ffp-contract=fast), so x - x is not 0 when x is a product
            raise Reject("filtered")
        if not fits(dt, lo, hi):
            raise Reject("range")
        return node(f"{a.op()} {op} {b.op()}", shape, dt, lo, hi, [a, b])

    def power(self, a: E, n) -> E:
        if a.dtype == "bool" or a.weak:
            raise Reject("pow")
        dt = a.dtype
        if isinstance(n, float) or n < 0:
            if a.lo < 0.1:
                raise Reject("pow domain")
            dt = float_of(dt)
        if isinstance(n, int) and n >= 0:
            ps = [a.lo ** n, a.hi ** n] + ([0.0] if a.lo <= 0 <= a.hi else [])
            lo, hi = min(ps), max(ps)
        else:
            lo, hi = sorted((a.lo ** n, a.hi ** n))
        lo, hi = wrapped(dt, lo, hi)
        if not fits(dt, lo, hi):
            raise Reject("range")
        nt = str(n) if n >= 0 else f"-{-n}"
        return node(f"{a.op()} ** {nt}", a.shape, dt, lo, hi, [a])

    def intdiv(self, op: str, a: E, b: E) -> E:
        if not literal_fits(a, b):
            raise Reject("literal out of the integer dtype's range")
        shape = self.bcast(a.shape, b.shape)
        if shape is None or not is_int(a.dtype) or not is_int(b.dtype):
            raise Reject("intdiv")
        dt = unify(a, b)
        if op == "%":
            m = max(abs(b.lo), abs(b.hi))
            lo, hi = (0, m) if b.lo > 0 else (-m, 0) if b.hi < 0 else (-m, m)
        else:
            lo, hi = -a.mag - 1, a.mag + 1
        return node(f"{a.op()} {op} {b.op()}", shape, dt, lo, hi, [a, b])

    def minmax(self, fn: str, a: E, b: E) -> E:
        if not literal_fits(a, b):
            raise Reject("literal out of the integer dtype's range")
        if "bool" in (a.dtype, b.dtype) or (a.weak and b.weak):
            raise Reject("minmax")
        shape = self.bcast(a.shape, b.shape)
        if shape is None:
            raise Reject("shapes")
        dt = unify(a, b)
        f = max if fn == "maximum" else min
        return node(f"{fn}({a.text}, {b.text})", shape, dt, f(a.lo, b.lo), f(a.hi, b.hi), [a, b],
                    atom=True)

    def clamp(self, a: E, lo: float, hi: float) -> E:
        if a.dtype == "bool":
            raise Reject("clamp")
        dt = unify(a, lit(float(lo)))
        return node(f"clamp({a.text}, {lit(float(lo)).text}, {lit(float(hi)).text})", a.shape, dt,
                    min(max(a.lo, lo), hi), max(min(a.hi, hi), lo), [a], atom=True)

    def leaky(self, a: E, slope: float) -> E:
        if a.dtype == "bool":
            raise Reject("leaky")
        dt = float_of("f32" if a.weak else a.dtype)
        lo = min(a.lo, a.lo * slope, 0.0) if a.lo < 0 else a.lo
        return node(f"leaky_relu({a.text}, {slope!r})", a.shape, dt, lo, max(a.hi, 0.0), [a],
                    atom=True)

    def compare(self, op: str, a: E, b: E) -> E:
        if not literal_fits(a, b):
            raise Reject("literal out of the integer dtype's range")
        if "bool" in (a.dtype, b.dtype) or (a.weak and b.weak):
            raise Reject("compare")
        if (a.red or b.red) and "bool_workspace" in self.filters:
            # bug (fixed): a comparison of a reduction's result can be materialized between kernels as a
            # bool workspace, which has no C type: KeyError 'bool' in cpu.render_kernel
            raise Reject("filtered")
        shape = self.bcast(a.shape, b.shape)
        if shape is None:
            raise Reject("shapes")
        return node(f"{a.op()} {op} {b.op()}", shape, "bool", 0, 1, [a, b])

    def logic(self, op: str, a: E, b: E) -> E:
        shape = self.bcast(a.shape, b.shape)
        if shape is None or a.dtype != "bool" or b.dtype != "bool":
            raise Reject("logic")
        return node(f"{a.op()} {op} {b.op()}", shape, "bool", 0, 1, [a, b])

    def invert(self, a: E) -> E:
        if a.dtype != "bool":
            raise Reject("invert")
        if "unary_prefix" in self.filters and not prefix_safe(a):
            raise Reject("filtered")  # see neg()
        return node(f"~{a.op()}", a.shape, "bool", 0, 1, [a])

    def where(self, c: E, a: E, b: E) -> E:
        if not literal_fits(a, b):
            raise Reject("literal out of the integer dtype's range")
        if c.dtype != "bool" or "bool" in (a.dtype, b.dtype) or (a.weak and b.weak):
            raise Reject("where")
        s = broadcast(a.shape, b.shape)
        shape = None if s is None else self.bcast(c.shape, s)
        if shape is None:
            raise Reject("shapes")
        dt = unify(a, b)
        return node(f"where({c.text}, {a.text}, {b.text})", shape, dt, min(a.lo, b.lo),
                    max(a.hi, b.hi), [c, a, b], atom=True)

    def axes_text(self, rank: int, axes: tuple) -> str:
        """An axis= argument for the (sorted, normalized) axes: int, negative, or tuple."""
        reps = [a - rank if self.ch.chance(0.4) else a for a in axes]
        if len(reps) == 1 and self.ch.chance(0.75):
            return str(reps[0])
        if len(reps) > 1 and self.ch.chance(0.3):
            reps = reps[::-1]  # order does not matter
        return "(" + ", ".join(str(r) for r in reps) + ("," if len(reps) == 1 else "") + ")"

    def reduce(self, fn: str, a: E, axes: tuple | None, keep: bool | None) -> E:
        if a.dtype == "bool" or a.weak or not a.shape:
            raise Reject("reduce operand")
        if fn in ("softmax", "logsumexp") and a.dtype in ("f16", "bf16") and \
                "sixteen_bit_internals" in self.filters:
            # bug (fixed): 16-bit softmax / logsumexp round their internal steps (x - max, exp,
            # sum, log) to 16 bits: bf16 results are several ulps off, which later powers and
            # softmaxes amplify past bf16's tolerance. Compute them in f32 instead.
            r = self.reduce(fn, self.cast(a, "f32"), axes, keep)
            return self.cast(r, a.dtype) if self.ch.chance(0.5) else r
        rank = len(a.shape)
        all_axes = tuple(range(rank))
        ax = all_axes if axes is None else axes
        dt = a.dtype
        if fn in ("mean", "logsumexp", "softmax") and is_int(dt):
            dt = promote(dt, "f16")
        n = numel_max((a.shape[i] for i in ax), self.dim_max)
        if fn == "mean" and dt == "f16" and n * max(a.mag, 1.0) >= 65000 and \
                "f16_mean" in self.filters:
            # bug (fixed): f16 mean() rounds its sum and its element count to f16 before dividing
            raise Reject("filtered")
        if fn == "sum":
            lo, hi = min(a.lo, a.lo * n), max(a.hi, a.hi * n)
        elif fn in ("max", "min", "mean"):
            lo, hi = a.lo, a.hi
        elif fn == "logsumexp":
            if a.mag > 60 or (dt in ("f16", "bf16") and a.hi - a.lo > 16):
                raise Reject("lse range")
            lo, hi = a.lo, a.hi + math.log(n)
        else:  # softmax
            if dt in ("f16", "bf16") and a.hi - a.lo > 16:
                raise Reject("softmax range")
            lo, hi = 0.0, 1.0
        if not fits(dt, lo, hi):
            raise Reject("range")
        if "size1_axis" in self.filters and any(a.shape[i] == 1 for i in ax):
            # bug (fixed): reductions (softmax, logsumexp) over an axis of constant size 1 next to other
            # reductions of the same rows fail in tile lowering: AssertionError "%N is on chip but
            # used at another position"
            raise Reject("filtered")
        kw = []
        if axes is not None:
            kw.append(f"axis={self.axes_text(rank, ax)}")
        elif fn == "softmax":
            raise Reject("softmax needs axis")
        if fn == "softmax":
            shape = a.shape
        else:
            shape = tuple(1 if i in ax else d for i, d in enumerate(a.shape) if keep or i not in ax)
            if not shape and "scalar_workspace" in self.filters:
                # bug (fixed): a rank-0 value that another kernel reads (a reduction over all axes, or
                # any scalar statement under `fuse off`) crashes the CPU renderer: IndexError
                # in cpu._bytes_expr
                raise Reject("filtered")
            if keep is not None:
                kw.append(f"keepdims={keep}")
        return node(f"{fn}({', '.join([a.text] + kw)})", shape, dt, lo, hi, [a], atom=True, red=True)

    # -- random composition
    def random_axes(self, rank: int):
        """(axes or None for 'no axis=', keepdims True/False/None)."""
        k = self.ch.integer(0, 9)
        keep = self.ch.choice((True, False, None))
        if k == 0:
            return None, keep
        if k <= 6:
            return (self.ch.integer(0, rank - 1),), keep
        sub = tuple(i for i in range(rank) if self.ch.chance(0.6))
        return (sub or (rank - 1,)), keep

    def random_reduce(self, a: E) -> E:
        if not a.shape:
            raise Reject("scalar")
        fn = self.ch.choice(("sum", "max", "min", "mean", "logsumexp", "sum", "mean", "max"))
        axes, keep = self.random_axes(len(a.shape))
        if fn == "sum" and (a.dtype == "f16" and numel_max(a.shape, self.dim_max) > 4096):
            a = self.cast(a, "f32") if self.ch.chance(0.5) else self.binop("*", a, lit(0.0625))
        if fn == "logsumexp":
            a = self.squash(a, exp_bound(a))
        return self.reduce(fn, a, axes, keep)

    def random_softmax(self, a: E) -> E:
        rank = len(a.shape)
        if rank == 0:
            raise Reject("scalar")
        a = self.squash(a, exp_bound(a))
        if self.ch.chance(0.85):
            ax = (rank - 1,) if self.ch.chance(0.6) else (self.ch.integer(0, rank - 1),)
        else:
            ax = tuple(i for i in range(rank) if self.ch.chance(0.6)) or (0,)
        return self.reduce("softmax", a, ax, None)

    def template(self, a: E, pool) -> E:
        """Common fused patterns: norms, manual softmax, log-softmax, max-scaling."""
        if not a.shape or a.dtype == "bool":
            raise Reject("template operand")
        rank = len(a.shape)
        ax = (rank - 1,) if self.ch.chance(0.6) else (self.ch.integer(0, rank - 1),)
        k = self.ch.integer(0, 6)
        a = self.squash(a, min(4.0, exp_bound(a)))
        if k == 6:  # masked softmax: -inf where the mask is set (a causal mask never masks a
            # whole row along the last axis; a value mask may, and then the row is nan)
            if rank >= 2 and (self.ch.chance(0.5) or "nan_propagation" in self.filters):
                # bug (nan_propagation, fixed): relu(nan) is 0 and max/min reductions skip nan in the
                # CPU build, where NumPy (the interpreter) propagates it; a value mask can mask
                # a whole row (a nan row), a causal mask never does
                mask = self.compare(">", node(f"index({a.text}, -1)", a.shape, "i64", 0, 256, [a],
                                              atom=True),
                                    node(f"index({a.text}, -2)", a.shape, "i64", 0, 256, [a],
                                         atom=True))
                ax = (rank - 1,)
            else:
                mask = self.condition(pool)
            shape = self.bcast(mask.shape, a.shape)
            if shape is None:
                raise Reject("shapes")
            masked = node(f"where({mask.text}, -inf, {a.text})", shape, a.dtype if not a.weak
                          else "f32", a.lo, a.hi, [mask, a], atom=True)
            return self.reduce("softmax", masked, ax if rank == len(shape) else
                               (len(shape) - 1,), None)
        if k == 0:  # rmsnorm
            x2 = self.binop("*", a, a)
            ms = self.reduce("mean", x2, ax, True)
            eps = self.ch.choice([lit(1e-5)] + [e for e in pool if e.shape == () and
                                                e.lo > 0 and not e.weak])
            r = self.unary("rsqrt", self.binop("+", ms, eps))
            return self.binop("*", a, r)
        if k == 1:  # layernorm
            d = self.binop("-", a, self.reduce("mean", a, ax, True))
            var = self.reduce("mean", self.binop("*", d, d), ax, True)
            return self.binop("*", d, self.unary("rsqrt", self.binop("+", var, lit(1e-5))))
        if k == 2:  # softmax written out
            e = self.unary("exp", self.binop("-", a, self.reduce("max", a, ax, True)))
            s = self.reduce("sum", e, ax, True)
            return node(f"{e.op()} / {s.op()}", a.shape, e.dtype, 0.0, 1.0, [e, s])
        if k == 3:  # log-softmax
            return self.binop("-", a, self.reduce("logsumexp", a, ax, True))
        if k == 4:  # scale by the max magnitude (|a| <= max|a|: well conditioned)
            m = self.reduce("max", self.unary("abs", a), ax, True)
            if "nan_propagation" in self.filters:  # an all-zero row would give 0/0 = nan
                m = self.binop("+", m, lit(0.001))
            dt = unify(a, m)
            dt = "f64" if is_int(dt) else dt  # true division of integers
            return node(f"{a.op()} / {m.op()}", a.shape, dt, -1.0, 1.0, [a, m])
        # softmax with a non-keepdims reduction broadcast back (axis 0 only broadcasts)
        m = self.reduce("max", a, (0,), False)
        if broadcast(m.shape, a.shape) != a.shape:
            raise Reject("broadcast")
        e = self.unary("exp", self.binop("-", a, m))
        s = self.reduce("sum", e, (0,), False)
        return node(f"{e.op()} / {s.op()}", a.shape, e.dtype, 0.0, 1.0, [e, s])

    def index_condition(self, a: E) -> E:
        """A mask from index(): causal-like (two axes) or a position test (one axis)."""
        rank = len(a.shape)
        if not rank:
            raise Reject("scalar")
        i = self.ch.integer(0, rank - 1)
        ia = node(f"index({a.text}, {i - rank if self.ch.chance(0.5) else i})", a.shape, "i64",
                  0, 256, [a], atom=True)
        if rank >= 2 and self.ch.chance(0.6):
            j = self.ch.choice([x for x in range(rank) if x != i])
            ib = node(f"index({a.text}, {j - rank if self.ch.chance(0.5) else j})", a.shape, "i64",
                      0, 256, [a], atom=True)
            return self.compare(self.ch.choice(("<", "<=", ">", ">=")), ia, ib)
        k = self.ch.integer(0, 2)
        if k == 0 or "i64_floordiv" in self.filters:
            # bug (i64_floordiv, fixed): `//` and `%` of an i64 value (index()) by a literal do not
            # compile: the literal renders as an int and tilec::floormod<T> cannot deduce T
            return self.compare(self.ch.choice(("<", ">=")), ia, lit(self.ch.choice((1, 2, 5))))
        m = node(f"{ia.op()} % {self.ch.choice((2, 3))}", a.shape, "i64", 0, 2, [ia])
        return self.compare(self.ch.choice(("==", "!=")), m, lit(0))

    def condition(self, pool) -> E:
        a = self.pick_leaf(pool, lambda e: e.dtype != "bool" and not e.weak)
        if a.shape and self.ch.chance(0.2):
            return self.index_condition(a)
        op = self.ch.choice(("<", "<=", ">", ">=", "==", "!="))
        if is_int(a.dtype) or self.ch.chance(0.5):
            b = lit(self.ch.choice((0, 1, -2)) if is_int(a.dtype) else self.ch.choice((0.0, 0.25, -0.5)))
            if op in ("==", "!=") and not is_int(a.dtype):
                op = ">"
        else:
            b = self.pick_leaf(pool, lambda e: e.dtype != "bool" and not e.weak and
                               broadcast(e.shape, a.shape) is not None, recent=False)
            if op in ("==", "!=") and not (is_int(a.dtype) and is_int(b.dtype)):
                op = "<"
        c = self.compare(op, a, b)
        k = self.ch.integer(0, 5)
        if k == 0:
            c = self.invert(c)
        elif k == 1:
            other = self.condition_simple(pool, c.shape)
            c = self.logic(self.ch.choice(("&", "|")), c, other)
        return c

    def condition_simple(self, pool, shape) -> E:
        a = self.pick_leaf(pool, lambda e: e.dtype != "bool" and not e.weak and
                           broadcast(e.shape, shape) is not None, recent=False)
        return self.compare(">", a, lit(0 if is_int(a.dtype) else 0.0))

    def step(self, pool, first: E | None = None) -> E:
        """One new expression built from pool members (`first`: its main operand)."""
        ch = self.ch
        k = ch.integer(0, 15)
        val = lambda e: e.dtype != "bool" and not e.weak  # noqa: E731
        a = first if first is not None else self.pick_leaf(pool, val)
        if k <= 2:  # arithmetic
            op = ch.choice(("+", "-", "*", "/", "+", "*"))
            if is_int(a.dtype) and ch.chance(0.4):  # Python floor semantics on negative values
                if ch.chance(0.5):
                    b = lit(ch.choice((2, 3, -3, 5)))
                else:
                    b = self.pick_leaf(pool, lambda e: is_int(e.dtype) and not e.weak and
                                       broadcast(e.shape, a.shape) is not None, recent=False)
                    if ch.chance(0.5):  # (a zero divisor gives 0, as in NumPy)
                        b = self.binop("+", self.binop("*", b, b), lit(1))
                return self.intdiv(ch.choice(("//", "%")), a, b)
            if ch.chance(0.25):
                b = lit(ch.choice((0.5, 2.0, 1.5, 0.25, 3.0, -1.0, 1)))
            else:
                b = self.pick_leaf(pool, lambda e: val(e) and broadcast(e.shape, a.shape) is not None,
                                   recent=False)
            if ch.chance(0.3):
                a, b = b, a
            if op == "/" and (b.lo < 0.1 and b.hi > -0.1):
                b = self.positivize(b)
            return self.binop(op, a, b)
        if k <= 4:  # unary functions
            fn = ch.choice(UNARY_ANY + UNARY_SMALL + UNARY_POS)
            if fn in UNARY_POS and a.lo < 0.05:
                a = self.positivize(a)
            if fn in ("exp", "exp2"):
                a = self.squash(a, min(4.0, exp_bound(a)))
            if fn in ("sin", "cos"):
                a = self.squash(a, 4.0)
            if is_int(a.dtype) and ch.chance(0.5):
                a = self.cast(a, "f32")
            return self.unary(fn, a)
        if k == 5:
            return self.random_reduce(a)
        if k == 6:
            return self.random_softmax(a)
        if k == 7:
            return self.template(a, pool)
        if k == 8:  # where
            c = self.condition(pool)
            b = self.pick_leaf(pool, lambda e: val(e) and broadcast(e.shape, a.shape) is not None,
                               recent=False) if ch.chance(0.7) else lit(ch.choice((0.0, -1.0, 1.0)))
            if ch.chance(0.3):
                a, b = b, a
            return self.where(c, a, b)
        if k == 9:  # casts, transposes
            if a.dtype == "bool":
                raise Reject("bool")
            square = len(a.shape) >= 2 and a.shape[-1] == a.shape[-2]
            if square and "square_transpose" in self.filters:
                # bug (fixed): x.T of a square [R, R] value fused with a reduction of the same
                # [R, R] domain: AssertionError "%N is on chip but used at another position"
                raise Reject("filtered")
            if len(a.shape) >= 2 and ch.chance(0.25):
                s = a.shape[:-2] + (a.shape[-1], a.shape[-2])
                t = f"{a.op()}.T" if ch.chance(0.5) else f"transpose({a.text})"
                # (not an atom: it renders as its operand's expression, e.g. in -x.T)
                return node(t, s, a.dtype if not a.weak else "f32", a.lo, a.hi, [a])
            return self.cast(a, ch.choice(("f16", "bf16", "f32", "f32", "f64")))
        if k == 10:
            b = self.pick_leaf(pool, lambda e: val(e) and broadcast(e.shape, a.shape) is not None,
                               recent=False) if ch.chance(0.8) else lit(ch.choice((0.0, 0.5)))
            return self.minmax(ch.choice(("maximum", "minimum")), a, b)
        if k == 11:
            if ch.chance(0.5):
                lo = ch.choice((-1.0, -0.5, 0.0))
                return self.clamp(a, lo, ch.choice((0.25, 0.5, 2.0)))
            return self.leaky(a, ch.choice((0.01, 0.1, 0.2)))
        if k == 12:  # powers, negation
            if ch.chance(0.3):
                return self.neg(a)
            n = ch.choice((2, 3, 2, -1, 0.5, -2))
            if (isinstance(n, float) or n < 0) and a.lo < 0.1:
                a = self.positivize(a)
            if n == 3 and a.mag > 30:
                a = self.squash(a, 4.0)
            return self.power(a, n)
        if k == 13:  # a dimension as a scalar
            if self.fuse_off and "scalar_workspace" in self.filters:
                raise Reject("filtered")  # f32(C) in two statements: a rank-0 workspace
            syms = sorted({d for e in pool for d in e.shape if isinstance(d, str)} & self.bound)
            if not syms:
                raise Reject("no dims")
            d = ch.choice(syms)
            form = ch.integer(0, 2)
            if form == 0:
                return self.binop("/", a, E(d, (), "i64", 1, self.dim_max[d], weak=True))
            if form == 1:
                r = node(f"rsqrt(f32({d}))", (), "f32", 1 / math.sqrt(self.dim_max[d]), 1.0, [])
                return self.binop("*", a, r)
            r = node(f"f32({d})", (), "f32", 1, self.dim_max[d], [])
            return self.binop("/", a, r)
        if k == 14:  # comparison result used as a number
            c = self.condition(pool)
            return self.cast(c, ch.choice(("f32", "f16", "i32")))
        # 15: the same function applied to a bigger combination (grows expression depth)
        b = self.pick_leaf(pool, lambda e: val(e) and broadcast(e.shape, a.shape) is not None,
                           recent=False)
        return self.binop(ch.choice(("+", "*")), self.unary(ch.choice(UNARY_ANY), a), b)

    def expression(self, pool, steps: int, first: E | None = None) -> E:
        pool = list(pool)
        made = []
        tries = 0
        while len(made) < steps and tries < 12 * steps:
            tries += 1
            try:
                e = self.step(pool + made, first if not made and tries <= 3 else None)
            except Reject:
                continue
            if e.size > 40:
                continue
            made.append(e)
        if not made:
            raise Reject("nothing built")
        # the newest value, usually the biggest combination
        return made[-1] if self.ch.chance(0.7) else self.ch.choice(made)

    # -- whole programs
    def output_dtype(self, e: E) -> str:
        if e.dtype == "bool":
            return self.ch.choice(("f32", "i32", "f16", "u8"))
        if is_int(e.dtype):
            opts = [e.dtype, "f32"] + (["f16"] if e.mag <= 2048 else [])
            return self.ch.choice(opts)
        fp8 = FP8 if self.ch.chance(0.3) and self.fp8 else ()
        opts = [d for d in (e.dtype, e.dtype, "f32", "f16", "bf16", "f64") + fp8
                if TOL[d] >= e.tol and fits(d, e.lo, e.hi)]
        return self.ch.choice(opts or [e.dtype])

    def program(self) -> Program:
        ch = self.ch
        k = ch.integer(0, 19)
        self.dim_values = LONG_ROWS if k == 0 else MANY_ROWS if k == 1 else DIM_VALUES
        self.dim_max = {d: max(v) for d, v in self.dim_values.items()}
        # inputs
        n_in = ch.integer(1, 3)
        inputs, pool = [], []
        self.bound = set()
        odd = ch.chance(0.1)
        for i in range(n_in):
            shape = ch.choice(TENSOR_SHAPES) if i == 0 or ch.chance(0.8) else ()
            if i == 0 and ch.chance(0.5):
                shape = ("R", "C")
            dt = ch.choice(FLOATS + FLOATS + ("i32",)) if shape else ch.choice(("f32", "f32", "f16",
                                                                                  "bf16", "f64"))
            if dt == "i32" and ch.chance(0.5):  # narrow integers, whose arithmetic wraps
                dt = ch.choice(("i8", "u8", "i16"))
            if odd and i == 0:
                name = ch.choice(ODD_NAMES)
                self.names_used.add(name)
            else:
                name = self.fresh("x" if shape else "s")
            inputs.append((name, dt, shape))
            self.bound |= {d for d in shape if isinstance(d, str)}
            if dt in ("i32", "i8", "i16"):
                e = E(name, shape, dt, -8, 8)
            elif dt == "u8":
                e = E(name, shape, dt, 0, 8)
            elif shape:
                e = E(name, shape, dt, -1.0, 1.0)
            else:
                e = E(name, shape, dt, 0.1, 1.0)
            pool.append(e)
        # a CPU schedule (sometimes): per-statement kernels, row blocks, thread counts
        sched = [it for it in ("fuse off", f"tile M={ch.choice((1, 3, 8, 64))}",
                               f"threads {ch.choice((1, 2, 3))}") if ch.chance(0.1)]
        self.fuse_off = "fuse off" in sched
        if self.fuse_off and "scalar_workspace" in self.filters and any(
                not s for _, _, s in inputs):
            # see reduce(): under `fuse off`, a scalar shared by two statements (e.g. the cast
            # of a scalar parameter, f32(C)) becomes a rank-0 workspace
            sched.remove("fuse off")
            self.fuse_off = False
        # statements
        n_st = ch.integer(1, 3)
        stmts, outs, vdt, temps = [], [], [], set()
        for k in range(n_st):
            last = k == n_st - 1
            unused = [p for p in pool if p.text in temps and not any(
                re.search(rf"\b{p.text}\b", s.split(" = ", 1)[1]) for s in stmts)]
            first = unused[-1] if unused and ch.chance(0.8) else None
            e = self.expression(pool, ch.integer(1, 4), first)
            if e.size == 1 and ch.chance(0.7) and not last:
                continue
            if not e.shape and self.fuse_off and "scalar_workspace" in self.filters and not last:
                continue  # see reduce(): a scalar statement's value becomes a rank-0 workspace
            as_output = last or ch.chance(0.5)
            if "output_alias" in self.filters and as_output and any(
                    e.text == s.split(" = ", 1)[1] for s in stmts):
                # bug (fixed): of two outputs with the same value after CSE (Y = exp(X); Z = exp(X), or
                # Y = X; Z = X) only one is written
                if last:
                    raise Reject("output alias")
                as_output = False
            if as_output and not e.shape:
                # outputs need a shape: combine with a tensor
                t = self.pick_leaf(pool, lambda v: v.shape and v.dtype != "bool" and not v.weak)
                e = self.binop("+", e if e.dtype != "bool" else self.cast(e, "f32"), t)
            if as_output:
                name = self.fresh("out")
                dt = self.output_dtype(e)
                if not fits(dt, e.lo, e.hi):
                    dt = "f32"
                outs.append((name, dt, e.shape))
                vdt.append(e.dtype)
                stmts.append(f"{name} = {e.text}")
                if dt != "u8" and dt not in FP8:
                    # later statements see the value converted to the output's dtype
                    # (not an atom: tilec inlines the value's expression where the name is used)
                    pool.append(E(name, e.shape, dt, e.lo, e.hi, max(e.tol, TOL.get(dt, 0.0)),
                                  atom=False, red=e.red))
                if ch.chance(0.05):  # a second output with the same value: a copy
                    n2 = self.fresh("out")
                    outs.append((n2, dt, e.shape))
                    vdt.append(dt)
                    stmts.append(f"{n2} = {name}")
            else:
                rebind = [p for p in pool if p.text in temps]
                name = ch.choice([p.text for p in rebind]) if rebind and ch.chance(0.2) else \
                    self.fresh("t")
                stmts.append(f"{name} = {e.text}")
                temps.add(name)
                pool = [p for p in pool if p.text != name]
                pool.append(E(name, e.shape, e.dtype, e.lo, e.hi, e.tol, atom=False, red=e.red))
        # dims
        dims = {}
        for d in sorted(self.bound):
            dims[d] = ch.choice(self.dim_values[d])
        order = list(range(len(outs)))
        if len(order) > 1 and ch.chance(0.5):
            order = order[::-1]
        outs = [outs[i] for i in order]
        vdt = [vdt[i] for i in order]
        params = ", ".join(f"{n}: {dt}{shape_text(s) if s else ''}" for n, dt, s in inputs)
        res = ", ".join(f"{n}: {dt}{shape_text(s)}" for n, dt, s in outs)
        if len(outs) > 1 or ch.chance(0.2):
            res = f"({res})"
        body = "\n".join("    " + s for s in stmts)
        text = f"kernel rnd({params}) -> {res}:\n{body}\n"
        if sched:
            lines = "".join(f"        {it}\n" for it in sched)
            text += f"\nschedule rnd:\n    target cpu:\n{lines}"
        return Program(text, dims, "rnd", inputs, outs, vdt)


def random_program(seed, filters=None, fp8: bool = True) -> Program:
    """A random program from `seed`; fp8=False: none of its outputs is fp8 (for the HIP target,
    which does not build them yet)."""
    while True:
        try:
            return Generator(RandomChooser(seed), filters, fp8).program()
        except Reject:
            seed = hash((seed, 1)) & 0xFFFFFFFF


if __name__ == "__main__":
    import sys
    for s in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        p = random_program(s)
        print(f"# dims={p.dims}\n{p.text}")
