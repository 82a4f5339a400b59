"""Integer arithmetic of the dimensions alone is named once, for the host to compute:

    for s in range(cdiv(K, kc)):      ->      host0 = cdiv(K, kc)
                                               for s in range(host0):

Every 64-bit division (`//`, `%`, `cdiv`) whose operands are dimensions, constants or names
made this way becomes a kernel-level `Let`, before the top-level statement that first needs it
(after the Lets it reads); a target whose launcher runs on the host (CUDA) computes those Lets
there and passes them in, instead of every thread of every block dividing 64-bit integers
(tens of instructions each, in dependent chains).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import map_expr, map_exprs, taken_names

DIVISIONS = ("floordiv", "mod", "idiv", "imod", "cdiv")


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
    names, out = T.shape_dims(k), []
    for st in k.body:
        if isinstance(st, T.Let) and of_dims(st.value, names):
            out.append(st)
            names.add(st.name)
    return out


def hoist(k: T.TileKernel) -> T.TileKernel:
    known = T.shape_dims(k) | {st.name for st in host_lets(k)}
    taken = taken_names(k)
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
    grid = tuple(map_expr(g, name) for g in k.grid)
    body = list(lets)
    for st in k.body:  # each new Let just before the top-level statement that made it
        made = len(lets)
        # (buffers are declared at the top level, with static shapes after specialization)
        new = st if isinstance(st, T.Alloc) else map_exprs(st, name)
        body += lets[made:] + [new]
    if not lets:
        return k
    return replace(k, body=tuple(body), grid=grid)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(hoist(k) for k in prog.kernels))
