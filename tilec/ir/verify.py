"""IR verifier: structural invariants every pass must keep (valid IR in, valid IR out)."""

from __future__ import annotations

from ..ir.types import broadcast_shapes
from .graph import HIGH_LEVEL, Module


class VerifyError(AssertionError):
    pass


_ARITY = {"input": 0, "const": 0, "dim": 0, "index": 0, "copy": 1, "cast": 1, "unary": 1, "compare": 2,
          "where": 3, "matmul": 2, "transpose": 1, "reduce": 1, "softmax": 1, "mean": 1,
          "logsumexp": 1}


def verify_graph(g, after: str):
    seen = set()

    def fail(msg):
        raise VerifyError(f"after {after}: graph {g.name}: {msg}")
    for n, op in enumerate(g.ops):
        if op.id != n:
            fail(f"op ids are not dense at %{op.id}")
        for a in op.args:
            if a not in seen:
                fail(f"%{op.id} uses %{a} before its definition")
        want = _ARITY.get(op.kind)
        if want is not None and len(op.args) != want:
            fail(f"%{op.id} ({op.kind}) has {len(op.args)} operands, expected {want}")
        if op.kind == "binary" and len(op.args) != (1 if op.attr("fn") == "pow" else 2):
            fail(f"%{op.id} binary {op.attr('fn')} has {len(op.args)} operands")
        if op.kind in ("binary", "compare", "where") and len(op.args) >= 2:
            ops = [g.ops[a] for a in op.args]
            vals = ops[1:] if op.kind == "where" else ops
            if len({o.type.dtype for o in vals}) != 1:
                fail(f"%{op.id} mixes dtypes {[o.type.dtype for o in vals]}")
            shape = ()
            for o in ops:
                shape = broadcast_shapes(shape, o.type.shape)
                if shape is None:
                    fail(f"%{op.id} operands do not broadcast")
            if shape != op.type.shape:
                fail(f"%{op.id} has shape {op.type.shape}, operands broadcast to {shape}")
        if op.kind == "matmul":
            a, b = (g.ops[x] for x in op.args)
            if a.type.shape[-1] != b.type.shape[-2]:
                fail(f"%{op.id} matmul K mismatch")
        seen.add(op.id)
    for r in g.results:
        if r not in seen:
            fail(f"result %{r} is not defined")
    for p, r in zip(g.outputs, g.results):
        if g.ops[r].type != p.type:
            fail(f"output {p.name} is {p.type} but %{r} is {g.ops[r].type}")


def verify_module(m: Module, after: str):
    for g in m.graphs:
        verify_graph(g, after)
        if after not in ("parse",) and any(o.kind in HIGH_LEVEL for o in g.ops):
            raise VerifyError(f"after {after}: graph {g.name} still has high-level ops")
    for g, plan in zip(m.graphs, m.plans):
        homes = {}
        for grp in plan.groups:
            for o in grp.members:
                if o in homes:
                    raise VerifyError(f"after {after}: %{o} is in kernels {homes[o]} and {grp.id}")
                homes[o] = grp.id
        bufs = dict(plan.buffers)
        for r in g.results:
            if r not in bufs:
                raise VerifyError(f"after {after}: result %{r} has no buffer")
        done = set()
        for grp in plan.groups:
            for r in grp.reads:
                if r in homes and homes[r] not in done and homes[r] != grp.id:
                    raise VerifyError(f"after {after}: kernel {grp.id} reads %{r} before kernel "
                                      f"{homes[r]} writes it")
            done.add(grp.id)
