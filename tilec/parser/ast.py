"""Syntax tree of a .tile file, as the Lark transformer builds it (no types yet)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import Loc


@dataclass(frozen=True, slots=True)
class Node:
    loc: Loc = field(compare=False, repr=False)


# ---- expressions -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Name(Node):
    id: str


@dataclass(frozen=True, slots=True)
class Number(Node):
    value: int | float
    is_float: bool


@dataclass(frozen=True, slots=True)
class Call(Node):
    func: str
    args: tuple
    kwargs: tuple  # ((name, expr, loc), ...)


@dataclass(frozen=True, slots=True)
class BinOp(Node):
    op: str  # + - * / // % @ ** & |
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # - ~
    operand: Node


@dataclass(frozen=True, slots=True)
class Attr(Node):
    value: Node
    attr: str


@dataclass(frozen=True, slots=True)
class Tuple(Node):
    items: tuple


@dataclass(frozen=True, slots=True)
class List(Node):
    items: tuple


@dataclass(frozen=True, slots=True)
class Subscript(Node):
    name: str
    index: tuple


# ---- tile-level statements -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Grid(Node):
    """`with grid(extents..., threads=T) as (bx, ...):` and its body."""

    call: Call
    vars: tuple
    body: tuple


@dataclass(frozen=True, slots=True)
class TAssign(Node):
    """`name = expr`: a buffer when expr is shared/fragment/local(...), else a scalar local."""

    name: str
    value: Node


@dataclass(frozen=True, slots=True)
class TStore(Node):
    name: str
    index: tuple
    value: Node


@dataclass(frozen=True, slots=True)
class TCall(Node):
    call: Call


@dataclass(frozen=True, slots=True)
class TFor(Node):
    vars: tuple
    iter: Call  # range(...), parallel(...), pipelined(..., stages=)
    body: tuple


@dataclass(frozen=True, slots=True)
class TIf(Node):
    cond: Node
    body: tuple
    orelse: tuple


# ---- kernels and schedules ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Param(Node):
    name: str
    dtype: str
    dtype_loc: Loc = field(compare=False, repr=False)
    dims: tuple | None  # None: a scalar parameter


@dataclass(frozen=True, slots=True)
class Assign(Node):
    name: str
    value: Node


@dataclass(frozen=True, slots=True)
class Assume(Node):
    cond: Node


@dataclass(frozen=True, slots=True)
class Kernel(Node):
    name: str
    params: tuple
    outputs: tuple
    doc: str | None
    body: tuple  # Assign | Assume, in source order


@dataclass(frozen=True, slots=True)
class SchedItem(Node):
    key: str
    args: tuple  # ((name or None, value, loc), ...)


@dataclass(frozen=True, slots=True)
class TargetSchedule(Node):
    target: str
    items: tuple


@dataclass(frozen=True, slots=True)
class Schedule(Node):
    kernel: str
    targets: tuple


@dataclass(frozen=True, slots=True)
class Module(Node):
    kernels: tuple
    schedules: tuple
