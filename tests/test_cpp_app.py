"""samples/cpp_app, built as its users would: with plain Make (tilec build + pkg-config) and with
CMake (tilec_add_library), under g++ and clang++; it runs and checks its own results, and the
kernels are rebuilt only when ops.tile changes. Needs make, cmake, pkg-config and both compilers
(CI installs them; elsewhere a missing one skips)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from conftest import SAMPLES

APP = SAMPLES / "cpp_app"
ON_CI = os.environ.get("CI", "").lower() == "true"


def need(*tools):
    for tool in tools:
        if shutil.which(tool) is None:
            if ON_CI:
                pytest.fail(f"{tool} is not installed on this CI machine")
            pytest.skip(f"{tool} not found")
    if shutil.which("tilec") is None:
        pytest.skip("the tilec command is not on PATH (pip install the package)")


def run(cmd, cwd, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def copy_app(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("build*", "app"))
    return app


@pytest.mark.parametrize("cxx", ["g++", "clang++"])
def test_app_with_make(tmp_path, cxx):
    need("make", "pkg-config", cxx)
    app = copy_app(tmp_path)
    env = dict(os.environ, CXX=cxx)
    run(["make"], app, env)
    assert "ok" in run(["./app"], app).splitlines()
    assert "tilec build" not in run(["make"], app, env)  # up to date: tilec does not rerun
    time.sleep(1.1)
    (app / "ops.tile").touch()
    assert "tilec build" in run(["make"], app, env)


@pytest.mark.parametrize("cxx", ["g++", "clang++"])
def test_app_with_cmake(tmp_path, cxx):
    need("cmake", "make", cxx)
    app = copy_app(tmp_path)
    build = tmp_path / "build"
    run(["cmake", "-S", app, "-B", build, f"-DCMAKE_CXX_COMPILER={cxx}"], tmp_path)
    out = run(["cmake", "--build", build], tmp_path)
    assert "tilec: ops.tile" in out
    assert "ok" in run([build / "app"], tmp_path).splitlines()
    assert "tilec: ops.tile" not in run(["cmake", "--build", build], tmp_path)
    time.sleep(1.1)
    (app / "ops.tile").touch()
    assert "tilec: ops.tile" in run(["cmake", "--build", build], tmp_path)
