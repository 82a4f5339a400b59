"""Partitions each canonical graph into device kernels: one heavy op family per kernel.

Groups are anchored by a matmul (GEMM + elementwise epilogue), by reductions over one domain
(row softmax / norms: every reduction and elementwise op over the same rows), or by the chain
matmul -> softmax -> matmul (one online-softmax attention kernel). Elementwise producers are
inlined (recomputed) into their consumers; values that cross kernels go to memory: outputs or
workspaces. With `fuse off` no kernel spans two source statements.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.fused import Buffer, Group, Plan
from ..ir.graph import LEAVES, Graph, Module, Op
from ..ir.types import Dim


def is_squeeze(o: Op, ops) -> bool:
    """A reduction over axes of size 1 only moves no data: it drops those axes."""
    src = ops[o.args[0]]
    return o.kind == "reduce" and all(src.type.shape[a] == Dim.const(1) for a in o.attr("axes"))


def _same_position(arg: Op, user: Op) -> bool:
    """Broadcasting `arg` into `user` keeps each element's position (no rank change)."""
    a, u = arg.type.shape, user.type.shape
    if user.kind == "reduce" and not user.attr("keepdims"):  # a squeeze drops size-1 axes
        a = tuple(d for n, d in enumerate(a) if n not in user.attr("axes"))
    return (len(a) == len(u) and all(x == y or x == Dim.const(1) for x, y in zip(a, u))) or not a


def _reduced_shapes(shape, axes):
    keep = tuple(Dim.const(1) if i in axes else d for i, d in enumerate(shape))
    drop = tuple(d for i, d in enumerate(shape) if i not in axes)
    return keep, drop


class Fuser:
    def __init__(self, g, fuse: bool, conservative: bool = False, isolate: bool = False):
        self.g, self.fuse = g, fuse
        # isolate: every op its own kernel (no epilogues, no shared reductions, no attention):
        # the fallback when tiling a fused plan hits an internal error
        self.isolate = isolate
        conservative = conservative or isolate
        # conservative: an op joins a group only if it reads no other group's values, and every
        # elementwise output gets its own kernel (used when the greedy partition turned out
        # cyclic; a value an inlined chain reads may still be grouped later, so `run` falls back
        # to `isolate` when this one is cyclic too)
        self.conservative = conservative
        self.ops = g.op_map()
        self.users = g.users()
        self.home: dict[int, int] = {}  # op -> group index
        self.groups: list[dict] = []
        self.mat: set[int] = set(g.results)  # ops whose value goes to memory
        if isolate:
            self.mat |= {o.id for o in g.ops if o.kind not in LEAVES}
        self.needed: set = set()  # (op, group) pairs `need` has visited

    # ---- helpers
    def new_group(self, kind, anchor: Op, domain, axes=(), roles=()) -> int:
        self.groups.append(dict(kind=kind, members=[anchor.id], domain=tuple(domain), axes=axes,
                                roles=dict(roles), stmt=anchor.stmt, open={anchor.id}))
        gi = len(self.groups) - 1
        self.home[anchor.id] = gi
        return gi

    def add(self, gi: int, op: Op):
        self.groups[gi]["members"].append(op.id)
        self.groups[gi]["open"].add(op.id)
        self.home[op.id] = gi

    def need_all(self, gi: int):
        for m in self.groups[gi]["members"]:
            self.need(self.ops[m], gi)

    def fits(self, gi: int, op: Op) -> bool:
        if self.isolate:
            return False
        grp = self.groups[gi]
        if (not self.fuse and op.stmt != grp["stmt"]) or op.kind == "transpose":
            return False
        shape = op.type.shape
        if grp["kind"] == "reduce":
            ok = shape == grp["domain"] or shape in _reduced_shapes(grp["domain"], grp["axes"])
        else:
            ok = shape == grp["domain"]
        return ok and all(self._inline_ok(a, gi, op, not self.conservative) for a in op.args)

    def _inline_ok(self, oid: int, gi: int, user: Op, other_groups: bool) -> bool:
        """Can `user`, computed in group gi, evaluate operand `oid` there? Group values live in
        tile buffers indexed by the block's own position, so every path from `user` to them
        must keep the index (same rank; broadcasting only over size-1 axes)."""
        o = self.ops[oid]
        if self.home.get(oid) == gi:
            return oid in self.groups[gi]["open"] and _same_position(o, user)
        if oid in self.home or (oid in self.mat and o.kind != "input"):
            return other_groups
        if o.kind in LEAVES:
            return True
        if o.kind in ("transpose", "dequant", "reduce") or not _same_position(o, user):
            # an index-changing path must not reach this group's on-chip values
            return not self._reaches(oid, lambda x: self.home.get(x) == gi, set()) and (
                other_groups or not self._reaches(oid, lambda x: self.home.get(x, gi) != gi, set()))
        return all(self._inline_ok(a, gi, o, other_groups) for a in o.args)

    def _reaches(self, oid: int, hit, seen: set) -> bool:
        """Does the inlined expression of `oid` read a grouped value for which `hit` holds?"""
        if oid in seen:
            return False
        seen.add(oid)
        o = self.ops[oid]
        if oid in self.home or (oid in self.mat and o.kind != "input"):
            return hit(oid)
        if o.kind in LEAVES:
            return False
        return any(self._reaches(a, hit, seen) for a in o.args)

    def reduce_group_for(self, o: Op):
        """An existing reduction group over the same rows that can also compute `o`: its input
        is made of that group's values, inlinable ops and kernel inputs only."""
        src = self.ops[o.args[0]]
        if self.isolate:
            return None
        for gi in reversed(range(len(self.groups))):
            grp = self.groups[gi]
            if grp["kind"] != "reduce" or grp["domain"] != src.type.shape or \
               grp["axes"] != o.attr("axes") or (not self.fuse and grp["stmt"] != o.stmt):
                continue
            if self._inline_ok(src.id, gi, src, False):
                return gi
        return None

    # ---- attention: matmul(P, V) where P = [cast] softmax(score(matmul(Q, K)))
    def match_attention(self, pv: Op) -> dict | None:
        if not self.fuse or self.isolate:
            return None
        p = self.ops[pv.args[0]]
        chain = [p.id]
        if p.kind == "cast":
            p = self.ops[p.args[0]]
            chain.append(p.id)
        if not (p.kind == "binary" and p.attr("fn") == "div"):
            return None
        e, s = self.ops[p.args[0]], self.ops[p.args[1]]
        if not (e.kind == "unary" and e.attr("fn") == "exp" and s.kind == "reduce"
                and s.attr("fn") == "sum" and s.args[0] == e.id and s.attr("keepdims")):
            return None
        rank = e.type.rank
        if s.attr("axes") != (rank - 1,):
            return None
        d = self.ops[e.args[0]]
        if not (d.kind == "binary" and d.attr("fn") == "sub"):
            return None
        x, m = self.ops[d.args[0]], self.ops[d.args[1]]
        if not (m.kind == "reduce" and m.attr("fn") == "max" and m.args[0] == x.id
                and m.attr("axes") == (rank - 1,) and m.attr("keepdims")):
            return None
        # the score: elementwise ops over the [.., L, S] domain, rooted at one matmul
        score, qk, stack = [], None, [x.id]
        while stack:
            o = self.ops[stack.pop()]
            if o.id in score or o.kind in LEAVES:
                continue
            if o.kind == "matmul":
                if qk not in (None, o.id) or o.type.shape != x.type.shape:
                    return None
                qk = o.id
                continue
            if o.kind not in ("cast", "unary", "binary", "compare", "where") or \
               (o.type.shape != x.type.shape and self._depends_on_anchor(o)):
                return None
            score.append(o.id)
            stack.extend(o.args)
        if qk is None or (self.ops[qk].type.dtype != "f32" and self.ops[qk].type.dtype != "f64"):
            return None
        inner = set(score) | {qk, m.id, d.id, e.id, s.id} | set(chain)
        for o in inner:
            if o in self.mat or any(u not in inner and u != pv.id for u in self.users[o]):
                return None
        return dict(qk=qk, score=sorted(score), max=m.id, sub=d.id, exp=e.id, sum=s.id,
                    chain=sorted(chain), pv=pv.id, x=x.id)

    def _depends_on_anchor(self, o: Op) -> bool:
        return any(self.ops[a].kind in ("matmul", "reduce") or
                   (self.ops[a].kind not in LEAVES and self._depends_on_anchor(self.ops[a]))
                   for a in o.args)

    # ---- main
    def run(self) -> Plan:
        g = self.g
        if not self.fuse:  # a value used by another statement is materialized
            for o in g.ops:
                if o.kind not in LEAVES and any(self.ops[u].stmt != o.stmt for u in self.users[o.id]):
                    self.mat.add(o.id)
        for o in g.ops:  # attention chains first: their inner matmul must not anchor a GEMM
            att = self.match_attention(o) if o.kind == "matmul" else None
            if att:
                gi = self.new_group("attention", self.ops[att["qk"]], o.type.shape,
                                    roles=[(k, v) for k, v in att.items()])
                for mid in sorted(set(att["score"]) | {att["max"], att["sub"], att["exp"],
                                                       att["sum"], o.id} | set(att["chain"])):
                    self.add(gi, self.ops[mid])
                self.groups[gi]["open"] = {o.id}
                self.need_all(gi)
        for o in g.ops:
            if o.id in self.home or o.kind in LEAVES:
                continue
            if o.kind == "matmul":
                self.new_group("gemm", o, o.type.shape)
                self.need(o, None)
            elif o.kind == "reduce" and not is_squeeze(o, self.ops):
                gi = self.reduce_group_for(o)
                if gi is not None:
                    self.add(gi, o)
                    self.need(o, gi)
                else:
                    gi = self.new_group("reduce", o, self.ops[o.args[0]].type.shape, o.attr("axes"))
                    self.need(o, gi)
            else:
                cands = sorted({self.home[a] for a in o.args if a in self.home
                                and a in self.groups[self.home[a]]["open"]})
                for gi in reversed(cands):
                    if self.fits(gi, o):
                        self.add(gi, o)
                        break
                self.need(o, self.home.get(o.id))
        # values that must reach memory but were computed by no group: elementwise kernels
        for r in sorted(self.mat):
            o = self.ops[r]
            if r in self.home:
                continue
            if o.kind == "input":
                continue
            o_shape = o.type.shape
            gi = None if self.conservative else next(
                (i for i, gr in enumerate(self.groups) if gr["kind"] == "elementwise"
                 and gr["domain"] == o_shape and (self.fuse or gr["stmt"] == o.stmt)), None)
            if gi is None:
                self.new_group("elementwise", o, o_shape)
            else:
                self.add(gi, o)
            self.need(o, self.home[o.id])
        return self.plan()

    def need(self, o: Op, gi: int | None):
        """`o` is computed in group gi (None: inlined): values it takes from other groups are
        materialized; inlined producers are visited in turn (each (op, group) pair once: a
        long chain of inlined ops is linear, not quadratic)."""
        if (o.id, gi) in self.needed:
            return
        self.needed.add((o.id, gi))
        for a in o.args:
            ao = self.ops[a]
            h = self.home.get(a)
            if h is not None and h != gi:
                self.mat.add(a)
            elif h is None and ao.kind not in LEAVES and a not in self.mat:
                self.need(ao, gi)

    def reads_of(self, gi: int) -> list:
        out, seen = [], set()
        members = set(self.groups[gi]["members"])

        def visit(a):
            if a in seen:
                return
            seen.add(a)
            o = self.ops[a]
            if a in members:
                for b in o.args:
                    visit(b)
            elif a in self.mat or o.kind == "input":
                out.append(a)
            else:
                for b in o.args:
                    visit(b)
        for m in members:
            visit(m)
        return sorted(out)

    def plan(self) -> Plan:
        g = self.g
        bufs: dict = {}
        for o in g.ops:
            if o.kind == "input":
                bufs[o.id] = Buffer(o.attr("name"), o.type, "input")
        for p, r in zip(g.outputs, g.results):
            if r in bufs:  # an output that is an input (or another output) is copied by a kernel
                continue
            bufs[r] = Buffer(p.name, p.type, "output")
        n = 0
        for r in sorted(self.mat):
            if r not in bufs:
                bufs[r] = Buffer(f"ws{n}", self.ops[r].type, "workspace")
                n += 1
        groups = []
        for gi, gr in enumerate(self.groups):
            members = sorted(gr["members"])
            outs = tuple(m for m in members if m in self.mat)
            groups.append(Group(gi, gr["kind"], tuple(members), outs, gr["domain"],
                                gr["axes"], tuple(sorted(gr["roles"].items(), key=lambda kv: kv[0]))
                                if gr["roles"] else (), tuple(self.reads_of(gi))))
        order = _toposort(groups, self.home, self.mat)
        ren = {old: new for new, old in enumerate(order)}
        groups = [replace(groups[i], id=ren[i]) for i in order]
        return Plan(tuple(groups), tuple(sorted(bufs.items())))


class CyclicPartition(Exception):
    pass


def _toposort(groups, home, mat) -> list:
    deps = {gr.id: {home[r] for r in gr.reads if r in home and home[r] != gr.id} for gr in groups}
    order, done, active = [], set(), set()

    def visit(i):
        if i in done:
            return
        if i in active:
            raise CyclicPartition()
        active.add(i)
        for d in sorted(deps[i]):
            visit(d)
        active.discard(i)
        done.add(i)
        order.append(i)
    for gr in groups:
        visit(gr.id)
    return order


def fusion_plan(g: Graph, fuse) -> Plan:
    """The fusion plan of graph `g` (schedule key `fuse`)."""
    if g.tile is not None:  # a tile-level kernel is its own single device kernel
        return Plan((), ())
    try:
        return Fuser(g, fuse).run()
    except CyclicPartition:
        try:
            return Fuser(g, fuse, conservative=True).run()
        except CyclicPartition:  # an inlined chain reached a value grouped later: one op
            return Fuser(g, fuse, isolate=True).run()  # per kernel cannot cycle


def run(m: Module, opts) -> Module:
    return replace(m, plans=tuple(fusion_plan(g, m.schedule_for(g.name, opts["target"].name).fuse)
                                  for g in m.graphs))
