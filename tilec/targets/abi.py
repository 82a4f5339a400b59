"""The C ABI every target shares: status codes, the launcher's argument list and checks, the
workspace layout, and the choice among kernel variants. Targets add only their trailing
arguments (a stream) and how one kernel is launched.

For a source kernel NAME the header declares

    size_t NAME_workspace_size(dims...);
    int NAME_with_workspace(inputs..., outputs..., dims..., void* workspace, size_t bytes[, stream]);
    int NAME(inputs..., outputs..., dims...[, stream]);   // allocates the workspace itself
"""

from __future__ import annotations

import textwrap

from ..diagnostics import TilecError
from ..ir import tile as T
from ..ir.types import DTYPES, Dim
from .cstyle import ABI_TYPE, NARROW_FLOATS, bytes_expr, cdim, cname

STATUSES = (
    ("TILEC_OK", 0, "success"),
    ("TILEC_ERR_NULL_POINTER", 1, "a tensor pointer is NULL"),
    ("TILEC_ERR_BAD_DIM", 2, "a dimension is less than 1"),
    ("TILEC_ERR_ASSUME", 3, "an assume promise of the kernel does not hold"),
    ("TILEC_ERR_SHAPE", 4, "tensor shapes are inconsistent"),
    ("TILEC_ERR_ALIAS", 5, "an output overlaps another tensor"),
    ("TILEC_ERR_OUT_OF_MEMORY", 6, "out of memory for scratch or workspace buffers"),
    ("TILEC_ERR_WORKSPACE", 7, "the workspace is NULL or smaller than NAME_workspace_size()"),
    ("TILEC_ERR_LAUNCH", 8, "the device rejected a kernel launch"),
    ("TILEC_ERR_UNSUPPORTED", 9, "a dimension is larger than this build supports on the device"),
    ("TILEC_ERR_TOO_LARGE", 10, "a size computed from the dimensions does not fit in 64 bits"),
)
WORKSPACE_ALIGN = 256
# TILEC_ABI_VERSION: 2 added NAME_info() and TILEC_ERR_TOO_LARGE, and one header per library
ABI_VERSION = 2


def c_string(text: str) -> str:
    """A C string literal (ASCII; other characters as universal character names)."""
    import json
    return json.dumps(text, ensure_ascii=True)


# Names a library may not take (lib<name>.so and <name>.h are written side by side): C, POSIX,
# OpenMP and CUDA headers that a user's `-I<output folder>` would hide, and system libraries that
# `-L<output folder> -l<name>` would
_SYSTEM_HEADERS = frozenset("""assert complex ctype errno fenv float inttypes iso646 limits locale
math setjmp signal stdalign stdarg stdatomic stdbool stddef stdint stdio stdlib stdnoreturn string
tgmath threads time uchar wchar wctype unistd fcntl pthread dlfcn strings sched semaphore dirent
omp cuda cuda_runtime cuda_runtime_api cuda_fp16 cuda_bf16 cuda_fp8 cublas cublasLt""".split())
_SYSTEM_LIBRARIES = frozenset("""c m dl rt pthread gomp omp iomp5 stdc++ gcc gcc_s mvec util crypt
resolv atomic cudart cuda cublas cublasLt amdhip64 hiprtc""".split())


def check_library_name(name: str, what: str):
    """Refuse a library name that would overwrite tilec's device headers in the output folder or
    hide a system header or library from the user's build; `what` says where the name came from."""
    if name.lower().startswith("tilec"):
        why = f"{name}.h would sit among tilec's own headers (tilec_cpu.h, tilec_cuda.h, ...)"
    elif name in _SYSTEM_HEADERS:
        why = f"{name}.h would hide the system's <{name}.h> from code built with -I<output folder>"
    elif name in _SYSTEM_LIBRARIES:
        why = f"lib{name} would hide the system's -l{name} from programs linked with -L<output folder>"
    else:
        return
    raise TilecError(f"{what} names the library '{name}': {why}", None,
                     "rename it (the library and its header take the file's name, or with "
                     "--per-kernel each kernel's)")


def library_name(source_name: str) -> str:
    """The library a .tile file builds: its stem as a C identifier (`my-ops.tile` -> my_ops)."""
    import re
    stem = source_name.rsplit("/", 1)[-1]
    stem = stem[:-5] if stem.endswith(".tile") else stem.rsplit(".", 1)[0]
    name = re.sub(r"[^A-Za-z0-9_]", "_", stem) or "kernels"
    name = name if not name[0].isdigit() else "k" + name
    check_library_name(name, f"the file name '{source_name.rsplit('/', 1)[-1]}'")
    return name


def common_files(env) -> dict:
    """Headers every target's device library includes: checked launcher arithmetic, and the
    integer and division helpers of generated code."""
    return {name: env.loader.get_source(env, f"common/{name}")[0]
            for name in ("tilec_checked.h", "tilec_arith.h")}


def libraries(source_name: str, graphs, per_kernel: bool) -> list:
    """(library name, [graphs]) of a build: one library for the file, or one per kernel."""
    if per_kernel:
        for g in graphs:
            check_library_name(g.name, f"kernel '{g.name}' (--per-kernel)")
        return [(g.name, [g]) for g in graphs]
    return [(library_name(source_name), list(graphs))]


def library_of(source_name: str, kernel: str, per_kernel: bool) -> str:
    return kernel if per_kernel else library_name(source_name)


def scalar_params(g) -> set:
    return {p.name for p in g.params if p.is_scalar}


# what a launcher says of each of T.MACHINE's names it computes
MACHINE_DOCS = {T.THREADS: "threads a call may use (variants by grid size)",
                T.SMS: "the device's multiprocessors (variants by waves of tiles)"}


def launcher_context(g, prog: T.TileProgram, target_params: list, target_args: list,
                     machine: dict | None = None, guards=None, refusable=None) -> dict:
    """Everything the shared header and launcher templates print for one source kernel.
    `machine`: {name of T.MACHINE: its C expression} for the names a variant's condition may
    hold on this target (CPU: the threads a call may use; CUDA: the multiprocessors), computed
    by the launchers whose variants ask for them. `guards(kernel)`: the target's own C
    conditions a variant (each of its kernels) also needs at run time (CUDA: TMA's aligned
    addresses, an sm_90a device). `refusable(kernel)`: whether a one-launch variant's launch
    may refuse (TILEC_ERR_UNSUPPORTED) where a later variant still runs (CUDA: a tensor map the
    driver does not build); the launcher then tries the next."""
    abi, arg_docs, checks, scalars = [], [], [], []
    tensors = [(p, "input") for p in g.params] + [(p, "output") for p in g.outputs]
    for p, role in tensors:
        if p.is_scalar:
            abi.append(f"{ABI_TYPE[p.type.dtype]} {cname(p.name)}")
            arg_docs.append(f"{p.name}: {p.type.dtype} scalar")
        else:
            const = "const " if role == "input" else ""
            abi.append(f"{const}{ABI_TYPE[p.type.dtype]}* {cname(p.name)}")
            arg_docs.append(f"{p.name}: {p.type} ({role})")
    dims = [f"int64_t {cname(s)}" for s in g.symbols]
    arg_docs += [f"{s}: dimension" for s in g.symbols]
    ptrs = [cname(p.name) for p, _ in tensors if not p.is_scalar]
    if ptrs:
        checks.append(dict(fail=" || ".join(f"!{x}" for x in ptrs), code="TILEC_ERR_NULL_POINTER",
                           why="NULL tensor"))
    checks += dim_checks(g)
    for o in g.outputs:
        for p, _ in tensors:
            if p is o or p.is_scalar:
                continue
            a, b = cname(o.name), cname(p.name)
            checks.append(dict(
                fail=f"tilec::overlap({a}, {bytes_expr(o.type.dtype, o.type.shape)}, {b}, "
                     f"{bytes_expr(p.type.dtype, p.type.shape)})",
                code="TILEC_ERR_ALIAS", why=f"{o.name} overlaps {p.name}"))
    # (a scalar that no kernel reads, e.g. one only its fused-away statements used, gets no
    # local: an unused variable would warn)
    read = {p.name for k in prog.kernels for p in k.params if p.kind == "scalar"}
    for p in g.params:
        if p.is_scalar:
            conv = f"tilec::{p.type.dtype}_to_f32" if p.type.dtype in NARROW_FLOATS else ""
            ctype = _REG.get(p.type.dtype, ABI_TYPE[p.type.dtype])
            scalars.append(f"const {ctype} tilec_s_{p.name} = {conv}({cname(p.name)});"
                           if p.name in read else f"(void){cname(p.name)};  // read by no kernel")
    # workspaces: one block, each buffer at an aligned offset
    workspaces, offset = [], "(size_t)0"
    for w in prog.workspaces:
        size = bytes_expr(w.dtype, w.shape)
        if w.when is not None:  # only the variant that uses it needs its bytes
            size = f"(({w.when.c(cname)}) ? {size} : (size_t)0)"
        workspaces.append(dict(cname=cname(w.name), ctype=ABI_TYPE[w.dtype], offset=offset,
                               decl=f"{w.name}: {w.dtype}[{', '.join(str(d) for d in w.shape)}]"))
        offset = f"tilec::workspace_align({offset} + {size})"
    scalar_names = scalar_params(g)
    machine = machine or {}
    launches, uses = [], set()

    def launcher_name(s: str) -> str:
        return s if s in T.MACHINE else cname(s)
    for variants in prog.slots():
        opts = []
        for parts in variants:
            calls = []
            for k in parts:
                args = [f"tilec_s_{p.name}" if p.name in scalar_names else cname(p.name)
                        for p in k.params]
                args += [cname(s) for s in g.symbols] + target_args
                calls.append(f"tilec_launch_{k.name}({', '.join(args)})")
            when = parts[0].when
            for name in (set(when.symbols()) & set(T.MACHINE) if when is not None else ()):
                if name not in machine:
                    raise AssertionError(f"{parts[0].name}: a variant condition on {name}, "
                                         "which this target does not compute")
                uses.add(name)
            # (every part's: a variant's first launch may prepare the one that needs them)
            conds = ([] if when is None else [when.c(launcher_name)]) + \
                list(dict.fromkeys(c for k in parts for c in (guards(k) if guards else ())))
            opts.append(dict(calls=calls, when=" && ".join(conds) if conds else None,
                             retry=len(calls) == 1 and refusable is not None and
                             refusable(parts[0])))
        opts[-1]["retry"] = False  # (the last variant: no next one to try)
        launches.append(opts)
    doc_lines = (g.doc or "").splitlines() or [""]
    info_args = []
    for p, role in tensors:
        kind = "TILEC_ARG_SCALAR" if p.is_scalar else (
            "TILEC_ARG_INPUT" if role == "input" else "TILEC_ARG_OUTPUT")
        info_args.append(dict(name=c_string(p.name), kind=kind, dtype=c_string(p.type.dtype),
                              shape=[c_string(str(d)) for d in p.type.shape]))
    info_args += [dict(name=c_string(s), kind="TILEC_ARG_DIM", dtype="nullptr", shape=[])
                  for s in g.symbols]
    info = dict(args=info_args, assumes=[c_string(a.text) for a in g.assumes],
                doc=c_string(g.doc or ""), name=c_string(g.name))
    return dict(name=g.name, abi_params=abi + dims + target_params, dims=dims,
                dim_args=[cname(s) for s in g.symbols],
                call_args=[cname(p.name) for p, _ in tensors] + [cname(s) for s in g.symbols],
                target_params=target_params, target_args=target_args, checks=checks,
                dim_checks=dim_checks(g),
                scalars=scalars + [f"const int64_t {name} = {machine[name]};  // "
                                   f"{MACHINE_DOCS[name]}" for name in T.MACHINE if name in uses],
                workspaces=workspaces, workspace_bytes=offset,
                workspace_align=WORKSPACE_ALIGN, launches=launches, statuses=STATUSES,
                title=f"{g.name}: {doc_lines[0]}" if g.doc else g.name, doc_lines=doc_lines,
                arg_docs=arg_docs, dim_names=list(g.symbols),
                assume_texts=[a.text for a in g.assumes], info=info,
                # NAME_release_scratch's statement (a target that keeps memory replaces it)
                release_scratch="// nothing: this target keeps no memory between calls")


_REG = {d: "float" for d in NARROW_FLOATS}


def size_exprs(g) -> list:
    """(expression, what it is) for the dimension expressions a call evaluates that could
    overflow 64 bits: the byte size of every tensor (which bounds every index and grid extent of
    the kernels), every derived dimension, every `assume`, the dequant group checks and the
    values that may go through a workspace."""
    out, seen = [], set()

    def add(d: Dim, why: str):
        if d.op not in ("sym", "const") and d not in seen:
            seen.add(d)
            out.append((d, why))

    def nbytes(dtype, shape) -> Dim:
        n = Dim.const(max(DTYPES[dtype][1] // 8, 1))
        for d in shape:
            n = Dim.bin("mul", n, d)
        return n
    for p in list(g.params) + list(g.outputs):
        for d in p.type.shape:
            add(d, f"dimension {d} of {p.name}")
        if p.type.shape:
            add(nbytes(p.type.dtype, p.type.shape), f"bytes of {p.name}")
    for a in g.assumes:
        add(a.cond, f"assume {a.text}")
    ops = g.op_map()
    for op in g.ops:
        if op.kind == "dequant":
            add(Dim.bin("mul", ops[op.args[1]].type.shape[0], Dim.const(op.attr("group"))),
                "dequant group check")
        elif op.kind not in ("input", "const") and op.type.shape:
            add(nbytes(op.type.dtype, op.type.shape), "bytes of an intermediate value")
    return out


def dim_checks(g) -> list:
    """Dimensions at least 1, every `assume`, derived shapes at least 1, dequant group sizes."""
    checks = []
    if g.symbols:
        checks.append(dict(fail=" || ".join(f"{cname(s)} < 1" for s in g.symbols),
                           code="TILEC_ERR_BAD_DIM", why="dimensions are at least 1"))
    for e, why in size_exprs(g):  # checked 64-bit arithmetic: an overflow is a status
        checks.append(dict(fail=f"tilec::overflows({e.c_checked(cname)})",
                           code="TILEC_ERR_TOO_LARGE", why=f"{why} fits in 64 bits"))
    for a in g.assumes:
        checks.append(dict(fail=f"!({a.cond.c(cname)})", code="TILEC_ERR_ASSUME",
                           why=f"assume {a.text}"))
    seen = set()
    for p in list(g.params) + list(g.outputs):
        for d in p.type.shape:
            if d.op not in ("sym", "const") and d not in seen:
                seen.add(d)
                checks.append(dict(fail=f"({cdim(d)}) < 1", code="TILEC_ERR_BAD_DIM",
                                   why=f"{p.name} has dimension {d}"))
    ops = g.op_map()
    for op in g.ops:
        if op.kind == "dequant":
            K = ops[op.args[0]].type.shape[0]
            R = ops[op.args[1]].type.shape[0]
            G = op.attr("group")
            checks.append(dict(fail=f"({cdim(R)}) * {G} < ({cdim(K)})", code="TILEC_ERR_SHAPE",
                               why=f"dequant group={G} needs {R} * {G} >= {K}"))
    return checks


def render_libraries(target, src, m, env, banner, options, kernel_context, includes: list,
                     target_doc: list, threads_note: str = "") -> tuple:
    """The sources and headers of a build's libraries, as (files, libs for the Makefile).
    `kernel_context(g, prog)` gives a source kernel's launcher context with its `kernels`; the
    source is `templates/TARGET/kernel{source_ext}.j2` rendered with it."""
    files, libs = {}, []
    graphs = dict(zip((g.name for g in m.graphs), zip(m.graphs, m.programs)))
    template = env.get_template(f"{target.templates}/kernel{target.source_ext}.j2")
    for lib, members in libraries(src.display, m.graphs, options.get("per_kernel", False)):
        ctxs = []
        for g in members:
            g, prog = graphs[g.name]
            ctx = kernel_context(g, prog)
            ctx.update(banner=banner("//"), header=f"{lib}.h", target_name=target.name)
            files[f"{g.name}{target.source_ext}"] = template.render(ctx)
            ctxs.append(ctx)
        files[f"{lib}.h"] = render_header(env, banner, lib, members, ctxs, includes, target_doc,
                                          target.link_flags, threads_note)
        libs.append(dict(name=lib, sources=[g.name for g in members]))
    files.update(common_files(env))
    return files, libs


def render_header(env, banner, lib: str, graphs, ctxs: list, includes: list, target_doc: list,
                  link_flags: str = "", threads_note: str = ""):
    """The C header of one library: the status codes and every kernel's declarations."""
    return env.get_template("common/header.h.j2").render(
        banner=banner("//"), lib=lib, kernels=ctxs, statuses=STATUSES, header_includes=includes,
        target_doc=target_doc, abi_version=ABI_VERSION, link_flags=link_flags,
        threads_note=textwrap.wrap(threads_note, 94),
        uses_bool=any(p.type.dtype == "bool" for g in graphs for p in g.params + g.outputs))
