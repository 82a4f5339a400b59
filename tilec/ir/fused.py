"""Fusion plan: how a kernel's Graph IR is partitioned into device kernels (groups)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .types import TensorType


@dataclass(frozen=True, slots=True)
class Group:
    """One device kernel. `members` are computed here; `outputs` leave it through memory."""

    id: int
    kind: str  # elementwise | reduce | gemm | attention
    members: tuple  # op ids, topological
    outputs: tuple  # op ids materialized by this group (graph outputs or workspaces)
    domain: tuple  # iteration shape (Dims)
    axes: tuple = ()  # reduce: reduced axes of `domain`
    roles: tuple = ()  # attention: (("qk", id), ("max", id), ("sum", id), ("p", id), ("pv", id), ...)
    reads: tuple = field(default=(), compare=False)  # op ids read from memory (inputs/workspaces)

    def role(self, name: str):
        return dict(self.roles).get(name)


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    type: TensorType
    kind: str  # input | output | workspace


@dataclass(frozen=True, slots=True)
class Plan:
    groups: tuple  # Group, in execution order
    buffers: tuple  # ((op id, Buffer), ...) for every op whose value lives in memory

    def buffer_of(self, op_id: int) -> Buffer | None:
        return dict(self.buffers).get(op_id)


def print_plan(g, plan: Plan) -> str:
    ops = g.op_map()
    bufs = dict(plan.buffers)
    lines = [f"fusion {g.name}: {len(plan.groups)} kernel(s)"]
    for grp in plan.groups:
        what = grp.kind
        if grp.axes:
            what += f" over axes {grp.axes}"
        lines.append(f"  kernel {grp.id}: {what}, domain [{', '.join(str(d) for d in grp.domain)}]")
        lines.append(f"    ops: {' '.join(f'%{m}' for m in grp.members)}")
        reads = [bufs[r].name for r in grp.reads if r in bufs]
        lines.append(f"    reads: {', '.join(reads) or '-'}")
        writes = [f"{bufs[o].name} (%{o}: {ops[o].type})" for o in grp.outputs]
        lines.append(f"    writes: {', '.join(writes)}")
    ws = [b for _, b in plan.buffers if b.kind == "workspace"]
    if ws:
        lines.append("  workspaces: " + ", ".join(f"{b.name}: {b.type}" for b in ws))
    return "\n".join(lines)
