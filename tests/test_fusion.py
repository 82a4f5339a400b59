"""Fusion is real: the partition and the Tile IR of each pattern, asserted structurally."""

from __future__ import annotations

import itertools
import math
import re

import pytest
from conftest import SAMPLES, check_text, compile_text

from tilec import driver
from tilec.ir import tile as T
from tilec.ir.tile import print_program


def plan_of(text, kernel=None):
    _, _, m = compile_text(text)
    i = 0 if kernel is None else [g.name for g in m.graphs].index(kernel)
    return m.graphs[i], m.plans[i], m.programs[i]


walk = T.walk_stmts
exprs = T.walk_exprs


def global_loads(kernel, name):
    """(statement, load) pairs reading global tensor `name` (tile copies count as loads)."""
    out = []
    for s in walk(kernel.body):
        if isinstance(s, T.Copy) and s.src.buf == name:
            out.append((s, s.src))
        for v in [getattr(s, "value", None), getattr(s, "cond", None)]:
            if v is not None and not isinstance(v, (str,)):
                out += [(s, e) for e in exprs(v) if isinstance(e, T.Load) and e.buf == name]
    return out


def sample(name):
    return (SAMPLES / f"{name}.tile").read_text()


def test_gemm_epilogue_runs_on_the_accumulator():
    g, plan, prog = plan_of(sample("gemm_bias_relu"))
    assert [grp.kind for grp in plan.groups] == ["gemm"]
    assert prog.workspaces == ()
    (k,) = prog.kernels
    stores = [s for s in walk(k.body) if isinstance(s, T.Store) and s.buf == "C"]
    assert len(stores) == 1
    loads = {e.buf for e in exprs(stores[0].value) if isinstance(e, T.Load)}
    assert loads == {"acc", "bias"}
    assert any(isinstance(e, T.Unary) and e.fn == "relu" for e in exprs(stores[0].value))


def test_row_kernels_read_their_input_once():
    # the Tile IR fusion makes (before target lowering: the CPU's forward_copies then reads the
    # row buffer's elements from X again, in cache, instead of copying them)
    for name, kernel in [("softmax", None), ("rmsnorm", "rmsnorm"), ("layernorm", None)]:
        m = driver.stage_module(driver.frontend(driver.Source(f"{name}.tile", sample(name))),
                                "tiled", "cpu")
        i = 0 if kernel is None else [g.name for g in m.graphs].index(kernel)
        plan, prog = m.plans[i], m.programs[i]
        assert [grp.kind for grp in plan.groups] == ["reduce"], name
        (k,) = prog.kernels
        assert len(global_loads(k, "X")) == 1, name
        assert prog.workspaces == ()


def test_elementwise_chain_is_one_kernel():
    g, plan, prog = plan_of(sample("elementwise_chain"))
    assert [grp.kind for grp in plan.groups] == ["elementwise"]
    assert len(prog.kernels) == 1 and prog.workspaces == ()


def test_dequant_happens_in_the_b_tile_load():
    g, plan, prog = plan_of(sample("w4a16"))
    assert [grp.kind for grp in plan.groups] == ["gemm"]
    k = prog.kernels[-1]  # the default tile (before it: the decode-size variants)
    assert k.when is None and "gemv" not in k.name
    (kloop,) = [s for s in k.body if isinstance(s, T.For) and s.kind in ("pipelined", "range")]
    inner = list(walk(kloop.body))
    assert any(isinstance(s, T.Gemm) for s in inner)
    wq = [s for s in inner if isinstance(s, T.Store) and
          any(isinstance(e, T.Load) and e.buf == "Wq" for e in exprs(s.value))]
    assert wq and all(s.buf == "B_s" for s in wq), "Wq must be dequantized into the B tile"
    assert all(w.when is not None for w in prog.workspaces)  # only split variants' partials


def test_weights_packed_along_k_fill_the_b_tile_transposed():
    """dequant(Wq.T, s.T, ...): the B tile is filled as [N, K] with K innermost (neighbouring
    threads read neighbouring nibbles of Wq[n, :]) and the gemm reads it transposed; an operand
    read through untransposed views keeps the [K, N] fill."""
    for name, transposed in (("w4a16_kmajor", True), ("w4a16", False)):
        _, _, prog = plan_of(sample(name))
        body = list(walk(prog.kernels[-1].body))  # the default tile
        (gemm,) = [s for s in body if isinstance(s, T.Gemm)]
        (fill,) = [s for s in body if isinstance(s, T.For) and s.kind == "parallel" and
                   any(isinstance(x, T.Store) and x.buf == gemm.b for x in walk(s.body))]
        stores = {x.idx for x in walk(fill.body) if isinstance(x, T.Store) and x.buf == gemm.b}
        outer, inner = (T.Var(v) for v in fill.vars)
        assert gemm.transpose_b == transposed
        assert stores == {(outer, inner)}  # rows by the outer variable, columns by the inner one
        loads = [e for x in walk(fill.body) if isinstance(x, T.Store)
                 for e in exprs(x.value) if isinstance(e, T.Load) and e.buf == "Wq"]
        assert loads and all(inner in list(exprs(e.idx[-1])) for e in loads), \
            "the innermost variable must step along Wq's contiguous dimension"


def test_attention_is_one_online_softmax_kernel():
    for name in ("attention", "causal_attention"):
        g, plan, prog = plan_of(sample(name))
        assert [grp.kind for grp in plan.groups] == ["attention"], name
        assert prog.workspaces == (), "the L x S matrix must not be materialized"
        (k,) = prog.kernels
        allocs = [s for s in walk(k.body) if isinstance(s, T.Alloc)]
        assert all(len(a.shape) <= 2 for a in allocs)
        gemms = [s for s in walk(k.body) if isinstance(s, T.Gemm)]
        assert len({(g.a, g.b, g.c) for g in gemms}) == 2  # QK^T and PV


def test_unmasked_key_tiles_run_without_the_mask():
    """In the key loop, the statement that masks the scores runs only where a mask touches the
    tile (a uniform test per tile): with the samples' scale folded into the softmax's exponent
    there is nothing else for it to do (test_a_mask_that_was_all_its_loop_did_runs_only_on_
    masked_tiles). The rest of the loop body (copies, both GEMMs) stays one copy."""
    def masks(stmts):
        return [e for s in walk(stmts) if isinstance(s, T.Store)
                for e in T.walk_exprs(s.value) if isinstance(e, T.Select) and
                isinstance(e.b, T.Const) and e.b.value == -math.inf]
    for name, tests in (("attention", 1), ("causal_attention", 2)):
        _, _, prog = plan_of(sample(name))
        (k,) = prog.kernels
        loop = next(s for s in walk(k.body) if isinstance(s, T.For) and s.kind == "range" and
                    any(isinstance(x, T.Gemm) for x in walk(s.body)))
        assert sum(isinstance(x, T.Gemm) for x in walk(loop.body)) == 2
        branches = [s for s in loop.body if isinstance(s, T.If)]
        (branch,) = [b for b in branches if masks(b.body)]
        # (the tile-wide tests negated: opposite comparisons, an `or` of them where several)
        assert not branch.orelse and "~" not in T.fmt(branch.cond)
        assert T.fmt(branch.cond).count("< 0") == tests, T.fmt(branch.cond)
        assert [type(s) for s in branch.body] == [T.For] and branch.body[0].kind == "parallel"
        assert not masks([s for s in loop.body if s is not branch]), "only one statement masks"


def test_unfusable_intermediate_goes_to_a_workspace():
    g, plan, prog = plan_of(sample("gemm_gelu_softmax"))
    assert [grp.kind for grp in plan.groups] == ["gemm", "reduce"]
    assert [w.name for w in prog.workspaces if w.when is None] == ["ws0"]


def test_multi_output_rows_share_one_kernel():
    g, plan, prog = plan_of(sample("multi_output"))
    assert len(plan.groups) == 1 and len(plan.groups[0].outputs) == 3


FUSE_OFF = """
kernel k(X: f32[R, C], w: f32[C]) -> Y: f32[R, C]:
    A = X * w
    B = exp(A)
    Y = B / sum(B, axis=-1, keepdims=True)

schedule k:
    target cpu:
        fuse off
"""


def test_fuse_off_gives_one_kernel_per_statement_and_same_results():
    g, plan, prog = plan_of(FUSE_OFF)
    assert len(prog.kernels) == 3
    assert {op_stmt for grp in plan.groups for op_stmt in
            [{g.ops[m].stmt for m in grp.members}.pop()]} == {0, 1, 2}
    on = FUSE_OFF.replace("fuse off", "fuse on")
    g2, plan2, prog2 = plan_of(on)
    assert len(prog2.kernels) == 1
    check_text(FUSE_OFF, {"R": 33, "C": 70})


def test_attention_with_fuse_off_materializes_the_scores():
    text = sample("attention") + "\nschedule attention:\n    target cpu:\n        fuse off\n"
    g, plan, prog = plan_of(text)
    assert len(prog.kernels) >= 2 and prog.workspaces
    check_text(text, {"B": 1, "H": 2, "L": 33, "S": 70, "D": 16})


ATTENTION_VARIANTS = """
kernel att_mask(Q: f32[H, L, D], K: f32[H, S, D], V: f16[H, S, E], mask: f32[L, S]) -> O: f32[H, L, E]:
    P = softmax(Q @ K.T * 0.125 + mask, axis=-1)
    O = P @ V

kernel att_bf16(Q: bf16[B, L, D], K: bf16[B, S, D], V: bf16[B, S, D], scale: f32) -> O: bf16[B, L, D]:
    T = Q @ transpose(K) * scale
    T = where(index(T, -1) >= index(T, -2) + 3, -inf, T)
    O = bf16(softmax(T, axis=-1)) @ V
"""


def test_attention_variants_fuse_and_match():
    """An additive mask tensor, f32 probabilities with f16 values, a value head dim that differs
    from the key's, a shifted causal mask, bf16 data, a scalar scale parameter."""
    _, _, m = compile_text(ATTENTION_VARIANTS)
    assert [[grp.kind for grp in p.groups] for p in m.plans] == [["attention"], ["attention"]]
    for dims in (dict(H=2, L=64, S=128, D=32, E=48, B=2), dict(H=2, L=70, S=33, D=5, E=7, B=1)):
        check_text(ATTENTION_VARIANTS, dims)


def test_a_mask_that_was_all_its_loop_did_runs_only_on_masked_tiles():
    """`S[i, j] = where(k * 64 + j < n, S[i, j], -inf)`: on whole tiles it would store what it
    reads, so its unmasked version is nothing and the masked one runs under the negated test."""
    from tilec.passes.version_masks import version
    i, j, k = T.Var("i", "i64"), T.Var("j", "i64"), T.Var("k", "i64")
    load = T.Load("S", (i, j), "f32")
    cond = T.Compare("lt", T.iadd(T.imul(k, T.iconst(64)), j), T.Var("n", "i64"))
    st = T.For(("i", "j"), (T.iconst(64), T.iconst(64)), "parallel",
               (T.Store("S", (i, j), T.Select(cond, load, T.Const(-math.inf, "f32"), "f32")),))
    out = version(st)
    assert isinstance(out, T.If) and out.body == (st,) and out.orelse == ()
    # the masked version runs exactly where some j of the tile fails the mask (k * 64 + 63 >= n),
    # under the opposite integer comparison (not a `not`)
    assert isinstance(out.cond, T.Compare), T.fmt(out.cond)
    for kv, nv in itertools.product(range(4), range(0, 300, 7)):
        assert eval(T.fmt(out.cond), {"k": kv, "n": nv}) == (kv * 64 + 63 >= nv)
    # a float comparison is negated by `not` (a NaN fails both it and its opposite); `and` by
    # De Morgan's law
    x = T.Load("X", (i,), "f32")
    neg = T.Compare("lt", x, T.Const(0.0, "f32"))
    assert T.lnot(neg) == T.Unary("not", neg, "bool")
    assert T.lnot(T.land(neg, cond)) == T.Binary("or", T.Unary("not", neg, "bool"),
                                                 T.Compare("ge", cond.a, cond.b), "bool")
    # a loop that also stores something else keeps an unmasked version without the self-store
    other = T.Store("R", (i, j), load)
    both = version(T.For(st.vars, st.extents, "parallel", st.body + (other,)))
    assert both.body[0].body == (other,) and both.orelse[0].body == st.body + (other,)


SCALED = """
kernel scaled(Q: f16[L, D], K: f16[S, D], V: f16[S, D], s: f32) -> O: f16[L, D]:
    T = (Q @ K.T) * SCALE
    T = where(index(T, -1) > index(T, -2), -inf, T)
    O = f16(softmax(T, axis=-1)) @ V
"""


@pytest.mark.parametrize("scale, folded", [("rsqrt(f32(D))", True), ("0.125", True),
                                           ("(f32(D) * 2.0)", True), ("s", False),
                                           ("-0.125", False), ("(0.5 - f32(D))", False),
                                           ("rsqrt(-0.0 * f32(D))", False),
                                           ("(1.0 / sqrt(-0.0 * f32(D)))", False),
                                           ("(1.0 / relu(-0.0 * f32(D)))", False)])
def test_attention_softmax_runs_in_base_2_with_the_scale_folded(scale, folded):
    """With a 16-bit P the online softmax computes exp(t - m) as exp2 of one fused multiply-add,
    t log2(e) - m log2(e). A score that is the product times a scalar known to be >= 0 (a
    constant, dimensions, rsqrt of them) keeps the bare product, its max taken before the scale
    (which rounding preserves), the scale folded into the exponent's factor; a scale of unknown
    or negative sign stays on the scores, and one that may be -0.0 (sqrt and relu keep it,
    rsqrt makes -inf of it). Both match the reference, masked or not."""
    text = SCALED.replace("SCALE", scale)
    _, _, m = compile_text(text)
    tiled = print_program(m.programs[0])
    assert "exp2(fma(" in tiled and re.search(r"m_sub\[i\] = where\(.*, 0\.0, m_new\[i\] \* ", tiled)
    unscaled = re.search(r"where\(k \* \d+ \+ j < S, where\(.*, -inf, S1?\[i, j\]\), -inf\)", tiled)
    assert bool(unscaled) == folded, tiled
    for dims in (dict(L=64, S=64, D=16), dict(L=70, S=33, D=5)):
        check_text(text, dims, seed=3)


def test_an_f32_softmax_keeps_the_exact_difference():
    """P kept in f32: exp(t - m) of the exact difference (at most 8 ln 2: exp_nonpos), the
    scale on the scores."""
    text = SCALED.replace("SCALE", "0.125").replace("O = f16(softmax(T, axis=-1)) @ V",
                                                    "O = f16(softmax(T, axis=-1) @ f32(V))")
    _, _, m = compile_text(text)
    tiled = print_program(m.programs[0])
    assert "exp2" not in tiled and re.search(r"= exp_nonpos\(S1?\[i, j\] - m_sub", tiled), tiled
    check_text(text, dict(L=70, S=33, D=5), seed=3)


GROWING = """
kernel growing(Q: f16[L, D], K: f16[S, D], V: f16[S, D]) -> O: f16[L, D]:
    T = (Q @ K.T) * 0.125 + f32(index(Q @ K.T, -1)) * SLOPE
    O = f16(softmax(T, axis=-1)) @ V

kernel growing_f32(Q: f32[L, D], K: f32[S, D], V: f32[S, D]) -> O: f32[L, D]:
    T = (Q @ K.T) * 0.125 + f32(index(Q @ K.T, -1)) * SLOPE
    O = softmax(T, axis=-1) @ V
"""


@pytest.mark.parametrize("slope", ["0.002", "0.02", "0.2", "-0.2"])
def test_online_softmax_renews_a_rows_max_only_when_it_grows_past_2_to_the_8(slope):
    """A row's running max is renewed only when a key tile's scores exceed it by more than a
    factor of 2^8 in exp (alpha is then exactly 1 in most tiles: no rescaling). Scores that grow
    along the keys (a positive slope: renewed every tile, every few tiles, never after the
    first) or fall (a negative one) match the reference, with 16-bit and f32 probabilities."""
    text = GROWING.replace("SLOPE", slope)
    _, _, m = compile_text(text)
    tiled = print_program(m.programs[0])
    assert re.search(r"m_new\[i\] = where\(\(m_new\[i\] - m\[i\]\) \* [^<]*<= 8\.0, m\[i\], "
                     r"m_new\[i\]\)", tiled), tiled
    assert re.search(r"alpha\[i\] = where\(m\[i\] == m_new\[i\], 1\.0, exp2\(", tiled), tiled
    for dims in (dict(L=40, S=700, D=16), dict(L=64, S=128, D=8)):
        check_text(text, dims, seed=5)


CAUSAL_SHIFTED = """
kernel shifted(Q: f32[L, D], K: f32[S, D], V: f32[S, D]) -> O: f32[L, D]:
    T = Q @ K.T
    T = where(index(T, -1) > index(T, -2) + SHIFT, -inf, T)
    O = softmax(T, axis=-1) @ V
"""


@pytest.mark.parametrize("shift", [0, 5, -3, -70])
def test_causal_mask_bounds_the_key_loop(shift):
    """Key tiles wholly above the diagonal are skipped (the loop's trip count is bounded by the
    block's last query), not computed and masked; results still match, also where a query has
    no key at all (a row of -inf: NaN, as the reference gives)."""
    text = CAUSAL_SHIFTED.replace("SHIFT", str(shift))
    _, _, m = compile_text(text)
    tiled = print_program(m.programs[0])
    assert re.search(r"for k in range\(min\(cdiv\(S, \d+\), \(bx \* \d+ [+-] \d+\) // \d+ \+ 1\)\)",
                     tiled), tiled
    for dims in (dict(L=100, S=100, D=8), dict(L=64, S=130, D=16), dict(L=1, S=1, D=1)):
        check_text(text, dims)


def test_cpu_deals_causal_blocks_out_one_at_a_time():
    """On the CPU the blocks of a causal kernel do different amounts of work (the key loop is
    bounded by the block's row): they go to the threads one at a time, not in contiguous
    halves (where one thread would get all the long blocks); equal blocks stay static."""
    from tilec.targets.cpu import render_kernel
    for shift, want in ((0, "dynamic, 1"), (None, "static")):
        text = CAUSAL_SHIFTED.replace("SHIFT", str(shift)) if shift is not None else \
            CAUSAL_SHIFTED.replace("index(T, -1) > index(T, -2) + SHIFT", "index(T, -1) > 3")
        _, _, m = compile_text(text)
        (k,) = m.programs[0].kernels
        assert render_kernel(k, m.graphs[0].symbols, "2")["schedule"] == want


@pytest.mark.parametrize("persistent", [True, False])
def test_causal_blocks_start_longest_first_on_hopper(monkeypatch, persistent):
    """A causal key loop is bounded by the block's row: in Hopper's warp-specialized kernel (one
    block per SM) the blocks with the most key tiles start first and the last to run are short:
    on its persistent grid (the default) the blocks walk query tiles in pairs of even work, the
    longest first; one block per query tile (TILEC_WGMMA_ATTENTION=3,1,0,0), the query blocks
    of each head count down. The mma.sync kernel (several blocks per SM; measured slower so)
    and the CPU keep the order, as does attention without a causal bound."""
    if not persistent:
        monkeypatch.setenv("TILEC_WGMMA_ATTENTION", "3,1,0,0")
    walk = ("const int tilec_per = tilec_pairs >= (int64_t)gridDim.x ? 2 : 1;" if persistent else
            "const int64_t bx = tilec_grid[0] - 1 - (tilec_b) % tilec_grid[0];")
    for name in ("causal_attention", "attention"):
        text = sample(name)
        for target, options in (("cuda", {"arch": ["sm_80", "sm_90a"]}), ("cpu", {})):
            _, _, m = compile_text(text, f"{name}.tile", target, options=options)
            got = {k.name.split("_k0")[1]: k.longest_first for p in m.programs for k in p.kernels}
            want = {v: name == "causal_attention" and v.startswith("_tma") for v in got}
            assert got == want and (target == "cpu" or any(want.values()) == (name != "attention"))
            src = next(v for f, v in driver.render(driver.Source(f"{name}.tile", text), m, target,
                                                   options).items() if f.startswith(name + "."))
            assert (walk in src) == any(want.values())


def test_non_causal_masks_keep_every_key_tile():
    text = CAUSAL_SHIFTED.replace("index(T, -1) > index(T, -2) + SHIFT", "index(T, -1) > 3")
    _, _, m = compile_text(text)
    assert "for k in range(cdiv(S," in print_program(m.programs[0])


def test_an_internal_error_in_a_fused_kernel_falls_back_to_unfused_kernels(monkeypatch):
    """Users get correct unfused kernels when tiling a fused group fails (tests run strict)."""
    from tilec.passes import tile
    monkeypatch.delenv("TILEC_STRICT_FUSION")
    lower = tile.GroupLowering.lower

    def broken(self):
        if len(self.grp.members) > 1:
            raise AssertionError("injected fusion bug")
        return lower(self)
    monkeypatch.setattr(tile.GroupLowering, "lower", broken)
    text = (SAMPLES / "gemm_bias_relu.tile").read_text()
    _, _, m = compile_text(text)
    assert len(m.programs[0].kernels) > 1
    check_text(text, {"M": 37, "N": 70, "K": 50})
    monkeypatch.setenv("TILEC_STRICT_FUSION", "1")
    with pytest.raises(AssertionError, match="injected"):
        compile_text(text)


def test_cpu_gemm_reads_same_dtype_operands_in_place():
    """On the CPU a GEMM whose operands are copied without a conversion reads the tensors in
    place (only the windows' valid part: no padding, no staging copy); a converting copy
    (f16 -> f32) still fills its tile; both give the reference's results at ragged sizes."""
    from tilec.targets.cpu import render_kernel
    f32 = "kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N]:\n    C = relu(A @ B)\n"
    f16 = f32.replace("f32[M, K]", "f16[M, K]")
    for text, copies in ((f32, 0), (f16, 1)):
        _, _, m = compile_text(text)
        k = m.programs[0].kernels[-1]  # the tiled GEMM (the GEMV variants come first)
        assert "gemv" not in k.name
        body = "\n".join(render_kernel(k, m.graphs[0].symbols, "2")["body"])
        assert body.count("tilec::copy_tile(") == copies, body
        check_text(text, dict(M=130, N=257, K=300))
        check_text(text, dict(M=1, N=3, K=1))


COPIED_OUT = """
kernel g3(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N], D: f32[M, K]):
    \"\"\"The A tile feeds a GEMM and is copied out: it must still be filled.\"\"\"
    with grid(1, cdiv(M, 32), threads=1) as (bx, by):
        A_s = shared(f32, [32, 32])
        B_s = shared(f32, [32, 32])
        acc = fragment(f32, [32, 32])
        clear(acc)
        copy(A[by * 32, 0], A_s)
        copy(B[0, 0], B_s)
        gemm(A_s, B_s, acc)
        copy(A_s, D[by * 32, 0])
        for i2, j2 in parallel(32, 32):
            if (by * 32 + i2 < M) & (j2 < N):
                C[by * 32 + i2, j2] = acc[i2, j2]
"""


def test_cpu_gemm_operand_read_elsewhere_is_still_filled():
    from tilec.targets.cpu import render_kernel
    _, _, m = compile_text(COPIED_OUT)
    (k,) = m.programs[0].kernels
    body = "\n".join(render_kernel(k, m.graphs[0].symbols, "2")["body"])
    assert body.count("tilec::copy_tile(") == 1 and "B_s is not filled" in body, body
    check_text(COPIED_OUT, dict(M=40, N=32, K=32))
