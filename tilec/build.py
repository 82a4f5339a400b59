"""The Makefile flow and the content-addressed compile cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .diagnostics import TilecError, error

# environment variables the generated Makefiles read: they change what a build produces
_BUILD_ENV = ("CXX", "CXXFLAGS", "NVCC", "NVCCFLAGS", "HIPCC", "HIPCCFLAGS")


def cache_root() -> Path:
    root = os.environ.get("TILEC_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilec"


def files_digest(files: dict, target=None) -> str:
    """Cache key of a build: the generated files, the toolchain version and the build flags."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    for var in _BUILD_ENV:
        h.update(var.encode() + b"=" + os.environ.get(var, "").encode() + b"\0")
    if target is not None:
        h.update(target.name.encode() + b"\0" + target.toolchain.version().encode())
    return h.hexdigest()[:20]


def run_make(out_dir: Path, target, jobs: int | None = None):
    """Run the generated Makefile; on failure raise a TilecError with the compiler's output."""
    target.check_toolchain()
    jobs = jobs or max(2, os.cpu_count() or 2)
    try:
        proc = subprocess.run(["make", "-C", str(out_dir), f"-j{jobs}", "--no-print-directory"],
                              capture_output=True, text=True)
    except OSError as e:
        raise error(f"cannot run make: {e}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise TilecError(f"the {target.name} build failed (the generated sources are kept in "
                         f"{out_dir}):\n{tail}")
    return proc


def cached_build(files: dict, target) -> Path:
    """Build `files` in the content-addressed cache and return the folder. Safe when several
    processes build the same kernel at once: each builds in a private folder and renames it into
    place; whoever comes second uses the first one's build. A failed build keeps its private
    folder (the error names it) and leaves the cache entry absent."""
    from .driver import write_files
    root = cache_root()
    final = root / files_digest(files, target)
    if (final / _DONE).exists():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    except OSError as e:
        raise error(f"cannot use the build cache {root}: {e.strerror or e}",
                    None, "set TILEC_CACHE_DIR to a writable folder") from None
    write_files(tmp, files)
    run_make(tmp, target)
    (tmp / _DONE).write_text("")
    try:
        os.rename(tmp, final)
    except OSError:  # another process finished first (or a stale, incomplete entry)
        if (final / _DONE).exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _DONE).exists():
                raise error(f"cannot place the build in the cache at {final}") from None
            shutil.rmtree(tmp, ignore_errors=True)
    return final


_DONE = ".tilec-built"  # written last: the cache entry is complete


def tilec_files() -> list:
    """Every file of tilec that decides what a build produces (code, templates, grammar)."""
    pkg = Path(__file__).resolve().parent
    files = [p for p in pkg.rglob("*") if p.suffix in (".py", ".j2", ".h", ".lark") and
             "__pycache__" not in p.parts]
    grammar = pkg.parent / "grammar" / "tile.lark"  # the source tree's copy
    if grammar.exists():
        files.append(grammar)
    return sorted(files)


def _make_escape(path) -> str:
    return str(path).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace(
        "$", "$$")


def write_stamp(out_dir: Path, stem: str, source: str, libs=(), link_flags: str = ""):
    """After a successful build: `STEM.stamp`; `STEM.d`, a Make-style depfile saying the stamp
    depends on the .tile file and on tilec itself, so a build system (Make, Ninja, CMake's
    DEPFILE) reruns tilec only when one of them changed; and a pkg-config file per library
    (its Libs carry an rpath to the output folder, where the shared library stays)."""
    from . import __version__
    stamp = out_dir / f"{stem}.stamp"
    deps = [Path(source).resolve()] + tilec_files()
    files = {f"{stem}.d": f"{_make_escape(stamp.resolve())}: \\\n" + " \\\n".join(
        f"  {_make_escape(d)}" for d in deps) + "\n"}
    prefix = out_dir.resolve()
    for lib in libs:
        files[f"{lib}.pc"] = (
            f"# pkg-config file tilec wrote for lib{lib} ({Path(source).name})\n"
            f"prefix={prefix}\nlibdir=${{prefix}}\nincludedir=${{prefix}}\n\n"
            f"Name: {lib}\nDescription: tilec kernels from {Path(source).name}\n"
            f"Version: {__version__}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -l{lib}\n"
            f"Libs.private: {link_flags}\nCflags: -I${{includedir}}\n")
    files[stamp.name] = ""
    try:
        for name, text in files.items():
            (out_dir / name).write_text(text)
            os.chmod(out_dir / name, 0o666 & ~_umask())
    except OSError as e:
        raise error(f"cannot write to {out_dir}: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def library_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"lib{name}.so"
