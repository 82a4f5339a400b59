"""Bad-input corpus: every tests/errors/*.tile holds one mistake and says what tilec must print.

File format: the first line is `# expect: LINE:COL: error: MESSAGE` (or `# expect: error: MESSAGE`
for an error without a position): the first line of the diagnostic without the file name.
Optional `# note: TEXT` lines right after it require a `  note: TEXT` line in the output.
Line numbers count the comment lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ERRORS = Path(__file__).resolve().parent / "errors"
CASES = sorted(ERRORS.glob("*.tile"))
_LOC = re.compile(r"^(\d+):(\d+): error: ")


def _tilec() -> list:
    # Prefer the script installed beside this interpreter (same environment, no pyenv shim).
    here = os.path.dirname(sys.executable)
    exe = shutil.which("tilec", path=here + os.pathsep + os.environ.get("PATH", ""))
    if exe:
        return [exe]
    return [sys.executable, "-c", "from tilec.cli import main; main()"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _header(path: Path) -> tuple:
    """(expected first line without the file name, [expected notes])."""
    lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    expect = None
    if lines and lines[0].startswith("# expect:"):
        expect = lines[0][len("# expect:"):].strip()
    notes = []
    for line in lines[1:]:
        if not line.startswith("# note:"):
            break
        notes.append(line[len("# note:"):].strip())
    return expect, notes


def _run(path: Path) -> Result:
    """`tilec check path` in this process (a subprocess per case spent a minute per test worker
    starting interpreters): its exit code and what it printed; an exception that escapes the
    command is printed as a traceback would be, which the tests then find."""
    from click.testing import CliRunner

    from tilec.cli import main
    try:
        runner = CliRunner(mix_stderr=False)  # (click < 8.2 mixes the streams unless told)
    except TypeError:
        runner = CliRunner()
    r = runner.invoke(main, ["check", str(path)], env={"TILEC_DEBUG": None})
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        err += "Traceback (escaped the command):\n" + "".join(
            traceback.format_exception(*r.exc_info))
    return Result(r.exit_code, r.stdout, err)


@pytest.fixture(scope="module")
def results() -> dict:
    return {p: _run(p) for p in CASES}


def test_the_installed_command_prints_the_same_errors(results):
    """The in-process runs above stand for the installed `tilec` command: a few cases run as
    users run it, in a subprocess, and print the same, with the same exit code."""
    env = dict(os.environ)
    env.pop("TILEC_DEBUG", None)
    for path in CASES[::40]:
        r = subprocess.run(_tilec() + ["check", str(path)], capture_output=True, text=True,
                           timeout=60, env=env)
        assert (r.returncode, r.stdout, r.stderr) == \
            (results[path].returncode, results[path].stdout, results[path].stderr), path.name


def test_corpus_is_complete():
    assert len(CASES) >= 30, f"only {len(CASES)} cases in {ERRORS}"
    missing = [p.name for p in CASES if not _header(p)[0]]
    assert not missing, f"no '# expect:' first line in: {', '.join(missing)}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_error(path: Path, results):
    expect, notes = _header(path)
    assert expect, f"{path.name}: no '# expect:' first line"
    r = results[path]
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert "internal compiler error" not in out, out
    assert r.returncode == 1, f"exit code {r.returncode}, expected 1\n{out}"
    assert r.stdout == "", f"stdout is not empty:\n{r.stdout}"
    lines = r.stderr.splitlines()
    sep = ":" if _LOC.match(expect) else ": "
    assert lines and lines[0] == f"{path.name}{sep}{expect}", f"\n{r.stderr}"
    m = _LOC.match(expect)
    if m:
        line_no, col = int(m.group(1)), int(m.group(2))
        src = path.read_bytes().decode("utf-8", "replace").splitlines()
        assert 1 <= line_no <= len(src), f"expected line {line_no} is not in the file"
        text = src[line_no - 1]
        assert len(lines) >= 3, f"no source line and caret:\n{r.stderr}"
        assert lines[1] == "    " + text.expandtabs(8).rstrip(), f"\n{r.stderr}"
        # The caret sits under the reported (1-based, character) column as displayed,
        # i.e. after expanding the tabs that precede it.
        visual = len(text[:col - 1].expandtabs(8))
        caret = lines[2]
        assert caret.startswith("    ") and caret[4:].lstrip(" ").startswith("^"), f"\n{r.stderr}"
        assert len(caret) - len(caret.lstrip(" ")) == 4 + visual, (
            f"caret is not under column {col}:\n{r.stderr}")
    for note in notes:
        assert f"  note: {note}" in lines, f"missing note '{note}':\n{r.stderr}"
