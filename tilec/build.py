"""Toolchain discovery, the Makefile flow, and the content-addressed compile cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .diagnostics import TilecError, error


def cache_root() -> Path:
    root = os.environ.get("TILEC_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilec"


def files_digest(files: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(os.environ.get("CXX", "").encode() + os.environ.get("CXXFLAGS", "").encode())
    return h.hexdigest()[:20]


def check_toolchain(target: str):
    """Raise a TilecError naming what is missing to build `target`."""
    missing = []
    if shutil.which("make") is None:
        missing.append("make")
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx.split()[0]) is None:
        missing.append(f"{cxx} (set CXX to another C++17 compiler)")
    if missing:
        raise TilecError(f"cannot build for target {target}: {' and '.join(missing)} not found")


def run_make(out_dir: Path, target: str = "cpu", jobs: int = 2):
    """Run the generated Makefile; on failure raise a TilecError with the compiler's output."""
    check_toolchain(target)
    try:
        proc = subprocess.run(["make", "-C", str(out_dir), f"-j{jobs}", "--no-print-directory"],
                              capture_output=True, text=True)
    except OSError as e:
        raise error(f"cannot run make: {e}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise TilecError(f"the {target} build failed (the generated sources are kept in "
                         f"{out_dir}):\n{tail}")
    return proc


def library_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"lib{name}.so"
