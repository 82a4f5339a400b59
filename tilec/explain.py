"""`tilec explain`: the fusion groups of each kernel and the global-memory bytes they move,
fused (what tilec emits) against unfused (every op its own kernel, every intermediate in memory).
"""

from __future__ import annotations

from .ir.fused import Plan
from .ir.graph import LEAVES, Graph
from .ir.types import itemsize_bits, numel


def tensor_bytes(t, dims: dict) -> int:
    n = numel(t.shape).eval(dims) if t.shape else 1
    bits = itemsize_bits(t.dtype)
    return (n * bits + 7) // 8


def unfused_bytes(g: Graph, dims: dict) -> int:
    """Each op reads its operands from memory and writes its result (eager execution)."""
    ops = g.op_map()
    total = 0
    for o in g.ops:
        if o.kind in LEAVES:
            continue
        total += tensor_bytes(o.type, dims)
        total += sum(tensor_bytes(ops[a].type, dims) for a in o.args if ops[a].kind not in
                     ("const", "dim", "index"))
    return total


def group_bytes(g: Graph, plan: Plan, grp, dims: dict) -> tuple:
    bufs = dict(plan.buffers)
    ops = g.op_map()
    r = sum(tensor_bytes(ops[x].type, dims) for x in grp.reads if x in bufs)
    w = sum(tensor_bytes(ops[x].type, dims) for x in grp.outputs)
    return r, w


def _computed(g: Graph, plan: Plan, grp) -> list:
    """Ops a kernel evaluates: its members and the producers it inlines (recomputes)."""
    ops, bufs, out = g.op_map(), dict(plan.buffers), set()

    def visit(i, top):
        if i in out or (not top and (i in bufs or i in grp.members)) or ops[i].kind in LEAVES:
            return
        out.add(i)
        for a in ops[i].args:
            visit(a, False)
    for m in grp.members:
        visit(m, True)
    return sorted(out)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def explain(g: Graph, plan: Plan, dims: dict) -> str:
    ops = g.op_map()
    bufs = dict(plan.buffers)
    dim_text = ", ".join(f"{k}={v}" for k, v in dims.items())
    lines = [f"kernel {g.name}  ({dim_text})" if dims else f"kernel {g.name}"]
    fused = 0
    for grp in plan.groups:
        r, w = group_bytes(g, plan, grp, dims)
        fused += r + w
        kinds = []
        for m in _computed(g, plan, grp):
            o = ops[m]
            k = o.attr("fn") if o.kind in ("unary", "binary", "compare") else \
                f"{o.kind}.{o.attr('fn')}" if o.kind == "reduce" else o.kind
            kinds.append(k)
        reads = ", ".join(bufs[x].name for x in grp.reads if x in bufs) or "-"
        writes = ", ".join(bufs[x].name for x in grp.outputs)
        lines.append(f"  device kernel {grp.id} [{grp.kind}]: {' '.join(kinds)}")
        lines.append(f"    reads {reads}; writes {writes}; {_mb(r + w)}")
    ws = [b for _, b in plan.buffers if b.kind == "workspace"]
    for b in ws:
        lines.append(f"  workspace {b.name}: {b.type} is materialized between kernels "
                     f"({_mb(tensor_bytes(b.type, dims))})")
    un = unfused_bytes(g, dims)
    ratio = un / fused if fused else float("inf")
    lines.append(f"  global memory traffic: fused {_mb(fused)}, unfused {_mb(un)} "
                 f"({ratio:.1f}x less with fusion)")
    return "\n".join(lines)
