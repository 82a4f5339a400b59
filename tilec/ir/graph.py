"""Graph IR: typed tensor ops in SSA form, one `Graph` per kernel, and its printer.

Op kinds (attrs in brackets):
  input[name]  const[value]  dim[dim]  index[axis]  copy  cast  unary[fn]  binary[fn]  compare[fn]
  where  matmul  transpose  reduce[fn, axes, keepdims]  dequant[group, zero]
  softmax[axes]  mean[axes, keepdims]  logsumexp[axes, keepdims]   (removed by canonicalize)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import Loc
from .types import Dim, TensorType, value_key

LEAVES = ("input", "const", "dim", "index")  # no operands: recomputed wherever used
ELEMENTWISE = ("copy", "cast", "unary", "binary", "compare", "where", "transpose", "dequant")
HIGH_LEVEL = ("softmax", "mean", "logsumexp")


@dataclass(frozen=True, slots=True)
class Op:
    id: int
    kind: str
    args: tuple
    type: TensorType
    attrs: tuple = ()  # sorted ((key, value), ...): hashable and printable
    loc: Loc | None = field(default=None, compare=False)
    stmt: int = field(default=-1, compare=False)  # source statement that produced it

    def attr(self, key, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default


def attrs(**kw) -> tuple:
    return tuple(sorted(kw.items()))


@dataclass(frozen=True, slots=True)
class ParamDecl:
    name: str
    type: TensorType
    loc: Loc | None = field(default=None, compare=False)
    in_memory: bool = False  # a rank-0 tensor passed by address (`x: f32[]`), not by value

    @property
    def is_scalar(self) -> bool:
        return not self.type.shape and not self.in_memory


@dataclass(frozen=True, slots=True)
class AssumeDecl:
    cond: Dim
    text: str
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    doc: str | None
    params: tuple  # inputs: ParamDecl
    outputs: tuple  # ParamDecl
    symbols: tuple  # dimension symbols, in order of first appearance in the inputs
    assumes: tuple  # AssumeDecl
    ops: tuple  # Op, topologically ordered
    results: tuple  # op id per output
    loc: Loc | None = field(default=None, compare=False)
    # a tile-level kernel: its hand-written Tile IR (no ops; it enters the pipeline after `tile`)
    tile: object = field(default=None, compare=False)
    tile_locs: dict = field(default_factory=dict, compare=False, hash=False)  # buffer -> Loc

    def op_map(self) -> dict:
        return {o.id: o for o in self.ops}

    def users(self) -> dict:
        out: dict = {o.id: [] for o in self.ops}
        for o in self.ops:
            for a in o.args:
                out[a].append(o.id)
        return out


@dataclass(frozen=True, slots=True)
class Schedule:
    """One `target X:` block; fields left None take the target's defaults."""

    target: str
    tile: tuple = ()  # (("M", 128), ("N", 128), ("K", 32))
    threads: int | None = None
    stages: int | None = None
    swizzle: int | None = None
    precision: str | None = None
    fuse: bool = True
    warp_specialize: bool | None = None
    loc: Loc | None = field(default=None, compare=False)
    locs: tuple = field(default=(), compare=False)  # ((key, Loc), ...) for error messages

    def tile_size(self, axis: str, default: int) -> int:
        return dict(self.tile).get(axis, default)

    def loc_of(self, key: str) -> Loc | None:
        locs = dict(self.locs)
        return locs.get(key) or locs.get(key.split(".")[0]) or self.loc


@dataclass(frozen=True, slots=True)
class Module:
    graphs: tuple
    schedules: tuple  # ((kernel name, (Schedule, ...)), ...)
    plans: tuple = ()  # fusion Plan per graph, once the fuse pass has run
    programs: tuple = ()  # TileProgram per graph, once the tile pass has run

    def schedule_for(self, kernel: str, target: str) -> Schedule:
        for k, scheds in self.schedules:
            if k == kernel:
                for s in scheds:
                    if s.target == target:
                        return s
        return Schedule(target)


# ---- printer -------------------------------------------------------------------------
def _fmt_attr(v) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def print_graph(g: Graph) -> str:
    if g.tile is not None:  # a tile-level kernel is its own graph
        from .tile import print_kernel
        return print_kernel(g.tile)

    def sig(p: ParamDecl) -> str:
        return f"{p.name}: {p.type}{'[]' if p.in_memory else ''}"

    outs = ", ".join(sig(p) for p in g.outputs)
    lines = [f"graph {g.name}({', '.join(sig(p) for p in g.params)}) -> ({outs}):"]
    for a in g.assumes:
        lines.append(f"    assume {a.cond}")
    for o in g.ops:
        args = ", ".join(f"%{a}" for a in o.args)
        at = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in o.attrs)
        what = o.kind
        if o.kind in ("unary", "binary", "compare", "reduce"):
            what = o.attr("fn") if o.kind != "reduce" else f"reduce.{o.attr('fn')}"
            at = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in o.attrs if k != "fn")
        body = " ".join(x for x in (what, args, f"[{at}]" if at else "") if x)
        lines.append(f"    %{o.id}: {o.type} = {body}")
    rets = ", ".join(f"{p.name}=%{r}" for p, r in zip(g.outputs, g.results))
    lines.append(f"    return {rets}")
    return "\n".join(lines)


def print_module(m: Module) -> str:
    return "\n\n".join(print_graph(g) for g in m.graphs) + "\n"


class GraphEditor:
    """Re-emits ops into a fresh graph: hash-consing (CSE) on the fly, DCE + renumbering at the end.

    Passes copy every op they don't touch with `keep`, and build replacements with `emit`.
    """

    def __init__(self, g: Graph):
        self.g = g
        self.ops: list[Op] = []
        self.memo: dict = {}
        self.map: dict[int, int] = {}  # old id -> new id

    def emit(self, kind, args, type_, attrs_=(), loc=None, stmt=-1) -> int:
        # (value_key: a -0.0 constant merged into a 0.0 before it made x / -0.0 x / 0.0)
        key = (kind, tuple(args), type_, tuple((k, value_key(v)) for k, v in attrs_))
        if kind != "input" and key in self.memo:
            return self.memo[key]
        op = Op(len(self.ops), kind, tuple(args), type_, attrs_, loc, stmt)
        self.ops.append(op)
        self.memo[key] = op.id
        return op.id

    def keep(self, op: Op) -> int:
        new = self.emit(op.kind, [self.map[a] for a in op.args], op.type, op.attrs, op.loc, op.stmt)
        self.map[op.id] = new
        return new

    def finish(self) -> Graph:
        results = []
        for r in (self.map[r] for r in self.g.results):
            # each output owns its value: CSE may have merged two outputs, or made one an input
            if r in results or self.ops[r].kind == "input":
                op = self.ops[r]
                copy = Op(len(self.ops), "copy", (r,), op.type, (), op.loc, op.stmt)
                self.ops.append(copy)
                r = copy.id
            results.append(r)
        live = set(results)
        for op in reversed(self.ops):
            if op.id in live:
                live.update(op.args)
        for op in self.ops:  # inputs stay: they are the ABI
            if op.kind == "input":
                live.add(op.id)
        renum, ops = {}, []
        for op in self.ops:
            if op.id in live:
                renum[op.id] = len(ops)
                ops.append(Op(len(ops), op.kind, tuple(renum[a] for a in op.args), op.type, op.attrs,
                              op.loc, op.stmt))
        from dataclasses import replace

        return replace(self.g, ops=tuple(ops), results=tuple(renum[r] for r in results))
