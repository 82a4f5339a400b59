"""The compiler driver: source -> Graph IR -> PIPELINE -> rendered sources. No CLI concerns."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import jinja2

from . import __version__, targets
from .diagnostics import TilecError, error
from .ir.fused import print_plan
from .ir.graph import Module, print_module
from .ir.tile import print_program
from .ir.verify import verify_module
from .parser import parse
from .parser.lower import lower_module
from .passes import PIPELINE

STAGES = ("graph", "canonical", "fused", "tiled", "lowered")
_STAGE_AFTER = {"canonical": "canonicalize", "fused": "fuse", "tiled": "tile"}
# every pass name `--print-after` accepts: the shared pipeline, then each target's lowering steps
PASS_NAMES = [n for n, _ in PIPELINE] + targets.lowering_pass_names()


@dataclass
class Source:
    path: str
    text: str

    @property
    def display(self) -> str:
        return os.path.basename(self.path)


def read_source(path: str) -> Source:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"no such file: {path}") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        data = data[3:]
    try:
        return Source(path, data.decode("utf-8"))
    except UnicodeDecodeError as e:
        from .diagnostics import Loc
        before = data[:e.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1:].decode("utf-8", "replace")) + 1
        err = TilecError(f"byte 0x{data[e.start]:02x} is not UTF-8 (.tile files are UTF-8 text)",
                         Loc(line, col))
        err.source = Source(path, data.decode("utf-8", "replace"))  # to show the line
        raise err from None


def frontend(src: Source) -> Module:
    m = lower_module(parse(src.text))
    if not m.graphs:
        raise error("the file defines no kernel")
    return m


def select(m: Module, kernels: str | Sequence[str] | None) -> Module:
    """`m` with only the kernels named (one name or several; None or none: all of them), in the
    file's order."""
    wanted = {kernels} if isinstance(kernels, str) else set(kernels or ())
    if not wanted:
        return m
    names = [g.name for g in m.graphs]
    for name in sorted(wanted - set(names)):
        raise error(f"no kernel named '{name}'; the file defines: {', '.join(names)}")
    keep = [i for i, g in enumerate(m.graphs) if g.name in wanted]
    return replace(m, graphs=tuple(m.graphs[i] for i in keep),
                   schedules=tuple(s for s in m.schedules if s[0] in wanted))


def parts(m: Module, size: int = 256):
    """`m` as modules of at most `size` kernels each (with their schedules), in order: what a
    whole-file check compiles one at a time, so that its memory is one part's IR."""
    for i in range(0, len(m.graphs), size):
        graphs = m.graphs[i:i + size]
        names = {g.name for g in graphs}
        yield replace(m, graphs=graphs, schedules=tuple(s for s in m.schedules if s[0] in names))


def get_target(name: str):
    if name not in targets.TARGETS:
        raise error(f"unknown target '{name}'; targets are {', '.join(targets.names())}")
    return targets.get(name)


def validate_schedules(m: Module):
    """Every schedule block must be runnable on its target (checked whatever we build for)."""
    for kname, scheds in m.schedules:
        g = next(g for g in m.graphs if g.name == kname)
        widths = [2 if p.type.dtype in ("f16", "bf16") else 4 for p in g.params if p.type.shape]
        for s in scheds:
            targets.get(s.target).validate(s, max(widths or [2]))


def print_stage(m: Module, stage: str) -> str:
    if stage in ("graph", "canonical"):
        return print_module(m)
    if stage == "fused":
        return "\n\n".join(print_graph_and_plan(g, p) for g, p in zip(m.graphs, m.plans)) + "\n"
    return "\n".join(print_program(p) for p in m.programs)


def _stage_of(pass_name: str) -> str:
    return next((s for s, p in _STAGE_AFTER.items() if p == pass_name), "lowered")


def print_graph_and_plan(g, plan) -> str:
    from .ir.graph import print_graph
    return print_graph(g) + "\n" + print_plan(g, plan)


def _handwritten_loc(programs):
    return next((k.loc for p in programs for k in p.kernels if k.loc is not None), None)


@contextlib.contextmanager
def _lowering_limits(target, programs):
    """A lowering step or renderer that cannot handle a hand-written tile-level kernel raises
    AssertionError or NotImplementedError: for those kernels that is a limit of the target, said
    at the kernel's grid block; for kernels tilec tiled itself it stays an internal error."""
    try:
        yield
    except (AssertionError, NotImplementedError) as e:
        loc = _handwritten_loc(programs)
        if loc is None:
            raise
        loc = getattr(e, "loc", None) or loc
        raise error(f"the {target.name} target cannot build this tile-level kernel: {e}", loc,
                    "see docs/LANGUAGE.md, 'Tile level', for what each target supports") from None


def _lowering_step(fn, target, options):
    def run(m: Module, opts) -> Module:
        out = []
        for p in m.programs:
            with _lowering_limits(target, (p,)):
                out.append(fn(p, target, options))
        return replace(m, programs=tuple(out))
    return run


def compile_module(m: Module, target: str = "cpu", print_after=(), verify: bool = False,
                   stop_after: str | None = None, log=None, options: dict | None = None) -> Module:
    """Run PIPELINE, then the target's lowering steps; `print_after` names passes whose output
    is sent to `log`."""
    t = get_target(target).for_options(options)
    opts = {"target": t, "options": options or {}}
    passes = list(PIPELINE) + [(n, _lowering_step(fn, t, opts["options"])) for n, fn in t.lowering]
    validate_schedules(m)
    if verify:
        verify_module(m, "parse")
    checked = (m.graphs, m.plans)  # what verify_module has seen (it checks graphs and plans)
    for name, fn in passes:
        m = fn(m, opts)
        if verify and (m.graphs is not checked[0] or m.plans is not checked[1]):
            verify_module(m, name)
            checked = (m.graphs, m.plans)
        if name in print_after and log is not None:
            log(f"// ----- after {name} -----\n" + print_stage(m, _stage_of(name)))
        if name == stop_after:
            break
    return m


def stage_module(m: Module, stage: str, target: str = "cpu", **kw) -> Module:
    if stage == "graph":
        validate_schedules(m)
        return m
    return compile_module(m, target, stop_after=_STAGE_AFTER.get(stage), **kw)


# ---- rendering ---------------------------------------------------------------------------------
def template_env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("tilec", "templates"),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def banner(src: Source, comment: str = "//") -> str:
    return (f"{comment} Generated by tilec {__version__} from {src.display}. Do not edit: "
            f"regenerate with `tilec build`.")


def render(src: Source, m: Module, target: str, options: dict | None = None) -> dict:
    """All generated files for `m` (compiled through the pipeline): {filename: text}."""
    t = get_target(target).for_options(options)
    if not t.buildable:
        buildable = [n for n in targets.names() if targets.get(n).buildable]
        raise error(f"target '{target}' cannot be rendered yet; buildable targets: "
                    f"{', '.join(buildable)}")
    with _lowering_limits(t, m.programs):
        return t.render_files(t, src, m, template_env(), lambda c: banner(src, c), options or {})


MANIFEST = ".tilec-files"  # in an output folder: the files tilec wrote there, one per line


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_files(out_dir: Path, files: dict, force: bool = False) -> list:
    """Write atomically, readable by all (0644 under the usual umask); leave a file untouched
    when its content is unchanged (make stays quiet). A file already there that tilec did not
    write (it is not in the folder's manifest) is never overwritten unless `force`."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create the output folder {out_dir}: {e.strerror or e}") from None
    manifest = out_dir / MANIFEST
    owned = set(manifest.read_text().split("\n")) if manifest.exists() else set()
    foreign = sorted(n for n in files if (out_dir / n).exists() and n not in owned and
                     (out_dir / n).read_bytes() != files[n].encode())
    if foreign and not force:
        raise error(f"{out_dir} holds {', '.join(foreign)}, which tilec did not write; tilec "
                    "does not overwrite them", None, "choose another output folder (-o), or "
                    "pass --force to overwrite")
    mode = 0o666 & ~_umask()
    written = []
    try:
        for name, text in sorted({**files, MANIFEST: "\n".join(sorted(owned | set(files)))}
                                 .items()):
            path = out_dir / name
            if path.exists() and path.read_text() == text:
                continue
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
            try:
                os.fchmod(fd, mode)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            if name != MANIFEST:
                written.append(name)
    except OSError as e:
        raise error(f"cannot write to {out_dir}: {e.strerror or e}") from None
    return written


__all__ = [
    "PASS_NAMES",
    "STAGES",
    "TilecError",
    "compile_module",
    "frontend",
    "print_stage",
    "read_source",
    "render",
    "select",
    "stage_module",
    "write_files",
]
