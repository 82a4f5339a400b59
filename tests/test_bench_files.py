"""bench/gpu.py calls bench/gpu.tile's kernels through ctypes from a table of their signatures
(it runs on the GPU machine only): the table must match what tilec generates, or a benchmark
would pass misplaced arguments."""

from __future__ import annotations

import ast

from conftest import ROOT

from tilec import driver


def _abi_table() -> dict:
    tree = ast.parse((ROOT / "bench" / "gpu.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ABI" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("bench/gpu.py has no ABI table")


def test_bench_abi_table_matches_the_kernels_signatures():
    m = driver.frontend(driver.read_source(ROOT / "bench" / "gpu.tile"))
    table = _abi_table()
    assert set(table) == {g.name for g in m.graphs}
    for g in m.graphs:
        kinds = "".join("f" if p.is_scalar else "T" for p in g.params)
        assert table[g.name] == (kinds, len(g.outputs), " ".join(g.symbols)), g.name
