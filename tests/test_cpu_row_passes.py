"""CPU lowering steps for row kernels: forward_copies (a tile buffer that only copies an input
tensor is read from the tensor, where that is exact, and kept where it is not) and
row_reciprocal (a division by a row's value multiplies by its reciprocal)."""

from __future__ import annotations

import re

import pytest
from conftest import SAMPLES, check_text, compile_text

from tilec import driver

ROWNORM = """
kernel rownorm(X: f32[R, C], w: f32[C]) -> Y: f32[R, C]:
    Y = X * rsqrt(mean(X * X, axis=-1, keepdims=True) + 1e-6) * w
"""

# the copy sits in a sequential loop and the buffer is read after it: the copy's index names the
# loop's variable, which is out of scope there (and the buffer then holds the last step's values)
AFTER_LOOP = """
kernel last_block(X: f32[R, 256]) -> Y: f32[R, 64]:
    with grid(R, threads=64) as (bx):
        F = fragment(f32, [1, 64])
        for k in range(4):
            for i, j in parallel(1, 64):
                F[i, j] = X[bx, k * 64 + j]
        for i, j in parallel(1, 64):
            Y[bx, j] = F[i, j] * 2.0
"""

# read over a different extent than the copy wrote (the copy fills 32 of 64 columns; the
# others are read but not used)
PARTIAL = """
kernel partial(X: f32[R, 64]) -> Y: f32[R, 64]:
    with grid(R, threads=64) as (bx):
        F = fragment(f32, [1, 64])
        for i, j in parallel(1, 32):
            F[i, j] = X[bx, j]
        for i, j in parallel(1, 64):
            Y[bx, j] = where(j < 32, F[i, j], 0.0) + 1.0
"""


def lowered(text: str) -> str:
    _, _, m = compile_text(text, "t.tile", "cpu")
    return driver.print_stage(m, "lowered")


def test_row_cache_of_an_input_is_read_from_the_input():
    ir = lowered(ROWNORM)
    assert "X_row" not in ir, ir
    assert "X[bx + i, j] * X[bx + i, j]" in ir
    for dims in (dict(R=3, C=17), dict(R=64, C=1000), dict(R=1, C=4096)):
        check_text(ROWNORM, dims, target="cpu")


def test_copy_read_after_its_loop_is_kept():
    ir = lowered(AFTER_LOOP)
    assert "F[i, j] = X[bx, k * 64 + j]" in ir and "F[i, j] * 2" in ir, ir
    for dims in (dict(R=1), dict(R=5)):
        check_text(AFTER_LOOP, dims, target="cpu")


def test_copy_read_beyond_what_it_wrote_is_kept():
    ir = lowered(PARTIAL)
    assert "F[i, j] = X[bx, j]" in ir, ir
    for dims in (dict(R=1), dict(R=7)):
        check_text(PARTIAL, dims, target="cpu")


SOFTMAX_ETC = """
kernel sm(X: f32[R, C]) -> Y: f32[R, C]:
    Y = softmax(X, axis=-1)

kernel by_const(X: f32[R, C]) -> Y: f32[R, C]:
    Y = X / 3.0

kernel by_element(X: f32[R, C], D: f32[R, C]) -> Y: f32[R, C]:
    Y = X / (D * D + 1.0)
"""


def test_division_by_a_row_value_is_one_reciprocal_per_row():
    ir = lowered(SOFTMAX_ETC)
    sm = ir[ir.index("kernel sm_k0"):ir.index("kernel by_const")]
    assert "row_sum_i_rcp = 1.0 / row_sum_i" in sm and "* row_sum_i_rcp" in sm, sm
    assert "t[i, j] / row_sum_i" not in sm
    rest = ir[ir.index("kernel by_const"):]
    assert "_rcp" not in rest and "/ 3" in rest, rest  # constants and elements: exact division
    for dims in (dict(R=3, C=17), dict(R=33, C=2000)):
        check_text(SOFTMAX_ETC, dims, target="cpu")


# ---- store_into_output
SOFTMAX16 = """
kernel sm16(X: f16[R, C]) -> Y: f16[R, C]:
    Y = softmax(X, axis=-1)
"""

# the output's store reads the buffer at another element (reversed columns): an in-place
# update would read elements it already overwrote
REVERSED = """
kernel rev(X: f32[R, 64]) -> Y: f32[R, 64]:
    with grid(R, threads=64) as (bx):
        F = fragment(f32, [1, 64])
        for i, j in parallel(1, 64):
            F[i, j] = exp(X[bx, j])
        for i, j in parallel(1, 64):
            Y[bx, j] = F[i, 63 - j]
"""

# the output has two stores, in the branches of an `if`: neither alone covers the buffer
BRANCHED = """
kernel half_row(X: f32[R, 64]) -> Y: f32[R, 64]:
    with grid(R, threads=64) as (bx):
        F = fragment(f32, [1, 64])
        for i, j in parallel(1, 64):
            F[i, j] = exp(X[bx, j])
        for i, j in parallel(1, 64):
            if j < 32:
                Y[bx, j] = F[i, j] * 2.0
            else:
                Y[bx, j] = 0.0
"""


def test_row_buffer_only_an_output_reads_is_the_output():
    ir = lowered(SOFTMAX_ETC)
    sm = ir[ir.index("kernel sm_k0"):ir.index("kernel by_const")]
    assert "t = fragment" not in sm, sm
    assert "Y[bx + i, j] = exp_nonpos(" in sm and "Y[bx + i, j] = Y[bx + i, j] * row_sum_i_rcp" in sm, sm
    # kept: an f16 output of an f32 row (the output would round it), another element, a branch
    assert "t = fragment(f32" in lowered(SOFTMAX16)
    assert "F = fragment" in lowered(REVERSED) and "F = fragment" in lowered(BRANCHED)
    for text, dims in ((SOFTMAX16, dict(R=5, C=300)), (REVERSED, dict(R=3)),
                       (BRANCHED, dict(R=3))):
        check_text(text, dims, target="cpu")


@pytest.mark.parametrize("sample,dims", [
    ("elementwise_chain", dict(R=5, C=1001)), ("rmsnorm", dict(R=3, C=777)),
    ("layernorm", dict(R=4, C=300)), ("multi_output", dict(R=17, C=100)),
    ("softmax", dict(R=3, C=4099))])
def test_streamed_stores_write_every_value(monkeypatch, sample, dims):
    """With the size threshold at 0 every output row that streams goes through the chunked
    loop and tilec::stream_row (unaligned row starts, chunks cut at 64-byte boundaries, plain
    stores at both ends): the results match the reference at ragged sizes."""
    monkeypatch.setenv("CXXFLAGS", "-O2 -DTILEC_STREAM_BYTES=0")
    text = (SAMPLES / f"{sample}.tile").read_text()
    check_text(text, dims, name=f"{sample}.tile")


def test_a_streamed_copy_streams_from_the_input_row(monkeypatch):
    """An output row that is a copy of an f32 input row goes to memory straight from that row
    (no staging buffer, which g++ filled with `rep movsq` and then stalled on), and every value
    arrives (ragged row length, unaligned row starts)."""
    text = "kernel cp(X: f32[R, C]) -> Y: f32[R, C]:\n    Y = X\n"
    s, m0, m = compile_text(text, "cp.tile", "cpu")
    cpp = driver.render(s, m, "cpu")["cp.cpp"]
    streamed = cpp.split(">= TILEC_STREAM_BYTES) {", 1)[1].split("} else {", 1)[0]
    assert re.search(r"tilec::stream_row\(tilec_row, X \+ ", streamed), streamed
    assert "tilec_vals" not in streamed
    monkeypatch.setenv("CXXFLAGS", "-O2 -DTILEC_STREAM_BYTES=0")
    check_text(text, dict(R=5, C=1001))


def test_streamed_loops_prefetch_the_rows_they_read():
    """Each chunk of a streamed loop prefetches, ahead of itself, every input row it reads along
    the loop (tilec::prefetch_ahead), once per row however often the body reads it; not the
    output, not 4-bit rows (unpacked before the loop)."""
    text = ("kernel k(X: f32[R, C], Y: f32[R, C], Q: u4[R, C]) -> Z: f32[R, C]:\n"
            "    Z = X * Y + X * X + Q\n")
    s, m0, m = compile_text(text, "k.tile", "cpu")
    cpp = driver.render(s, m, "cpu")["k.cpp"]
    chunk = cpp.split("alignas(64) float tilec_vals[256];", 1)[1].split("#pragma omp simd", 1)[0]
    rows = re.findall(r"tilec::prefetch_ahead\((\w+), ", chunk)
    assert sorted(rows) == ["X", "Y"], chunk


def test_reductions_over_input_rows_prefetch_them_in_chunks():
    """A reduction loop over an input row (a row kernel's first pass, which reads the row from
    memory) runs in chunks that each prefetch the row ahead; a float sum adds each chunk into
    its double total."""
    text = ("kernel k(X: f32[R, C], w: f32[C]) -> Y: f32[R, C]:\n"
            "    Y = X * rsqrt(mean(X * X, axis=-1, keepdims=True) + 1e-5) * w\n")
    s, m0, m = compile_text(text, "k.tile", "cpu")
    cpp = driver.render(s, m, "cpu")["k.cpp"]
    head, loop = cpp.split("#pragma omp simd reduction(+:", 1)
    chunk = head.rsplit("double ", 1)[1]
    assert "+= 256) {" in chunk and re.findall(r"tilec::prefetch_ahead\((\w+), ", chunk) == ["X"]
    acc = re.search(r"reduction\(\+:(\w+)\)", "reduction(+:" + loop)[1]
    assert re.search(rf"{acc}_total \+= {acc};\s+{acc} = 0;\s+}}", loop)  # after each chunk
    check_text(text, dict(R=3, C=4099))  # (chunks ragged at both levels)


def test_only_first_writes_of_large_outputs_stream():
    """A row written once from inputs streams (RMSNorm's output); a softmax's in-place scaling
    of the exponentials it stored does not (those lines are in cache), nor a GEMM's epilogue;
    no kernel streams below TILEC_STREAM_BYTES (tested at run time)."""
    src = {}
    texts = {f"{n}.tile": (SAMPLES / f"{n}.tile").read_text() for n in ("rmsnorm", "softmax")}
    texts["gemm.tile"] = "kernel gemm32(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = A @ B\n"
    for name, text in texts.items():
        s, m0, m = compile_text(text, name, "cpu")
        src.update(driver.render(s, m, "cpu"))
    cpp = {k: v for k, v in src.items() if k.endswith(".cpp")}
    rms = cpp["rmsnorm_f32.cpp"]  # (the f16 kernel beside it writes f16: not streamed)
    sm = next(v for k, v in cpp.items() if "softmax" in k)
    assert "tilec::stream_row(" in rms and ">= TILEC_STREAM_BYTES" in rms
    assert "tilec::stream_fence();" in rms
    assert "stream_row" not in sm and "stream_fence" not in sm
    tiled = cpp["gemm32.cpp"].split("tilec_launch_gemm32_k0(", 1)[1].split("\n}\n", 1)[0]
    assert "stream_row" not in tiled  # the tiled GEMM (its GEMV variants write small outputs)
