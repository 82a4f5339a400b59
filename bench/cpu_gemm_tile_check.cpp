// Correctness tests and a GEMM benchmark for the tilec CPU device library
// (tilec/templates/cpu/tilec_cpu.h).
//
// Build & run:
//   g++ -std=c++17 -O3 -march=native -fopenmp -fno-math-errno -Wall -Wextra
//       -I tilec/templates/cpu -I tilec/templates/common
//       bench/cpu_gemm_tile_check.cpp -o /tmp/cpu_gemm_tile_check
//   /tmp/cpu_gemm_tile_check [BM BN BK] [--sweep]
// Compare with numpy (OpenBLAS) on the same machine:
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 -c "import numpy as np,time;
//     a=np.random.rand(1024,1024).astype('f4'); b=a.copy(); a@b; t=time.perf_counter();
//     [a@b for _ in range(20)]; print(2*1024**3*20/(time.perf_counter()-t)/1e9,'GFLOP/s')"
//   (shown on several lines; paste as one)
// Exit status is nonzero if any check fails.
#include "tilec_cpu.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static int g_failures = 0;
#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            ++g_failures;                                  \
            if (g_failures < 30) {                         \
                std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
                std::printf(__VA_ARGS__);                  \
                std::printf("\n");                         \
            }                                              \
        }                                                  \
    } while (0)

// ---------------------------------------------------------------------------
// (1) gemm_tile vs a naive triple loop in double.
template <bool TA, bool TB, typename T>
static double check_gemm_case(int64_t m, int64_t n, int64_t k, std::mt19937& rng, int64_t ldb_pad = 5) {
    // Leading dimensions larger than the logical extents, to catch ld mix-ups.
    const int64_t arows = TA ? k : m, acols = TA ? m : k;
    const int64_t brows = TB ? n : k, bcols = TB ? k : n;
    const int64_t lda = acols + 3, ldb = bcols + ldb_pad, ldc = n + 2;
    std::uniform_real_distribution<double> U(-1.0, 1.0);
    std::vector<T> A(std::max<int64_t>(1, arows * lda)), B(std::max<int64_t>(1, brows * ldb)),
        C(std::max<int64_t>(1, m * ldc));
    for (auto& x : A) x = (T)U(rng);
    for (auto& x : B) x = (T)U(rng);
    for (auto& x : C) x = (T)U(rng);
    std::vector<T> C0 = C;
    tilec::gemm_tile<TA, TB, T>(m, n, k, A.data(), lda, B.data(), ldb, C.data(), ldc);
    double max_err = 0;  // relative to sum |a*b| + |c|: the natural error scale
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
            if (j >= n) {  // padding columns must be untouched
                CHECK(C[i * ldc + j] == C0[i * ldc + j], "gemm wrote outside n");
                continue;
            }
            double s = (double)C0[i * ldc + j], mag = std::fabs(s);
            for (int64_t p = 0; p < k; ++p) {
                const double a = TA ? A[p * lda + i] : A[i * lda + p];
                const double b = TB ? B[j * ldb + p] : B[p * ldb + j];
                s += a * b;
                mag += std::fabs(a * b);
            }
            max_err = std::max(max_err, std::fabs((double)C[i * ldc + j] - s) / mag);
        }
    return max_err;
}

template <typename T>
static void check_gemm(const char* name) {
    std::mt19937 rng(1234);
    const int64_t sizes[] = {0, 1, 7, 17, 64, 130};
    double worst = 0;
    const double eps = std::numeric_limits<T>::epsilon();
    for (int64_t m : sizes)
        for (int64_t n : sizes)
            for (int64_t k : sizes) {
                const double e[4] = {check_gemm_case<false, false, T>(m, n, k, rng),
                                     check_gemm_case<false, true, T>(m, n, k, rng),
                                     check_gemm_case<true, false, T>(m, n, k, rng),
                                     check_gemm_case<true, true, T>(m, n, k, rng)};
                for (int t = 0; t < 4; ++t) {
                    // Rounding error of a k-term sum is bounded by ~k*eps relative
                    // to sum |a*b|; use a generous 4*(k+2)*eps.
                    CHECK(e[t] <= 4.0 * (double)(k + 2) * eps, "gemm<%s> TA=%d TB=%d m=%ld n=%ld k=%ld err=%g",
                          name, t >> 1, t & 1, (long)m, (long)n, (long)k, e[t]);
                    worst = std::max(worst, e[t]);
                }
            }
    // Larger cases: k crossing the internal KC slice, n crossing NC, and a
    // B stride large enough (> 8 KiB) that B is packed instead of read in place.
    const double big[] = {check_gemm_case<false, false, T>(67, 301, 600, rng),
                          check_gemm_case<true, true, T>(130, 520, 513, rng),
                          check_gemm_case<false, false, T>(19, 100, 70, rng, 3000),
                          check_gemm_case<true, false, T>(64, 96, 300, rng, 4096 - 96),
                          check_gemm_case<false, true, T>(33, 70, 257, rng, 1000)};
    for (double e : big) {
        CHECK(e <= 4.0 * 602 * eps, "gemm<%s> large case err=%g", name, e);
        worst = std::max(worst, e);
    }
    std::printf("gemm_tile<%s>: all TA/TB, sizes {0,1,7,17,64,130}^3: max err %.3g (x eps = %.2f)\n",
                name, worst, worst / eps);
}

// ---------------------------------------------------------------------------
// (2) f16 / bf16
static uint32_t fbits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

static bool is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool is_nanbf(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

// Reference bf16 rounding done in double: pick the nearer of the two
// neighbouring bf16 values (ties to even).  Independent of the bit trick.
static uint16_t ref_f32_to_bf16(float x) {
    const uint32_t u = fbits(x);
    const uint16_t lo = (uint16_t)(u >> 16);  // truncation toward zero
    if ((u & 0xffff) == 0) return lo;
    const uint16_t hi = (uint16_t)(lo + 1);   // next value away from zero (may become inf)
    const double dx = std::fabs((double)x);
    const double dlo = std::fabs((double)bitsf((uint32_t)lo << 16));
    // For rounding purposes "inf" sits at 2^128 (IEEE overflow rule).
    const double dhi = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs((double)bitsf((uint32_t)hi << 16));
    if (dx - dlo < dhi - dx) return lo;
    if (dx - dlo > dhi - dx) return hi;
    return (lo & 1) ? hi : lo;
}

static void check_half() {
    int bad_rt16 = 0, bad_rtbf = 0, bad_f16_exact = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t b = (uint16_t)h;
        // f16 -> f32 must be exact: compare with the compiler's _Float16.
        const float f = tilec::f16_to_f32(b);
#if defined(__FLT16_MAX__)
        _Float16 hv;
        std::memcpy(&hv, &b, 2);
        const float ref = (float)hv;
        if (!(fbits(ref) == fbits(f) || (std::isnan(ref) && std::isnan(f)))) ++bad_f16_exact;
#endif
        const uint16_t back = tilec::f32_to_f16(f);
        if (is_nan16(b)) {
            if (!(is_nan16(back) && (back & 0x8000) == (b & 0x8000))) ++bad_rt16;
        } else if (back != b) {
            ++bad_rt16;
        }
        const uint16_t bb = tilec::f32_to_bf16(tilec::bf16_to_f32(b));
        if (is_nanbf(b)) {
            if (!(is_nanbf(bb) && (bb & 0x8000) == (b & 0x8000))) ++bad_rtbf;
        } else if (bb != b) {
            ++bad_rtbf;
        }
    }
    CHECK(bad_rt16 == 0, "f16 round trip: %d bad patterns", bad_rt16);
    CHECK(bad_rtbf == 0, "bf16 round trip: %d bad patterns", bad_rtbf);
    CHECK(bad_f16_exact == 0, "f16_to_f32 vs _Float16: %d bad patterns", bad_f16_exact);

    // Rounding of f32 -> f16/bf16.  Sample: every f32 whose low 13 bits are in
    // an interesting set (exact ties, just below/above ties, random) for all
    // high parts, which covers every exponent incl. subnormal/overflow edges.
    std::mt19937 rng(42);
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x7fff, 0x8000, 0x8001, 0xffff};
    long n16 = 0, nbf = 0, bad16 = 0, badbf = 0;
    for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
        for (uint32_t l : lows) {
            const uint32_t low13 = l & 0x1fff;
            const uint32_t u16 = (hi << 13) | low13;                           // for f16: vary the dropped 13 bits
            const uint32_t ubf = ((hi & 0xffff) << 16) | (l & 0xffff);  // for bf16: vary the dropped 16 bits
            for (int s = 0; s < 2; ++s) {
                const float x = bitsf(u16 ^ (s ? 0x80000000u : 0));
#if defined(__FLT16_MAX__)
                const _Float16 r = (_Float16)x;
                uint16_t rb;
                std::memcpy(&rb, &r, 2);
                const uint16_t got = tilec::f32_to_f16(x);
                ++n16;
                if (std::isnan(x) ? !is_nan16(got) : got != rb) ++bad16;
#endif
                const float y = bitsf(ubf ^ (s ? 0x80000000u : 0));
                const uint16_t gb = tilec::f32_to_bf16(y);
                ++nbf;
                if (std::isnan(y) ? !is_nanbf(gb) : gb != ref_f32_to_bf16(y)) ++badbf;
            }
        }
        // plus a random float per step
        const float x = bitsf((uint32_t)rng());
#if defined(__FLT16_MAX__)
        const _Float16 r = (_Float16)x;
        uint16_t rb;
        std::memcpy(&rb, &r, 2);
        ++n16;
        if (std::isnan(x) ? !is_nan16(tilec::f32_to_f16(x)) : tilec::f32_to_f16(x) != rb) ++bad16;
#endif
        ++nbf;
        if (std::isnan(x) ? !is_nanbf(tilec::f32_to_bf16(x)) : tilec::f32_to_bf16(x) != ref_f32_to_bf16(x)) ++badbf;
    }
    CHECK(bad16 == 0, "f32_to_f16 vs _Float16: %ld / %ld bad", bad16, n16);
    CHECK(badbf == 0, "f32_to_bf16 vs reference: %ld / %ld bad", badbf, nbf);
    // Specific values.
    CHECK(tilec::f32_to_f16(65504.0f) == 0x7bff, "65504");
    CHECK(tilec::f32_to_f16(65519.99f) == 0x7bff, "65519.99");
    CHECK(tilec::f32_to_f16(65520.0f) == 0x7c00, "65520 -> inf");
    CHECK(tilec::f32_to_f16(1e30f) == 0x7c00, "1e30 -> inf");
    CHECK(tilec::f32_to_f16(-INFINITY) == 0xfc00, "-inf");
    CHECK(tilec::f32_to_f16(5.960464477539063e-8f) == 0x0001, "min subnormal");
    CHECK(tilec::f32_to_f16(2.98023223876953125e-8f) == 0x0000, "half min subnormal ties to 0");
    CHECK(tilec::f32_to_f16(2.9802326e-8f) == 0x0001, "just above half min subnormal");
    CHECK(tilec::f32_to_f16(-0.0f) == 0x8000, "-0");
    CHECK(std::isnan(tilec::round_f16(NAN)) && std::isnan(tilec::round_bf16(NAN)), "nan");
    CHECK(tilec::f32_to_bf16(bitsf(0x7f800001u)) != 0x7f80, "signalling nan must not become inf");
    CHECK(tilec::f32_to_bf16(3.4028235e38f) == 0x7f80, "FLT_MAX -> bf16 inf");
    CHECK(tilec::round_bf16(1.00390625f) == 1.0f, "bf16 tie to even");
    std::printf("f16/bf16: 65536-pattern round trips, %ld f16 and %ld bf16 rounding samples: %s\n", n16, nbf,
                (bad_rt16 | bad_rtbf | bad_f16_exact | bad16 | badbf) ? "ERRORS" : "exact");
}

// ---------------------------------------------------------------------------
// (3) exp_f32 vs std::exp in double.
static void check_exp() {
    double max_rel = 0, worst_x = 0;
    long count = 0;
    auto one = [&](float x) {
        const float got = tilec::exp_f32(x);
        const double ref = std::exp((double)x);
        ++count;
        if (ref < 1.1754943508222875e-38) {  // subnormal results may flush; absolute check
            CHECK(got >= 0 && std::fabs(got - ref) <= 2e-45 + 1e-6 * ref, "exp underflow x=%a got=%a ref=%a",
                  (double)x, (double)got, ref);
            return;
        }
        if (ref > 3.4028234663852886e38) {
            CHECK(std::isinf(got) && got > 0, "exp overflow x=%a got=%a", (double)x, (double)got);
            return;
        }
        const double rel = std::fabs((double)got - ref) / ref;
        if (rel > max_rel) max_rel = rel, worst_x = x;
    };
    // every 37th float (in bit order) of [0, 89) and (-104, -0], plus random points
    for (uint32_t u = 0; u < 0x42b20000u; u += 37) one(bitsf(u));               // [0, 89)
    for (uint32_t u = 0x80000000u; u < 0xc2d00000u; u += 37) one(bitsf(u));     // (-104, -0]
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-110.0f, 95.0f);
    for (int i = 0; i < 2000000; ++i) one(U(rng));
    CHECK(tilec::exp_f32(-INFINITY) == 0.0f, "exp(-inf)");
    CHECK(std::isinf(tilec::exp_f32(INFINITY)), "exp(inf)");
    CHECK(std::isnan(tilec::exp_f32(NAN)) && std::isnan(tilec::exp_f32(-NAN)), "exp(nan)");
    CHECK(tilec::exp_f32(0.0f) == 1.0f && tilec::exp_f32(-0.0f) == 1.0f, "exp(0)");
    CHECK(std::isinf(tilec::exp_f32(88.8f)) && tilec::exp_f32(88.7f) > 1e38f, "exp overflow edge");
    CHECK(tilec::exp_f32(-1e30f) == 0.0f && tilec::exp_f32(1e30f) == INFINITY, "exp huge");
    CHECK(max_rel < 3e-7, "exp_f32 max rel err %g at x=%a", max_rel, worst_x);
    std::printf("exp_f32: %ld samples, max rel err %.3g (= %.2f x FLT_EPSILON) at x=%.9g; specials ok\n", count,
                max_rel, max_rel / 1.1920928955078125e-7, worst_x);
    // exp_f64 is std::exp; one sanity check.
    CHECK(tilec::exp_f64(1.0) == std::exp(1.0), "exp_f64");
}

// Vectorization probe: a loop the way generated code writes it.  Timed so a
// regression to a scalar/libm path is visible.
static void bench_exp() {
    const int N = 1 << 16;
    std::vector<float> x(N), y(N);
    for (int i = 0; i < N; ++i) x[i] = -20.0f + 40.0f * (float)i / N;
    float* px = x.data();
    float* py = y.data();
    const int reps = 2000;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
#pragma omp simd
        for (int i = 0; i < N; ++i) py[i] = tilec::exp_f32(px[i]);
        px[r & (N - 1)] += 0.0f * py[(r * 7) & (N - 1)];  // keep the loop live
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("exp_f32 in omp simd loop: %.2f Gelem/s (1 thread)\n", (double)N * reps / s / 1e9);
}

// ---------------------------------------------------------------------------
// (4) small helpers
static void check_misc() {
    // 4-bit: a 3 x 5 matrix, 3 bytes per row.
    const int rows = 3, cols = 5;
    uint8_t buf[rows * 3];
    int vals[rows][cols];
    std::memset(buf, 0, sizeof buf);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            vals[r][c] = (r * 7 + c * 5 + 3) & 15;
            buf[r * 3 + c / 2] |= (uint8_t)(vals[r][c] << (4 * (c & 1)));
        }
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            CHECK(tilec::load_u4(buf, r, c, cols) == vals[r][c], "load_u4 %d %d", r, c);
            CHECK(tilec::load_i4(buf, r, c, cols) == (vals[r][c] >= 8 ? vals[r][c] - 16 : vals[r][c]), "load_i4");
        }
    // sat_cast
    CHECK(tilec::sat_cast<int8_t>(300.0) == 127 && tilec::sat_cast<int8_t>(-300.0) == -128, "sat i8");
    CHECK(tilec::sat_cast<int8_t>(-128.4) == -128 && tilec::sat_cast<int8_t>(127.4) == 127, "sat i8 edge");
    CHECK(tilec::sat_cast<uint8_t>(-1.0) == 0 && tilec::sat_cast<uint8_t>(255.5) == 255, "sat u8");
    CHECK(tilec::sat_cast<int32_t>(2.5) == 2 && tilec::sat_cast<int32_t>(3.5) == 4 && tilec::sat_cast<int32_t>(-2.5) == -2,
          "sat ties to even");
    CHECK(tilec::sat_cast<int32_t>(NAN) == 0 && tilec::sat_cast<int32_t>(INFINITY) == INT32_MAX &&
              tilec::sat_cast<int32_t>(-INFINITY) == INT32_MIN, "sat specials");
    CHECK(tilec::sat_cast<int32_t>(2147483647.4) == INT32_MAX && tilec::sat_cast<int32_t>(2147483648.0) == INT32_MAX,
          "sat i32 edge");
    CHECK(tilec::sat_cast<int64_t>(9.3e18) == INT64_MAX && tilec::sat_cast<int64_t>(-9.3e18) == INT64_MIN &&
              tilec::sat_cast<int64_t>(-9223372036854775808.0) == INT64_MIN &&
              tilec::sat_cast<int64_t>(9223372036854774784.0) == 9223372036854774784LL, "sat i64");
    CHECK(tilec::sat_cast<uint64_t>(1.9e19) == UINT64_MAX && tilec::sat_cast<uint64_t>(1.8e19) == 18000000000000000000ULL,
          "sat u64");
    CHECK(tilec::sat_cast<uint32_t>(4294967295.0) == 4294967295u && tilec::sat_cast<uint32_t>(5e9) == 4294967295u,
          "sat u32");
    CHECK(tilec::sat_cast<bool>(0.5) == true && tilec::sat_cast<bool>(0.0) == false, "sat bool");
    // floordiv / floormod against the Python definition: a == b*q + r, r has b's sign, |r| < |b|.
    for (int a = -20; a <= 20; ++a)
        for (int b = -7; b <= 7; ++b) {
            if (b == 0) continue;
            const int q = tilec::floordiv<int>(a, b), r = tilec::floormod<int>(a, b);
            const int pq = (int)std::floor((double)a / b);
            CHECK(q == pq && r == a - b * pq, "floordiv/mod %d %d -> %d %d", a, b, q, r);
            const int64_t q64 = tilec::floordiv<int64_t>(a, b), r64 = tilec::floormod<int64_t>(a, b);
            CHECK(q64 == pq && r64 == a - b * pq, "floordiv/mod i64");
            const int8_t q8 = tilec::floordiv<int8_t>((int8_t)a, (int8_t)b);
            CHECK(q8 == pq, "floordiv i8");
        }
    CHECK(tilec::floordiv<uint32_t>(7u, 2u) == 3u && tilec::floormod<uint32_t>(7u, 2u) == 1u, "unsigned");
    CHECK(tilec::floordiv<double>(-7.0, 2.0) == -4.0 && tilec::floormod<double>(-7.0, 2.0) == 1.0, "float floordiv");
    CHECK(tilec::floormod<double>(7.0, -2.0) == -1.0 && tilec::floordiv<float>(7.5f, -2.0f) == -4.0f, "float floormod");
    CHECK(std::signbit(tilec::floormod<double>(4.0, -2.0)), "python: 4.0 %% -2.0 == -0.0");
    std::printf("load_u4/load_i4, sat_cast, floordiv/floormod: %s\n", g_failures ? "see failures" : "ok");
}

// ---------------------------------------------------------------------------
// (5) 1024^3 f32 GEMM driven like generated code: one BM x BN accumulator
// per output tile, K walked in BK steps, operand tiles copied into As[BM][BK]
// and Bs[BK][BN] by plain loops with zero fill, then gemm_tile on the tiles.
// Two copy styles are timed:
//   naive:   a bounds check per element  ((r < M && c < K) ? A[..] : 0)
//   hoisted: the bounds are resolved once per row, the inner loop is an
//            unconditional contiguous copy plus a zero-fill tail (vectorizes
//            to plain vmovups; about 2x cheaper).
static void run_gemm(const float* A, const float* B, float* C, int M, int N, int K, int BM, int BN, int BK,
                     bool naive_copy) {
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
#pragma omp parallel
    {
        // per-thread scratch, allocated once per parallel region
        std::vector<float> acc_v((size_t)BM * BN), As_v((size_t)BM * BK), Bs_v((size_t)BK * BN);
        float* acc = acc_v.data();
        float* As = As_v.data();
        float* Bs = Bs_v.data();
#pragma omp for collapse(2) schedule(static)
        for (int by = 0; by < tiles_m; ++by)
            for (int bx = 0; bx < tiles_n; ++bx) {
                std::fill(acc, acc + (size_t)BM * BN, 0.0f);
                for (int k0 = 0; k0 < K; k0 += BK) {
                    if (naive_copy) {
                        for (int i = 0; i < BM; ++i)
                            for (int kk = 0; kk < BK; ++kk) {
                                const int r = by * BM + i, c = k0 + kk;
                                As[i * BK + kk] = (r < M && c < K) ? A[(size_t)r * K + c] : 0.0f;
                            }
                        for (int kk = 0; kk < BK; ++kk)
                            for (int j = 0; j < BN; ++j) {
                                const int r = k0 + kk, c = bx * BN + j;
                                Bs[kk * BN + j] = (r < K && c < N) ? B[(size_t)r * N + c] : 0.0f;
                            }
                    } else {
                        for (int i = 0; i < BM; ++i) {
                            const int r = by * BM + i;
                            const int valid = r < M ? std::max(0, std::min(BK, K - k0)) : 0;
                            const float* src = A + (size_t)r * K + k0;
                            float* dst = As + i * BK;
                            for (int kk = 0; kk < valid; ++kk) dst[kk] = src[kk];
                            for (int kk = valid; kk < BK; ++kk) dst[kk] = 0.0f;
                        }
                        for (int kk = 0; kk < BK; ++kk) {
                            const int r = k0 + kk;
                            const int valid = r < K ? std::max(0, std::min(BN, N - bx * BN)) : 0;
                            const float* src = B + (size_t)r * N + bx * BN;
                            float* dst = Bs + kk * BN;
                            for (int j = 0; j < valid; ++j) dst[j] = src[j];
                            for (int j = valid; j < BN; ++j) dst[j] = 0.0f;
                        }
                    }
                    tilec::gemm_tile<false, false, float>(BM, BN, BK, As, BK, Bs, BN, acc, BN);
                }
                for (int i = 0; i < BM; ++i)
                    for (int j = 0; j < BN; ++j) {
                        const int r = by * BM + i, c = bx * BN + j;
                        if (r < M && c < N) C[(size_t)r * N + c] = acc[i * BN + j];
                    }
            }
    }
}

// Best-of-`reps` GFLOP/s (the machine is a shared VM: the minimum time is the
// stable statistic).  With verify, spot-checks entries against double sums.
static double bench_gemm(int M, int N, int K, int BM, int BN, int BK, bool naive_copy, bool verify, int reps = 30) {
    std::vector<float> A((size_t)M * K), B((size_t)K * N), C((size_t)M * N);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    for (auto& x : A) x = U(rng);
    for (auto& x : B) x = U(rng);
    run_gemm(A.data(), B.data(), C.data(), M, N, K, BM, BN, BK, naive_copy);  // warm-up
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        run_gemm(A.data(), B.data(), C.data(), M, N, K, BM, BN, BK, naive_copy);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (verify) {  // spot-check some entries in double
        std::mt19937 r2(9);
        double worst = 0;
        for (int t = 0; t < 2000; ++t) {
            const int i = (int)(r2() % M), j = (int)(r2() % N);
            double s = 0, mag = 0;
            for (int p = 0; p < K; ++p) {
                s += (double)A[(size_t)i * K + p] * B[(size_t)p * N + j];
                mag += std::fabs((double)A[(size_t)i * K + p] * B[(size_t)p * N + j]);
            }
            worst = std::max(worst, std::fabs(C[(size_t)i * N + j] - s) / mag);
        }
        CHECK(worst < 1e-5, "driver GEMM err %g", worst);
    }
    return 2.0 * M * N * K / best / 1e9;
}

int main(int argc, char** argv) {
    bool sweep = false;
    int BM = 128, BN = 256, BK = 256;  // recommended defaults for f32
    std::vector<int> pos;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--sweep")) sweep = true;
        else if (!std::strcmp(argv[i], "--bench-only")) ;
        else pos.push_back(std::atoi(argv[i]));
    }
    bool bench_only = false;
    for (int i = 1; i < argc; ++i) bench_only |= !std::strcmp(argv[i], "--bench-only");
    if (pos.size() == 3) BM = pos[0], BN = pos[1], BK = pos[2];

    if (!bench_only) {
        check_gemm<float>("float");
        check_gemm<double>("double");
        check_half();
        check_exp();
        check_misc();
        bench_exp();
    }
    std::printf("threads: %d\n", omp_get_max_threads());
    if (sweep) {
        const int bms[] = {64, 128, 256};
        const int bns[] = {128, 256, 512};
        const int bks[] = {128, 256, 512};
        for (int bm : bms)
            for (int bn : bns)
                for (int bk : bks)
                    std::printf("  BM=%3d BN=%3d BK=%3d: %7.1f GFLOP/s (hoisted copies)\n", bm, bn, bk,
                                bench_gemm(1024, 1024, 1024, bm, bn, bk, false, false, 10));
    }
    // Ragged sizes through the same driver (correctness of the zero-fill path).
    bench_gemm(1000, 777, 555, BM, BN, BK, false, true, 1);
    bench_gemm(1000, 777, 555, BM, BN, BK, true, true, 1);
    const double gh = bench_gemm(1024, 1024, 1024, BM, BN, BK, false, true);
    const double gn = bench_gemm(1024, 1024, 1024, BM, BN, BK, true, true);
    std::printf("GEMM 1024^3 f32 via gemm_tile, BM=%d BN=%d BK=%d: %.1f GFLOP/s (hoisted copies), "
                "%.1f GFLOP/s (naive per-element copies)\n", BM, BN, BK, gh, gn);
    std::printf("%s (%d failures)\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
    return g_failures ? 1 : 0;
}
