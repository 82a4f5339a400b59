"""Tile buffers that only copy a tensor are read from the tensor itself (targets whose tile
buffers live in memory, the CPU):

    for i, j in parallel(n, C):                     for i, j in parallel(n, C):
        X_row[i, j] = X[bx + i, j]          ->          m[i] = maximum(m[i], X[bx + i, j])
        m[i] = maximum(m[i], X_row[i, j])           for i in parallel(n):
    for i in parallel(n):                               for j in parallel(C):
        for j in parallel(C):                               Y[bx + i, j] = X[bx + i, j] * v
            Y[bx + i, j] = X_row[i, j] * v

On a GPU such a fragment is the row held in registers; on the CPU it is a scratch buffer, and
the copy writes and re-reads a row the cache already holds. The rewrite is exact: the tensor is
not written by the kernel (so every later read sees what the copy saw), the buffer has no other
writer, and every read of it is at the loop variables of loops that run over the same extents
as the copy (so no read reaches an element the copy did not write, and the tensor element read
instead is one the copy read).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .rewrite import loads_of, map_exprs, subst, whole_buffer_uses, writes_per_buffer


def _candidates(k: T.TileKernel, writes: dict, opaque: set) -> dict:
    """{fragment: (its copy store, the copy loop, the statements after the loop in its body)}
    for fragments written only by one store `F[v...] = G[...]` at the loop variables of its
    enclosing loop, of a tensor G the kernel does not write, with no conversion."""
    params = {p.name: p for p in k.params}
    allocs = {st.name: st for st in T.walk_stmts(k.body) if isinstance(st, T.Alloc)}
    out = {}

    def visit(stmts):
        for n, st in enumerate(stmts):
            if isinstance(st, T.For):
                for s in st.body:
                    if isinstance(s, T.Store) and s.buf in allocs and \
                       allocs[s.buf].scope == "fragment" and s.buf not in opaque and \
                       writes.get(s.buf) == 1 and s.idx == tuple(T.Var(v) for v in st.vars) and \
                       isinstance(s.value, T.Load) and s.value.buf in params and \
                       writes.get(s.value.buf, 0) == 0 and \
                       s.value.dtype == allocs[s.buf].dtype == params[s.value.buf].dtype:
                        out[s.buf] = (s, st, tuple(stmts[n + 1:]))
                visit(st.body)
            elif isinstance(st, T.If):
                visit(st.body)
                visit(st.orelse)
    visit(k.body)
    return out


def _reads_covered(k: T.TileKernel, buf: str, loop: T.For) -> bool:
    """Is every read of `buf` at the variables of enclosing loops with the copy loop's extents?"""
    ok = True

    def check(e, extent_of):
        nonlocal ok
        for x in T.walk_exprs(e):
            if isinstance(x, T.Load) and x.buf == buf and (
                    len(x.idx) != len(loop.extents) or not all(
                        isinstance(i, T.Var) and extent_of.get(i.name) == ext
                        for i, ext in zip(x.idx, loop.extents))):
                ok = False

    def visit(stmts, extent_of):
        for st in stmts:
            if isinstance(st, T.For):
                inner = {**extent_of, **dict(zip(st.vars, st.extents))}
                for e in st.extents:
                    check(e, extent_of)
                visit(st.body, inner)
                continue
            if isinstance(st, T.If):
                check(st.cond, extent_of)
                visit(st.body, extent_of)
                visit(st.orelse, extent_of)
                continue
            for e in [getattr(st, "value", None)] + list(getattr(st, "idx", ()) or ()):
                if e is not None and not isinstance(e, (str, bool)):
                    check(e, extent_of)
    visit(k.body, {})
    return ok


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(forward(k) for k in prog.kernels))


def forward(k: T.TileKernel) -> T.TileKernel:
    writes, opaque = writes_per_buffer(k), whole_buffer_uses(k)
    # every read is in the copy loop or after it in the same body (where the names the copy's
    # index uses are in scope and hold the same values), at variables over the copy's extents
    forward = {buf: (store, loop) for buf, (store, loop, after)
               in _candidates(k, writes, opaque).items()
               if len(loads_of(k.body, buf)) == len(loads_of((loop,) + after, buf)) and
               _reads_covered(k, buf, loop)}
    if not forward:
        return k

    def source(x):  # F[a, b] -> G[its copy's index with the copy loop's variables -> a, b]
        if isinstance(x, T.Load) and x.buf in forward:
            store, loop = forward[x.buf]
            return subst(store.value, dict(zip(loop.vars, x.idx)))
        return None

    def rewrite(stmts):
        out = []
        for st in stmts:
            if isinstance(st, T.Alloc) and st.name in forward:
                continue
            if isinstance(st, T.Store) and st.buf in forward and forward[st.buf][0] is st:
                continue
            if isinstance(st, T.For):
                st = replace(st, body=tuple(rewrite(st.body)))
                if not st.body:
                    continue
            elif isinstance(st, T.If):
                st = replace(st, body=tuple(rewrite(st.body)), orelse=tuple(rewrite(st.orelse)))
            out.append(map_exprs(st, source))
        return out
    return replace(k, body=tuple(rewrite(k.body)))
