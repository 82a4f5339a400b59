"""Integer arithmetic of the dimensions alone is named once, for the host to compute:

    for s in range(cdiv(K, kc)):      ->      host0 = cdiv(K, kc)
                                               for s in range(host0):

Every 64-bit division (`//`, `%`, `cdiv`) whose operands are dimensions, constants or names
made this way becomes a kernel-level `Let`, before the top-level statement that first needs it
(after the Lets it reads); a target whose launcher runs
on the host (CUDA) computes those Lets there and passes them in, instead of every thread of every
block dividing 64-bit integers (tens of instructions each, in dependent chains: a split-K sum
kernel spent most of its 7.8 us on them).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_expr, map_exprs

DIVISIONS = ("floordiv", "mod", "idiv", "imod", "cdiv")


def dimensions(k: T.TileKernel) -> set:
    """The dimension symbols of kernel k: the free variables of its parameters' shapes."""
    out = set()
    for p in k.params:
        for d in p.shape:
            out |= set(d.symbols())
    return out


def of_dims(e, names: set) -> bool:
    """Is `e` integer arithmetic of `names` and constants only (no loads, no other variables)?"""
    for x in T.walk_exprs(e):
        if isinstance(x, T.Load) or (isinstance(x, T.Var) and x.name not in names):
            return False
        if getattr(x, "dtype", "i64") not in ("i64", "bool"):
            return False
    return True


def host_lets(k: T.TileKernel) -> list:
    """The top-level Lets of k whose values are arithmetic of the dimensions and of the Lets
    before them of that kind: what a host launcher can compute."""
    names, out = dimensions(k), []
    for st in k.body:
        if isinstance(st, T.Let) and of_dims(st.value, names):
            out.append(st)
            names.add(st.name)
    return out


def hoist(k: T.TileKernel) -> T.TileKernel:
    known = dimensions(k) | {st.name for st in host_lets(k)}
    taken = known | {p.name for p in k.params} | set(k.block_vars) | \
        {s.name for s in T.walk_stmts(k.body) if isinstance(s, (T.Alloc, T.Let))} | \
        {v for s in T.walk_stmts(k.body) if isinstance(s, T.For) for v in s.vars}
    lets, names = [], {}

    def name(e):
        if not (isinstance(e, T.Binary) and e.fn in DIVISIONS and e.dtype == "i64" and
                of_dims(e, known)):
            return None
        if e not in names:
            n = len(names)
            while f"host{n}" in taken:
                n += 1
            taken.add(f"host{n}")
            known.add(f"host{n}")
            names[e] = T.Var(f"host{n}", "i64")
            lets.append(T.Let(f"host{n}", e))
        return names[e]

    def stmt(st):
        if isinstance(st, T.Alloc):  # (static shapes after specialization; leave them be)
            return st
        if isinstance(st, (T.For, T.If)):
            st = map_exprs(replace(st, body=(), **({"orelse": ()} if isinstance(st, T.If) else {})),
                           name)
            return st
        return map_exprs(st, name)

    def block(stmts):
        out = []
        for st in stmts:
            new = stmt(st)
            if isinstance(st, T.For):
                new = replace(new, body=block(st.body))
            elif isinstance(st, T.If):
                new = replace(new, body=block(st.body), orelse=block(st.orelse))
            out.append(new)
        return tuple(out)
    grid = tuple(map_expr(g, name) for g in k.grid)
    body = list(lets)
    for st in k.body:  # each new Let just before the top-level statement that made it
        made = len(lets)
        new = block((st,))
        body += lets[made:] + list(new)
    if not lets:
        return k
    return replace(k, body=tuple(body), grid=grid)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(hoist(k) for k in prog.kernels))
