"""Tiles that no mask touches run without the mask. In a sequential loop, a statement whose
parallel loops select -inf by comparisons of tile positions (a key bound `k * 64 + j < S`, a
causal `key > query`) runs unmasked on the tiles where one uniform test holds, in one of two
ways (Resources.diagonal_masks chooses for masks that relate two tile positions; masks of one
position always take the first):

Per statement: the masked statement gets two versions, chosen per iteration by its test:

    for k in range(n):                        for k in range(n):
        ...                                       ...
        S[i, j] = where(k*64 + j < S, x, -inf)    if k * 64 + 63 < S:       # the whole tile
        ...                                           S[i, j] = x
                                                  else:
                                                      S[i, j] = where(k*64 + j < S, x, -inf)
                                                  ...

Split: where every test is monotone in the loop variable (the tiles free of the masks form one
run of iterations, a prefix for key bounds and causal masks), the loop is split there, each
piece holding one version of the body (a piece after the first gets a fresh loop variable):

    for k in range(n):                        for k in range(free):       # free = clamp(..., 0, n)
        ...                                       ...
        S[i, j] = where(k > q, -inf, x)           S[i, j] = x
        ...                                   for k1 in range(free, n):
                                                  S[i, j] = where(k1 > q, -inf, x)

The tests are exact: one holds only when every comparison has the unmasked value at every
(i, j) of the tile (comparisons are affine in the loop variables, the parallel loops' extents
static), so both versions compute the same values. Only the last key tile (and the diagonal
tiles of a causal mask) pay for the mask.

Only the masked statements are versioned, never the whole body inside one loop (two copies of
a body holding 200 accumulators spilled on CUDA). On CUDA, attention at D = 128 on 4 warps
spilled 8 bytes with the causal statement's two versions and none with the split loop, while a
key bound's split loop spilled 12 bytes where its two versions fit: hence the two ways.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..ir import tile as T
from .rewrite import defined_names, map_exprs, map_stmts, taken_names


def affine(e) -> dict | None:
    """{variable: coefficient, None: constant} of an integer expression, or None if it is not
    affine in its variables (dimension symbols count as variables)."""
    if isinstance(e, T.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {None: e.value}
    if isinstance(e, T.Var):
        return {e.name: 1}
    if isinstance(e, T.Binary) and e.fn in ("add", "sub"):
        a, b = affine(e.a), affine(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.fn == "add" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if isinstance(e, T.Binary) and e.fn == "mul":
        a, b = affine(e.a), affine(e.b)
        if a is None or b is None:
            return None
        for x, y in ((a, b), (b, a)):
            if set(x) == {None}:
                return {k: v * x[None] for k, v in y.items()}
        return None
    return None


def _expr(terms: dict):
    """An i64 expression of affine terms."""
    out = None
    for var, coef in sorted(terms.items(), key=lambda t: (t[0] is None, t[0] or "")):
        if coef == 0:
            continue
        if var is None:
            term = T.iconst(abs(coef))
        else:
            term = T.imul(T.Var(var), T.iconst(abs(coef))) if abs(coef) != 1 else T.Var(var)
        if out is None:
            out = term if coef > 0 else T.isub(T.iconst(0), term)
        else:
            out = T.Binary("add" if coef > 0 else "sub", out, term, "i64")
    return out if out is not None else T.iconst(0)


def tile_test(cond: T.Compare, want: bool, ranges: dict):
    """A condition free of the tile variables (`ranges`: name -> extent) that holds exactly when
    `cond` equals `want` at every point of the tile; None if cond is not affine."""
    fn = cond.fn if want else {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}.get(cond.fn)
    if fn is None:
        return None
    a, b = affine(cond.a), affine(cond.b)
    if a is None or b is None:
        return None
    # a fn b  <=>  d = b - a  (lt: d > 0, le: d >= 0), or a - b for gt/ge
    d = dict(b) if fn in ("lt", "le") else dict(a)
    for k, v in (a if fn in ("lt", "le") else b).items():
        d[k] = d.get(k, 0) - v
    low = d.pop(None, 0)
    rest = {}
    for var, coef in d.items():
        if var in ranges:
            low += min(0, coef * (ranges[var] - 1))  # the tile's least value of d
        elif coef:
            rest[var] = coef
    rest[None] = low - (1 if fn in ("lt", "gt") else 0)
    return T.Compare("ge", _expr(rest), T.iconst(0))  # min over the tile of d (- 1) >= 0


def _masks(body) -> list:
    """(comparison, the value that leaves the score unmasked, tile ranges) of every affine
    comparison that selects -inf in the parallel loops of the statements `body`."""
    out = []
    for st in T.walk_stmts(body):
        if not (isinstance(st, T.For) and st.kind == "parallel"):
            continue
        if not all(isinstance(x, T.Const) for x in st.extents):
            continue
        ranges = dict(zip(st.vars, (x.value for x in st.extents)))
        for s in T.walk_stmts(st.body):
            if not isinstance(s, T.Store):
                continue
            for e in T.walk_exprs(s.value):
                if not (isinstance(e, T.Select) and isinstance(e.cond, T.Compare)):
                    continue
                ninf = [isinstance(x, T.Const) and x.value == -math.inf for x in (e.a, e.b)]
                if ninf[0] != ninf[1] and e.cond.fn in ("lt", "le", "gt", "ge"):
                    out.append((e.cond, ninf[1], ranges))  # -inf in b: want the condition true
    return out


def _diagonal(cond, ranges) -> bool:
    """Does the comparison relate two positions of the tile (a causal key > query)?"""
    names = {x.name for x in T.walk_exprs(cond) if isinstance(x, T.Var)}
    return len(names & set(ranges)) > 1


def lift(st):
    """(tests, diagonal, unmasked) for the parallel loop `st`: the uniform tests (`expr >= 0`)
    under which its masks leave every score of the tile alone, whether a mask relates two tile
    positions, and `st` without those masks; None when it holds no mask a test can lift."""
    if not (isinstance(st, T.For) and st.kind == "parallel"):
        return None
    masks = _masks((st,))
    tests, values, diagonal = [], {}, False
    for cond, want, ranges in masks:
        t = tile_test(cond, want, ranges)
        if t is None:
            continue
        tests.append(t)
        values[cond] = T.Const(want, "bool")
        diagonal |= _diagonal(cond, ranges)
    if not tests:
        return None

    def unmask(e):
        if isinstance(e, T.Select) and isinstance(e.cond, T.Const) and e.cond.dtype == "bool":
            return e.a if e.cond.value else e.b
        if e in values:
            return values[e]
        return None
    return tests, diagonal, without_self_stores(map_exprs(st, unmask))


def without_self_stores(st):
    """Parallel loop `st` without the stores that write back what they read (`S[i, j] = S[i, j]`:
    a score that only its mask changed); None when nothing else is left."""
    body = tuple(x for x in st.body if not (isinstance(x, T.Store) and isinstance(x.value, T.Load)
                                            and (x.value.buf, x.value.idx) == (x.buf, x.idx)))
    return replace(st, body=body) if body else None


def version(st, diagonal: bool = True):
    """The parallel loop `st` as `if TEST: st unmasked else: st`, or None when it holds no mask
    a test can lift (or, `diagonal` False, a mask relating two tile positions)."""
    lifted = lift(st)
    if lifted is None or (lifted[1] and not diagonal):
        return None
    tests, _, unmasked = lifted
    test = tests[0]
    for t in tests[1:]:
        test = T.land(test, t)
    if unmasked is None:  # (the mask was all the loop did)
        return T.If(T.lnot(test), (st,), ())
    return T.If(test, (unmasked,), (st,))


def version_body(loop: T.For, diagonal: bool = True):
    body = tuple(version(st, diagonal) or st for st in loop.body)
    return None if body == loop.body else [replace(loop, body=body)]


def free_range(tests: list, k: str, defined: set):
    """(lo, hi): the iterations k in [lo, hi) where every test holds, as expressions (None: no
    bound on that side), or None when a test is not monotone in k (or reads a name the loop
    body defines). A test c*k + r >= 0 holds for k <= floor(r / -c) if c < 0 (a prefix), for
    k >= ceil(-r / c) if c > 0 (a suffix)."""
    lo = hi = None
    for t in tests:
        terms = affine(t.a)
        if terms is None or not isinstance(t.b, T.Const) or t.b.value != 0 or t.fn != "ge":
            return None
        c = terms.pop(k, 0)
        if c == 0 or any(v in defined for v in terms if v is not None):
            return None
        r = _expr(terms)
        if c < 0:  # k < floor(r / -c) + 1
            end = T.iadd(T.Binary("floordiv", r, T.iconst(-c), "i64"), T.iconst(1))
            hi = end if hi is None else T.Binary("min", hi, end, "i64")
        else:  # k >= -floor(r / c)
            first = T.isub(T.iconst(0), T.Binary("floordiv", r, T.iconst(c), "i64"))
            lo = first if lo is None else T.Binary("max", lo, first, "i64")
    return lo, hi


def lifted_body(loop: T.For) -> dict:
    """{index: lift(statement)} for the statements of `loop`'s body whose masks a test lifts."""
    return {i: x for i, x in enumerate(map(lift, loop.body)) if x is not None}


def split_loop(loop: T.For, lifted: dict, fresh):
    """The range loop `loop` as loops over the iterations before, inside and after the run of
    iterations where no mask of its statements (`lifted`, from lifted_body) touches the tile
    (the middle one with those statements unmasked); None when a test is not monotone. Each
    piece after the first gets its own loop variable, `fresh(name)` (targets declare per-loop
    state, such as a stage counter, by the variable's name)."""
    if len(loop.vars) != 1:
        return None
    (k,) = loop.vars
    rng = free_range([t for tests, _, _ in lifted.values() for t in tests], k,
                     defined_names(loop.body))
    if rng is None:
        return None
    start, n = loop.start if loop.start is not None else T.iconst(0), loop.extents[0]

    def clamp(e):  # into [start, n]: the pieces' bounds never cross
        return T.Binary("max", start, T.Binary("min", n, e, "i64"), "i64")
    lo, hi = (None if e is None else clamp(e) for e in rng)
    if hi is not None and lo is not None:
        hi = T.Binary("max", lo, hi, "i64")
    free = replace(loop, body=tuple(lifted[i][2] if i in lifted else st
                                    for i, st in enumerate(loop.body)
                                    if i not in lifted or lifted[i][2] is not None),
                   start=lo if lo is not None else loop.start,
                   extents=(hi,) if hi is not None else loop.extents)
    out = [] if lo is None else [replace(loop, extents=(lo,))]
    out.append(free)
    if hi is not None:
        out.append(replace(loop, start=hi))
    return [out[0]] + [renamed(piece, fresh(k)) for piece in out[1:]]


def renamed(loop: T.For, var: str) -> T.For:
    """`loop` with its variable called `var` (in its body; its bounds are outside it)."""
    (k,) = loop.vars
    body = tuple(map_exprs(st, lambda e: T.Var(var) if isinstance(e, T.Var) and e.name == k
                           else None) for st in loop.body)
    return replace(loop, vars=(var,), body=body)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    split = target.resources.diagonal_masks == "split"

    def one(k: T.TileKernel) -> T.TileKernel:
        taken = taken_names(k)

        def fresh(base: str) -> str:
            n = 1
            while f"{base}{n}" in taken:
                n += 1
            taken.add(f"{base}{n}")
            return f"{base}{n}"

        def visit(st):
            if isinstance(st, T.For) and st.kind == "warp_specialized":
                # (the producer and the consumers walk the same loop: its tiles are versioned in
                # place, never split into loops of their own)
                return version_body(st, True)
            if not (isinstance(st, T.For) and st.kind == "range"):
                return None
            lifted = lifted_body(st) if split else {}
            if any(diagonal for _, diagonal, _ in lifted.values()):
                return split_loop(st, lifted, fresh) or version_body(st, False)
            return version_body(st, not split)
        return replace(k, body=map_stmts(k.body, visit))
    return replace(prog, kernels=tuple(one(k) for k in prog.kernels))

