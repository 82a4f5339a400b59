"""Target lowering of the Tile IR: software pipelining of K loops and guard hoisting.

CPU: a `pipelined` loop becomes a plain `range` loop (out-of-order cores and hardware prefetch
stand in for cp.async/TMA stages), and bounds guards `if base + i < N` at the top of a parallel
loop become clamped trip counts, so the inner loops vectorize without masks.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from ..ir.graph import Module


def _uses(e, names: set) -> bool:
    if isinstance(e, T.Var):
        return e.name in names
    if isinstance(e, (T.Const, type(None))):
        return False
    if isinstance(e, T.Load):
        return any(_uses(i, names) for i in e.idx)
    return any(_uses(getattr(e, f), names) for f in ("x", "a", "b", "cond") if hasattr(e, f))


def _conjuncts(c) -> list:
    if isinstance(c, T.Binary) and c.fn == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _split_bound(c, loop_vars):
    """`base + v < bound` (or `v < bound`) -> (v, base, bound), else None."""
    if not (isinstance(c, T.Compare) and c.fn == "lt"):
        return None
    lhs, bound = c.a, c.b
    if _uses(bound, set(loop_vars)):
        return None
    if isinstance(lhs, T.Var) and lhs.name in loop_vars:
        return lhs.name, T.iconst(0), bound
    if isinstance(lhs, T.Binary) and lhs.fn == "add" and isinstance(lhs.b, T.Var) and \
       lhs.b.name in loop_vars and not _uses(lhs.a, set(loop_vars)):
        return lhs.b.name, lhs.a, bound
    return None


def hoist_guards(stmts) -> tuple:
    out = []
    for s in stmts:
        if isinstance(s, T.For):
            body = hoist_guards(s.body)
            extents = list(s.extents)
            if s.kind == "parallel" and len(body) == 1 and isinstance(body[0], T.If) and \
               not body[0].orelse:
                rest = []
                for c in _conjuncts(body[0].cond):
                    hit = _split_bound(c, s.vars)
                    if hit is None:
                        rest.append(c)
                        continue
                    v, base, bound = hit
                    k = s.vars.index(v)
                    extents[k] = T.Binary("min", extents[k], T.isub(bound, base), "i64")
                inner = body[0].body
                if rest:
                    cond = rest[0]
                    for c in rest[1:]:
                        cond = T.land(cond, c)
                    inner = (T.If(cond, inner),)
                body = inner
            kind = "range" if s.kind == "pipelined" else s.kind
            out.append(replace(s, body=tuple(body), extents=tuple(extents), kind=kind))
        elif isinstance(s, T.If):
            out.append(replace(s, body=hoist_guards(s.body), orelse=hoist_guards(s.orelse)))
        else:
            out.append(s)
    return tuple(out)


def lower_program(p: T.TileProgram, target: str) -> T.TileProgram:
    if target != "cpu":
        return p
    ks = tuple(replace(k, body=hoist_guards(k.body)) for k in p.kernels)
    return replace(p, kernels=ks)


def run(m: Module, opts=None) -> Module:
    target = (opts or {}).get("target", "cpu")
    return replace(m, programs=tuple(lower_program(p, target) for p in m.programs))
