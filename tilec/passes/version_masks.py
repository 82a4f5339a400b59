"""Tiles that no mask touches run without the mask: in a sequential loop, each statement whose
parallel loops select -inf by comparisons of tile positions (a key bound `k * 64 + j < S`, a
causal `key > query`) gets two versions, chosen per iteration by one uniform test:

    for k in range(n):                        for k in range(n):
        ...                                       ...
        S[i, j] = where(k*64 + j < S, x, -inf)    if k * 64 + 63 < S:       # the whole tile
        ...                                           S[i, j] = x
                                                  else:
                                                      S[i, j] = where(k*64 + j < S, x, -inf)
                                                  ...

The test is exact: it holds only when every comparison has the unmasked value at every (i, j)
of the tile (comparisons are affine in the loop variables, the parallel loops' extents static),
so both versions compute the same values. Only the last key tile (and the diagonal tiles of a
causal mask) pay for the mask. A target may leave masks that relate two tile positions
(causal: key > query) unversioned (Resources.version_diagonal_masks).

Only the masked statements are versioned, not the whole body: one copy of the rest of the loop
(an attention loop's copies and GEMMs) keeps its registers apart from the other's (two copies
of a body that holds 200 accumulators spilled on CUDA).
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_exprs, map_stmts


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


def version(st, diagonal: bool = True):
    """The parallel loop `st` as `if TEST: st unmasked else: st`, or None when it holds no mask
    a test can lift (or, `diagonal` False, a mask relating two tile positions)."""
    if not (isinstance(st, T.For) and st.kind == "parallel"):
        return None
    masks = _masks((st,))
    if not diagonal and any(_diagonal(cond, ranges) for cond, _, ranges in masks):
        return None
    tests, values = [], {}
    for cond, want, ranges in masks:
        t = tile_test(cond, want, ranges)
        if t is None:
            continue
        tests.append(t)
        values[cond] = T.Const(want, "bool")
    if not tests:
        return None
    test = tests[0]
    for t in tests[1:]:
        test = T.land(test, t)

    def unmask(e):
        if isinstance(e, T.Select) and isinstance(e.cond, T.Const) and e.cond.dtype == "bool":
            return e.a if e.cond.value else e.b
        if e in values:
            return values[e]
        return None
    return T.If(test, (map_exprs(st, unmask),), (st,))


def version_body(loop: T.For, diagonal: bool = True):
    body = tuple(version(st, diagonal) or st for st in loop.body)
    return None if body == loop.body else [replace(loop, body=body)]


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    diagonal = target.resources.version_diagonal_masks

    def visit(st):
        if isinstance(st, T.For) and st.kind == "range":
            return version_body(st, diagonal)
        return None
    return replace(prog, kernels=tuple(replace(k, body=map_stmts(k.body, visit))
                                       for k in prog.kernels))

