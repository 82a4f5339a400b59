"""Bounds guards at the top of a parallel loop become clamped trip counts:

    for i, j in parallel(BM, BN):            for i, j in parallel(min(BM, M - r0), min(BN, N - c0)):
        if r0 + i < M & c0 + j < N:    ->        ...
            ...

so a CPU compiler vectorizes the inner loop without masks. Conjuncts of another form stay as a
guard inside the loop.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_stmts, uses_var


def conjuncts(c) -> list:
    if isinstance(c, T.Binary) and c.fn == "and":
        return conjuncts(c.a) + conjuncts(c.b)
    return [c]


def split_bound(c, loop_vars):
    """`base + v < bound` (or `v < bound`) with v a loop variable -> (v, base, bound), else None."""
    if not (isinstance(c, T.Compare) and c.fn == "lt"):
        return None
    lhs, bound = c.a, c.b
    if uses_var(bound, loop_vars):
        return None
    if isinstance(lhs, T.Var) and lhs.name in loop_vars:
        return lhs.name, T.iconst(0), bound
    if isinstance(lhs, T.Binary) and lhs.fn == "add" and isinstance(lhs.b, T.Var) and \
       lhs.b.name in loop_vars and not uses_var(lhs.a, loop_vars):
        return lhs.b.name, lhs.a, bound
    return None


def _hoist(s):
    if not (isinstance(s, T.For) and s.kind == "parallel" and len(s.body) == 1 and
            isinstance(s.body[0], T.If) and not s.body[0].orelse):
        return None
    extents, rest = list(s.extents), []
    for c in conjuncts(s.body[0].cond):
        hit = split_bound(c, s.vars)
        if hit is None:
            rest.append(c)
            continue
        v, base, bound = hit
        k = s.vars.index(v)
        extents[k] = T.imin(extents[k], T.isub(bound, base))
    inner = s.body[0].body
    if rest:
        cond = rest[0]
        for c in rest[1:]:
            cond = T.land(cond, c)
        inner = (T.If(cond, inner),)
    return [replace(s, body=tuple(inner), extents=tuple(extents))]


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(replace(k, body=map_stmts(k.body, _hoist))
                                       for k in prog.kernels))
