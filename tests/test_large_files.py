"""Large .tile files: parsed in parts (bounded memory) with the same result and the same located
errors as parsing the whole text at once."""

from __future__ import annotations

import re

import pytest
from conftest import SAMPLES

from tilec import driver
from tilec.diagnostics import TilecError
from tilec.parser import grammar


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    """Parts of 2 KB: the parts path on files of tens of KB (the real parts are 64 KB)."""
    monkeypatch.setattr(grammar, "_PART_BYTES", 2048)


def big_file(copies: int) -> str:
    """The samples, `copies` times over, with every kernel renamed per copy (~4 KB a copy)."""
    texts = [p.read_text() for p in sorted(SAMPLES.glob("*.tile"))]
    out = []
    for n in range(copies):
        for t in texts:
            for name in re.findall(r"^kernel (\w+)", t, re.M):
                t = re.sub(rf"\b{name}\b", f"{name}_{n}", t)
            out.append(t)
    return "\n".join(out)


def test_a_large_file_parses_in_parts_to_the_same_syntax_tree():
    text = big_file(8)
    assert len(text) > 8 * grammar._PART_BYTES  # several parts
    whole = grammar._parse_text(text if text.endswith("\n") else text + "\n")
    assert grammar.parse(text) == whole
    assert len(whole.kernels) == len(re.findall(r"^kernel ", text, re.M))


def test_errors_in_a_large_file_point_at_their_own_line():
    text = big_file(8)
    lines = text.splitlines()
    # a semantic error (found after parsing, from the syntax nodes' locations) near the end
    at = max(i for i, line in enumerate(lines) if line.startswith("    Y = "))
    lines[at] = lines[at].replace("Y = ", "Y = undefined_name + ")
    with pytest.raises(TilecError) as e:
        driver.frontend(driver.Source("big.tile", "\n".join(lines) + "\n"))
    assert e.value.loc.line == at + 1 and "undefined_name" in str(e.value)
    # a syntax error in a middle part
    lines = text.splitlines()
    mid = len(lines) // 2 + [line.startswith("    ") for line in lines[len(lines) // 2:]].index(True)
    lines[mid] = lines[mid] + " )"
    with pytest.raises(TilecError) as e:
        grammar.parse("\n".join(lines) + "\n")
    assert e.value.loc.line == mid + 1


def test_a_line_inside_a_docstring_that_looks_like_a_kernel_is_not_a_part_boundary():
    """A part cut there fails to parse (an unterminated string), so the whole text is parsed at
    once: the file means what it says."""
    filler = big_file(4)
    tricky = ('kernel doc_k(X: f32[N]) -> Y: f32[N]:\n    """Looks like two kernels:\n'
              'kernel not_a_kernel(X: f32[N]) -> Y: f32[N]:\n    """\n    Y = X\n')
    m = grammar.parse(filler + "\n" + tricky + filler.replace("kernel ", "kernel z"))
    names = [k.name for k in m.kernels]
    assert "doc_k" in names and "not_a_kernel" not in names
