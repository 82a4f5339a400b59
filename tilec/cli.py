"""The `tilec` command line: parses arguments, calls the driver, prints diagnostics."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from pathlib import Path

import click

from . import __version__, driver, targets
from .diagnostics import TilecError

TARGETS = click.Choice(targets.names())
ARCH_HELP = ("Architectures. cpu: one -march (native, x86-64-v2, x86-64-v3, x86-64-v4; default "
             "x86-64-v3 for build, native for run). cuda: comma-separated (sm_80,sm_86,sm_89,"
             "sm_90,sm_90a; default sm_80,sm_90a for build: the Hopper kernels on an H100/H200, "
             "sm_80 code elsewhere; the device's own for run); a list builds one library for all "
             "of them.")


def _fail(src, e: TilecError):
    name = src.display if src else "tilec"
    click.echo(e.format(name, src.text if src else None), err=True)
    raise SystemExit(1)


# Deeply nested programs (hundreds of chained statements or nested calls) recurse deeply in the
# front end and the passes: commands run on a thread with a large stack and a high recursion
# limit; what still goes deeper is a user error, not a crash.
STACK_BYTES = 512 * 1024 * 1024  # reserved address space; pages are touched only when used
RECURSION_LIMIT = 100_000


def deep_stack(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a thread with a deep stack; its result or exception."""
    import threading
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised on the calling thread
            out["error"] = e
    old_limit = sys.getrecursionlimit()
    old_size = threading.stack_size(STACK_BYTES)
    sys.setrecursionlimit(max(old_limit, RECURSION_LIMIT))
    try:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join()
    finally:
        threading.stack_size(old_size)
        sys.setrecursionlimit(old_limit)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def guarded(fn):
    """Turn TilecErrors into `file:line:col: error:` output and exit 1; never a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        state = {"src": None}
        gc_threshold = gc.get_threshold()
        try:
            return deep_stack(fn, state, *args, **kwargs)
        except TilecError as e:
            _fail(state["src"], e)
        except RecursionError:
            _fail(state["src"], TilecError("the program nests too deeply for tilec (statements "
                                           "or expressions thousands of levels deep)"))
        except (KeyboardInterrupt, SystemExit, click.exceptions.Exit, click.ClickException):
            raise
        except BrokenPipeError:  # `tilec dump-ir ... | head`: the reader left, nothing to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        except Exception as e:  # a bug in tilec: say so plainly
            if os.environ.get("TILEC_DEBUG"):
                traceback.print_exc()
            where = state["src"].display if state["src"] else "tilec"
            click.echo(f"{where}: internal compiler error: {type(e).__name__}: {e}\n"
                       "  please report this with the input file (TILEC_DEBUG=1 shows the trace)",
                       err=True)
            raise SystemExit(2) from None
        finally:  # the collector as _load found it (the command may run inside a larger program)
            gc.unfreeze()
            gc.set_threshold(*gc_threshold)
    return wrapper


def _load(state, file, kernel=None):
    try:
        state["src"] = driver.read_source(file)
    except TilecError as e:
        state["src"] = getattr(e, "source", None)
        raise
    # The parse of a large file builds millions of objects that all stay alive: the cyclic
    # garbage collector would traverse them again and again for nothing (a 5 MB file: 36 s of
    # parsing instead of 15). So it is off while parsing; what the parse built is then kept out
    # of later collections (freeze), which the passes' short-lived objects make rarer. (`guarded`
    # puts the collector back when the command ends.)
    gc.disable()
    try:
        m = driver.frontend(state["src"])
    finally:
        gc.freeze()
        gc.set_threshold(50_000, 20, 20)
        gc.enable()
    return driver.select(m, kernel)


def _print_cmake_dir(ctx, param, value):
    if value and not ctx.resilient_parsing:
        click.echo(Path(__file__).resolve().parent / "cmake")
        ctx.exit()


@click.group()
@click.version_option(__version__, prog_name="tilec")
@click.option("--cmake-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_cmake_dir,
              help="Print the folder of tilec's CMake module (TilecConfig.cmake) and exit.")
def main():
    """tilec: compile fused tile kernels (.tile) to C++, CUDA and HIP."""


def _options(target: str, arch: str | None, per_kernel: bool = False) -> dict:
    return {"arch": driver.get_target(target).parse_arch(arch), "per_kernel": per_kernel}


KERNEL_HELP = "Only this kernel (repeatable: these kernels)."
PER_KERNEL_HELP = "One library and header per kernel (default: one for the whole file)."


@main.command()
@click.argument("file")
@click.option("--target", type=TARGETS, default="cpu", show_default=True)
@click.option("--arch", "--march", "arch", help=ARCH_HELP)
@guarded
def check(state, file, target, arch):
    """Parse, verify and compile FILE without writing anything."""
    m = _load(state, file)
    for part in driver.parts(m):  # the IR of one part at a time: a large file's check fits
        driver.compile_module(part, target, verify=True, options=_options(target, arch))
    click.echo(f"{state['src'].display}: ok ({len(m.graphs)} kernel(s))")


@main.command("dump-ir")
@click.argument("file")
@click.option("--stage", type=click.Choice(driver.STAGES), default="graph", show_default=True,
              help="graph: as parsed; canonical; fused: with the kernel partition; tiled: Tile IR;"
                   " lowered: after target lowering.")
@click.option("--print-after", "print_after", multiple=True, type=click.Choice(driver.PASS_NAMES),
              help="Also print the IR after this pass (repeatable).")
@click.option("--print-after-all", is_flag=True, help="Print the IR after every pass.")
@click.option("--target", type=TARGETS, default="cpu", show_default=True)
@click.option("--arch", "--march", "arch", help=ARCH_HELP)
@click.option("--kernel", multiple=True, help=KERNEL_HELP)
@guarded
def dump_ir(state, file, stage, print_after, print_after_all, target, arch, kernel):
    """Print FILE's IR at a pipeline stage."""
    m = _load(state, file, kernel)
    options = _options(target, arch)
    after = tuple(driver.PASS_NAMES) if print_after_all else tuple(print_after)
    if after:
        driver.compile_module(m, target, print_after=after, log=click.echo, options=options)
        return
    click.echo(driver.print_stage(driver.stage_module(m, stage, target, options=options), stage),
               nl=False)


@main.command()
@click.argument("file")
@click.option("--target", type=TARGETS, default="cpu", show_default=True)
@click.option("--kernel", multiple=True, help=KERNEL_HELP)
@click.option("--dims", help="Dimension values for the byte counts, e.g. M=4096,N=4096 "
                             "(default: 1024, batch axes 8).")
@guarded
def explain(state, file, target, kernel, dims):
    """Show each kernel's fusion groups and the memory traffic fusion saves."""
    from .explain import explain as explain_graph
    from .runner import choose_dims, parse_dims

    m = _load(state, file, kernel)
    given = parse_dims(dims)
    m = driver.compile_module(m, target, stop_after="fuse")
    out = []
    for g, plan in zip(m.graphs, m.plans):
        d = choose_dims(g, {k: v for k, v in given.items() if k in g.symbols}, inner=1024, batch=8)
        out.append(explain_graph(g, plan, d))
    click.echo("\n\n".join(out))


FORCE_HELP = "Overwrite files in the output folder that tilec did not write."


def _build(state, file, target, out, kernel, emit_only, arch, force=False, per_kernel=False):
    options = _options(target, arch, per_kernel)
    m0 = _load(state, file, kernel)
    m = driver.compile_module(m0, target, options=options)
    files = driver.render(state["src"], m, target, options)
    out_dir = Path(out)
    driver.write_files(out_dir, files, force)
    if not emit_only:
        from .build import run_make, write_stamp
        from .targets.abi import libraries, library_name
        t = driver.get_target(target)
        run_make(out_dir, t)
        libs = [lib for lib, _ in libraries(state["src"].display, m.graphs, per_kernel)]
        write_stamp(out_dir, library_name(state["src"].display), file, libs, t.link_flags)
    return m0, m, out_dir


@main.command()
@click.argument("file")
@click.option("--target", type=TARGETS, default="cpu", show_default=True)
@click.option("--arch", "--march", "arch", help=ARCH_HELP)
@click.option("-o", "--out", help="Output directory (default: build/<file stem>).")
@click.option("--kernel", multiple=True, help=KERNEL_HELP)
@click.option("--emit-only", is_flag=True, help="Write the sources and Makefile; do not run make.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--per-kernel", is_flag=True, help=PER_KERNEL_HELP)
@guarded
def build(state, file, target, arch, out, kernel, emit_only, force, per_kernel):
    """Compile FILE: sources, header, Makefile, then the libraries."""
    out = out or os.path.join("build", Path(file).stem)
    _, m, out_dir = _build(state, file, target, out, kernel, emit_only, arch, force, per_kernel)
    what = "sources" if emit_only else "libraries"
    names = ", ".join(g.name for g in m.graphs)
    click.echo(f"{state['src'].display}: {what} for {names} in {out_dir}")
    if not emit_only:
        from .targets.abi import libraries
        t = driver.get_target(target)
        libs = " ".join(f"-l{lib}" for lib, _ in libraries(state["src"].display, m.graphs,
                                                            per_kernel))
        click.echo(f"link with: -I{out_dir} -L{out_dir} {libs} {t.link_flags}".rstrip())


def _device_arch(t) -> str | None:
    """The CUDA device's own --arch, or None (the default list) when there is no device to
    ask: the run then fails with the runtime's own message."""
    from . import runtimes
    try:
        rt = runtimes.get("cuda")
    except TilecError:
        return None
    try:
        return rt.device_arch(t.arch_choices)
    finally:
        rt.close()


@main.command()
@click.argument("file")
@click.option("--target", type=TARGETS, default="cpu", show_default=True)
@click.option("--arch", "--march", "arch", help=ARCH_HELP)
@click.option("--kernel", multiple=True,
              help="Kernel to run (repeatable; default: every kernel in FILE).")
@click.option("--dims", help="Dimension values, e.g. M=100,N=200 (others get defaults that are "
                             "not tile multiples and satisfy the assumes).")
@click.option("--seed", type=int, default=None, help="Random seed (default: fresh).")
@click.option("-o", "--out", help="Build directory (default: a content-addressed cache).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--per-kernel", is_flag=True, help=PER_KERNEL_HELP)
@guarded
def run(state, file, target, arch, kernel, dims, seed, out, force, per_kernel):
    """Build FILE, run it on random inputs, check it against the reference interpreter."""
    from .build import cached_build, run_make
    from .runner import check_memory, choose_dims, parse_dims, reduced_precision, run_kernel
    from .targets.abi import library_of

    t = driver.get_target(target)
    if not t.runtime:
        raise TilecError(f"tilec run cannot run target {target} yet")
    # it runs where it builds: the CPU code may use every instruction this machine has, the
    # CUDA code is built for the device's own architecture (sm_90a on an H100/H200)
    if arch is None and target == "cpu":
        arch = "native"
    elif arch is None and t.runtime == "cuda":
        arch = _device_arch(t)
    options = _options(target, arch, per_kernel)
    m0 = _load(state, file, kernel)
    given = parse_dims(dims)
    known = {s for g in m0.graphs for s in g.symbols}
    for name in given:
        if name not in known:
            names = ", ".join(g.name for g in m0.graphs)
            which = (f"no kernel in {state['src'].display} has a" if not kernel else
                     f"kernel {names} has no" if len(m0.graphs) == 1 else f"kernels {names} have no")
            raise TilecError(f"{which} dimension '{name}' "
                             f"(dimensions: {', '.join(sorted(known)) or 'none'})")
    chosen = {}
    for g in m0.graphs:  # dims are checked before anything is built
        chosen[g.name] = choose_dims(g, {k: v for k, v in given.items() if k in g.symbols})
        check_memory(g, chosen[g.name])
    m = driver.compile_module(m0, target, options=options)
    files = driver.render(state["src"], m, target, options)
    if out:
        out_dir = Path(out)
        driver.write_files(out_dir, files, force)
        run_make(out_dir, t)
    else:
        out_dir = cached_build(files, t)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    failed = False
    for g in m0.graphs:
        d = chosen[g.name]
        lib = library_of(state["src"].display, g.name, per_kernel)
        r = run_kernel(out_dir / f"lib{lib}.so", g, d, seed, runtime=t.runtime,
                       reduced=reduced_precision(m0, g, t))
        dim_text = ",".join(f"{k}={v}" for k, v in d.items())
        for name in r.errors:
            status = "ok" if r.errors[name] <= r.tolerances[name] else "MISMATCH"
            click.echo(f"{g.name} [{dim_text}] seed={seed} {name}: max rel error "
                       f"{r.errors[name]:.2e} (tolerance {r.tolerances[name]:.0e}) {status}")
        batches = f" of {r.calls} calls" if r.calls > 1 else ""
        click.echo(f"{g.name}: {r.seconds * 1e3:.3f} ms per call (median of {r.samples} "
                   f"samples{batches}), {r.rates()}")
        failed |= not r.ok
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
