"""Overlap the end of each pipelined K loop iteration with its GEMM (GPU targets, after `barriers`).

The pipeline pass ends iteration k of a pipelined loop with the wait for iteration k+1's tiles, a
barrier, and the copies of iteration k+S into the stage k has read (the refill). When the body
ends with a gemm on the matrix units whose operands are both staged tiles of this iteration, that
sync and refill move into the gemm, before its last k-step: the last k-step computes from
registers while the warp meets the barrier, loads the first k-step's fragments of the next stage
and issues the refill's copies, so the matrix units keep working across K tiles:

    wait(S - 1)
    barrier()
    gemm_load(A_s[0], B_s[0], acc)                   # the first k-step's fragments of tile 0
    for k in range(n):
        gemm(A_s[k % S], B_s[k % S], acc, then=[wait(S - 2); barrier()], next=(k + 1) % S,
             refill=[if k + S < n: copy_async(..., A_s[k % S]); ...; commit()])

Nothing else in the body may write the operands (the fragments of the next stage load before the
body's other statements of the next iteration run).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from .layout import on_matrix_units
from .rewrite import mod_of_var, written_by


def _overlap(loop: T.For, allocs: dict, resources):
    """(GemmLoad, loop) with the loop's last gemm overlapped; None when it does not apply."""
    body, refill = loop.body, ()
    if len(body) >= 2 and isinstance(body[-1], T.Commit) and _only_async_copies(body[-2]):
        body, refill = body[:-2], body[-2:]  # the copies of a later tile: into the gemm too
    if loop.kind != "range" or len(loop.vars) != 1 or len(body) < 3 or \
       not isinstance(body[-2], T.Wait) or not isinstance(body[-1], T.Barrier) or \
       not isinstance(body[-3], T.Gemm):
        return None
    g, k = body[-3], loop.vars[0]
    stage = mod_of_var(g.a_stage, k)  # (0, S): the stage k % S
    if stage is None or stage[0] != 0 or g.b_stage != g.a_stage or g.next_stage is not None or \
       allocs[g.a].scope != "shared" or not on_matrix_units(g, allocs, resources):
        return None
    # (the pipeline's own asynchronous copies write other stages)
    if any({g.a, g.b} & set(written_by(s)) for st in body[:-3] for s in T.walk_stmts([st])
           if not (isinstance(s, T.Copy) and s.async_)):
        return None
    nxt = T.imod(T.iadd(T.Var(k), T.iconst(1)), T.iconst(stage[1]))
    first = replace(g, a_stage=T.iconst(0), b_stage=T.iconst(0))
    return T.GemmLoad(first), replace(loop, body=body[:-3] + (
        replace(g, sync=body[-2:], next_stage=nxt, refill=refill),))


def _only_async_copies(st) -> bool:
    """`st` issues asynchronous copies and nothing else (the pipeline's `if k + S < n:`)."""
    inner = st.body + st.orelse if isinstance(st, T.If) else (st,)
    return bool(inner) and all(isinstance(x, T.Copy) and x.async_ for x in inner)


def _walk(stmts, allocs, resources) -> tuple:
    out = []
    for st in stmts:
        if isinstance(st, T.For):
            st = replace(st, body=_walk(st.body, allocs, resources))
            done = _overlap(st, allocs, resources)
            if done is not None:
                out += done
                continue
        elif isinstance(st, T.If):
            st = replace(st, body=_walk(st.body, allocs, resources),
                         orelse=_walk(st.orelse, allocs, resources))
        out.append(st)
    return tuple(out)


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    ks = []
    for k in prog.kernels:
        allocs = {a.name: a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
        ks.append(replace(k, body=_walk(k.body, allocs, target.resources)))
    return replace(prog, kernels=tuple(ks))
