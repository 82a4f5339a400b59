"""Block barriers: a `barrier()` goes before any statement that reads a shared buffer written
since the last barrier (another thread may have written it), or writes one read or written since
then (another thread may still be reading it). Loops are analysed with the state their body ends
in carried round to its start; a loop that only reads what was written before it gets its
barrier before the loop rather than in every iteration. Asynchronous copies are ordered by the
pipeline pass's own wait + barrier; a block-wide `allreduce` synchronizes the block itself.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from ..ir.layout import VecRows
from .rewrite import loads_in


def _access(st, shared: set) -> tuple:
    """(shared buffers read, shared buffers written) by statement `st`, nested ones included."""
    reads, writes = set(), set()
    for s in T.walk_stmts([st]):
        if isinstance(s, T.Copy):
            if s.dst.buf in shared and not s.async_:
                writes.add(s.dst.buf)
            if s.src.buf in shared:
                reads.add(s.src.buf)
        elif isinstance(s, T.Gemm):
            reads |= {s.a, s.b} & shared
        elif isinstance(s, T.GemvMma) and s.dst in shared:
            writes.add(s.dst)
        elif isinstance(s, (T.Store, T.Fill)) and s.buf in shared:
            writes.add(s.buf)
    reads |= {ld.buf for ld in loads_in(st) if ld.buf in shared}
    return reads, writes


def _syncs(st, layouts: dict) -> bool:
    return isinstance(st, T.Barrier) or (isinstance(st, T.Allreduce) and
                                         isinstance(layouts.get(st.buf), VecRows))


def insert(stmts, state: tuple, shared: set, layouts: dict) -> tuple:
    """(statements with barriers, state after them); state = (read, written) since a barrier."""
    read, written = state
    out = []
    for st in stmts:
        if _syncs(st, layouts):
            out.append(st)
            read, written = frozenset(), frozenset()
            continue
        if isinstance(st, T.If):  # a block-level branch: its condition is the same in every thread
            body, s1 = insert(st.body, (read, written), shared, layouts)
            orelse, s2 = insert(st.orelse, (read, written), shared, layouts)
            if _access(st, shared) != (set(), set()) or body != st.body or orelse != st.orelse:
                st = replace(st, body=body, orelse=orelse)
            out.append(st)
            read, written = s1[0] | s2[0], s1[1] | s2[1]
            continue
        if isinstance(st, T.For) and st.kind != "parallel":
            r, w = _access(st, shared)
            if not w and (r & written):
                # a loop that only reads shared memory another thread wrote before it: one
                # barrier before the loop, none per iteration
                out.append(T.Barrier())
                read, written = frozenset(), frozenset()
            _, end = insert(st.body, (read, written), shared, layouts)
            entry = (read | end[0], written | end[1])
            body, end = insert(st.body, entry, shared, layouts)
            out.append(replace(st, body=body))
            read, written = read | end[0], written | end[1]
            continue
        r, w = _access(st, shared)
        if (r & written) or (w & read) or (w & written):
            out.append(T.Barrier())
            read, written = frozenset(), frozenset()
        out.append(st)
        read, written = read | r, written | w
    return tuple(out), (read, written)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        allocs = [a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)]
        shared = {a.name for a in allocs if a.scope == "shared"}
        layouts = {a.name: a.layout for a in allocs}
        body, _ = insert(k.body, (frozenset(), frozenset()), shared, layouts)
        ks.append(replace(k, body=body))
    return replace(prog, kernels=tuple(ks))
