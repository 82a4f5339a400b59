"""Tile-buffer values that do not change along the inner axis of a 2-D parallel loop are read once
per outer iteration:

    for i, j in parallel(R, C):              for i in parallel(R):
        y[i, j] = x[i, j] * s[i]       ->        s_i = s[i]
                                                 for j in parallel(C):
                                                     y[i, j] = x[i, j] * s_i

A CPU compiler does not vectorize the inner loop while it must reload such values (it cannot
prove the stores do not change them).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_exprs, map_stmts, uses_var


def _invariant_loads(body, var: str, allocs: set) -> list:
    """Loads of tile buffers in `body` whose index does not use `var` and whose buffer `body`
    does not write (so reading them once before the loop is exact), in first-use order."""
    written, exprs = set(), []
    for st in T.walk_stmts(body):
        if isinstance(st, T.Store):
            written.add(st.buf)
            exprs += list(st.idx) + [st.value]
        elif isinstance(st, T.If):
            exprs.append(st.cond)
        elif isinstance(st, T.Let):
            exprs.append(st.value)
    out = []
    for e in exprs:
        for x in T.walk_exprs(e):
            if isinstance(x, T.Load) and x.buf in allocs and x.buf not in written and x not in out \
               and not any(uses_var(i, (var,)) for i in x.idx):
                out.append(x)
    return out


def _split(loop: T.For, allocs: set, taken: set):
    if not (loop.kind == "parallel" and len(loop.vars) == 2):
        return None
    loads = _invariant_loads(loop.body, loop.vars[1], allocs)
    if not loads:
        return None
    lets, names = [], {}
    for ld in loads:
        name = f"{ld.buf}_{'_'.join(T.fmt(i) for i in ld.idx)}"
        name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
        while name in taken:
            name += "_"
        taken.add(name)
        names[ld] = T.Var(name, ld.dtype)
        lets.append(T.Let(name, ld))
    body = tuple(map_exprs(st, lambda e: names.get(e) if isinstance(e, T.Load) else None)
                 for st in loop.body)
    inner = T.For((loop.vars[1],), (loop.extents[1],), "parallel", body)
    return [replace(loop, vars=(loop.vars[0],), extents=(loop.extents[0],),
                    body=tuple(lets) + (inner,))]


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        allocs = {a.name for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
        taken = allocs | set(k.block_vars) | {p.name for p in k.params} | \
            {v for s in T.walk_stmts(k.body) if isinstance(s, T.For) for v in s.vars}
        def split(s, allocs=allocs, taken=taken):
            return _split(s, allocs, taken) if isinstance(s, T.For) else None
        ks.append(replace(k, body=map_stmts(k.body, split)))
    return replace(prog, kernels=tuple(ks))
