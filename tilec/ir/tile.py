"""Tile IR: kernels over a grid of blocks, with buffers in memory scopes, tile copies, tile GEMMs,
reductions and parallel loops. Its printer prints the tile-level .tile syntax (LANGUAGE.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .types import Dim, value_key

# Names of what the launcher knows of the machine, which a variant's condition may hold next to
# the dimensions: the number of threads a call may use (the CPU's `omp_get_max_threads()`) and
# the GPU's multiprocessors (CUDA's `tilec::sm_count()`); the reference interpreter takes
# MACHINE's values (it runs every variant alike: they only change speed)
THREADS = "tilec_threads"
SMS = "tilec_sms"
MACHINE = {THREADS: 1, SMS: 132}


# ---- expressions -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Var:
    name: str
    dtype: str = "i64"


@dataclass(frozen=True, slots=True, eq=False)
class Const:
    value: object
    dtype: str

    # equal constants also agree in a zero's sign (value_key), or passes that share equal
    # expressions (hoisting a kernel-wide `s * -0.0` beside an `s * 0.0`) divide by the wrong zero
    def _key(self) -> tuple:
        return (value_key(self.value), self.dtype)

    def __eq__(self, other) -> bool:
        return type(other) is Const and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True, slots=True)
class Load:
    buf: str
    idx: tuple
    dtype: str


@dataclass(frozen=True, slots=True)
class Unary:
    fn: str
    x: object
    dtype: str


@dataclass(frozen=True, slots=True)
class Binary:
    fn: str  # add sub mul div floordiv mod maximum minimum and or pow | idiv imod cdiv min max (index math)
    a: object
    b: object
    dtype: str
    exponent: object = None  # pow only


@dataclass(frozen=True, slots=True)
class Compare:
    fn: str
    a: object
    b: object
    dtype: str = "bool"


@dataclass(frozen=True, slots=True)
class Select:
    cond: object
    a: object
    b: object
    dtype: str


@dataclass(frozen=True, slots=True)
class Cast:
    x: object
    dtype: str


@dataclass(frozen=True, slots=True)
class Fma:
    """a * b + c where a matrix product accumulates (float dtypes): the target may round once
    (a fused multiply-add); elementwise `x * y + z` of a program stays a Binary and never fuses."""

    a: object
    b: object
    c: object
    dtype: str


# index-math helpers (i64, non-negative operands)
def iconst(v: int) -> Const:
    return Const(int(v), "i64")


def iadd(a, b):
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return iconst(a.value + b.value)
    return Binary("add", a, b, "i64")


def isub(a, b):
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return iconst(a.value - b.value)
    return Binary("sub", a, b, "i64")


def imin(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return iconst(min(a.value, b.value))
    return Binary("min", a, b, "i64")


def imul(a, b):
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const) and x.value == 1:
            return y
        if isinstance(x, Const) and x.value == 0:
            return iconst(0)
    if isinstance(a, Const) and isinstance(b, Const):
        return iconst(a.value * b.value)
    return Binary("mul", a, b, "i64")


def idiv(a, b):
    if isinstance(b, Const) and b.value == 1:
        return a
    return Binary("idiv", a, b, "i64")


def imod(a, b):
    if isinstance(b, Const) and b.value == 1:
        return iconst(0)
    return Binary("imod", a, b, "i64")


def ilt(a, b):
    return Compare("lt", a, b)


_NEGATED = {"lt": "ge", "ge": "lt", "le": "gt", "gt": "le", "eq": "ne", "ne": "eq"}


def lnot(c):
    """Boolean `c` negated: an integer comparison by its opposite (`a >= b` becomes `a < b`;
    not a float's, which a NaN makes false both ways), `and` and `or` by De Morgan's laws,
    anything else as `not c`."""
    if isinstance(c, Compare) and c.fn in _NEGATED and all(
            getattr(x, "dtype", None) in ("i32", "i64") for x in (c.a, c.b)):
        return Compare(_NEGATED[c.fn], c.a, c.b)
    if isinstance(c, Binary) and c.fn in ("and", "or") and c.dtype == "bool":
        return Binary("or" if c.fn == "and" else "and", lnot(c.a), lnot(c.b), "bool")
    return Unary("not", c, "bool")


def land(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return Binary("and", a, b, "bool")


def dim_to_expr(d: Dim):
    """A shape `Dim` as an i64 Tile IR expression."""
    if d.op == "sym":
        return Var(d.args[0])
    if d.op == "const":
        return iconst(d.args[0])
    a, b = (dim_to_expr(x) for x in d.args)
    return {"add": iadd, "sub": isub, "mul": imul, "floordiv": idiv, "mod": imod,
            "cdiv": lambda x, y: Binary("cdiv", x, y, "i64"),
            "min": lambda x, y: Binary("min", x, y, "i64"),
            "max": lambda x, y: Binary("max", x, y, "i64")}[d.op](a, b)


# `//` and `%` of i64 values: `idiv`/`imod` (C's / and %) where the dividend cannot be negative
# and the divisor cannot be zero or negative, `floordiv`/`mod` (NumPy's, with x // 0 == 0)
# elsewhere. The tile pass and the tile-level parser both follow this rule, so a printed kernel
# (where both print as // and %) reads back as the same IR.
def nonneg(e, index_vars) -> bool:
    """`e` cannot be negative: constants >= 0, block/loop variables and dimensions (named in
    `index_vars`), and + * // % cdiv min of those."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Var):
        return e.name in index_vars
    if isinstance(e, Binary) and e.fn in ("add", "mul", "idiv", "imod", "cdiv", "min", "max",
                                          "floordiv", "mod"):
        return e.dtype == "i64" and nonneg(e.a, index_vars) and nonneg(e.b, index_vars)
    return False


def positive(e, dims) -> bool:
    """`e` cannot be zero or negative: constants > 0, dimensions (each at least 1; named in
    `dims`), and sums and products of those."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value > 0
    if isinstance(e, Var):
        return e.name in dims
    if isinstance(e, Binary) and e.fn in ("add", "mul", "cdiv"):
        return e.dtype == "i64" and positive(e.a, dims) and positive(e.b, dims)
    return False


def int_division(fn: str, a, b, index_vars, dims):
    """The node for `a // b` (fn "floordiv") or `a % b` ("mod") of i64 values, by the rule above."""
    if nonneg(a, index_vars) and positive(b, dims):
        return Binary("idiv" if fn == "floordiv" else "imod", a, b, "i64")
    return Binary(fn, a, b, "i64")


# ---- statements --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Alloc:
    name: str
    scope: str  # shared | fragment | local
    dtype: str
    shape: tuple  # expressions (Const for static sizes)
    layout: object = None  # GPU targets: how threads hold it (ir/layout.py), set by the layout pass


@dataclass(frozen=True, slots=True)
class Fill:
    buf: str
    value: object


@dataclass(frozen=True, slots=True)
class Region:
    buf: str
    offsets: tuple | None = None  # a window of a global tensor starting at offsets; for a
    #                               shared buffer with a leading stage axis, the stage index


@dataclass(frozen=True, slots=True)
class Copy:
    src: Region
    dst: Region
    async_: bool = False  # issued now, complete after a later `wait` (GPU cp.async)
    loc: object = field(default=None, compare=False)  # hand-written copies: where, for errors


@dataclass(frozen=True, slots=True)
class Commit:
    """Close the group of async copies issued since the last commit."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until at most `pending` committed groups of async copies are still in flight."""

    pending: int


@dataclass(frozen=True, slots=True)
class Barrier:
    """All threads of the block reach this point, and their shared-memory writes are visible."""


@dataclass(frozen=True, slots=True)
class Let:
    """A scalar local: `name = value` (value computed once, read by the statements after it)."""

    name: str
    value: object


@dataclass(frozen=True, slots=True)
class Gemm:
    a: str
    b: str
    c: str
    transpose_a: bool = False
    transpose_b: bool = False
    a_stage: object = None  # stage index into a multi-buffered shared operand (pipeline pass)
    b_stage: object = None
    # overlapped (overlap_gemm pass): the fragments of the first k-step are already loaded (by a
    # GemmLoad, or by the previous iteration); `sync` runs before the last k-step, after which the
    # first k-step's fragments of stage `next_stage` load while the last k-step computes
    sync: tuple = ()
    next_stage: object = None
    refill: tuple = ()  # overlapped: statements run after `sync` (later tiles' copies into the stage)
    # f32 operands multiplied in tf32 on the matrix units (`precision tf32`, targets with tf32)
    tf32: bool = False
    # > 0: the matrix units sum each `promote` values of K into a partial sum, which is added to
    # c in f32 (fp8 products, which Hopper's tensor cores accumulate in less than f32 precision)
    promote: int = 0

    def k_extent(self, a_shape: tuple):
        """K's extent in a tile of operand a (`a_shape`, its buffer's shape): the last axis,
        or the one before it where a is read transposed."""
        return a_shape[-2] if self.transpose_a else a_shape[-1]


@dataclass(frozen=True, slots=True)
class GemmLoad:
    """Load the fragments of `gemm`'s first k-step (its operands at its stages), for the overlapped
    gemm of the loop that follows (overlap_gemm pass)."""

    gemm: Gemm


@dataclass(frozen=True, slots=True)
class GemvMma:
    """The partial sums of a GEMV of 4-bit weights by the target's GEMV routine (targets with
    `gemv_mma`: tilec_cuda.h gemv_dequant4_mma on the matrix units, tilec_cpu.h gemv_dequant4
    for f32, which scales each group's sum once): with idx = (row, first, rows, col0, m) and
    (S * mr) x BN the shape of shared `dst`, dst[w * mr + i, j] = the sum over warp w's rows r of
    f32(a[row + i, r]) * f32(dt((f32(q[r, col0 + j]) - zero) * f32(s[r // group, col0 + j]))), dt
    the dtype of s, for i < m (A's rows given, at most mr) and col0 + j below q's column count (0
    past it, and for i >= m). The 16-row chunks (rows 16c .. 16c + 15) that hold rows first ..
    first + rows - 1 go to the S warps in contiguous runs: warp w takes the rows of that range
    from 16 (first // 16) + w * per, per rows, per = 16 cdiv(chunks, S) (group is a multiple of
    16: a chunk lies in one group)."""

    a: str
    q: str
    s: str
    dst: str
    zero: int
    group: int
    idx: tuple  # (A's first row, first row of q, rows, first column, A's rows given)
    # q is [N, K] and s [N, K // group] (weights packed along K): q[r, n] above reads q[n, r]
    # and s[r // group, n] reads s[n, r // group]; the warps' rows go in 128-row chunks
    kmajor: bool = False
    mr: int = 1  # rows of A a warp's sums hold (a compile-time bound on m)


@dataclass(frozen=True, slots=True)
class Reduce:
    fn: str  # sum max min
    src: str
    dst: str
    axis: int = 1


@dataclass(frozen=True, slots=True)
class Allreduce:
    """Combine the partial row values (`fn` in sum max min) that the threads sharing each row of
    `buf` accumulated, so every thread holds the whole row's value (a no-op with one thread)."""

    fn: str
    buf: str
    loc: object = field(default=None, compare=False)  # hand-written: where, for errors


@dataclass(frozen=True, slots=True)
class Store:
    buf: str
    idx: tuple
    value: object
    loc: object = field(default=None, compare=False)  # hand-written stores: where, for errors


@dataclass(frozen=True, slots=True)
class For:
    vars: tuple
    extents: tuple
    kind: str  # range | parallel | pipelined | warp_specialized (Hopper: see passes/pipeline.py)
    body: tuple
    stages: int = 1
    by: object = None  # GPU parallel loops: the layout (ir/layout.py) that splits the iterations
    #                    over threads (each thread runs the iterations whose elements it holds)
    loc: object = field(default=None, compare=False)  # hand-written loops: where, for errors
    # pipelined loops (pipeline pass): when this holds, every tile copy in the body reads a
    # window wholly inside its tensor, in every iteration (None: not known)
    inside: object = None
    # range loops: the variable's first value (None: 0); it runs while below the extent
    start: object = None


@dataclass(frozen=True, slots=True)
class If:
    cond: object
    body: tuple
    orelse: tuple = ()


@dataclass(frozen=True, slots=True)
class TensorDecl:
    name: str
    dtype: str
    shape: tuple  # Dims
    kind: str  # input | output | workspace | scalar
    when: object = None  # workspaces: needed only when this Dim condition holds (else 0 bytes)


@dataclass(frozen=True, slots=True)
class TileKernel:
    name: str
    params: tuple  # TensorDecl it reads or writes (inputs/scalars first, then outputs/workspaces)
    grid: tuple  # i64 expressions, x first
    block_vars: tuple
    threads: int
    body: tuple
    comment: str = ""
    swizzle: int = 0
    # Variants: several kernels may fill the same launch `slot`; the launcher runs the first whose
    # `when` (a Dim condition on the dimensions, None = always) holds. A variant may take several
    # launches: its kernels share the `when` and run in the order of `part` (split-K: the partial
    # products, then their sum with the epilogue).
    slot: int = 0
    when: object = None
    part: int = 0
    # GPU targets: blocks of this kernel meant to be resident on one SM at once (the register
    # budget per thread follows from it)
    blocks_per_sm: int = 1
    # GPU targets: compile-time capacities of dynamic extents held on chip, ((symbol, (cap, ...)),
    # ...): one instantiation per capacity, the launcher picks the smallest that holds the value
    capacities: tuple = ()
    # the threads are the target's default (no schedule fixed them): passes may pick others
    auto_threads: bool = field(default=False, compare=False)
    # a hand-written (tile-level) kernel: where its grid block is, for errors the passes and
    # renderers raise about it (None for kernels the tile pass made)
    loc: object = field(default=None, compare=False)
    # Hopper (sm_90a) warp specialization: the number of consumer warpgroups (0: none). The
    # block's last warpgroup is the producer: one of its threads issues the TMA copies of the
    # `warp_specialized` loop; the consumer warpgroups (warps 0 ..) run everything else
    warp_specialize: int = 0
    # ... ping-pong: each consumer warpgroup computes whole tiles of its own (the block's tiles
    # alternate between them), so one's epilogue runs while the other multiplies
    pingpong: bool = False
    # ... thread block clusters of this many blocks (2: neighbouring M tiles, the B tile loaded
    # half by each block for both, TMA multicast); 1: none
    cluster: int = 1
    # a persistent grid: one block per SM (times blocks_per_sm) walks the grid's tiles in order
    persistent: bool = False
    # block x's work grows with x (a causal key loop, bounded by the block's last query row):
    # the first block variable counts down, so blocks with the most work start first and the
    # last to finish are short; a persistent grid walks x in pairs (last - j, then j) instead,
    # each pair's work alike, so that its blocks' static shares are even
    longest_first: bool = False
    # tensors whose address must be 16-byte aligned for this variant (TMA); the launcher tests it
    # with the variant's `when`
    aligned: tuple = ()
    # ((tensor, its padded copy), ...): the tensors this kernel's copies read through a copy whose
    # rows are 128-byte multiples, written by the variant's earlier launches (operands whose
    # rows TMA cannot address: passes/tile.py pad_kernel)
    padded: tuple = ()
    # ... those of them whose copy is transposed (the last two axes swapped): a wgmma form that
    # takes K-major operands only (fp8, tf32) reading a tensor stored the other way
    # (passes/tile.py transpose_kernel)
    transposed: tuple = ()
    # its epilogue stores from registers, never through TMA (the variant for operands whose rows
    # TMA cannot take, whose outputs' rows mostly are off too: passes/tile.py GemmVariant.pad)
    register_stores: bool = False
    # ((output, staging buffer), ...): the epilogue stores these outputs' whole tiles through a
    # shared staging buffer by TMA (passes/tma_store.py)
    tma_stores: tuple = ()
    # ... and a persistent kernel stores each whole tile during the next tile's K loop, its values
    # packed in registers meanwhile (a deferred epilogue: passes/tma_store.py)
    deferred_stores: bool = False


@dataclass(frozen=True, slots=True)
class TileProgram:
    """All device kernels of one source kernel, in launch order, plus what the launcher needs."""

    name: str
    kernels: tuple
    workspaces: tuple  # TensorDecl
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def slots(self) -> list:
        """The kernels grouped by launch slot, in launch order: [[variant, ...], ...], where a
        variant is the tuple of kernels it launches (its parts, in order)."""
        out: dict = {}
        for k in self.kernels:
            variants = out.setdefault(k.slot, [])
            if k.part and variants and variants[-1][-1].part == k.part - 1:
                variants[-1] = variants[-1] + (k,)
            else:
                variants.append((k,))
        return [out[s] for s in sorted(out)]


class Unsupported(NotImplementedError):
    """A lowering pass or renderer cannot handle a construct of a hand-written kernel; `loc` is
    where it is (None: the kernel's grid block)."""

    def __init__(self, message: str, loc=None):
        super().__init__(message)
        self.loc = loc


# ---- traversal ---------------------------------------------------------------------------
def walk_exprs(e):
    """`e` and every sub-expression, index expressions of loads included, in pre-order
    (iterative: deep expressions cost linear time and no recursion)."""
    stack = [e]
    pop, push = stack.pop, stack.append
    while stack:
        e = pop()
        yield e
        t = type(e)  # children pushed last-first, so they come out in order
        if t is Binary or t is Compare:
            push(e.b)
            push(e.a)
        elif t is Unary or t is Cast:
            push(e.x)
        elif t is Load:
            stack.extend(reversed(e.idx))
        elif t is Select:
            push(e.cond)
            push(e.b)
            push(e.a)
        elif t is Fma:
            push(e.c)
            push(e.b)
            push(e.a)


def walk_stmts(stmts):
    """Every statement, nested loop and branch bodies included, in program order."""
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body)
        elif isinstance(s, If):
            yield from walk_stmts(s.body)
            yield from walk_stmts(s.orelse)
        elif isinstance(s, Gemm) and (s.sync or s.refill):  # an overlapped gemm's statements
            yield from walk_stmts(s.sync)
            yield from walk_stmts(s.refill)


# ---- printer -----------------------------------------------------------------------------
# Python precedence: comparisons < | < & < + - < * / // %
_PREC = {"lt": 3, "le": 3, "gt": 3, "ge": 3, "eq": 3, "ne": 3, "or": 4, "and": 5,
         "add": 7, "sub": 7, "mul": 8, "div": 8, "floordiv": 8, "mod": 8, "idiv": 8, "imod": 8}
_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "idiv": "//",
        "imod": "%", "and": "&", "or": "|", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
        "eq": "==", "ne": "!="}


def fmt_const(c: Const) -> str:
    v = c.value
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return repr(v)
    return str(v)


def fmt(e, parent: int = 0) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        s = fmt_const(e)
        return f"({s})" if s.startswith("-") and parent >= 7 else s
    if isinstance(e, Load):
        return f"{e.buf}[{', '.join(fmt(i) for i in e.idx)}]"
    if isinstance(e, Cast):
        return f"{e.dtype}({fmt(e.x)})"
    if isinstance(e, Unary):
        if e.fn == "neg":
            return f"-{fmt(e.x, 9)}"
        if e.fn == "not":
            return f"~{fmt(e.x, 9)}"
        return f"{e.fn}({fmt(e.x)})"
    if isinstance(e, Select):
        return f"where({fmt(e.cond)}, {fmt(e.a)}, {fmt(e.b)})"
    if isinstance(e, Fma):
        return f"fma({fmt(e.a)}, {fmt(e.b)}, {fmt(e.c)})"
    if isinstance(e, (Binary, Compare)):
        if e.fn == "pow":
            return f"{fmt(e.a, 10)} ** {e.exponent!r}"
        if e.fn in ("maximum", "minimum", "min", "max", "cdiv"):
            return f"{e.fn}({fmt(e.a)}, {fmt(e.b)})"
        p = _PREC[e.fn]
        s = f"{fmt(e.a, p)} {_SYM[e.fn]} {fmt(e.b, p + 1)}"
        return f"({s})" if p < parent else s
    raise TypeError(f"not a tile expression: {e!r}")


def _region(r: Region) -> str:
    if r.offsets is None:
        return r.buf
    return f"{r.buf}[{', '.join(fmt(o) for o in r.offsets)}]"


def _inline(stmts) -> str:
    """Statements on one line (`if c: a; b; c2`), for those a statement holds (a gemm's)."""
    out = []
    for st in stmts:
        first, *rest = (x.strip() for x in print_stmts([st], 0))
        out.append(" ".join([first, "; ".join(rest)]) if rest else first)
    return "; ".join(out)


def print_stmts(stmts, indent: int) -> list:
    pad = "    " * indent
    out = []
    for s in stmts:
        if isinstance(s, Alloc):
            lay = f"  # layout: {s.layout}" if s.layout is not None else ""
            out.append(f"{pad}{s.name} = {s.scope}({s.dtype}, [{', '.join(fmt(x) for x in s.shape)}])"
                       f"{lay}")
        elif isinstance(s, Fill):
            if isinstance(s.value, Const) and s.value == Const(0, s.value.dtype):  # (not -0.0)
                out.append(f"{pad}clear({s.buf})")
            else:
                out.append(f"{pad}fill({s.buf}, {fmt(s.value)})")
        elif isinstance(s, Copy):
            out.append(f"{pad}copy{'_async' if s.async_ else ''}({_region(s.src)}, {_region(s.dst)})")
        elif isinstance(s, Commit):
            out.append(f"{pad}commit()")
        elif isinstance(s, Wait):
            out.append(f"{pad}wait({s.pending})")
        elif isinstance(s, Barrier):
            out.append(f"{pad}barrier()")
        elif isinstance(s, Let):
            out.append(f"{pad}{s.name} = {fmt(s.value)}")
        elif isinstance(s, Gemm):
            kw = "".join([", transpose_a=True" if s.transpose_a else "",
                          ", transpose_b=True" if s.transpose_b else "",
                          ", precision=tf32" if s.tf32 else "",
                          f", promote={s.promote}" if s.promote else ""])
            a = s.a if s.a_stage is None else f"{s.a}[{fmt(s.a_stage)}]"
            b = s.b if s.b_stage is None else f"{s.b}[{fmt(s.b_stage)}]"
            if s.next_stage is not None:
                kw += f", then=[{_inline(s.sync)}], next={fmt(s.next_stage)}"
            if s.refill:
                kw += f", refill=[{_inline(s.refill)}]"
            out.append(f"{pad}gemm({a}, {b}, {s.c}{kw})")
        elif isinstance(s, GemmLoad):
            g = s.gemm
            out.append(f"{pad}gemm_load({g.a}[{fmt(g.a_stage)}], {g.b}[{fmt(g.b_stage)}], {g.c})")
        elif isinstance(s, Reduce):
            out.append(f"{pad}reduce({s.fn}, {s.src}, {s.dst}, axis={s.axis})")
        elif isinstance(s, GemvMma):
            row, first, rows, col0, m = (fmt(x) for x in s.idx)
            more = f", m={m}, mr={s.mr}" if s.mr != 1 else ""  # (one row: m = mr = 1)
            out.append(f"{pad}gemv_mma{'_kmajor' if s.kmajor else ''}({s.dst}, {s.a}, {s.q}, {s.s}, "
                       f"zero={s.zero}, group={s.group}, row={row}, first={first}, rows={rows}, "
                       f"col0={col0}{more})")
        elif isinstance(s, Allreduce):
            out.append(f"{pad}allreduce({s.fn}, {s.buf})")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{', '.join(fmt(i) for i in s.idx)}] = {fmt(s.value)}")
        elif isinstance(s, For):
            ext = ", ".join(fmt(x) for x in s.extents)
            if s.start is not None:
                ext = f"{fmt(s.start)}, {ext}"
            if s.kind in ("pipelined", "warp_specialized"):
                ext += f", stages={s.stages}"
            if s.by:
                ext += f", by={s.by}"
            note = f"  # copies inside their tensors if {fmt(s.inside)}" if s.inside is not None else ""
            if s.kind == "warp_specialized":
                st = f"{s.vars[0]} % {s.stages}"
                note = (f"  # producer: TMA copies into stage {st}, completing on full[{st}] "
                        f"after empty[{st}]; consumers: wait full[{st}], wgmma, arrive empty[{st}]")
            out.append(f"{pad}for {', '.join(s.vars)} in {s.kind}({ext}):{note}")
            out += print_stmts(s.body, indent + 1)
        elif isinstance(s, If):
            out.append(f"{pad}if {fmt(s.cond)}:")
            out += print_stmts(s.body, indent + 1)
            if s.orelse:
                out.append(f"{pad}else:")
                out += print_stmts(s.orelse, indent + 1)
        else:
            raise TypeError(f"not a tile statement: {s!r}")
    return out


def _decl(t: TensorDecl) -> str:
    if not t.shape:  # by value, or a rank-0 tensor in memory
        return f"{t.name}: {t.dtype}{'' if t.kind == 'scalar' else '[]'}"
    return f"{t.name}: {t.dtype}[{', '.join(str(d) for d in t.shape)}]"


def shape_dims(k: TileKernel) -> set:
    """The dimension symbols kernel `k`'s tensors' shapes name."""
    return {s for p in k.params for d in p.shape for s in d.symbols()}


def free_dims(k: TileKernel) -> list:
    """The dimensions kernel `k` uses that no input's shape names as a plain axis, in first use:
    those no shape names, and those its shapes use only inside expressions (a view's B * S
    rows, passes/merge_rows.py), which a tile-level kernel declares as `B: dim`."""
    plain = {d.args[0] for p in k.params if p.kind == "input" for d in p.shape if d.op == "sym"}
    inside = [s for p in k.params for d in p.shape for s in sorted(d.symbols()) if s not in plain]
    bound, named = set(k.block_vars) | {p.name for p in k.params}, shape_dims(k) - set(inside)
    exprs = list(k.grid)
    for s in walk_stmts(k.body):
        if isinstance(s, For):
            bound |= set(s.vars)
            exprs += list(s.extents) + ([s.start] if s.start is not None else [])
        elif isinstance(s, Let):
            bound.add(s.name)
            exprs.append(s.value)
        elif isinstance(s, Alloc):
            exprs += list(s.shape)
        elif isinstance(s, Fill):
            exprs.append(s.value)
        elif isinstance(s, Copy):
            exprs += list(s.src.offsets or ()) + list(s.dst.offsets or ())
        elif isinstance(s, Store):
            exprs += list(s.idx) + [s.value]
        elif isinstance(s, If):
            exprs.append(s.cond)
    out = list(dict.fromkeys(inside))
    for e in exprs:
        for x in walk_exprs(e):
            if isinstance(x, Var) and x.name not in bound and x.name not in named and \
                    x.name not in out:
                out.append(x.name)
    return out


def print_kernel(k: TileKernel) -> str:
    ins = [p for p in k.params if p.kind in ("input", "scalar")]
    outs = [p for p in k.params if p.kind not in ("input", "scalar")]
    dims = [f"{d}: dim" for d in free_dims(k)]
    lines = []
    if k.comment:
        lines += [f"# {c}" for c in k.comment.splitlines()]
    part = f", launch {k.part + 1} of the variant" if k.part else ""
    if k.when is not None:
        aligned = "".join(f" & aligned16({n})" for n in k.aligned) + \
            (" & sm90a_device()" if k.warp_specialize else "")
        lines.append(f"# variant of launch {k.slot}{part}, when {k.when}{aligned}")
    elif part:
        lines.append(f"# launch {k.slot}{part}")
    for sym, caps in k.capacities:
        lines.append(f"# {sym} held on chip up to a capacity of {' | '.join(str(c) for c in caps)}")
    o = ", ".join(_decl(p) for p in outs)
    lines.append(f"kernel {k.name}({', '.join([_decl(p) for p in ins] + dims)}) -> "
                 f"{o if len(outs) == 1 else '(' + o + ')'}:")
    grid = ", ".join(fmt(g) for g in k.grid)
    lines.append(f"    with grid({grid}, threads={k.threads}) as ({', '.join(k.block_vars)}):")
    if k.swizzle:
        lines.append(f"        swizzle({k.swizzle})")
    if k.longest_first and k.persistent:
        lines.append(f"        # tiles in pairs of even work ({k.block_vars[0]} = last - j, then j)")
    elif k.longest_first:
        lines.append(f"        # blocks start longest first ({k.block_vars[0]} counts down)")
    # (decisions of the tile pass that the tile language does not spell: printed as comments,
    # so a dump still parses back as a tile-level kernel)
    if k.persistent:
        lines.append("        # persistent grid: one block per SM walks the tiles in order")
    if k.cluster > 1:
        lines.append(f"        # clusters of {k.cluster}: blocks on neighbouring M tiles; each loads "
                     "part of the B tile for all (TMA multicast)")
    if k.warp_specialize:
        n = k.warp_specialize
        lines.append(f"        # warp roles: consumers = warpgroups 0-{n - 1}, producer = warpgroup {n}"
                     + (" (ping-pong: the consumers take turns, a tile each)" if k.pingpong else "")
                     + "; the producer's first thread issues the copies")
        once = [st.dst.buf for st in k.body if isinstance(st, Copy)]
        if once and k.persistent:
            lines.append(f"        # {', '.join(once)}: copied once per tile (its own mbarrier); "
                         "the consumers free it after the loop's last product that reads it, "
                         "so the next tile's copy lands during this tile's end")
    for src, copy in k.padded:
        how = "transposed copy (K-major)" if src in k.transposed else "copy"
        lines.append(f"        # {src}: read through {copy}, its {how} with rows padded to "
                     "128-byte multiples (the variant's earlier launches write it)")
    for out, buf in k.tma_stores:
        lines.append(f"        # epilogue: a whole tile of {out} leaves through {buf} (64-row panels "
                     "of 128-byte rows per consumer warpgroup) by TMA stores" +
                     (", during the next tile's first K tiles (deferred: its values wait in "
                      "registers, packed)" if k.deferred_stores else ""))
    lines += print_stmts(k.body, 2)
    return "\n".join(lines)


def print_program(p: TileProgram) -> str:
    head = [f"# {p.name}: {len(p.kernels)} device kernel(s)"]
    if p.workspaces:
        head.append("# workspaces: " + ", ".join(
            _decl(w) + (f" (when {w.when})" if w.when is not None else "") for w in p.workspaces))
    return "\n".join(head) + "\n" + "\n\n".join(print_kernel(k) for k in p.kernels) + "\n"
