"""The TMA-store epilogue of a warp-specialized kernel (Hopper; CUDA lowering, after `layout`).

The consumer warpgroups of a warp-specialized GEMM run its epilogue on the accumulator registers.
Where the epilogue stores an output tile at the accumulator's own positions,

    for i, j in parallel(128, 256, by=wgmma(...)):
        if (by * 128 + i < M) & (bx * 256 + j < N):
            C[by * 128 + i, bx * 256 + j] = f16(relu(acc[i, j] + f32(bias[bx * 256 + j])))

a block whose whole tile lies inside the tensors stores C through shared memory instead of from
registers: each consumer warpgroup writes its 64 rows in panels of 128 bytes per row (64 16-bit
or 32 f32 columns) into a staging buffer laid out in TMA's 128-byte swizzle (free of bank
conflicts), and one of its threads hands the panel to a TMA store; two buffers per warpgroup let
the next panel be written while the last one is stored, and the stores of a tile's last panels
run while the block's next tile is multiplied. A block at the tensors' ragged edge stores from
registers (storing edge tiles by TMA too, the copy engine leaving out what lies outside, was
measured no faster on an H100: docs/PERFORMANCE.md, 2026-12-06 07:45).

In a persistent kernel whose epilogue stores nothing else, and only 16-bit values, the tile's
stores are deferred (TileKernel.deferred_stores, resources.deferred_epilogue): its values are
computed as its K loop ends and kept in registers, packed two to a word, and the next tile's K
loop writes and stores a panel of them after issuing each of its first K tiles' wgmmas, so the
tensor cores do not idle while the consumers write the tile to shared memory.

This pass decides it: for each such store of an f16, bf16 or f32 output of at most 3 dims it adds
the staging buffer (a shared Alloc) and records (output, buffer) in TileKernel.tma_stores; the
variant's run-time conditions grow by what TMA needs of the output (rows a multiple of 16 bytes,
a 16-byte aligned address, extents below 2^31). It leaves the kernel alone where the staging
buffers would not fit in shared memory, for the ping-pong schedule (one warpgroup's tile is 128
rows there), where the grid is not persistent (the stores would not overlap another tile's
products) and in attention (its persistent kernel is not measured with them). The renderer
writes the panels, barriers and stores.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import tile as T
from ..ir.layout import SharedLayout, WgmmaLayout, placed_bytes
from ..ir.types import DTYPES, Dim
from .rewrite import uses_var

# output dtypes TMA stores (the tensor map's element types tilec uses)
STORED = ("f16", "bf16", "f32")
# bytes of the mbarriers after the shared buffers, per stage (full and empty)
BARRIER_BYTES = 16
# a deferred epilogue keeps at most this many 32-bit words of a tile's packed values per
# consumer thread, and they and the accumulators at most this many registers: 128 + 64 of a
# 128 x 256 f16 tile compiled without spills in the 232 of a consumer thread
DEFERRED_WORDS = 64
DEFERRED_REGISTERS = 192


def tma_conditions(decls, names, when):
    """`when` and the conditions under which TMA can address the tensors `names` of `decls`
    (name -> TensorDecl): each row a multiple of 16 bytes, every extent below 2^31 (32-bit
    coordinates); False where a condition is false for every dimension (no TMA)."""
    seen, stack = set(), [when] if when is not None else []
    while stack:  # (the conjuncts `when` holds already)
        c = stack.pop()
        if c.op == "and":
            stack += c.args
        else:
            seen.add(c)
    for name in names:
        p = decls[name]
        per16 = 16 // (DTYPES[p.dtype][1] // 8)
        for cond in [Dim.bin("eq", p.shape[-1] % per16, 0)] + [Dim.bin("lt", d, 2 ** 31)
                                                                for d in p.shape]:
            if cond == Dim.const(1) or cond in seen:
                continue
            if cond == Dim.const(0):
                return False
            seen.add(cond)
            when = cond if when is None else Dim.bin("and", when, cond)
    return when


def panel_cols(dtype: str) -> int:
    """Columns of one staging panel: a 128-byte row (the swizzle's span)."""
    return 128 // (DTYPES[dtype][1] // 8)


def tile_store(st, ivar: str, jvar: str, outputs: dict):
    """Is `st` a store of an output tile at the accumulator's positions: out[..., r0 + i, c0 + j]
    (r0, c0 and the leading indices free of i and j)?"""
    if not isinstance(st, T.Store) or st.buf not in outputs or len(st.idx) < 2:
        return False
    *lead, r, c = st.idx

    def offset_by(e, v):
        return (isinstance(e, T.Var) and e.name == v) or (
            isinstance(e, T.Binary) and e.fn == "add" and isinstance(e.b, T.Var) and
            e.b.name == v and not uses_var(e.a, (ivar, jvar)))
    return offset_by(r, ivar) and offset_by(c, jvar) and \
        not any(uses_var(x, (ivar, jvar)) for x in lead)


def _epilogue_stores(k: T.TileKernel, outputs: dict) -> list:
    """(output, accumulator columns) of the outputs stored as whole accumulator tiles by the
    loops after the warp-specialized loop (in order, each once)."""
    body = k.body
    at = next(n for n, s in enumerate(body) if isinstance(s, T.For) and s.kind == "warp_specialized")
    found = []
    for loop in body[at + 1:]:
        # (a consumer warpgroup's 64 rows: 16 per warp)
        if not (isinstance(loop, T.For) and loop.kind == "parallel" and len(loop.vars) == 2 and
                isinstance(loop.by, WgmmaLayout) and not loop.by.pingpong and loop.by.mi == 1):
            continue
        inner = loop.body
        if len(inner) == 1 and isinstance(inner[0], T.If):
            if inner[0].orelse:
                continue
            inner = inner[0].body
        if any(isinstance(s, T.Allreduce) for s in T.walk_stmts(inner)):
            continue
        ivar, jvar = loop.vars
        for st in inner:
            if tile_store(st, ivar, jvar, outputs) and st.buf not in dict(found) and \
                    loop.by.cols % panel_cols(outputs[st.buf].dtype) == 0:
                found.append((st.buf, loop.by.cols))
    return found


def _stage(k: T.TileKernel, target) -> T.TileKernel:
    # (a persistent kernel: its tile's stores run beside the next tile's products; elsewhere
    # they would gain little for their shared memory)
    # (nor in the variant for rows off 16 bytes: the output's mostly are too, and the staged
    # stores would need them on 16 bytes)
    if not k.warp_specialize or k.pingpong or not k.persistent or k.register_stores:
        return k
    loop = next(s for s in k.body if isinstance(s, T.For) and s.kind == "warp_specialized")
    # (a GEMM's K loop alone)
    if sum(isinstance(s, T.Gemm) for s in loop.body) != 1:
        return k
    outputs = {p.name: p for p in k.params if p.kind == "output" and p.dtype in STORED and
               len(p.shape) <= 3}
    budget = target.resources.tile_memory - BARRIER_BYTES * (loop.stages + 1)
    # (a warp-specialized kernel's buffers are 1024-byte aligned: TMA's 128-byte swizzle)
    used = placed_bytes([a for a in T.walk_stmts(k.body)
                         if isinstance(a, T.Alloc) and a.scope == "shared"], 1024)
    names = {a.name for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc)}
    stores, allocs, when = [], [], k.when
    for out, acc_cols in _epilogue_stores(k, outputs):
        p = outputs[out]
        cols = panel_cols(p.dtype)
        buffers = k.warp_specialize * min(2, acc_cols // cols)
        size = buffers * 64 * 128
        cond = tma_conditions({p.name: p}, [p.name], when)
        # (one panel width per epilogue: the renderer walks the tile's panels once)
        if used + size > budget or cond is False or \
                any(panel_cols(a.dtype) != cols for a in allocs):
            continue
        name = f"{out}_st"
        while name in names:
            name += "_"
        names.add(name)
        used += size
        when = cond
        stores.append((out, name))
        allocs.append(T.Alloc(name, "shared", p.dtype,
                              (T.iconst(buffers), T.iconst(64), T.iconst(cols)),
                              SharedLayout(64, cols, DTYPES[p.dtype][1] // 8, False, tma=True)))
    if not stores:
        return k
    # (the staging buffers after the kernel's other allocations, before the warp-specialized loop)
    at = k.body.index(loop)
    body = k.body[:at] + tuple(allocs) + k.body[at:]
    aligned = tuple(sorted(set(k.aligned) | {o for o, _ in stores}))
    deferred = target.resources.deferred_epilogue and _deferrable(k, loop, dict(stores), outputs)
    return replace(k, body=body, when=when, aligned=aligned, tma_stores=tuple(stores),
                   deferred_stores=deferred)


def _deferrable(k: T.TileKernel, loop: T.For, staged: dict, outputs: dict) -> bool:
    """Can the epilogue after the K loop `loop` wait for the next tile's K loop: one loop over
    the accumulators (Lets beside it) whose every store is a staged one of 16-bit values, their
    packed pairs fitting beside the accumulators in a consumer thread's registers?"""
    (gemm,) = [s for s in loop.body if isinstance(s, T.Gemm)]
    post = k.body[k.body.index(loop) + 1:]
    epilogue = [s for s in post if isinstance(s, T.For)]
    if gemm.promote or len(epilogue) != 1 or \
            any(not isinstance(s, (T.For, T.Let)) for s in post):
        return False
    (ep,) = epilogue
    stores = [s for s in T.walk_stmts(ep.body) if isinstance(s, T.Store)]
    if not isinstance(ep.by, WgmmaLayout) or not stores or \
            any(s.buf not in staged or DTYPES[outputs[s.buf].dtype][1] != 16 for s in stores):
        return False
    acc = next(a for a in T.walk_stmts(k.body) if isinstance(a, T.Alloc) and a.name == gemm.c)
    words = ep.by.slots() // 2 * len(stores)  # (two 16-bit values per word)
    return words <= DEFERRED_WORDS and acc.layout.slots() + words <= DEFERRED_REGISTERS


def run(prog: T.TileProgram, target, options) -> T.TileProgram:
    return replace(prog, kernels=tuple(_stage(k, target) for k in prog.kernels))


__all__ = ["STORED", "panel_cols", "run", "tile_store", "tma_conditions"]
