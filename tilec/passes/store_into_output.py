"""A tile buffer whose only consumer is the element-by-element store of an output is that output
(targets whose tile buffers live in memory, the CPU):

    for j in parallel(C):                            for j in parallel(C):
        t[i, j] = exp(X[r, j] - m)                       Y[r, j] = exp(X[r, j] - m)
        s[i] = s[i] + t[i, j]                ->          s[i] = s[i] + Y[r, j]
    ...                                              ...
    for j in parallel(C):                            for j in parallel(C):
        Y[r, j] = t[i, j] / s_i                          Y[r, j] = Y[r, j] / s_i

The row is written into the output where it ends up, then finished in place: one buffer less to
write and re-read through the cache. Exact when: the buffer has one writer (a store at loop
variables) and the output one (a store at loop variables over the same extents, with no branch
around it, so it covers every element the buffer's store writes); the output is not read
elsewhere and has the buffer's dtype; the buffer is read only by the output's store at that
store's own element and, in the writer's loop, at the writer's element; the output's index
names nothing the kernel body defines (it is in scope at the writer).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import (
    defined_names,
    loads_of,
    map_exprs,
    subst,
    uses_var,
    whole_buffer_uses,
    writes_per_buffer,
)


def _sites(k: T.TileKernel):
    """(statement, {loop var: extent} of its enclosing loops, innermost enclosing loop, whether a
    branch lies between it and that loop) for every non-loop statement, in program order."""
    out = []

    def visit(stmts, extent_of, loop, branched):
        for st in stmts:
            if isinstance(st, T.For):
                visit(st.body, {**extent_of, **dict(zip(st.vars, st.extents))}, st, False)
            elif isinstance(st, T.If):
                visit(st.body, extent_of, loop, True)
                visit(st.orelse, extent_of, loop, True)
            else:
                out.append((st, extent_of, loop, branched))
    visit(k.body, {}, None, False)
    return out


def _injective(idx: tuple, tv: tuple) -> bool:
    """Does each of the variables `tv` appear in exactly one entry of `idx`, as `v` or
    `base + v` with a base free of them, and no entry use two of them?"""
    names = [v.name for v in tv]
    seen = []
    for e in idx:
        used = [n for n in names if uses_var(e, (n,))]
        if not used:
            continue
        if len(used) > 1:
            return False
        v = T.Var(used[0])
        if not (e == v or (isinstance(e, T.Binary) and e.fn == "add" and e.b == v and
                           not uses_var(e.a, tuple(names)))):
            return False
        seen.append(used[0])
    return sorted(seen) == sorted(names)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(store_into(k) for k in prog.kernels))


def store_into(k: T.TileKernel) -> T.TileKernel:
    writes, opaque = writes_per_buffer(k), whole_buffer_uses(k)
    params = {p.name: p for p in k.params}
    allocs = {st.name: st for st in T.walk_stmts(k.body) if isinstance(st, T.Alloc)}
    defined = defined_names(k.body) | set(allocs)
    sites = _sites(k)
    stores = [s for s in sites if isinstance(s[0], T.Store)]
    plans = {}
    for st, ext, loop, _ in stores:
        buf = st.buf
        if buf not in allocs or allocs[buf].scope != "fragment" or buf in opaque or \
           writes.get(buf) != 1 or buf in plans or loop is None or \
           not all(isinstance(i, T.Var) and i.name in ext for i in st.idx) or \
           len({i.name for i in st.idx}) != len(st.idx):
            continue
        # the output's store reading the buffer
        outs = [(w, wext, wloop, br) for w, wext, wloop, br in stores
                if w.buf in params and params[w.buf].kind == "output" and
                any(isinstance(x, T.Load) and x.buf == buf for x in T.walk_exprs(w.value))]
        if len(outs) != 1:
            continue
        w, wext, _, branched = outs[0]
        out = params[w.buf]
        reads = [x for x in T.walk_exprs(w.value) if isinstance(x, T.Load) and x.buf == buf]
        tv = reads[0].idx
        if branched or writes.get(w.buf) != 1 or loads_of(k.body, w.buf) or \
           out.dtype != allocs[buf].dtype or any(x.idx != tv for x in reads) or \
           len(tv) != len(st.idx) or \
           not all(isinstance(v, T.Var) and wext.get(v.name) == ext[i.name]
                   for v, i in zip(tv, st.idx)) or \
           not _injective(w.idx, tv) or \
           any(isinstance(x, T.Var) and x.name in defined and x not in tv
               for e in w.idx for x in T.walk_exprs(e)):
            continue
        # the buffer's other reads: in its writer's loop, at the writer's element
        local = loads_of(loop.body, buf)
        if any(x.idx != st.idx for x in local) or \
                len(loads_of(k.body, buf)) != len(local) + len(reads):
            continue
        plans[buf] = (st, w, tv)
    if not plans:
        return k

    def at(buf, idx):  # the output element that stands for buffer element `idx`
        _, w, tv = plans[buf]
        return subst_idx(w.idx, dict(zip((v.name for v in tv), idx)))

    def load(x):
        if isinstance(x, T.Load) and x.buf in plans:
            w = plans[x.buf][1]
            return T.Load(w.buf, at(x.buf, x.idx), x.dtype)
        return None

    writers = {id(st): buf for buf, (st, _, _) in plans.items()}

    def rewrite(stmts):
        out = []
        for st in stmts:
            if isinstance(st, T.Alloc) and st.name in plans:
                continue
            if isinstance(st, T.For):
                st = replace(st, body=tuple(rewrite(st.body)))
            elif isinstance(st, T.If):
                st = replace(st, body=tuple(rewrite(st.body)), orelse=tuple(rewrite(st.orelse)))
            else:
                if id(st) in writers:
                    buf = writers[id(st)]
                    st = replace(st, buf=plans[buf][1].buf, idx=at(buf, st.idx))
                st = map_exprs(st, load)
            out.append(st)
        return out
    return replace(k, body=tuple(rewrite(k.body)))


def subst_idx(idx: tuple, mapping: dict) -> tuple:
    return tuple(subst(e, mapping) for e in idx)
